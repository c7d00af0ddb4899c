"""A replica that rejoins (thawed, or back after a cut) moves only the pools placement gives it,
in one version of the owners table: the table, as `pool_owners.assign` computes it, and as the
replicas write it to a real Redis when one of them read the membership just before the rejoin
(the flap: it wrote the rejoined replica out again, and the rejoiner took pools back)."""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.state.ownership import Ownership, _split
from scheduler.state.pool_owners import assign
from scheduler.state.redis_members import RedisMembers
from tests.test_state_ownership import pytestmark as needs_redis  # noqa: F401 (a marker below)
from tests.test_state_ownership import redis_url  # noqa: F401 (the module's redis-server)

POOLS = [f"p{i}" for i in range(6)]
R = ["r1", "r2", "r3"]


def test_a_rejoin_moves_only_the_rejoiners_share_once() -> None:
    table = dict(assign(POOLS, R, {}).owners)
    left = assign(POOLS, ["r1", "r3"], table)  # r2 frozen past its membership
    assert set(left.moved) == {p for p, r in table.items() if r == "r2"}
    back = assign(POOLS, R, left.owners)
    assert len(back.moved) == 2 and {back.owners[p] for p in back.moved} == {"r2"}
    assert assign(POOLS, R, back.owners).moved == ()  # a fixpoint: nothing more moves


@settings(max_examples=200, deadline=None)
@given(
    pools=st.lists(st.text("abcdefgh", min_size=1, max_size=4), min_size=1, max_size=20, unique=True),
    n=st.integers(2, 5),
    who=st.integers(0, 4),
)
def test_a_rejoin_moves_pools_only_to_the_rejoiner(pools: list[str], n: int, who: int) -> None:
    replicas = [f"r{i}" for i in range(n)]
    gone = replicas[who % n]
    table = dict(assign(pools, replicas, {}).owners)
    left = assign(pools, [r for r in replicas if r != gone], table)
    back = assign(pools, replicas, left.owners)
    assert all(back.owners[p] == gone for p in back.moved)
    assert len(back.moved) == len(back.pools_of(gone)) <= -(-len(pools) // n)
    assert assign(pools, replicas, back.owners).moved == ()


class _Paused(RedisMembers):
    """RedisMembers whose next `owners()` waits for `gate`: a replica that read the membership
    and is about to read the table when another replica rejoins."""

    gate: asyncio.Event | None = None
    beaten: asyncio.Event | None = None

    async def beat(self, replica_id: str, address: str, ttl_s: float) -> list:  # type: ignore[type-arg]
        live = await super().beat(replica_id, address, ttl_s)
        if self.beaten is not None:
            self.beaten.set()
        return live

    async def owners(self) -> tuple[int, dict[str, str]]:
        gate, self.gate = self.gate, None
        if gate is not None:
            await gate.wait()
        return await super().owners()


@needs_redis
def test_a_stale_membership_read_does_not_write_the_rejoiner_out(redis_url: str) -> None:  # noqa: F811
    async def go() -> None:
        prefix = f"rj{uuid.uuid4().hex[:8]}"
        group = {
            n: Ownership(_Paused(redis_url, prefix), n, f"{n}:1", lambda: POOLS, member_ttl_s=30) for n in R
        }
        try:
            for _ in range(2):
                for o in group.values():
                    await o.step()
            first = dict(group["r1"].table)
            await group["r2"].leave()
            await group["r1"].step()
            await group["r3"].step()
            v_left, left = await group["r1"].members.owners()
            left = _split(left)[0]  # the owners (the table holds the successors beside them)
            assert "r2" not in left.values()
            # r1 reads the membership (r2 out), then r2 rejoins and writes, then r1 reads the table.
            m1 = group["r1"].members
            assert isinstance(m1, _Paused)
            gate = m1.gate = asyncio.Event()
            m1.beaten = asyncio.Event()
            stepping = asyncio.create_task(group["r1"].step())
            await asyncio.wait_for(m1.beaten.wait(), 10)
            await group["r2"].step()
            gate.set()
            await asyncio.wait_for(stepping, 10)
            for _ in range(2):
                for o in group.values():
                    await o.step()
            v_end, end = await group["r1"].members.owners()
            end = _split(end)[0]
            assert v_end == v_left + 1  # the rejoin is one version
            moved = [p for p in POOLS if end[p] != left[p]]
            assert len(moved) == 2 and {end[p] for p in moved} == {"r2"}
            assert {group[n].version for n in R} == {v_end}
            assert sorted(first) == sorted(end)
        finally:
            for o in group.values():
                await o.members.close()

    asyncio.run(go())
