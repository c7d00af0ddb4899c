"""Hot standby and clients that follow the leader (issue 14, parts 1 and 2), over a real
redis-server and real gRPC:

* a standby keeps a live core equal to the leader's, also across journal trims it fell behind;
* its take-over replays nothing (it reads only the journal's tail) and the SDK's session keeps
  its lease id and epoch, renews on the new leader, and a new session is granted;
* a standby's NOT_LEADER names the leader (ErrorInfo and `x-slotsched-leader`);
* a leader whose renewals stall stops serving at its local deadline, cannot write once a
  successor won (fencing) and steps down;
* a SIGKILLed leader subprocess: the standby serves, the SDK (given both addresses) follows.

Timings are printed, never asserted (bench/standby_failover.py measures them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import redis
from google.rpc import error_details_pb2, status_pb2

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.client import AsyncClient, Phase, QoS
from scheduler.client.channel import parse_targets
from scheduler.client.follow import LEADER_KEY, Follower
from scheduler.grants import GrantKeyring
from scheduler.serve import RunningServer, StateOptions, default_advertise, start_server
from scheduler.state.redis_store import id_key as _id
from scheduler.state.roles import Role
from scheduler.state.store import StaleTerm
from tests.grpc_fixtures import TOKENS, policy_yaml, write_policy
from tests.test_state_redis import NOT_SERVING, REDIS_BIN, SERVING, RedisProc, Sched, queue_order

ACME = TOKENS["acme"]

pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_BIN) and not os.environ.get("CI"), reason="redis-server not installed"
)


@contextlib.asynccontextmanager
async def replicas(
    n: int = 2, snapshot_every: int = 5, ttl: float = 1.0, heartbeat_interval_s: float = 5.0
) -> AsyncIterator[tuple[RedisProc, list[RunningServer]]]:
    """`n` in-process replicas on one Redis; the first one started leads."""
    with tempfile.TemporaryDirectory(prefix="slotsched-hot-") as d:
        r = RedisProc(d).start()
        policy = write_policy(d, policy_yaml(workers=2, slots_per_worker=1, floor=0, lease_ttl_s=3))
        keys = GrantKeyring.generate()  # shared, as replicas of one deployment must
        servers: list[RunningServer] = []
        try:
            for i in range(n):
                state = StateOptions(
                    state=r.url, replica_id=f"r{i}", leader_ttl_s=ttl, snapshot_every=snapshot_every
                )
                servers.append(
                    await start_server(
                        policy,
                        "127.0.0.1:0",
                        None,
                        state=state,
                        grant_keys=keys,
                        heartbeat_interval_s=heartbeat_interval_s,
                    )
                )
                # A snapshot every `snapshot_every` entries, however little time passed: the
                # duty cycle (compaction.py) would space these tiny ones by tens of ms, and the
                # tests count trims.
                replica_of(servers[-1]).snapshot_duty = 0.0
            yield r, servers
        finally:
            for s in servers:
                await s.stop(0)
            r.kill()


def replica_of(s: RunningServer) -> Any:
    assert s.replica is not None
    return s.replica


async def caught_up(r: RedisProc, standby: RunningServer, timeout: float = 10) -> None:
    """Until the standby's core is at the journal's last entry."""
    rc = redis.asyncio.Redis(port=r.port)
    try:
        deadline = time.monotonic() + timeout
        while True:
            last = await rc.xrevrange("slotsched:journal", count=1)
            want = last[0][0].decode() if last else None
            if want is not None and replica_of(standby)._pos == want:
                return
            assert time.monotonic() < deadline, (replica_of(standby)._pos, want)
            await asyncio.sleep(0.02)
    finally:
        await rc.aclose()


def same_state(leader: RunningServer, standby: RunningServer, sessions: list[str]) -> None:
    assert standby.loop.core.describe() == leader.loop.core.describe()
    for sid in sessions:
        key: Any = f"acme/{sid}"
        assert standby.loop.core.session(key) == leader.loop.core.session(key), sid
    a, b = leader.loop.export_state(), standby.loop.export_state()
    assert (b.addresses, b.yields, b.waited, b.qos, b.wait_timeouts) == (
        a.addresses,
        a.yields,
        a.waited,
        a.qos,
        a.wait_timeouts,
    )
    assert list(b.ended) == list(a.ended)
    assert set(standby.registry.workers) == set(leader.registry.workers)


async def crash(s: RunningServer) -> None:
    """Stop a leader as SIGKILL would, in-process: no resignation, no more renewals, port closed."""
    rep = replica_of(s)
    rep.role = Role.STOPPED  # a killed process does nothing more (no step-down, no following)
    if rep._task is not None:
        rep._task.cancel()
    await s.server.stop(None)


def error_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    md = dict(err.trailing_metadata() or ())
    status = status_pb2.Status.FromString(md["grpc-status-details-bin"])
    for d in status.details:
        info = error_details_pb2.ErrorInfo()
        if d.Unpack(info):
            return info
    raise AssertionError("no ErrorInfo")


@pytest.mark.parametrize("multiplex", [True, False], ids=["channel", "per-session"])
def test_standby_follows_the_leader_and_takes_over_without_replaying_the_journal(multiplex: bool) -> None:
    async def body() -> None:
        async with replicas() as (r, (a, b)):
            ra, rb = replica_of(a), replica_of(b)
            assert ra.serving and not rb.serving and rb.snapshot_loads == 1
            # A standby's refusal names the leader, for programs (ErrorInfo) and the SDK (metadata).
            async with grpc.aio.insecure_channel(b.target) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await scheduler_pb2_grpc.SchedulerStub(ch).GetSession(  # type: ignore[no-untyped-call]
                        scheduler_pb2.GetSessionRequest(session_id="x"),
                        metadata=(("authorization", f"Bearer {ACME}"),),
                        timeout=5,
                    )
            e = err.value
            assert e.code() == grpc.StatusCode.UNAVAILABLE
            assert dict(e.trailing_metadata() or ())[LEADER_KEY] == a.target
            info = error_info(e)
            assert (info.reason, info.metadata["leader"]) == ("NOT_LEADER", a.target)

            # The SDK is given both replicas, the standby first: it follows to the leader.
            async with AsyncClient(
                [b.target, a.target], token=ACME, reattach_timeout_s=20, multiplex=multiplex
            ) as client:
                names = [f"s{i}" for i in range(5)]
                sessions = [client.session(n, QoS.BURSTABLE) for n in names]
                for s in sessions:  # one after the other: s0 and s1 hold, the others wait in order
                    s.start()
                    await s.wait_until(lambda s: s.lease is not None or s.queue is not None, 5)
                assert [s.lease is not None for s in sessions] == [True, True, False, False, False]
                assert client.leader == a.target
                await sessions[0].release()  # s2 is granted: churn, with trims (snapshot_every=5)
                await sessions[2].wait_granted(5)
                await caught_up(r, b)
                same_state(a, b, names)
                assert rb.snapshot_loads == 1

                # The standby falls behind a trim (not following for a while): it reloads the
                # snapshot, and is equal again.
                await rb._stop_following()
                await sessions[1].release()
                await sessions[3].wait_granted(5)
                await sessions[2].release()
                await sessions[4].wait_granted(5)
                # A snapshot drops what the one before it covered: churn (a waiter that leaves)
                # until the journal is trimmed past the standby.
                rc = redis.asyncio.Redis(port=r.port)
                for i in range(200):
                    dropped = await rc.hget("slotsched:snapshot", "trimmed_to")
                    assert rb._pos is not None
                    if dropped is not None and _id(dropped.decode()) > _id(rb._pos):
                        break
                    passer = client.session(f"passer{i}", QoS.BURSTABLE)
                    passer.start()
                    await passer.wait_until(lambda s: s.queue is not None, 5)
                    await passer.release()
                else:
                    raise AssertionError("the journal was never trimmed past the standby")
                await rc.aclose()
                rb._ensure_following()
                await caught_up(r, b)
                assert rb.snapshot_loads == 2
                same_state(a, b, names)

                holder = sessions[3]
                before = (holder.lease_id, holder.epoch)
                renew = scheduler_pb2.RenewRequest(
                    session_id=holder.session_id, lease_id=holder.lease_id or "", epoch=holder.epoch or 0
                )
                t0 = time.monotonic()
                await crash(a)
                # A Renew sent while no replica leads is not lost: it reaches the new leader.
                stub = client.stub()
                in_flight = asyncio.create_task(stub.Renew(renew, metadata=client.metadata, timeout=5))
                await holder.wait_until(lambda s: s.reattaches >= 1 and s.phase is Phase.HOLDING, 15)
                took = time.monotonic() - t0
                print(f"\nin-process failover: re-attached on the new leader {took:.3f} s after the crash")
                while rb.last_takeover is None:  # set once the take-over's Resumed is journaled
                    await asyncio.sleep(0.02)
                assert rb.last_takeover.hot, rb.last_takeover
                assert rb.snapshot_loads == 2  # nothing loaded, nothing replayed at take-over
                assert rb.last_takeover.entries <= 2, rb.last_takeover  # the tail only, if anything
                assert (holder.lease_id, holder.epoch) == before
                assert client.leader == b.target
                assert (await in_flight).state == common_pb2.LEASE_STATE_ACTIVE
                # Renewals go to the new leader (the holder's own task, and one of ours).
                got = await client.stub().Renew(renew, metadata=client.metadata, timeout=5)
                assert got.state == common_pb2.LEASE_STATE_ACTIVE
                await sessions[4].release()
                new = client.session("after", QoS.BURSTABLE)
                await new.wait_granted(5)
                await new.release()
                assert not holder.lost_lease.is_set() and (holder.lease_id, holder.epoch) == before

    asyncio.run(body())


def test_a_standby_without_a_state_snapshot_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A fresh store holds no state snapshot yet: the standby says it follows the journal from
    its start (it logged "loaded the snapshot at ;", naming an empty position)."""
    caplog.set_level(logging.INFO, logger="slotsched.state")

    async def body() -> None:
        async with replicas() as (_, (_, b)):
            assert replica_of(b).snapshot_loads == 1

    asyncio.run(body())
    said = [m for m in (r.getMessage() for r in caplog.records) if m.startswith("standby:")]
    assert "standby: no state snapshot covers the journal; following it from its start" in said, said
    assert not any(" at ;" in m for m in said), said


def test_a_leader_whose_renewals_stall_stops_serving_cannot_write_and_steps_down() -> None:
    async def body() -> None:
        async with replicas() as (_r, (a, b)):
            ra, rb = replica_of(a), replica_of(b)
            release = asyncio.Event()
            real_extend = ra.store.extend_lead

            async def stalled(ttl_s: float, now: float) -> bool:
                await release.wait()  # a paused process: the renewal never reaches Redis
                return bool(await real_extend(ttl_s, now))

            ra.store.extend_lead = stalled
            old_token = ra.store.token
            # Past its local deadline the leader refuses calls, still believing it leads...
            while ra.leading():
                await asyncio.sleep(0.02)
            assert ra.serving
            # ... and no earlier than that can the standby win (the lease lapses in Redis).
            while rb.last_takeover is None:  # set once it serves
                await asyncio.sleep(0.02)
            assert rb.last_takeover.hot
            # The ex-leader's writes are fenced off.
            with pytest.raises(StaleTerm):
                await ra.store.append([b"late"], old_token)
            release.set()  # the renewal goes through now, finds the lease gone: step down
            while ra.serving:
                await asyncio.sleep(0.02)
            assert not ra.leading() and rb.leading()
            # Stepped down, it follows the new leader again (a full reload: its core is stale).
            while ra._pos is None or ra.leader_address != b.target:
                await asyncio.sleep(0.02)
            assert ra.snapshot_loads == 2

    asyncio.run(body())


def test_a_sigkilled_leader_is_followed_by_the_sdk_to_the_hot_standby() -> None:
    with tempfile.TemporaryDirectory(prefix="slotsched-hot-") as d:
        r = RedisProc(d).start()
        policy = write_policy(d, policy_yaml(workers=1, slots_per_worker=1, floor=0, lease_ttl_s=3))
        a = Sched(policy, r.url, "a", ttl=1.0)
        started = [a]
        try:
            a.wait_health(SERVING)
            b = Sched(policy, r.url, "b", ttl=1.0)
            started.append(b)
            b.wait_health(NOT_SERVING)

            async def body() -> None:
                async with AsyncClient(f"{a.target},{b.target}", token=ACME, reattach_timeout_s=20) as client:
                    holder = client.session("holder", QoS.BURSTABLE)
                    await holder.wait_granted(5)
                    w1, w2 = client.session("w1", QoS.BURSTABLE), client.session("w2", QoS.BURSTABLE)
                    for w in (w1, w2):
                        w.start()
                        await w.wait_until(lambda s: s.queue is not None, 5)
                    before = (holder.lease_id, holder.epoch)
                    t0 = time.monotonic()
                    a.kill(signal.SIGKILL)
                    await holder.wait_until(lambda s: s.reattaches >= 1 and s.phase is Phase.HOLDING, 15)
                    took = time.monotonic() - t0
                    assert client.leader == b.target
                    assert await queue_order(b.target) == ["w1", "w2"]  # no waiter lost or reordered
                    await asyncio.sleep(3.5)  # past the lease TTL: renewed by the new leader
                    assert (holder.lease_id, holder.epoch) == before and not holder.lost_lease.is_set()
                    await holder.release()
                    assert (await w1.wait_granted(10)).session_id == "w1"
                    print(f"\nSIGKILL failover: the holder re-attached {took:.3f} s after the kill")
                    await w1.release()
                    await w2.release()

            asyncio.run(body())
            assert "hot standby" in b.output(), b.output()
        finally:
            for s in started:
                s.kill()
            r.kill()
            for s in started:
                with contextlib.suppress(OSError):
                    os.unlink(s.log.name)


@pytest.mark.parametrize(
    ("target", "want"),
    [
        ("a:1", ["a:1"]),
        ("a:1,b:2", ["a:1", "b:2"]),
        (" a:1 , b:2 ,", ["a:1", "b:2"]),
        (["a:1", "b:2"], ["a:1", "b:2"]),
        ("ipv4:127.0.0.1:1,127.0.0.1:2", ["ipv4:127.0.0.1:1,127.0.0.1:2"]),  # one gRPC URI
        ("dns:///sched:50051", ["dns:///sched:50051"]),
    ],
)
def test_targets(target: Any, want: list[str]) -> None:
    assert parse_targets(target) == want


def test_no_target_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no scheduler address"):
        parse_targets(" , ")


class _Err(grpc.aio.AioRpcError):
    def __init__(
        self, details: str, leader: str | None = None, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    ) -> None:
        md = grpc.aio.Metadata() if leader is None else grpc.aio.Metadata((LEADER_KEY, leader))
        super().__init__(code, grpc.aio.Metadata(), md, details)


@pytest.mark.parametrize(
    ("steps", "want"),
    [
        # (address that failed, its error) ... -> where the next call goes, and whether it waits
        ([("a", _Err("not the leader", "c"))], ("c", 0.0)),  # named: go there at once
        ([("a", _Err("not the leader"))], ("b", "pause")),  # no leader known: next target
        ([("a", _Err("connection refused"))], ("b", "pause")),
        # grpc's core reports a connection that died under a stream's write as INTERNAL
        ([("a", _Err("Internal error from Core", code=grpc.StatusCode.INTERNAL))], ("b", "pause")),
        ([("a", _Err("a server bug", code=grpc.StatusCode.INTERNAL))], ("a", None)),
        ([("a", _Err("stale", code=grpc.StatusCode.FAILED_PRECONDITION))], ("a", None)),
        # the named leader just failed us (dead, its lease not lapsed): ask the others instead
        ([("c", _Err("refused")), ("b", _Err("not the leader", "c"))], ("a", "pause")),
    ],
)
def test_where_the_follower_goes(steps: list[tuple[str, _Err]], want: tuple[str, Any]) -> None:
    f = Follower(["a", "b"], [], None)
    wait: float | None = None
    for address, err in steps:
        f.current = address
        wait = f.failed(address, err)
    assert f.current == want[0]
    if want[1] is None:
        assert wait is None  # not a lost connection: the caller's error
    else:
        assert (wait == 0.0) if want[1] == 0.0 else (wait is not None and wait > 0)


def test_one_target_that_is_down_is_left_to_the_callers_backoff() -> None:
    f = Follower("a:1", [], None)
    assert f.failed("a:1", _Err("connection refused")) is None and f.current == "a:1"
    assert f.failed("a:1", _Err("not the leader")) is not None  # a standby: a take-over is under way


def test_the_default_advertised_address() -> None:
    assert default_advertise("10.0.0.7", 50051) == "10.0.0.7:50051"
    assert default_advertise("0.0.0.0", 50051, {"POD_IP": "10.1.2.3"}) == "10.1.2.3:50051"
    assert default_advertise("::", 1, {"POD_IP": "fd00::1"}) == "[fd00::1]:1"


def test_the_blocking_client_follows_the_leader_too() -> None:
    from scheduler.client.sync import Client

    def use(targets: list[str]) -> tuple[str, str]:
        with Client(targets, token=ACME) as client, client.session("sync", QoS.BURSTABLE) as s:
            return s.lease_id or "", client.aio.leader

    async def body() -> None:
        async with replicas() as (_r, (a, b)):
            lease_id, leader = await asyncio.to_thread(use, [b.target, a.target])  # the standby first
            assert lease_id and leader == a.target

    asyncio.run(body())


def test_a_take_over_that_fails_before_serving_reloads_and_campaigns_again() -> None:
    async def body() -> None:
        async with replicas() as (_r, (a, b)):
            rb = replica_of(b)
            real_publish = rb.store.publish_address
            failures: list[str] = []

            async def lose_once(address: str, token: str) -> bool:
                if not failures:
                    failures.append(token)
                    return False  # as if the lease were lost between winning and serving
                return bool(await real_publish(address, token))

            rb.store.publish_address = lose_once
            await crash(a)
            while rb.last_takeover is None:
                await asyncio.sleep(0.02)
            # The failed try reloaded the state (its core may have been half caught up) and
            # followed again; the next try led.
            assert failures and rb.serving and rb.snapshot_loads == 2
            assert rb.store.token != failures[0]

    asyncio.run(body())


def test_the_worker_agent_follows_the_leader(tmp_path: Any) -> None:
    from slots.worker.main import start_worker
    from tests.grpc_fixtures import WORKER_TOKEN

    async def body() -> None:
        async with replicas(heartbeat_interval_s=0.2) as (_r, (a, b)):
            worker = await start_worker(
                f"{b.target},{a.target}",  # the standby first
                "w1",
                1,
                snapshots=str(tmp_path),
                token=WORKER_TOKEN,
                verify_leases=False,
            )
            try:
                await asyncio.wait_for(worker.agent.registered.wait(), 10)
                assert "w1" in a.registry.workers
                await crash(a)
                rb = replica_of(b)
                while rb.last_takeover is None:
                    await asyncio.sleep(0.02)
                beats = worker.agent.heartbeats
                while worker.agent.heartbeats < beats + 2:  # answered by the new leader
                    await asyncio.sleep(0.05)
                entry = b.registry.workers["w1"]
                assert entry.last_heartbeat is not None and entry.last_heartbeat >= b.loop.now() - 5
            finally:
                await worker.kill()

    asyncio.run(body())
