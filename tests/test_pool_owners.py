"""Which replica leads each pool (scheduler/state/pool_owners.py): balanced, sticky, spread by
rendezvous. Table cases for the moves a platform sees, properties for every input."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.state.pool_owners import assign, rank

POOLS = [f"pool-{i:02d}" for i in range(30)]


def loads(owners: dict[str, str] | object, replicas: list[str]) -> list[int]:
    count = Counter(owners.values())  # type: ignore[attr-defined]
    return sorted(count.get(r, 0) for r in replicas)


def settled(replicas: list[str]) -> dict[str, str | None]:
    """The leaders once `replicas` have taken every pool from a cold start."""
    return dict(assign(POOLS, replicas, {}).owners)


@pytest.mark.parametrize(
    ("case", "before", "after", "moved"),
    [
        # A cold start: every pool is placed, 10 each.
        ("cold start", [], ["a", "b", "c"], 30),
        # A fourth replica takes about 30/4 pools, from the others; nothing else moves.
        ("one joins", ["a", "b", "c"], ["a", "b", "c", "d"], 7),
        # A replica dies: only its own pools move, to the rest.
        ("one dies", ["a", "b", "c"], ["a", "b"], 10),
        ("one of four dies", ["a", "b", "c", "d"], ["a", "b", "d"], None),  # c's 7 or 8
        # The same replicas again: nothing moves.
        ("nothing changes", ["a", "b", "c"], ["a", "b", "c"], 0),
    ],
)
def test_moves_are_the_fewest_the_balance_needs(
    case: str, before: list[str], after: list[str], moved: int | None
) -> None:
    leaders = settled(before) if before else {}
    got = assign(POOLS, after, leaders)
    if moved is None:  # exactly the dead replica's own pools
        moved = sum(1 for r in leaders.values() if r not in after)
        assert moved in (7, 8)
    assert len(got.moved) == moved, case
    assert max(loads(got.owners, after)) - min(loads(got.owners, after)) <= 1, case
    gone = set(before) - set(after)
    for pool in got.moved:  # a pool moves only because its leader left or held too many
        old = leaders.get(pool)
        assert old is None or old in gone or Counter(leaders.values())[old] > len(POOLS) // len(after)


def test_thirty_pools_on_three_replicas_are_ten_each_and_four_are_eight_or_seven() -> None:
    three = assign(POOLS, ["r1", "r2", "r3"], {})
    assert loads(three.owners, ["r1", "r2", "r3"]) == [10, 10, 10]
    four = assign(POOLS, ["r1", "r2", "r3", "r4"], three.owners)
    assert loads(four.owners, ["r1", "r2", "r3", "r4"]) == [7, 7, 8, 8]
    assert {four.owners[p] for p in four.moved} == {"r4"}  # only the newcomer gains


def test_no_live_replica_leads_nothing_and_a_dead_leader_is_not_kept() -> None:
    assert assign(POOLS[:3], [], {"pool-00": "a"}).owners == {}
    got = assign(["p"], ["b"], {"p": "a"})
    assert got.owners == {"p": "b"} and got.moved == ("p",)


def test_where_a_pool_lands_does_not_depend_on_the_order_replicas_are_listed() -> None:
    a = assign(POOLS, ["x", "y", "z"], {})
    b = assign(reversed(POOLS), ["z", "x", "y"], {})
    assert a == b
    assert rank("p", ["x", "y", "z"]) == rank("p", ["z", "y", "x"])


names = st.lists(st.text("abcdefgh", min_size=1, max_size=3), unique=True)


@settings(max_examples=300, deadline=None)
@given(
    pools=names,
    live=names,
    leaders=st.dictionaries(st.text("abcdefgh", max_size=3), st.text("abcdefgh", max_size=3)),
)
def test_every_pool_has_a_live_owner_and_loads_are_within_one(
    pools: list[str], live: list[str], leaders: dict[str, str]
) -> None:
    got = assign(pools, live, leaders)
    if not live:
        assert got.owners == {}
        return
    assert set(got.owners) == set(pools) and set(got.owners.values()) <= set(live)
    count = Counter(got.owners.values())
    per = [count.get(r, 0) for r in live]
    assert max(per) - min(per) <= 1
    # Sticky: a pool leaves its live leader only if that leader held more than its share.
    held = Counter(leaders[p] for p in pools if p in leaders and leaders[p] in live)
    for p in got.moved:
        old = leaders.get(p)
        if old in live:
            assert held[old] > len(pools) // len(live)
    # And the result is the same computed again (every replica computes it alone).
    assert assign(list(reversed(pools)), list(reversed(live)), leaders) == got


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 8), p=st.integers(0, 60))
def test_a_join_moves_at_most_the_newcomers_share(n: int, p: int) -> None:
    pools = [f"p{i}" for i in range(p)]
    replicas = [f"r{i}" for i in range(n)]
    before = assign(pools, replicas, {}).owners
    after = assign(pools, [*replicas, "new"], before)
    assert len(after.moved) == sum(1 for r in after.owners.values() if r == "new")
    assert len(after.moved) <= -(-p // (n + 1))
