"""The SDK over Scheduler.Channel: `client.session(...)` unchanged, every session of a client on one
stream; the per-session way on request or against a server without Channel; and a session on a
channel re-attached to a successor scheduler (Redis state store) with its lease."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import grpc
import pytest

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.client import AsyncClient, AsyncSession, InvalidArgument, Phase, QoS, SnapshotRef
from scheduler.client.mux import rpc_error
from scheduler.server.session_channel import ChannelStream
from scheduler.server.stream import LeaseStream
from tests.channel_fixtures import RawChannel, cmd, lease_of
from tests.grpc_fixtures import TOKENS, B, ServerThread, policy_yaml, running_server
from tests.test_client_sdk import CuttableProxy
from tests.test_state_redis import NOT_SERVING, REDIS_BIN, SERVING, Sched, cluster

ACME = TOKENS["acme"]


def _streams(server: ServerThread) -> dict[str, Any]:
    return server.call(lambda r: {k.partition("/")[2]: s for k, s in r.loop._streams.items()})


def test_a_clients_sessions_share_one_channel_and_behave_as_before() -> None:
    with running_server(policy_yaml(slots_per_worker=2, floor=0)) as server:

        async def body() -> None:
            async with AsyncClient(server.target, token=ACME) as client:
                a = client.session("a", QoS.BURSTABLE)
                b = client.session("b", QoS.BURSTABLE)
                c = client.session("c", QoS.BURSTABLE)
                for s in (a, b, c):
                    s.start()
                await a.wait_granted(5)
                await b.wait_granted(5)
                await c.wait_until(lambda s: s.queue is not None, 5)  # acme's limit is 2
                streams = _streams(server)
                assert all(isinstance(streams[n], ChannelStream) for n in "abc")
                assert len({id(streams[n].channel) for n in "abc"}) == 1  # one stream for all
                await a.release()
                await c.wait_granted(5)  # the freed slot, told on the same channel
                assert a.end_reason == "released" and a.error is None
                await b.release()
                await c.release()
                assert c.grants == 1 and c.phase is Phase.ENDED

        asyncio.run(body())


def test_a_broken_channel_re_attaches_every_session_on_it() -> None:
    with running_server(policy_yaml(slots_per_worker=2, floor=0, lease_ttl_s=1.5)) as server:

        async def body() -> None:
            proxy = await CuttableProxy(server.port).start()
            try:
                async with AsyncClient(f"127.0.0.1:{proxy.port}", token=ACME) as client:
                    one = client.session("one", QoS.BURSTABLE)
                    two = client.session("two", QoS.BURSTABLE)
                    for s in (one, two):
                        s.start()
                    before = {s.session_id: (await s.wait_granted(5)).key for s in (one, two)}
                    assert proxy.cut() >= 1
                    for s in (one, two):
                        await s.wait_until(lambda s: s.reattaches >= 1 and s._attached, 5)
                    await asyncio.sleep(2.0)  # past the TTL: renewals go on over the new channel
                    for s in (one, two):
                        assert s.lease is not None and s.lease.key == before[s.session_id]
                        assert s.phase is Phase.HOLDING and not s.lost_lease.is_set()
                    await one.release()
                    await two.release()
            finally:
                await proxy.close()

        asyncio.run(body())


def test_a_session_the_wire_guard_refuses_fails_alone_on_the_shared_channel() -> None:
    """A command with a field over its limit is that session's INVALID_ARGUMENT, not the channel's:
    the other sessions of the client keep their leases and renew on the same channel."""
    with running_server(policy_yaml(slots_per_worker=2, floor=0, lease_ttl_s=1.5)) as server:

        async def body() -> None:
            async with AsyncClient(server.target, token=ACME) as client:
                with pytest.raises(InvalidArgument, match="session_id: 1 to 256 bytes"):
                    client.session("x" * 300)  # checked before anything is sent
                keeper = client.session("keeper", QoS.BURSTABLE)
                keeper.start()
                held = await keeper.wait_granted(5)
                # As a client without that check sends it (an SDK of before, another language).
                long_id = AsyncSession(client, "x" * 300, QoS.BURSTABLE)
                over = SnapshotRef("s3://b/k")
                object.__setattr__(over, "uri", "s3://b/" + "k" * 2100)  # past SnapshotRef's own check
                long_uri = client.session("snap", QoS.BURSTABLE, resume_from=over)
                for s in (long_id, long_uri):
                    s.start()
                    with pytest.raises(InvalidArgument):
                        await s.wait_granted(5)
                assert long_id.error is not None and "acquire.session_id: longer than 256" in str(
                    long_id.error
                )
                assert long_uri.error is not None and "acquire.resume_from.uri: longer" in str(long_uri.error)
                await asyncio.sleep(2.0)  # past the TTL: the keeper renewed on the same channel
                assert (
                    keeper.phase is Phase.HOLDING and keeper.error is None and not keeper.lost_lease.is_set()
                )
                assert keeper.lease is not None and keeper.lease.key == held.key and keeper.reattaches == 0
                later = client.session("later", QoS.BURSTABLE)
                later.start()
                await later.wait_granted(5)
                streams = _streams(server)
                assert streams["keeper"].channel is streams["later"].channel
                await later.release()
                await keeper.release()
                assert keeper.end_reason == "released" and keeper.error is None

        asyncio.run(body())


def test_more_sessions_starting_at_once_than_one_message_may_carry() -> None:
    """1100 acquires ready at once go as two ChannelRequests: one of more than 1024 commands
    would end the channel INVALID_ARGUMENT, failing every session on it. (Queue caps above the
    1100: the 1098 that wait count against them, slots free or not.)"""
    caps = {"max_pending": 2000, "max_pending_per_tenant": 2000}
    with running_server(policy_yaml(slots_per_worker=2, floor=0, **caps)) as server:

        async def body() -> None:
            async with AsyncClient(server.target, token=ACME) as client:
                sessions = [client.session(f"s{i}", QoS.BURSTABLE) for i in range(1100)]
                for s in sessions:
                    s.start()
                for s in sessions:
                    await s.wait_until(lambda s: s.queue is not None or s.lease is not None or s.error, 10)
                assert [s.error for s in sessions if s.error is not None] == []
                assert sum(s.lease is not None for s in sessions) == 2  # acme's Burstable limit

        asyncio.run(body())


def test_multiplex_false_keeps_one_acquire_stream_per_session() -> None:
    with running_server(policy_yaml(slots_per_worker=2, floor=0)) as server:

        async def body() -> None:
            client = AsyncClient(server.target, token=ACME, multiplex=False)
            async with client, client.session("solo", QoS.BURSTABLE):
                assert type(_streams(server)["solo"]) is LeaseStream

        asyncio.run(body())


class _NoChannel(scheduler_pb2_grpc.SchedulerServicer):
    """A Scheduler of before the Channel: Acquire grants at once, Release ends the stream."""

    def __init__(self) -> None:
        self.released: dict[str, asyncio.Event] = {}

    async def Acquire(self, request: Any, context: Any) -> None:  # noqa: N802
        done = self.released[request.session_id] = asyncio.Event()
        lease = common_pb2.Lease(lease_id="w/0#1.tag", session_id=request.session_id, epoch=1)
        await context.write(scheduler_pb2.LeaseEvent(granted=scheduler_pb2.Granted(lease=lease)))
        await done.wait()
        ended = scheduler_pb2.Ended(reason=scheduler_pb2.END_REASON_RELEASED, session_over=True)
        await context.write(scheduler_pb2.LeaseEvent(ended=ended))

    async def Release(self, request: Any, context: Any) -> scheduler_pb2.ReleaseResponse:  # noqa: N802
        self.released[request.session_id].set()
        return scheduler_pb2.ReleaseResponse(reason=scheduler_pb2.END_REASON_RELEASED)


def test_a_server_without_channel_is_served_per_session() -> None:
    async def body() -> None:
        server = grpc.aio.server()
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(_NoChannel(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with AsyncClient(f"127.0.0.1:{port}", tenant="t", renew_interval_s=60) as client:
                async with client.session("old", QoS.BURSTABLE) as lease:
                    assert lease.lease_id == "w/0#1.tag"
                    assert client._mux is not None and client._mux.unsupported
                assert lease.end_reason == "released" and lease.error is None
        finally:
            await server.stop(0)

    asyncio.run(body())


@pytest.mark.skipif(
    not os.path.exists(REDIS_BIN) and not os.environ.get("CI"), reason="redis-server not installed"
)
def test_a_channel_session_re_attaches_to_the_new_leader_with_its_lease() -> None:
    """Redis state store, two replicas: the standby's Channel says "not the leader"; the leader
    SIGKILLed, the standby takes over and the session, re-acquired on a channel to it, replays
    the same lease (id, epoch) and renews."""
    with cluster() as (r, policy, started):
        a = Sched(policy, r.url, "a")
        started.append(a)
        a.wait_health(SERVING)
        b = Sched(policy, r.url, "b")
        started.append(b)
        b.wait_health(NOT_SERVING)
        md = (("authorization", f"Bearer {ACME}"),)

        async def body() -> None:
            standby = RawChannel(b.target, md)
            code, details = await standby.status()
            await standby.close()
            assert code == grpc.StatusCode.UNAVAILABLE and "not the leader" in details
            ch = RawChannel(a.target, md)
            await ch.send(cmd(1, acquire=scheduler_pb2.AcquireRequest(session_id="s", qos=B)))
            lease = lease_of(await ch.event_of("s", "granted"))
            a.kill(signal.SIGKILL)
            code, _ = await ch.status()
            assert code == grpc.StatusCode.UNAVAILABLE
            await ch.close()
            await asyncio.to_thread(b.wait_health, SERVING, 15)
            again = RawChannel(b.target, md)
            try:
                await again.send(cmd(1, acquire=scheduler_pb2.AcquireRequest(session_id="s", qos=B)))
                replay = lease_of(await again.event_of("s", "granted", 10))
                assert (replay.lease_id, replay.epoch) == (lease.lease_id, lease.epoch)
                renew = scheduler_pb2.RenewRequest(
                    session_id="s", lease_id=replay.lease_id, epoch=replay.epoch
                )
                await again.send(cmd(2, renew=renew))
                assert (await again.answer(2)).HasField("renewed")
            finally:
                await again.close()

        asyncio.run(body())


def test_an_ended_session_is_freed_without_the_cycle_collector() -> None:
    """No part of a session holds the session, and the state's hook to its renewer is cut at its
    end: an ended session is freed by its last reference going, not by the cyclic garbage
    collector (whose passes over thousands of ended sessions a second cost the SDK a third of
    its CPU per pair: decision 0020)."""
    import gc
    import weakref

    with running_server(policy_yaml(slots_per_worker=2, floor=0)) as server:

        async def body() -> None:
            async with AsyncClient(server.target, token=ACME) as client:
                async with client.session("warm", QoS.BURSTABLE):
                    pass
                gc.collect()
                gc.disable()
                try:
                    session = client.session("a", QoS.BURSTABLE)
                    async with session:
                        pass
                    assert session.end_reason == "released"
                    parts = [weakref.ref(session), weakref.ref(session._state)]
                    del session
                    await asyncio.sleep(0)  # (the loop drops its last handles to the ended call)
                    assert [r() for r in parts] == [None, None]
                finally:
                    gc.enable()

        asyncio.run(body())


def test_a_session_on_a_channel_needs_no_stream_task_until_its_stream_breaks() -> None:
    """On a channel the reader hands a session its events directly (attach.py): no stream task
    while all goes well; one once the channel breaks, to re-attach, keeping the lease."""
    with running_server(policy_yaml(slots_per_worker=2, floor=0)) as server:

        def streams() -> list[str]:
            return [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("slotsched-stream")]

        async def body() -> None:
            async with AsyncClient(server.target, token=ACME) as client:
                async with client.session("a", QoS.BURSTABLE) as a:
                    lease = a.lease_id
                    assert streams() == []
                    assert client._mux is not None
                    client._mux.conns[0]._break(rpc_error(grpc.StatusCode.UNAVAILABLE, "cut"))
                    assert streams() == ["slotsched-stream-a"]
                    await a.wait_until(lambda s: s.reattaches == 1 and s._attached, 5)
                    assert a.lease_id == lease and a.error is None
                assert a.end_reason == "released" and a.error is None

        asyncio.run(body())
