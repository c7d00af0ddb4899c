"""The counts of queue positions (`PositionCounts` in scheduler/core/indexes.py): prefix sums
agree with a plain count over any mix of arrivals, departures and re-queued old positions; and
its window follows what is counted, so a churn of millions of positions keeps it small (it grew
without end, each doubling a stall of the loop)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.indexes import PositionCounts

# A move: (kind, amount): "arrive" a new position ahead of all, "leave" the k-th counted one,
# "requeue" an old position again (a yielded session keeps its place), "load" the counted set.
moves = st.lists(
    st.tuples(st.sampled_from(["arrive", "leave", "requeue", "load"]), st.integers(0, 10_000)),
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(moves)
def test_prefix_sums_match_a_plain_count(script: list[tuple[str, int]]) -> None:
    tree = PositionCounts()
    counted: set[int] = set()
    gone: list[int] = []
    top = 0
    for kind, k in script:
        if kind == "arrive":
            top += 1 + k % 500  # positions only grow, with gaps (other classes' arrivals)
            tree.add(top, 1)
            counted.add(top)
        elif kind == "leave" and counted:
            pos = sorted(counted)[k % len(counted)]
            tree.add(pos, -1)
            counted.discard(pos)
            gone.append(pos)
        elif kind == "requeue" and gone:
            pos = gone.pop(k % len(gone))
            tree.add(pos, 1)
            counted.add(pos)
        elif kind == "load":
            tree = PositionCounts()
            tree.load(sorted(counted))
        for probe in {0, top + 1, *list(counted)[:5], k}:
            assert tree.prefix(probe) == sum(1 for p in counted if p < probe), (kind, probe)


def test_a_long_churn_keeps_the_window_to_what_is_counted() -> None:
    tree = PositionCounts()
    for pos in range(1_000_000):  # a session arrives and leaves; at most 3 wait at a time
        tree.add(pos, 1)
        if pos >= 3:
            tree.add(pos - 3, -1)
    assert tree.prefix(1_000_000) == 3
    assert tree.prefix(999_998) == 1
    assert tree._size <= 1024  # was 2**20: every position ever seen


class _Counting(PositionCounts):
    rebuilds = 0

    def _rebuild(self, index: int) -> None:
        type(self).rebuilds += 1
        super()._rebuild(index)


def test_old_positions_coming_back_in_descending_order_rebuild_a_few_times_only() -> None:
    """A worker removed revokes its leases, re-queued at their old places, possibly from the
    newest down: the window grows below with room, so k of them cost O(log) rebuilds, not k."""
    tree = _Counting()
    for pos in range(200_000):  # churn pushes the window up
        tree.add(pos, 1)
        tree.add(pos, -1)
    tree.add(200_000, 1)
    _Counting.rebuilds = 0
    for pos in range(199_000, -1, -1000):  # 200 old positions back, newest first
        tree.add(pos, 1)
    assert _Counting.rebuilds <= 12, _Counting.rebuilds
    assert tree.prefix(200_001) == 201
    assert tree.prefix(1000) == 1
