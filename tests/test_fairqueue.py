"""The pure fair queue of the admission gate (scheduler/core/fairqueue.py): a table of moves
(Kueue style: each case a sequence of offers and releases and what each must come to), and
properties: no flow with waiting work starves, and a flooding flow's admitted share is bounded by
its weight's share while the others are backlogged."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.fairqueue import MAX_RETRY_S, MIN_RETRY_S, FairQueue, Offer

A, Q, R = Offer.ADMITTED, Offer.QUEUED, Offer.REFUSED

# A step: ("offer", flow, cost, weight, expected Offer) | ("release", [flows admitted, in order])
#        | ("cancel", flow, index among the flow's offers, expected bool)
#        | ("free", seats, [flows admitted])
Step = tuple[Any, ...]
TABLE: list[tuple[str, int, int, list[Step]]] = [
    (
        "admitted-at-once-while-seats-are-free",
        2,
        8,
        [("offer", "a", 1, 1, A), ("offer", "b", 1, 1, A), ("offer", "c", 1, 1, Q), ("release", ["c"])],
    ),
    (
        "a-quiet-flow-goes-before-the-floods-backlog",
        1,
        8,
        [
            ("offer", "flood", 1, 1, A),
            ("offer", "flood", 1, 1, Q),
            ("offer", "flood", 1, 1, Q),
            ("offer", "flood", 1, 1, Q),
            ("offer", "quiet", 1, 1, Q),
            ("release", ["quiet"]),
            ("release", ["flood"]),
            ("release", ["flood"]),
            ("release", ["flood"]),
            ("release", []),
        ],
    ),
    (
        "nothing-waits-nothing-jumps-the-line: a new item waits behind the waiting ones",
        1,
        8,
        [("offer", "a", 1, 1, A), ("offer", "b", 1, 1, Q), ("release", ["b"]), ("offer", "a", 1, 1, Q)],
    ),
    (
        "the-bound-refuses-on-the-flooders-side-only",
        1,
        2,
        [
            ("offer", "flood", 1, 1, A),
            ("offer", "flood", 1, 1, Q),
            ("offer", "flood", 1, 1, Q),
            ("offer", "flood", 1, 1, R),
            ("offer", "worker", 1, 1, Q),
            ("release", ["worker"]),
        ],
    ),
    (
        "weights-share-the-seats: 2 to 1",
        1,
        8,
        [
            ("offer", "x", 1, 1, A),
            *[("offer", "heavy", 1, 2, Q)] * 4,
            *[("offer", "light", 1, 1, Q)] * 2,
            ("release", ["heavy"]),
            ("release", ["light"]),
            ("release", ["heavy"]),
            ("release", ["heavy"]),
            ("release", ["light"]),
            ("release", ["heavy"]),
        ],
    ),
    (
        "cost-counts: a message of 10 commands weighs 10 unit rpcs",
        1,
        16,
        [
            ("offer", "x", 1, 1, A),
            ("offer", "big", 10, 1, Q),
            ("offer", "big", 10, 1, Q),
            *[("offer", "small", 1, 1, Q)] * 10,
            ("release", ["small"]),
            *[("release", ["small"])] * 8,
            ("release", ["big"]),  # tag 10, as the tenth small one: the older flow's first
            ("release", ["small"]),
            ("release", ["big"]),
        ],
    ),
    (
        "an-idle-flow-saves-no-credit",
        1,
        8,
        [
            ("offer", "a", 1, 1, A),
            *[("offer", "b", 1, 1, Q)] * 3,
            ("release", ["b"]),
            ("release", ["b"]),
            ("release", ["b"]),
            ("release", []),
            # a was idle all along: it starts at the virtual time, not three items ahead of b.
            ("offer", "a", 1, 1, A),
            ("offer", "a", 1, 1, Q),
            ("offer", "b", 1, 1, Q),
            ("release", ["a"]),
            ("release", ["b"]),
        ],
    ),
    (
        "a-cancelled-item-is-never-admitted",
        1,
        8,
        [
            ("offer", "a", 1, 1, A),
            ("offer", "b", 1, 1, Q),
            ("offer", "b", 1, 1, Q),
            ("cancel", "b", 0, True),
            ("cancel", "b", 0, False),
            ("release", ["b"]),
            ("release", []),
        ],
    ),
    (
        "a-width-is-at-most-all-the-seats",
        2,
        8,
        [
            ("offer", "a", 1, 1, A),
            ("offer", "huge", 1000, 1, Q),
            ("release", ["huge"]),
            ("offer", "b", 1, 1, Q),
        ],
    ),
    (
        "a-wide-item-takes-as-many-seats-as-its-cost",
        4,
        8,
        [
            ("offer", "a", 3, 1, A),
            ("offer", "b", 1, 1, A),
            ("offer", "c", 2, 1, Q),
            ("offer", "d", 1, 1, Q),
            ("free", 4, ["d", "c"]),
        ],
    ),
    (
        "nothing-narrower-overtakes-a-wide-item-waiting-for-room",
        2,
        8,
        [
            ("offer", "a", 1, 1, A),
            ("offer", "b", 1, 1, A),
            ("offer", "wide", 2, 1, Q),  # both seats; tag 2
            ("offer", "n", 1, 1, Q),
            ("release", ["n"]),
            ("offer", "n", 1, 1, Q),  # tag 2 too, after wide's
            ("release", []),  # wide is next in order and needs both seats: n waits behind it
            ("release", ["wide"]),
            ("free", 2, ["n"]),
        ],
    ),
    (
        "several-seats-freed-fill-in-order",
        2,
        8,
        [
            ("offer", "a", 1, 1, A),
            ("offer", "a", 1, 1, A),
            ("offer", "a", 1, 1, Q),
            ("offer", "b", 1, 1, Q),
            ("release", ["b"]),
            ("release", ["a"]),
        ],
    ),
]


# With an overdraft: an item ahead of every waiting one in fair order is admitted at once, over
# the seats by at most `overdraft` (the server's gate: as many again as the seats).
OVERDRAFT_TABLE: list[tuple[str, int, int, list[Step]]] = [
    (
        "an-item-first-in-fair-order-goes-at-once-over-the-seats",
        1,
        8,
        [
            ("offer", "flood", 1, 1, A),
            ("offer", "flood", 1, 1, Q),
            ("offer", "flood", 1, 1, Q),
            ("offer", "quiet", 1, 1, A),  # tag 1, the flood's head 2: it would be next anyway
            ("release", []),  # one seat back: still at the seats (quiet took the overdraft)
            ("release", ["flood"]),
            ("release", ["flood"]),
        ],
    ),
    (
        "no-overdraft-at-a-tie-with-work-waiting-or-past-its-bound",
        1,
        8,
        [
            ("offer", "a", 1, 1, A),
            ("offer", "a", 1, 1, Q),  # tag 2
            ("offer", "b", 1, 1, A),  # tag 1: ahead, over the seats
            ("offer", "b", 1, 1, Q),  # tag 2: a tie with a's head is not ahead
            ("offer", "c", 1, 1, Q),  # tag 1, ahead, but the overdraft is used up
            ("release", []),
            ("release", ["c"]),
            ("release", ["a"]),
            ("release", ["b"]),
        ],
    ),
    (
        "nothing-waits: the seats bound as without an overdraft",
        1,
        8,
        [("offer", "a", 1, 1, A), ("offer", "b", 1, 1, Q), ("release", ["b"])],
    ),
    (
        "a-flow-with-a-backlog-never-jumps-its-own-queue",
        1,
        8,
        [
            ("offer", "x", 1, 1, A),
            ("offer", "flood", 1, 1, Q),
            ("offer", "flood", 1, 1, Q),
            ("release", ["flood"]),
            ("offer", "flood", 1, 1, Q),
            ("release", ["flood"]),
            ("release", ["flood"]),
        ],
    ),
]


@pytest.mark.parametrize(
    ("seats", "bound", "overdraft", "steps"),
    [pytest.param(s, b, 0, st_, id=i) for i, s, b, st_ in TABLE]
    + [pytest.param(s, b, s, st_, id=f"overdraft-{i}") for i, s, b, st_ in OVERDRAFT_TABLE],
)
def test_fair_queue_moves(seats: int, bound: int, overdraft: int, steps: list[Step]) -> None:
    fq: FairQueue[object] = FairQueue(seats, bound, overdraft)
    offered: dict[str, list[object]] = {}
    for n, step in enumerate(steps):
        now = float(n)
        if step[0] == "offer":
            _, flow, cost, weight, want = step
            item = object()
            offered.setdefault(flow, []).append(item)
            assert fq.offer(flow, item, now, cost, weight) is want, (n, step)
        elif step[0] == "cancel":
            _, flow, index, want = step
            assert fq.cancel(flow, offered[flow][index]) is want, (n, step)
        elif step[0] == "free":
            got = [flow for flow, _ in fq.release(now, step[1])]
            assert got == step[2], (n, step)
        else:
            got = [flow for flow, _ in fq.release(now)]
            assert got == step[1], (n, step)


def test_retry_after_is_bounded_and_grows_with_the_backlog() -> None:
    fq: FairQueue[int] = FairQueue(1, 1000)
    assert fq.retry_after("nobody", 0.0) == 1.0  # no rate seen yet: a second
    fq.offer("a", 0, 0.0)
    for i in range(1, 100):
        assert fq.offer("a", i, 0.0) is Q
    for _ in range(50):
        fq.release(0.1)
    small = fq.retry_after("a", 0.1)
    for i in range(500):
        fq.offer("a", i, 0.1)
    assert MIN_RETRY_S <= small < fq.retry_after("a", 0.1) <= MAX_RETRY_S


def test_refuses_a_size_that_admits_nothing() -> None:
    with pytest.raises(ValueError, match="seats >= 1"):
        FairQueue(0, 1)


# --- properties --------------------------------------------------------------------------------

moves = st.lists(
    st.one_of(st.tuples(st.just("offer"), st.integers(0, 4)), st.tuples(st.just("release"), st.just(0))),
    min_size=1,
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(moves, st.integers(1, 3), st.integers(1, 6))
def test_no_flow_with_waiting_work_starves(script: list[tuple[str, int]], seats: int, bound: int) -> None:
    """Every item queued is admitted, after at most (items ahead of it in its flow + 3) items of
    each other flow, whatever the interleaving; and once offers stop, releases admit them all."""
    fq: FairQueue[int] = FairQueue(seats, bound)
    waiting: dict[int, tuple[str, int]] = {}  # item -> (flow, items of its own flow ahead of it)
    since: dict[int, Counter[str]] = {}  # item -> admissions of other flows while it waited
    flows = set()
    n = 0

    def admitted(out: list[tuple[str, int]]) -> None:
        for flow, item in out:
            waiting.pop(item)
            since.pop(item)
            for other, (oflow, ahead) in waiting.items():
                if oflow != flow:
                    since[other][flow] += 1
                    assert since[other][flow] <= ahead + 3, (other, oflow, flow, since[other])

    for kind, f in script:
        if kind == "offer":
            n += 1
            flow = f"f{f}"
            flows.add(flow)
            ahead = fq.queued(flow)
            if fq.offer(flow, n, float(n)) is Q:
                waiting[n] = (flow, ahead)
                since[n] = Counter()
        else:
            admitted(fq.release(float(n)))
    for _ in range(len(waiting) + seats + 1):
        admitted(fq.release(float(n)))
    assert not waiting
    assert fq.waiting == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=4), st.integers(20, 200))
def test_a_flooding_flows_share_is_its_weights_share_when_others_are_backlogged(
    weights: list[int], rounds: int
) -> None:
    """Flow 0 floods (its queue always full); every flow stays backlogged: over any run, each
    flow's admitted count is within 2 of its weight's share of the admissions."""
    fq: FairQueue[int] = FairQueue(1, 64)
    names = [f"f{i}" for i in range(len(weights))]
    n = 0
    fq.offer("warm", 0, 0.0)  # holds the seat: everything else queues
    for name, w in zip(names, weights, strict=True):
        for _ in range(8 if name != "f0" else 64):
            n += 1
            fq.offer(name, n, 0.0, 1.0, float(w))
    got: Counter[str] = Counter()
    for r in range(rounds):
        for flow, _ in fq.release(float(r)):
            got[flow] += 1
            n += 1
            fq.offer(flow, n, float(r), 1.0, float(weights[names.index(flow)]))  # stays backlogged
            while fq.offer("f0", n, float(r), 1.0, float(weights[0])) is Q:  # the flood refills
                n += 1
    total = sum(got.values())
    for name, w in zip(names, weights, strict=True):
        fair = total * w / sum(weights)
        assert abs(got[name] - fair) <= 2, (name, got, fair)
