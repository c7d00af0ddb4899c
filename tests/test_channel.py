"""Scheduler.Channel over real gRPC on loopback: many sessions on one stream, with the same
semantics, errors and authentication as the per-session rpcs (docs in scheduler.proto)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2, status_pb2

from scheduler.api.gen.slotsched.v1 import admin_pb2, common_pb2
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.server import session_channel
from scheduler.server.session_channel import ChannelStream
from tests.channel_fixtures import RawChannel, cmd, lease_of, unary_status
from tests.grpc_fixtures import (
    ADMIN_TOKEN,
    BE,
    DEFAULT_TENANTS,
    TOKENS,
    B,
    Client,
    ServerThread,
    next_event,
    policy_yaml,
    running_server,
)

Code = grpc.StatusCode
ACME = (("authorization", f"Bearer {TOKENS['acme']}"),)
GLOBEX = (("authorization", f"Bearer {TOKENS['globex']}"),)


@pytest.fixture
def server() -> Iterator[ServerThread]:
    """Two workers of two slots, floor 0: four slots, acme may hold two Burstable leases."""
    with running_server(policy_yaml(slots_per_worker=2, floor=0)) as s:
        yield s


def acquire(ref: int, sid: str, qos: int = B, **kw: Any) -> pb.ChannelCommand:
    return cmd(ref, acquire=pb.AcquireRequest(session_id=sid, qos=qos, **kw))


def release(ref: int, sid: str, lease: Any) -> pb.ChannelCommand:
    return cmd(ref, release=pb.ReleaseRequest(session_id=sid, lease_id=lease.lease_id, epoch=lease.epoch))


def renew(ref: int, sid: str, lease: Any) -> pb.ChannelCommand:
    return cmd(ref, renew=pb.RenewRequest(session_id=sid, lease_id=lease.lease_id, epoch=lease.epoch))


def test_many_sessions_on_one_channel_queue_grant_and_end(server: ServerThread) -> None:
    async def go() -> None:
        ch = RawChannel(server.target, ACME)
        try:
            await ch.send(acquire(1, "a"), acquire(2, "b"), acquire(3, "c"))
            a = lease_of(await ch.event_of("a", "granted"))
            b = lease_of(await ch.event_of("b", "granted"))
            queued = await ch.event_of("c", "queued")  # acme's Burstable limit is 2
            assert queued.ref == 0 and queued.event.queued.position == 0
            # The same signed grants and tagged lease ids as Acquire: GetSession quotes the same id.
            async with Client(server.target, token=TOKENS["acme"]) as c:
                view = await c.scheduler.GetSession(pb.GetSessionRequest(session_id="a"), metadata=c.md)
            assert view.lease.lease_id == a.lease_id and "." in a.lease_id.rpartition("#")[2]
            await ch.send(release(10, "a", a))
            ended = await ch.event_of("a", "ended")
            assert ended.event.ended.reason == pb.END_REASON_RELEASED and ended.event.ended.session_over
            # The freed slot goes to c (on the same channel): both events precede the answer.
            c_granted = await ch.next()
            assert c_granted.session_id == "c" and c_granted.event.HasField("granted")
            assert (await ch.next()).released.reason == pb.END_REASON_RELEASED
            c_lease = lease_of(c_granted)
            assert c_lease.session_id == "c" and c_lease.lease_id != a.lease_id
            await ch.send(cmd(11, withdraw=pb.WithdrawRequest(session_id="b")))
            err = await ch.answer(11)  # b holds a lease: withdrawing it is refused, as Release says
            assert err.error.status.code == Code.FAILED_PRECONDITION.value[0]
            await ch.send(release(12, "b", b), release(13, "c", c_lease))
            assert (await ch.answer(12)).HasField("released")
            assert (await ch.answer(13)).HasField("released")
            await ch.call.done_writing()
            assert (await ch.status())[0] == Code.OK  # half-closed, every answer written
        finally:
            await ch.close()

    asyncio.run(go())


def test_renewals_batched_in_one_message(server: ServerThread) -> None:
    async def go() -> None:
        ch = RawChannel(server.target, ACME)
        try:
            await ch.send(acquire(1, "a"), acquire(2, "b"))
            leases = {s: lease_of(await ch.event_of(s, "granted")) for s in ("a", "b")}
            await ch.send(renew(3, "a", leases["a"]), renew(4, "b", leases["b"]))
            r3, r4 = await ch.answer(3), await ch.answer(4)
            for ev, sid in ((r3, "a"), (r4, "b")):
                assert ev.session_id == sid and ev.renewed.state == common_pb2.LEASE_STATE_ACTIVE
                assert ev.renewed.grant and ev.renewed.expires_at.seconds >= leases[sid].expires_at.seconds
        finally:
            await ch.close()

    asyncio.run(go())


async def _unary_failure(aw: Any) -> status_pb2.Status:
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await aw
    return unary_status(ei.value)


async def _acquire_failure(call: Any) -> tuple[status_pb2.Status, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        while await asyncio.wait_for(call.read(), 5) is not grpc.aio.EOF:
            pass
    md = {k: v for k, v in ei.value.trailing_metadata() or () if isinstance(v, str)}
    return unary_status(ei.value), md


def test_per_session_errors_carry_the_per_session_rpcs_code_message_and_details(server: ServerThread) -> None:
    """The same status (code, message, every detail) and trailers as the per-session rpc, table-driven."""

    async def go() -> None:
        ch = RawChannel(server.target, ACME)
        try:
            async with Client(server.target, token=TOKENS["acme"]) as c:
                await ch.send(acquire(1, "held"))
                held = lease_of(await ch.event_of("held", "granted"))
                stale = pb.RenewRequest(session_id="held", lease_id=held.lease_id, epoch=held.epoch + 5)
                untagged = pb.RenewRequest(session_id="held", lease_id="local-0/0#1", epoch=1)
                cases = [
                    (acquire(2, "q", 0), c.acquire("q", 0), True),  # qos unspecified: BadRequest
                    (
                        acquire(4, "be", BE, wait_timeout=Duration(seconds=-1)),
                        c.acquire("be", BE, wait_timeout=Duration(seconds=-1)),
                        True,
                    ),
                    (cmd(5, renew=stale), c.scheduler.Renew(stale, metadata=c.md), False),
                    (cmd(6, renew=untagged), c.scheduler.Renew(untagged, metadata=c.md), False),
                    (
                        cmd(7, release=pb.ReleaseRequest(session_id="nobody")),
                        c.scheduler.Release(pb.ReleaseRequest(session_id="nobody"), metadata=c.md),
                        False,
                    ),
                    (
                        cmd(
                            8,
                            yield_slot=pb.YieldRequest(
                                session_id="held",
                                lease_id=held.lease_id,
                                epoch=held.epoch,
                                snapshot=common_pb2.SnapshotRef(),
                            ),
                        ),
                        c.scheduler.Yield(
                            pb.YieldRequest(
                                session_id="held",
                                lease_id=held.lease_id,
                                epoch=held.epoch,
                                snapshot=common_pb2.SnapshotRef(),
                            ),
                            metadata=c.md,
                        ),
                        False,
                    ),
                ]
                for command, per_session, streaming in cases:
                    want = (
                        (await _acquire_failure(per_session))[0]
                        if streaming
                        else await _unary_failure(per_session)
                    )
                    await ch.send(command)
                    got = await ch.answer(command.ref)
                    assert got.HasField("error"), got
                    assert got.error.status == want, (command, got.error.status, want)
        finally:
            await ch.close()

    asyncio.run(go())


def test_no_quota_and_queue_full_as_error_events_with_details_and_trailers() -> None:
    text = policy_yaml(workers=1, floor=0, max_pending=1)
    with running_server(text) as srv:

        async def go() -> None:
            ch = RawChannel(srv.target, ACME)
            try:
                async with Client(srv.target, token=TOKENS["globex"]) as globex:
                    # globex has no Guaranteed quota: PERMISSION_DENIED NO_QUOTA, on both shapes.
                    want, _ = await _acquire_failure(globex.acquire("g", common_pb2.QOS_CLASS_GUARANTEED))
                    gch = RawChannel(srv.target, GLOBEX)
                    await gch.send(acquire(1, "g", common_pb2.QOS_CLASS_GUARANTEED))
                    got = (await gch.answer(1)).error
                    await gch.close()
                    assert got.status == want and got.status.code == Code.PERMISSION_DENIED.value[0]
                    info = error_details_pb2.ErrorInfo()
                    assert got.status.details[-1].Unpack(info) and info.reason == "NO_QUOTA"
                await ch.send(acquire(1, "holder"), acquire(2, "waiter"), acquire(3, "third"))
                await ch.event_of("holder", "granted")
                await ch.event_of("waiter", "queued")
                full = (await ch.answer(3)).error
                assert full.status.code == Code.RESOURCE_EXHAUSTED.value[0]
                assert int(full.trailers["retry-after-ms"]) >= 1000
                quota = error_details_pb2.QuotaFailure()
                assert full.status.details[0].Unpack(quota) and quota.violations[0].subject == "pool"
            finally:
                await ch.close()

        asyncio.run(go())


def test_wait_timeout_withdraws_a_queued_session_then_deadline_exceeded() -> None:
    with running_server(policy_yaml(workers=1, floor=0)) as srv:

        async def go() -> None:
            ch = RawChannel(srv.target, ACME)
            try:
                await ch.send(acquire(1, "holder"), acquire(2, "w", wait_timeout=Duration(nanos=200_000_000)))
                await ch.event_of("holder", "granted")
                await ch.event_of("w", "queued")
                ended = await ch.event_of("w", "ended")
                assert ended.event.ended.reason == pb.END_REASON_WITHDRAWN
                err = await ch.until(lambda ev: ev.session_id == "w")
                assert err.ref == 0 and err.error.status.code == Code.DEADLINE_EXCEEDED.value[0]
                assert "wait_timeout" in err.error.status.message
            finally:
                await ch.close()

        asyncio.run(go())


def test_authentication_and_other_tenants(server: ServerThread) -> None:
    async def go() -> None:
        # No credential, a bad one: the channel ends as any rpc would.
        for md, code in (
            ((), Code.UNAUTHENTICATED),
            ((("authorization", "Bearer nope"),), Code.PERMISSION_DENIED),
        ):
            ch = RawChannel(server.target, md)
            try:
                assert (await ch.status())[0] == code  # checked when the channel opens
            finally:
                await ch.close()
        acme, globex = RawChannel(server.target, ACME), RawChannel(server.target, GLOBEX)
        try:
            await acme.send(acquire(1, "s"))
            lease = lease_of(await acme.event_of("s", "granted"))
            # globex quoting acme's lease: refused as the per-session Renew and Release refuse it.
            await globex.send(renew(2, "s", lease), release(3, "s", lease))
            for ref in (2, 3):
                st = (await globex.answer(ref)).error.status
                assert st.code == Code.FAILED_PRECONDITION.value[0] and "another tenant" in st.message
            # The same session id under globex is another session: it never touches acme's.
            await globex.send(acquire(4, "s"))
            other = lease_of(await globex.event_of("s", "granted"))
            assert other.tenant == "globex" and other.lease_id != lease.lease_id
            await acme.send(renew(5, "s", lease))
            assert (await acme.answer(5)).HasField("renewed")
        finally:
            await acme.close()
            await globex.close()

    asyncio.run(go())


def test_garbage_and_too_many_commands_end_the_channel_invalid_argument(server: ServerThread) -> None:
    async def go() -> None:
        ch = grpc.aio.insecure_channel(server.target)
        try:
            raw = ch.stream_stream("/slotsched.v1.Scheduler/Channel")  # bytes in, bytes out
            call = raw(metadata=ACME)
            await call.write(b"\xff\xff\xff\xff garbage")
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await call.read()
            assert ei.value.code() == Code.INVALID_ARGUMENT and "ChannelRequest" in (ei.value.details() or "")
        finally:
            await ch.close(None)
        rc = RawChannel(server.target, ACME)
        try:
            await rc.send(acquire(1, "ok"))
            await rc.event_of("ok", "granted")
            await rc.send(*(cmd(i, withdraw=pb.WithdrawRequest(session_id="w")) for i in range(1025)))
            code, details = await rc.status()
            assert code == Code.INVALID_ARGUMENT and "commands: more than 1024 entries" in details
        finally:
            await rc.close()

    asyncio.run(go())


def test_a_command_over_a_limit_is_refused_alone_and_the_channel_goes_on(server: ServerThread) -> None:
    async def go() -> None:
        rc = RawChannel(server.target, ACME)
        try:
            long_id = "x" * 300
            await rc.send(acquire(1, "good"), acquire(2, long_id), acquire(3, "after"))
            seen = [await rc.next() for _ in range(3)]  # in order: good's grant, the error, after's
            assert [ev.ref for ev in seen] == [0, 2, 0]
            bad = seen[1]
            assert bad.ref == 2 and bad.session_id == ""  # the over-long id is not echoed
            status = bad.error.status
            assert status.code == Code.INVALID_ARGUMENT.value[0]
            assert status.message.startswith("acquire.session_id: longer than 256 bytes (got 300)")
            assert len(status.message) < 200  # the value is quoted, not echoed whole
            violation = error_details_pb2.BadRequest()
            assert status.details[0].Unpack(violation)
            assert violation.field_violations[0].field == "acquire.session_id"
            # The commands before and after it in the same message were applied.
            assert [(ev.session_id, ev.event.WhichOneof("event")) for ev in (seen[0], seen[2])] == [
                ("good", "granted"),
                ("after", "granted"),
            ]
            good = lease_of(seen[0])
            # The same status the per-session rpc ends with for that field (named from the request).
            async with Client(server.target, token=TOKENS["acme"]) as c:
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    stream = c.scheduler.Acquire(pb.AcquireRequest(session_id=long_id, qos=B), metadata=c.md)
                    await next_event(stream)
            unary = unary_status(ei.value)
            assert (unary.code, "acquire." + unary.message) == (status.code, status.message)
            # Another over-long field of another command kind: answered by ref, naming it.
            long_uri = common_pb2.SnapshotRef(uri="s3://b/" + "k" * 2100)
            over = pb.RenewRequest(session_id="good", lease_id="l" * 300)
            await rc.send(
                acquire(4, "snap", resume_from=long_uri), cmd(5, renew=over), renew(6, "good", good)
            )
            four, five = await rc.answer(4), await rc.answer(5)
            assert four.session_id == "snap" and "acquire.resume_from.uri: longer than 2048" in (
                four.error.status.message
            )
            assert five.session_id == "good" and five.error.status.message.startswith("renew.lease_id: ")
            assert (await rc.answer(6)).HasField("renewed")  # the channel is still open
            await rc.send(release(7, "good", good))
            assert (await rc.answer(7)).HasField("released")
        finally:
            await rc.close()

    asyncio.run(go())


def test_a_session_moves_to_another_channel_and_keeps_its_lease(server: ServerThread) -> None:
    async def go() -> None:
        one, two = RawChannel(server.target, ACME), RawChannel(server.target, ACME)
        try:
            await one.send(acquire(1, "s"))
            lease = lease_of(await one.event_of("s", "granted"))
            await one.send(acquire(2, "s"))  # re-attach on the same channel: a replay, no error
            again = await one.event_of("s", "granted")
            assert lease_of(again).lease_id == lease.lease_id and again.event.granted.grant
            await two.send(acquire(1, "s"))  # taken over by another channel
            moved = lease_of(await two.event_of("s", "granted"))
            assert (moved.lease_id, moved.epoch) == (lease.lease_id, lease.epoch)
            aborted = await one.until(lambda ev: ev.HasField("error"))
            assert aborted.session_id == "s" and aborted.ref == 0
            assert aborted.error.status.code == Code.ABORTED.value[0]
            # A broken channel loses nothing: the session re-attaches on a fresh one.
            await two.close()
            three = RawChannel(server.target, ACME)
            await three.send(acquire(1, "s"))
            assert lease_of(await three.event_of("s", "granted")).lease_id == lease.lease_id
            await three.send(release(2, "s", lease))
            assert (await three.answer(2)).HasField("released")
            await three.close()
        finally:
            await one.close()

    asyncio.run(go())


def _channel_of(srv: ServerThread, sid: str) -> Any:
    def find(r: Any) -> Any:
        return next(
            s.channel
            for k, s in r.loop._streams.items()
            if k.endswith("/" + sid) and isinstance(s, ChannelStream)
        )

    return srv.call(find)


def test_a_reader_that_does_not_read_stops_the_channel_reading_then_loses_nothing(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_channel, "SOFT_LIMIT", 16)

    async def go() -> None:
        ch = RawChannel(server.target, ACME)
        try:
            await ch.send(acquire(1, "anchor"))
            await ch.event_of("anchor", "granted")
            chan = _channel_of(server, "anchor")
            bad = pb.RenewRequest(session_id="s" * 200, lease_id="nope" * 60)
            sent = 0

            async def flood() -> None:
                nonlocal sent
                for i in range(400):
                    await ch.send(*(cmd(1000 + i * 64 + j, renew=bad) for j in range(64)))
                    sent += 64

            flooding = asyncio.create_task(flood())
            # Without reading, the server stops reading: the writes stall well before the end.
            for _ in range(200):
                await asyncio.sleep(0.05)
                if server.call(lambda r: not chan.drained.is_set()) and not flooding.done():
                    break
            assert not flooding.done(), "the server kept reading from a client that does not read"
            outbox = server.call(lambda r: len(chan.outbox))
            assert outbox <= session_channel.SOFT_LIMIT + 64  # bounded: one message past the limit
            # Reading again drains it all: every command answered, none lost.
            answered = 0
            while answered < 400 * 64:
                ev = await ch.next(10)
                if ev.HasField("error"):
                    answered += 1
            await flooding
            assert sent == answered
        finally:
            await ch.close()

    asyncio.run(go())


def test_events_piling_up_past_the_hard_limit_end_the_channel_resource_exhausted(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that reads nothing while events keep coming for its sessions: the server's writes
    stall, and past HARD_LIMIT waiting events the channel ends (memory stays bounded)."""
    monkeypatch.setattr(session_channel, "SOFT_LIMIT", 16)

    async def go() -> None:
        ch = RawChannel(server.target, ACME)
        try:
            await ch.send(acquire(1, "s"))
            lease = lease_of(await ch.event_of("s", "granted"))
            chan = _channel_of(server, "s")
            filler = session_channel.AnswerEntry(
                "s" * 200, 0, session_channel.errors.not_found("x" * 200)
            )  # ~450 bytes each

            def pile(n: int) -> None:
                for _ in range(n):
                    chan.push(filler)

            for _ in range(400):  # until the writes stall (the client reads nothing)
                server.call(lambda r: pile(2000))
                await asyncio.sleep(0.02)
                if server.call(lambda r: len(chan.outbox) >= session_channel.SOFT_LIMIT):
                    break
            server.call(lambda r: pile(session_channel.HARD_LIMIT + 1))
            code, details = await ch.status(30)
            assert code == Code.RESOURCE_EXHAUSTED and "too slow" in details
            # The session is kept, as after any broken stream: it re-attaches.
            again = RawChannel(server.target, ACME)
            await again.send(acquire(1, "s"))
            assert lease_of(await again.event_of("s", "granted")).lease_id == lease.lease_id
            await again.close()
        finally:
            await ch.close()

    asyncio.run(go())


def test_per_session_acquire_takes_a_session_from_a_channel(server: ServerThread) -> None:
    async def go() -> None:
        ch = RawChannel(server.target, ACME)
        try:
            await ch.send(acquire(1, "s"))
            lease = lease_of(await ch.event_of("s", "granted"))
            async with Client(server.target, token=TOKENS["acme"]) as c:
                call = c.acquire("s", B)
                replay = await next_event(call)
                assert replay.granted.lease.lease_id == lease.lease_id
                aborted = await ch.until(lambda ev: ev.HasField("error"))
                assert aborted.error.status.code == Code.ABORTED.value[0]
                call.cancel()
        finally:
            await ch.close()

    asyncio.run(go())


def test_a_credential_the_policy_drops_stops_working_on_an_open_channel() -> None:
    text = policy_yaml(slots_per_worker=2, floor=0)
    with running_server(text) as srv:

        async def go() -> None:
            ch = RawChannel(srv.target, ACME)
            try:
                await ch.send(acquire(1, "s"))
                await ch.event_of("s", "granted")
                # acme's token rotated away by ApplyPolicy: the next message on the channel fails.
                tenants = [
                    {**t, "token": "acme-new-token"} if t["name"] == "acme" else t for t in DEFAULT_TENANTS
                ]
                async with Client(srv.target, token=ADMIN_TOKEN) as admin:
                    req = admin_pb2.ApplyPolicyRequest(yaml=policy_yaml(tenants, slots_per_worker=2, floor=0))
                    await admin.admin.ApplyPolicy(req, metadata=admin.md)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await ch.send(acquire(2, "t"))
                code, details = await ch.status()
                assert code == Code.PERMISSION_DENIED, details
            finally:
                await ch.close()

        asyncio.run(go())


def test_each_command_is_charged_to_its_rpcs_bucket() -> None:
    """renewals: burst 2, slow refill; tenant (acquire): unlimited here. Three renews in one
    message: two pass, the third is RESOURCE_EXHAUSTED with QuotaFailure and retry-after-ms."""
    text = policy_yaml(slots_per_worker=2, floor=0, rate_limits={"renewals": {"qps": 0.01, "burst": 2}})
    with running_server(text) as srv:

        async def go() -> None:
            ch = RawChannel(srv.target, ACME)
            try:
                await ch.send(acquire(1, "s"))
                lease = lease_of(await ch.event_of("s", "granted"))
                await ch.send(renew(2, "s", lease), renew(3, "s", lease), renew(4, "s", lease))
                assert (await ch.answer(2)).HasField("renewed")
                assert (await ch.answer(3)).HasField("renewed")
                err = (await ch.answer(4)).error
                assert err.status.code == Code.RESOURCE_EXHAUSTED.value[0] and "Renew" in err.status.message
                assert int(err.trailers["retry-after-ms"]) > 0
                quota = error_details_pb2.QuotaFailure()
                assert err.status.details[0].Unpack(quota) and "renewals" in quota.violations[0].description
            finally:
                await ch.close()

        asyncio.run(go())
