"""Per-pool leadership (issue 25, `serve --leadership pool`) over a real redis-server and real
gRPC: two in-process replicas of a three-pool policy.

* the pools spread over the replicas, each led by exactly one; health says who leads which;
* a call for a pool led elsewhere is UNAVAILABLE NOT_LEADER naming the pool and its leader
  (Acquire, Channel, a worker's Register); the leader grants it in that pool;
* every replica follows every pool: Admin reads any pool from any replica;
* a replica that stops hands its pools to the other, whose hot standby of each keeps the
  leases (same lease id, same epoch); a replica joining takes its share back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    workers_pb2,
    workers_pb2_grpc,
)
from scheduler.client.follow import LEADER_KEY
from scheduler.grants import GrantKeyring
from scheduler.serve import RunningServer, StateOptions, start_server
from scheduler.server.keda_service import METRIC_NAME
from tests.grpc_fixtures import ADMIN_TOKEN, TOKENS, WORKER_TOKEN, B, pools_policy_yaml, write_policy
from tests.test_state_redis import REDIS_BIN, RedisProc

pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_BIN) and not os.environ.get("CI"), reason="redis-server not installed"
)

POOLS = ("cpu-a", "cpu-b", "gpu")
ACME = (("authorization", f"Bearer {TOKENS['acme']}"),)
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
WORKER = (("authorization", f"Bearer {WORKER_TOKEN}"),)


@contextlib.asynccontextmanager
async def cluster(
    n: int = 2, lease_ttl_s: float = 30
) -> AsyncIterator[tuple[str, str, list[RunningServer], GrantKeyring]]:
    """`n` replicas of the three-pool policy over one redis-server; `lease_ttl_s` is the
    sessions' lease TTL (a test waiting for a renewal to move an expiry waits half of it)."""
    with tempfile.TemporaryDirectory(prefix="slotsched-pools-") as d:
        r = RedisProc(d).start()
        policy = write_policy(d, pools_policy_yaml(workers_per_pool=1, lease_ttl_s=lease_ttl_s))
        keys = GrantKeyring.generate()
        servers: list[RunningServer] = []
        try:
            for i in range(n):
                servers.append(await start(policy, r.url, f"r{i}", keys))
            yield policy, r.url, servers, keys
        finally:
            for s in servers:
                await s.stop(0)
            r.kill()


#: No test here waits for a lease or a membership to lapse (a replica that stops leaves the
#: membership and resigns its pools' leases), so the TTL is one a busy machine keeps: at 1 s (a
#: Redis call bounded by a third of it) a loop stalled for a second on a loaded test machine drops
#: out, and its pools move under the test.
LEADER_TTL_S = 5.0


async def start(policy: str | None, url: str, rid: str, keys: GrantKeyring, **kw: Any) -> RunningServer:
    state = StateOptions(state=url, replica_id=rid, leadership="pool", leader_ttl_s=LEADER_TTL_S)
    return await start_server(policy, "127.0.0.1:0", None, state=state, grant_keys=keys, **kw)


def leaders(servers: list[RunningServer]) -> dict[str, list[str]]:
    """pool -> the replicas leading it now (by target)."""
    out: dict[str, list[str]] = {p: [] for p in POOLS}
    for s in servers:
        assert s.pools is not None
        for p in s.pools.led_here():
            out[p].append(s.target)
    return out


async def until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """`check()` once it is true; the bound only stops a hang (it is no performance claim)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def spread(servers: list[RunningServer]) -> Callable[[], dict[str, str] | None]:
    """Every pool led by exactly one replica, and every replica leading at least one."""

    def check() -> dict[str, str] | None:
        now = leaders(servers)
        if any(len(v) != 1 for v in now.values()):
            return None
        if {v[0] for v in now.values()} != {s.target for s in servers}:
            return None
        return {p: v[0] for p, v in now.items()}

    return check


def trailers(err: grpc.aio.AioRpcError) -> dict[str, str]:
    return {k: v for k, v in (err.trailing_metadata() or ()) if isinstance(v, str)}


async def health(target: str, service: str) -> int:
    async with grpc.aio.insecure_channel(target) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service))
        return int(resp.status)


async def granted(target: str, sid: str, pool: str) -> scheduler_pb2.LeaseEvent:
    async with grpc.aio.insecure_channel(target) as ch:
        call = scheduler_pb2_grpc.SchedulerStub(ch).Acquire(
            scheduler_pb2.AcquireRequest(session_id=sid, qos=B, pool=pool), metadata=ACME
        )
        async for ev in call:
            if ev.WhichOneof("event") == "granted":
                call.cancel()
                return ev
    raise AssertionError("no grant")


def test_pools_spread_route_follow_and_move() -> None:
    asyncio.run(_spread_route_follow_and_move())


async def _spread_route_follow_and_move() -> None:
    async with cluster(2) as (policy, url, servers, keys):
        owner = await until("the pools to spread over both replicas", spread(servers))
        by_target = {s.target: s for s in servers}
        pool = "gpu"
        lead = owner[pool]
        other = next(t for t in by_target if t != lead)
        serving = health_pb2.HealthCheckResponse.SERVING
        # Health: both replicas serve; the pool's entry only where it is led.
        assert await health(lead, "") == serving and await health(other, "") == serving
        assert await health(lead, f"slotsched.pool/{pool}") == serving
        assert await health(other, f"slotsched.pool/{pool}") != serving

        # A replica that does not lead the pool sends the caller to the one that does (until it
        # has seen the leader's address it names none, with retry-after 200 ms: a client retries).
        for _ in range(50):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await granted(other, "s1", pool)
            assert e.value.code() is grpc.StatusCode.UNAVAILABLE
            md = trailers(e.value)
            if LEADER_KEY in md:
                break
            await asyncio.sleep(int(md.get(wire.RETRY_AFTER_MS, "200")) / 1000)
        assert md.get(wire.POOL) == pool and md.get(LEADER_KEY) == lead, md
        ev = await granted(lead, "s1", pool)
        assert ev.granted.lease.pool == pool
        lease_id, epoch = ev.granted.lease.lease_id, ev.granted.lease.epoch

        # A Channel binds to its first command's pool: elsewhere it ends NOT_LEADER for it.
        async with grpc.aio.insecure_channel(other) as ch:
            call = scheduler_pb2_grpc.SchedulerStub(ch).Channel(metadata=ACME)
            acq = scheduler_pb2.AcquireRequest(session_id="c1", qos=B, pool=pool)
            command = scheduler_pb2.ChannelCommand(acquire=acq)
            await call.write(scheduler_pb2.ChannelRequest(commands=[command]))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                async for _ in call:
                    pass
            assert e.value.code() is grpc.StatusCode.UNAVAILABLE
            assert trailers(e.value).get(wire.POOL) == pool

        # A worker joining the pool is sent to its leader too.
        async with grpc.aio.insecure_channel(other) as ch:
            reg = workers_pb2.RegisterRequest(worker_id="w-9", address="127.0.0.1:1", slots=1, pool=pool)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await workers_pb2_grpc.WorkersStub(ch).Register(reg, metadata=WORKER)
            assert trailers(e.value).get(wire.POOL) == pool

        # Every replica follows every pool: the lease is listed from the other replica.
        async def listed() -> list[str]:
            async with grpc.aio.insecure_channel(other) as ch:
                resp = await admin_pb2_grpc.AdminStub(ch).ListLeases(
                    admin_pb2.ListLeasesRequest(pool=pool), metadata=ADMIN
                )
                return [lease.session_id for lease in resp.leases]

        deadline = time.monotonic() + 60
        while "s1" not in await listed():
            assert time.monotonic() < deadline, "the other replica never listed the lease"
            await asyncio.sleep(0.05)
        async with grpc.aio.insecure_channel(other) as ch:
            admin = admin_pb2_grpc.AdminStub(ch)
            desc = await admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=ADMIN)
            assert set(desc.pools) == set(POOLS)

        # KEDA's metric of the pool from either replica (a ScaledObject reaches any through the
        # Service): the same demand, the held lease counted.
        from scheduler.api.gen.externalscaler import externalscaler_pb2, externalscaler_pb2_grpc

        async def demand(target: str) -> float:
            ref = externalscaler_pb2.ScaledObjectRef(
                name="workers", namespace="slots", scalerMetadata={"pool": pool, "token": ADMIN_TOKEN}
            )
            req = externalscaler_pb2.GetMetricsRequest(scaledObjectRef=ref, metricName=METRIC_NAME)
            async with grpc.aio.insecure_channel(target) as ch:
                got = await externalscaler_pb2_grpc.ExternalScalerStub(ch).GetMetrics(req, timeout=5)
            return float(got.metricValues[0].metricValueFloat)

        assert await demand(lead) >= 1.0 and await demand(other) == await demand(lead)

        # The pool's leader stops: the other replica leads every pool, the lease kept.
        leaving = by_target[lead]
        await leaving.stop(0)
        servers.remove(leaving)
        alone = [other]
        await until("the survivor to lead all", lambda: all(v == alone for v in leaders(servers).values()))
        async with grpc.aio.insecure_channel(other) as ch:
            view = await scheduler_pb2_grpc.SchedulerStub(ch).GetSession(
                scheduler_pb2.GetSessionRequest(session_id="s1"), metadata=ACME
            )
            assert view.lease.lease_id == lease_id and view.lease.epoch == epoch, view
            renewed = await scheduler_pb2_grpc.SchedulerStub(ch).Renew(
                scheduler_pb2.RenewRequest(session_id="s1", lease_id=lease_id, epoch=epoch), metadata=ACME
            )
            assert renewed.expires_at.seconds > 0  # renewed on the new leader

        # A replica joining takes its share, and the lease moves with its pool, kept.
        servers.append(await start(policy, url, "r9", keys))
        owner = await until("the pools to spread again", spread(servers))
        async with grpc.aio.insecure_channel(owner[pool]) as ch:
            view = await scheduler_pb2_grpc.SchedulerStub(ch).GetSession(
                scheduler_pb2.GetSessionRequest(session_id="s1"), metadata=ACME
            )
            assert view.lease.lease_id == lease_id, view


def test_each_pools_autoscaler_runs_on_its_leader_only() -> None:
    """The companion autoscaler (dry-run actuator) runs a pool's loop where the pool is led,
    and moves with the pool."""

    async def body() -> None:
        with tempfile.TemporaryDirectory(prefix="slotsched-pools-auto-") as d:
            r = RedisProc(d).start()
            policy = write_policy(d, pools_policy_yaml(workers_per_pool=1))
            keys = GrantKeyring.generate()
            env = {"SLOTSCHED_AUTOSCALER": "dry-run"}
            servers: list[RunningServer] = []
            try:
                for i in range(2):
                    servers.append(await start(policy, r.url, f"a{i}", keys, autoscaler_env=env))

                def running_where_led() -> bool:
                    for s in servers:
                        assert s.pools is not None and s.autoscalers is not None
                        if set(s.autoscalers._tasks) != set(s.pools.led_here()):
                            return False
                    return bool(spread(servers)())

                await until("each pool's loop on its leader", running_where_led)
                assert all(set(s.autoscalers._tasks) for s in servers)  # type: ignore[union-attr]
                await servers[0].stop(0)
                survivor = servers.pop(1)
                servers.clear()
                servers.append(survivor)
                await until(
                    "every loop on the survivor",
                    lambda: set(survivor.autoscalers._tasks) == set(POOLS),  # type: ignore[union-attr]
                )
            finally:
                for s in servers:
                    await s.stop(0)
                r.kill()

    asyncio.run(asyncio.wait_for(body(), 180))  # a hang fails here, with where it waited


def test_a_policy_version_is_applied_by_every_pools_leader() -> None:
    """`--policy-source` under per-pool leadership (PoolLeadership.bind_watcher): each replica
    applies a new version to the pools it leads, and a version adding a pool is refused
    (PoolsChanged), the policy in force unchanged. The watcher is a stand-in that hands each
    replica the version, as PolicyWatcher does (its watch of the object: tests/test_policy_watch.py)."""
    import copy

    import yaml

    from scheduler.policy.yaml_io import parse_policy
    from scheduler.server.policy_log import PolicyLog

    class Watcher:
        ref = "kubernetes://slotsched/cluster"

        def bind(self, apply: Any, reporting: Any) -> None:
            self.apply, self.reporting = apply, reporting

    doc = yaml.safe_load(pools_policy_yaml(workers_per_pool=1))

    def version(edit: Callable[[dict[str, Any]], None]) -> Any:
        new = copy.deepcopy(doc)
        edit(new["spec"])
        return parse_policy(yaml.safe_dump(new))[0]

    def acme_nominal(spec: dict[str, Any]) -> None:
        next(t for t in spec["tenants"] if t["name"] == "acme")["burstable"]["nominal"] = 2

    def another_pool(spec: dict[str, Any]) -> None:
        spec["pools"].append(dict(spec["pools"][0], name="cpu-c"))

    async def nominal(target: str, pool: str) -> int:
        async with grpc.aio.insecure_channel(target) as ch:
            desc = await admin_pb2_grpc.AdminStub(ch).DescribePool(
                admin_pb2.DescribePoolRequest(pool=pool), metadata=ADMIN, timeout=5
            )
        return next(t.burstable_nominal for t in desc.tenants if t.tenant == "acme")

    async def body() -> None:
        async with cluster(2) as (_, _, servers, _):
            owner = await until("the pools to spread", spread(servers))
            watchers = []
            for s in servers:
                assert s.pools is not None
                w = Watcher()
                s.pools.bind_watcher(w, True, PolicyLog(w.ref, durable=True))  # type: ignore[arg-type]
                watchers.append(w)
            assert {p: await nominal(t, p) for p, t in owner.items()} == dict.fromkeys(POOLS, 1)
            outcomes = [await w.apply(version(acme_nominal), []) for w in watchers]
            assert all(o.applied for o in outcomes), outcomes
            assert sum(1 for w in watchers if w.reporting()) == 1  # one replica writes the status
            assert {p: await nominal(t, p) for p, t in owner.items()} == dict.fromkeys(POOLS, 2)
            refused = [await w.apply(version(another_pool), []) for w in watchers]
            assert all(not o.applied and o.reason == "PoolsChanged" for o in refused), refused
            assert {p: await nominal(t, p) for p, t in owner.items()} == dict.fromkeys(POOLS, 2)

    asyncio.run(asyncio.wait_for(body(), 180))
