"""Pools spread over replicas through the owners table (scheduler/state/ownership.py) on a real
Redis: three replicas split 30 pools 10/10/10, a fourth takes about 30/4 and nothing else moves,
a replica that stops beating loses its pools to the rest within the membership TTL, one that
cannot reach Redis claims nothing, and replicas stepping together write one table."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from scheduler.state.ownership import Ownership
from scheduler.state.redis_members import RedisMembers
from scheduler.state.store import StoreUnavailable
from tests.test_state_redis import RedisProc, free_port
from tests.test_state_redis import pytestmark as needs_redis

pytestmark = needs_redis

POOLS = [f"pool-{i:02d}" for i in range(30)]


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="slotsched-owners-") as d:
        r = RedisProc(d).start()
        try:
            yield r.url
        finally:
            r.kill()


def replicas(url: str, names: list[str], prefix: str, ttl_s: float = 1.0) -> dict[str, Ownership]:
    return {
        n: Ownership(RedisMembers(url, prefix), n, f"{n}.svc:50051", lambda: POOLS, member_ttl_s=ttl_s)
        for n in names
    }


async def settle(group: dict[str, Ownership], rounds: int = 3) -> None:
    for _ in range(rounds):
        for o in group.values():
            await o.step()


def led(group: dict[str, Ownership]) -> dict[str, tuple[str, ...]]:
    return {n: o.mine() for n, o in group.items()}


async def close(group: dict[str, Ownership]) -> None:
    for o in group.values():
        await o.members.close()


def test_pools_spread_evenly_and_a_joiner_takes_its_share_only(redis_url: str) -> None:
    async def go() -> None:
        prefix = f"o{uuid.uuid4().hex[:8]}"
        group = replicas(redis_url, ["r1", "r2", "r3"], prefix)
        try:
            await settle(group)
            before = led(group)
            assert sorted(len(v) for v in before.values()) == [10, 10, 10]
            assert sorted(p for v in before.values() for p in v) == POOLS  # each pool once
            assert sum(o.writes for o in group.values()) <= 3  # not a write per step
            # Every replica sees the same table, and where each pool's owner serves.
            tables = {tuple(sorted(o.table.items())) for o in group.values()}
            assert len(tables) == 1
            owner = group["r1"].table["pool-00"]
            assert group["r2"].address_of("pool-00") == f"{owner}.svc:50051"
            group |= replicas(redis_url, ["r4"], prefix)
            await settle(group)
            after = led(group)
            assert sorted(len(v) for v in after.values()) == [7, 7, 8, 8]
            moved = [p for p in POOLS if group["r1"].table[p] != _owner(before, p)]
            assert len(moved) in (7, 8) and all(group["r1"].table[p] == "r4" for p in moved)
        finally:
            await close(group)

    asyncio.run(go())


def _owner(led: dict[str, tuple[str, ...]], pool: str) -> str:
    return next(n for n, pools in led.items() if pool in pools)


def test_a_replica_that_stops_beating_loses_only_its_pools(redis_url: str) -> None:
    async def go() -> None:
        prefix = f"o{uuid.uuid4().hex[:8]}"
        group = replicas(redis_url, ["r1", "r2", "r3"], prefix, ttl_s=0.4)
        try:
            await settle(group)
            before = led(group)
            dead = group.pop("r2")  # frozen: it beats no more, the others go on beating
            for _ in range(8):
                await settle(group, rounds=1)
                await asyncio.sleep(0.1)
            after = led(group)
            assert sorted(len(v) for v in after.values()) == [15, 15]
            for n in ("r1", "r3"):
                assert set(before[n]) <= set(after[n])  # the survivors keep what they had
            # Thawed past its membership, it claims nothing of its old table; its beat rejoins it.
            assert dead.table and dead.mine() == () and not dead.should_lead(before["r2"][0])
            await dead.step()
            group["r2"] = dead
            await settle(group)
            assert sorted(len(v) for v in led(group).values()) == [10, 10, 10]
        finally:
            await close(group | {"r2": dead})

    asyncio.run(go())


def test_a_graceful_leave_hands_its_pools_on_at_once(redis_url: str) -> None:
    async def go() -> None:
        prefix = f"o{uuid.uuid4().hex[:8]}"
        group = replicas(redis_url, ["r1", "r2"], prefix, ttl_s=30)
        try:
            await settle(group)
            await group["r2"].leave()
            assert group["r2"].mine() == ()
            await group["r1"].step()
            assert len(group["r1"].mine()) == 30  # no TTL to wait out
        finally:
            await close(group)

    asyncio.run(go())


def test_one_failed_beat_keeps_the_pools_until_the_membership_could_lapse(redis_url: str) -> None:
    """A slow or failed beat must not hand every pool over (the others still see the replica
    live): it keeps claiming until TTL - 10 % after its last good beat was sent, then nothing."""

    async def go() -> None:
        prefix = f"o{uuid.uuid4().hex[:8]}"
        group = replicas(redis_url, ["r1", "r2"], prefix, ttl_s=1.0)
        try:
            await settle(group)
            r2 = group["r2"]
            mine = r2.mine()
            assert mine

            async def fail(*_: object) -> list[object]:
                raise StoreUnavailable("a beat lost")

            r2.members.beat = fail  # type: ignore[method-assign]
            await r2.step()
            assert not r2.reachable and r2.mine() == mine and r2.should_lead(mine[0])
            await asyncio.sleep(1.0)
            assert r2.mine() == () and not r2.should_lead(mine[0])
        finally:
            await close(group)

    asyncio.run(go())


def test_a_replica_cut_from_redis_claims_no_pool(redis_url: str) -> None:
    async def go() -> None:
        cut = Ownership(
            RedisMembers(f"redis://127.0.0.1:{free_port()}/0", "x", 0.2), "r9", "a", lambda: POOLS
        )
        try:
            await cut.step()
            assert not cut.reachable and cut.mine() == () and not cut.should_lead("pool-00")
        finally:
            await cut.members.close()

    asyncio.run(go())


def test_replicas_stepping_together_write_one_table(redis_url: str) -> None:
    async def go() -> None:
        prefix = f"o{uuid.uuid4().hex[:8]}"
        group = replicas(redis_url, ["a", "b", "c"], prefix)
        try:
            for o in group.values():  # all live first, so each computes the same table
                await o.members.beat(o.replica_id, o.address, 5.0)
            await asyncio.gather(*(o.step() for o in group.values()))
            assert sum(o.writes for o in group.values()) == 1  # the compare-and-set let one in
            assert len({tuple(sorted(o.table.items())) for o in group.values()}) == 1
            owners = Counter(group["a"].table.values())
            assert sorted(owners.values()) == [10, 10, 10]
        finally:
            await close(group)

    asyncio.run(go())


# ------------------------------------------------------------------ a pool's lease follows the table


def test_a_leader_hands_its_pool_to_the_new_owner_with_every_lease(redis_url: str) -> None:
    """Two replicas of one pool over real Redis: the owner leads; when the table gives the pool
    to the other, the leader makes its state durable, resigns, and the other (a hot standby)
    takes over at its next campaign with every lease; the old one campaigns no more."""
    from prometheus_client import CollectorRegistry

    from scheduler.core.types import Acquire, Granted, QoS, SessionId, TenantName, WorkerId
    from scheduler.policy.model import Policy, PoolSpec, TenantSpec
    from scheduler.server.loop import SchedulerLoop
    from scheduler.server.registry import WorkerRegistry
    from scheduler.state.metrics import StateMetrics
    from scheduler.state.redis_store import RedisStore
    from scheduler.state.replica import Replica
    from scheduler.state.roles import Role

    policy = Policy(
        pool=PoolSpec(slots_per_worker=4, workers=0, floor=0),
        tenants=(TenantSpec("a", burstable_nominal=4, burstable_limit=4),),
    )
    owner = {"pool": "a"}

    async def go() -> None:
        prefix = f"h{uuid.uuid4().hex[:8]}"
        replicas: dict[str, Replica] = {}
        loops: dict[str, SchedulerLoop] = {}
        registries: dict[str, WorkerRegistry] = {}

        async def nothing(*_: object) -> None:
            return None

        for name in ("a", "b"):
            loop = SchedulerLoop(policy)
            registry = WorkerRegistry(loop, 30.0)
            r = Replica(
                RedisStore(redis_url, prefix, name),
                loop,
                registry,
                policy,
                StateMetrics(CollectorRegistry()),
                on_lead=nothing,
                on_step_down=nothing,
                leader_ttl_s=1.0,
                campaign_interval_s=0.05,
                may_lead=lambda n=name: owner["pool"] == n,
            )
            loop.journal = r
            replicas[name], loops[name], registries[name] = r, loop, registry
        try:
            await replicas["a"].start()
            await replicas["b"].start()
            a, b = replicas["a"], replicas["b"]
            assert a.role is Role.LEADER and b.role is Role.STANDBY  # b may not lead: it never tried
            registries["a"].register(WorkerId("w1"), "h1:1", 4, {})
            got = loops["a"].submit(Acquire(SessionId("s1"), TenantName("a"), QoS.BURSTABLE))
            grants = [d.lease for d in got if isinstance(d, Granted)]
            assert grants, got
            lease = grants[0]
            await loops["a"].durable()
            owner["pool"] = "b"  # the table moved the pool
            for _ in range(100):
                # Both: the role moves to LEADER before the take-over's record is written.
                if b.role is Role.LEADER and b.last_takeover is not None:
                    break
                await asyncio.sleep(0.05)
            assert b.role is Role.LEADER and a.role is Role.STANDBY
            assert b.last_takeover is not None and b.last_takeover.hot  # a hot standby: no reload
            held = {held_lease.lease_id: held_lease.session for held_lease, _ in loops["b"].core.leases()}
            assert held == {lease.lease_id: SessionId("s1")}  # the lease came along
            await asyncio.sleep(0.3)
            assert a.role is Role.STANDBY  # it does not campaign back
        finally:
            for r in replicas.values():
                await r.stop()

    asyncio.run(go())


def test_a_replica_neither_owner_nor_successor_holds_and_asks_nothing_of_a_pool(redis_url: str) -> None:
    """Three replicas of one pool over real Redis: a owns it, b is its successor, c neither. c
    loads nothing, follows nothing and never asks the store about the lease (no campaign), and
    b neither while a is live; made
    the successor it loads the pool hot; no longer the successor it drops it (an empty core).
    When a stops, b (the successor, hot) takes over; c still never campaigns."""
    from prometheus_client import CollectorRegistry

    from scheduler.core.types import Acquire, QoS, SessionId, TenantName, WorkerId
    from scheduler.policy.model import Policy, PoolSpec, TenantSpec
    from scheduler.server.loop import SchedulerLoop
    from scheduler.server.registry import WorkerRegistry
    from scheduler.state.metrics import StateMetrics
    from scheduler.state.redis_store import RedisStore
    from scheduler.state.replica import Replica
    from scheduler.state.roles import Role

    policy = Policy(
        pool=PoolSpec(slots_per_worker=4, workers=0, floor=0),
        tenants=(TenantSpec("a", burstable_nominal=4, burstable_limit=4),),
    )
    table = {"owner": "a", "next": "b", "live": {"a", "b", "c"}}

    def may_lead(name: str) -> bool:  # Ownership.should_lead's rule, over this test's table
        return table["owner"] == name or (table["next"] == name and table["owner"] not in table["live"])

    def may_follow(name: str) -> bool:
        return name in (table["owner"], table["next"])

    class Counting(RedisStore):
        asked = 0

        async def try_lead(self, ttl_s: float) -> bool:
            self.asked += 1
            return await super().try_lead(ttl_s)

        async def leader_address(self) -> str | None:
            self.asked += 1
            return await super().leader_address()

    async def go() -> None:
        prefix = f"s{uuid.uuid4().hex[:8]}"
        replicas: dict[str, Replica] = {}
        loops: dict[str, SchedulerLoop] = {}
        stores: dict[str, Counting] = {}

        async def nothing(*_: object) -> None:
            return None

        for name in ("a", "b", "c"):
            loop = SchedulerLoop(policy)
            registry = WorkerRegistry(loop, 30.0)
            stores[name] = Counting(redis_url, prefix, name)
            r = Replica(
                stores[name], loop, registry, policy, StateMetrics(CollectorRegistry()),
                on_lead=nothing, on_step_down=nothing, leader_ttl_s=1.0, campaign_interval_s=0.05,
                may_lead=lambda n=name: may_lead(n), may_follow=lambda n=name: may_follow(n),
            )  # fmt: skip
            loop.journal = r
            replicas[name], loops[name] = r, loop
            if name == "a":
                registry.register(WorkerId("w1"), "h1:1", 4, {})
        a, b, c = replicas["a"], replicas["b"], replicas["c"]
        try:
            for r in replicas.values():
                await r.start()
            assert a.role is Role.LEADER
            loops["a"].submit(Acquire(SessionId("s1"), TenantName("a"), QoS.BURSTABLE))
            await loops["a"].durable()
            for _ in range(100):
                if loops["b"].core.session(SessionId("s1")) is not None:
                    break
                await asyncio.sleep(0.05)
            assert loops["b"].core.session(SessionId("s1")) is not None  # b follows hot
            await asyncio.sleep(0.5)  # ten campaign intervals
            assert c.snapshot_loads == 0 and loops["c"].core.session(SessionId("s1")) is None
            assert stores["c"].asked == 0  # no campaign, no look at the lease
            assert stores["b"].asked == 0  # the successor neither, while its owner is live
            table["next"] = "c"  # c is the successor now: it loads; b drops the pool
            for _ in range(100):
                if (
                    loops["c"].core.session(SessionId("s1")) is not None
                    and b.snapshot_loads
                    and b._pos is None
                ):
                    break
                await asyncio.sleep(0.05)
            assert loops["c"].core.session(SessionId("s1")) is not None
            assert b._follow_task is None and loops["b"].core.session(SessionId("s1")) is None
            asked_b = stores["b"].asked
            table["live"] = {"b", "c"}
            await a.stop()  # resigns: c, the successor, takes over hot; b never asks
            for _ in range(100):
                if c.role is Role.LEADER and c.last_takeover is not None:
                    break
                await asyncio.sleep(0.05)
            assert c.role is Role.LEADER and c.last_takeover is not None and c.last_takeover.hot
            assert loops["c"].core.session(SessionId("s1")) is not None
            assert b.role is Role.STANDBY and stores["b"].asked == asked_b
        finally:
            for r in replicas.values():
                await r.stop()

    asyncio.run(go())
