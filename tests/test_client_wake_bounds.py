"""What the re-attach wake (scheduler/client/wake.py) must not do, against fake servers over real
gRPC on loopback (found by review, each reproduced first):

* sessions whose streams answer one event and then break must not wake each other into re-attach
  loops with no backoff (before the fix: ~700 Acquires per session in 2 s; the old code's pace,
  one per `backoff_initial_s`, is the bound);
* a session that keeps failing without an event must not retry each time another session of the
  client starts (before: one Acquire per new session; now one early wake per run of failures);
* on a Channel, the late answer to a command whose caller gave up (a Renew that timed out) must not
  be taken for the end of the session's stream (before: the session ended RESOURCE_EXHAUSTED).

Counts over a wall-clock window bound a rate from above only (a slow machine makes fewer calls).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import grpc
from google.rpc import status_pb2

from scheduler.api import commands
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.api.gen.slotsched.v1 import scheduler_pb2_grpc as pbg
from scheduler.client import AsyncClient, Phase, QoS


async def _serve(servicer: Any) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    pbg.add_SchedulerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _queued() -> pb.LeaseEvent:
    ev = pb.LeaseEvent()
    ev.queued.position = 1
    return ev


class _EventThenBreak(pbg.SchedulerServicer):
    """Every Acquire: one Queued event, then UNAVAILABLE."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def Acquire(self, request: Any, context: Any) -> None:  # noqa: N802
        self.calls[request.session_id] += 1
        await context.write(_queued())
        await context.abort(grpc.StatusCode.UNAVAILABLE, "bye")


class _OneAlwaysFails(pbg.SchedulerServicer):
    """Session `bad` is refused UNKNOWN at once, every time; the others queue and stay."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def Acquire(self, request: Any, context: Any) -> None:  # noqa: N802
        self.calls[request.session_id] += 1
        if request.session_id == "bad":
            await context.abort(grpc.StatusCode.UNKNOWN, "a server bug for this one")
        await context.write(_queued())
        await asyncio.sleep(60)


class _LateRenewAnswer(pbg.SchedulerServicer):
    """A Channel: acquire -> Queued; renew -> answered 0.5 s late, RESOURCE_EXHAUSTED on its ref."""

    async def Channel(self, requests: Any, context: Any) -> None:  # noqa: N802
        async for req in requests:
            for c in req.commands:
                kind = c.WhichOneof("command")
                r = pb.ChannelResponse()
                if kind == "acquire":
                    r.events.add(session_id=c.acquire.session_id).event.CopyFrom(_queued())
                elif kind == "renew":
                    await asyncio.sleep(0.5)
                    ev = r.events.add(session_id=c.renew.session_id, ref=c.ref)
                    code = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
                    ev.error.status.CopyFrom(status_pb2.Status(code=code, message="rate limited"))
                await context.write(r)


def test_sessions_whose_streams_break_after_one_event_keep_the_initial_backoff() -> None:
    async def body() -> None:
        fake = _EventThenBreak()
        server, target = await _serve(fake)
        client = AsyncClient(target, multiplex=False, reattach_timeout_s=60, backoff_initial_s=0.1)
        try:
            sessions = [client.session(f"s{i}", QoS.BURSTABLE) for i in range(3)]
            for s in sessions:
                s.start()
                await asyncio.sleep(0.037)  # broken at different times: each wakes the others
            await asyncio.sleep(2.0)
            per_session = [fake.calls[s.session_id] for s in sessions]
            # At most one attach per 0.1 s each (the old pace: every event reset the backoff).
            assert max(per_session) <= 2.3 / 0.1, per_session
        finally:
            for s in sessions:
                s._state.closing = True
            await server.stop(0)

    asyncio.run(body())


def test_a_session_that_keeps_failing_is_woken_once_not_by_every_new_session() -> None:
    async def body() -> None:
        fake = _OneAlwaysFails()
        server, target = await _serve(fake)
        client = AsyncClient(target, multiplex=False, reattach_timeout_s=60, connect_timeout_s=60)
        try:
            bad = client.session("bad", QoS.BURSTABLE)
            bad.start()
            for i in range(100):  # a runtime starting a session every 20 ms
                client.session(f"n{i}", QoS.BURSTABLE).start()
                await asyncio.sleep(0.02)
            # Its own backoff (0.1, 0.2, 0.4, 0.8 s: ~5 tries in 2 s) plus one early wake.
            assert fake.calls["bad"] <= 8, fake.calls["bad"]
            assert fake.calls["n99"] >= 1
        finally:
            await server.stop(0)

    asyncio.run(body())


def test_a_late_answer_to_a_command_whose_caller_gave_up_does_not_end_the_session() -> None:
    async def body() -> None:
        server, target = await _serve(_LateRenewAnswer())
        client = AsyncClient(target)
        try:
            s = client.session("a", QoS.BURSTABLE)
            s.start()
            await s.wait_until(lambda s: s.queue is not None, 5)
            try:
                await client.transport().send(
                    commands.RENEW,
                    pb.RenewRequest(session_id="a", lease_id="x", epoch=1),
                    client.metadata,
                    0.2,
                )
                raise AssertionError("the Renew should have timed out")
            except grpc.aio.AioRpcError as e:
                assert e.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.sleep(0.8)  # its answer came meanwhile, to nobody
            assert s.phase is Phase.QUEUED and s.error is None, (s.phase, s.error)
        finally:
            await server.stop(0)

    asyncio.run(body())


def test_a_snapshot_ref_over_the_wire_limits_is_refused_where_it_is_made() -> None:
    """A ref the scheduler would refuse (a 4 MiB uri would even break the shared channel for
    everyone) fails where the runtime makes it, naming the field."""
    import pytest

    from scheduler.client import SnapshotRef

    SnapshotRef(uri="s3://b/" + "k" * 2000, sha256="0" * 64)  # within the limits
    with pytest.raises(ValueError, match="uri is 2049 bytes: at most 2048"):
        SnapshotRef(uri="u" * 2049)
    with pytest.raises(ValueError, match="sha256 is 257 bytes"):
        SnapshotRef(uri="s3://b/k", sha256="0" * 257)


class _RateLimitedReattach(pbg.SchedulerServicer):
    """First Acquire: Queued, then the stream breaks. The next two (the re-attaches): refused
    RESOURCE_EXHAUSTED with retry-after-ms, as the tenant's rate limit does past its burst. Then
    Queued, and the stream stays."""

    def __init__(self) -> None:
        self.calls = 0

    async def Acquire(self, request: Any, context: Any) -> None:  # noqa: N802
        self.calls += 1
        if self.calls in (2, 3):
            context.set_trailing_metadata((("retry-after-ms", "200"),))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limited: retry later")
        await context.write(_queued())
        if self.calls == 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        await asyncio.sleep(60)


def test_a_reattach_refused_by_the_rate_limit_waits_as_told_and_keeps_the_session() -> None:
    """After a restart every session of a client re-attaches at once, past the tenant's burst: a
    re-attach refused RESOURCE_EXHAUSTED with retry-after waits that long and tries again (before:
    the session failed QueueFull for good). A new session's refusal is still its answer."""

    async def body() -> None:
        fake = _RateLimitedReattach()
        server, target = await _serve(fake)
        client = AsyncClient(target, multiplex=False, reattach_timeout_s=30, backoff_initial_s=0.05)
        try:
            s = client.session("a", QoS.BURSTABLE)
            s.start()
            await s.wait_until(lambda s: fake.calls >= 4 or s.error is not None, 10)
            await asyncio.sleep(0.1)
            assert s.error is None and s.phase is Phase.QUEUED, (s.phase, s.error)
            assert fake.calls == 4
        finally:
            await server.stop(0)

    asyncio.run(body())
