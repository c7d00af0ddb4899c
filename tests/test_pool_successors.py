"""Which replica follows each pool hot besides its owner (pool_owners.follow), and how `assign`
hands a pool whose owner left to it. Table cases for the moves a platform sees, then properties:
never the owner, always live, within the caps, a fixed point (no table rewritten at every beat),
and a join moves no more successors than leaders."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.state.pool_owners import assign, follow

POOLS = [f"pool-{i:02d}" for i in range(30)]


@pytest.mark.parametrize(
    ("case", "owners", "live", "before", "want"),
    [
        ("one replica: nobody to follow", {"p": "a"}, ["a"], {}, {}),
        ("two replicas: each follows the other's", {"p": "a", "q": "b"}, ["a", "b"], {},
         {"p": "b", "q": "a"}),
        # Sticky: a successor stays while it is live, not the owner and within its share.
        ("kept", {"p": "a", "q": "a", "r": "b"}, ["a", "b", "c"], {"p": "c", "q": "b", "r": "c"},
         {"p": "c", "q": "b", "r": "c"}),
        # p's successor became its owner (a failover): p needs another; q's successor left.
        ("owner now, or gone", {"p": "b", "q": "a"}, ["a", "b"], {"p": "b", "q": "z"}, {"p": "a", "q": "b"}),
        # a leads both: their successors spread over b and c, not both on one.
        ("an owner's pools spread", {"p": "a", "q": "a"}, ["a", "b", "c"], {}, None),
    ],
)  # fmt: skip
def test_successor_cases(
    case: str, owners: dict[str, str], live: list[str], before: dict[str, str], want: dict[str, str] | None
) -> None:
    got = follow(sorted(owners), owners, live, before)
    if want is not None:
        assert got == want, case
    else:
        assert sorted(got.values()) == ["b", "c"], case
    for pool, s in got.items():
        assert s in live and s != owners[pool], case


def test_thirty_pools_on_three_replicas_each_holds_twenty_hot() -> None:
    live = ["r1", "r2", "r3"]
    owners = dict(assign(POOLS, live, {}).owners)
    nxt = follow(POOLS, owners, live, {})
    assert set(nxt) == set(POOLS)
    assert sorted(Counter(nxt.values()).values()) == [10, 10, 10]
    for r in live:  # what it leads and what it follows: 20 of 30 pools, not all 30
        assert sum(1 for p in POOLS if r in (owners[p], nxt[p])) == 20
    # Each replica leaving: every one of its pools goes to the replica already following it.
    for gone in live:
        after = assign(POOLS, [r for r in live if r != gone], owners, nxt).owners
        assert all(after[p] == nxt[p] for p in POOLS if owners[p] == gone), gone


@pytest.mark.parametrize(("n", "p"), [(2, 30), (3, 30), (4, 30), (3, 100), (5, 100)])
def test_a_join_moves_no_more_successors_than_leaders(n: int, p: int) -> None:
    pools = [f"p{i:03d}" for i in range(p)]
    live = [f"r{i}" for i in range(n)]
    owners = dict(assign(pools, live, {}).owners)
    nxt = follow(pools, owners, live, {})
    joined = assign(pools, [*live, "new"], owners, nxt)
    nxt2 = follow(pools, joined.owners, [*live, "new"], nxt)
    moved_successors = sum(1 for q in pools if nxt[q] != nxt2[q])
    assert moved_successors <= len(joined.moved), (moved_successors, joined.moved)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 8), p=st.integers(0, 40), gone=st.integers(0, 7))
def test_successors_are_live_bounded_and_a_fixed_point(n: int, p: int, gone: int) -> None:
    pools = [f"p{i}" for i in range(p)]
    live = [f"r{i}" for i in range(n)]
    owners = dict(assign(pools, live, {}).owners)
    nxt = follow(pools, owners, live, {})
    assert set(nxt) == (set(pools) if n > 1 else set())
    for pool, s in nxt.items():
        assert s != owners[pool] and s in live
    if n > 1:
        assert max(Counter(nxt.values()).values(), default=0) <= -(-p // n) + 1
    # Computed again from the table it wrote: the same (no table rewritten every beat).
    assert follow(pools, owners, live, nxt) == nxt
    assert assign(pools, live, owners, nxt).moved == ()
    # A replica leaves: the owners stay balanced, and each of its pools goes to its successor
    # unless that one has no room (then by rendezvous, as ever).
    leaving = live[gone % n]
    rest = [r for r in live if r != leaving]
    after = assign(pools, rest, owners, nxt)
    if rest:
        loads = Counter(after.owners.values())
        assert max(loads.values(), default=0) - min((loads.get(r, 0) for r in rest), default=0) <= 1
