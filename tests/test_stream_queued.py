"""What a waiter's stream tells it, with an injected clock (scheduler/server/stream.py, `offer`):
a new place, pool or reason at once; the estimate counting down with time, told again once it
has fallen by a quarter (at least ESTIMATE_MIN_STEP_S) down to zero; and the stream's own
countdown timer re-telling it with nothing else happening."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.core.types import BlockedReason, Queued, SessionId
from scheduler.server.stream import ESTIMATE_CHANGE, ESTIMATE_MIN_STEP_S, QUEUED, LeaseStream

KEY = SessionId("t/s")
QUOTA, LIMIT = BlockedReason.TENANT_QUOTA, BlockedReason.TENANT_LIMIT


class _Loop:
    """The loop as a stream's Patience: a clock the test moves, the core's answer it sets."""

    def __init__(self, q: Queued) -> None:
        self.t = 0.0
        self.q: Queued | None = q

    def now(self) -> float:
        return self.t

    def wait_timeout(self, key: SessionId) -> float | None:
        return None

    def withdraw_queued(self, key: SessionId) -> bool:
        return False

    def queued_now(self, key: SessionId) -> Queued | None:
        return self.q


def _q(
    position: int = 0, estimate: float | None = 8.0, reason: BlockedReason = QUOTA, pool: str = "a"
) -> Queued:
    return Queued(KEY, position, estimate, pool, reason)


def _told(stream: LeaseStream) -> list[tuple[int, float | None, str, str]]:
    out = []
    for kind, notice, _ in stream.items:
        assert kind == QUEUED and notice is not None
        d = notice.decision
        assert isinstance(d, Queued)
        out.append(
            (
                d.position,
                None if d.estimated_wait_s is None else round(d.estimated_wait_s, 6),
                d.pool,
                d.reason,
            )
        )
    return out


# (time, the core's answer then) offered in turn -> what the stream told, in order.
CASES = {
    # 8 s at 0; a quarter is 2 s: told again at 2 (6), then 1.5 s later (4.5), ...; a Queued
    # offered between steps tells nothing.
    "counts_down_by_quarters": (
        [(0, _q()), (1, _q()), (2, _q()), (3, _q()), (3.5, _q()), (4.7, _q())],
        [(0, 8.0, "a", QUOTA), (0, 6.0, "a", QUOTA), (0, 4.5, "a", QUOTA), (0, 3.3, "a", QUOTA)],
    ),
    # A short estimate falls by at least ESTIMATE_MIN_STEP_S, and the last step is to zero; then
    # nothing more is told while nothing moves.
    "short_estimates_step_by_a_second_down_to_zero": (
        [
            (0, _q(estimate=1.5)),
            (0.4, _q(estimate=1.5)),
            (1.0, _q(estimate=1.5)),
            (1.6, _q(estimate=1.5)),
            (9, _q(estimate=1.5)),
        ],
        [(0, 1.5, "a", QUOTA), (0, 0.5, "a", QUOTA), (0, 0.0, "a", QUOTA)],
    ),  # fmt: skip
    # A new position is told at once with the core's estimate for it (the countdown restarts).
    "a_new_position_is_told_at_once": (
        [(0, _q(1, 16.0)), (1, _q(0, 8.0)), (2, _q(0, 8.0)), (3, _q(0, 8.0))],
        [(1, 16.0, "a", QUOTA), (0, 8.0, "a", QUOTA), (0, 6.0, "a", QUOTA)],
    ),
    # A new reason (or pool) at the same place is told at once, with the countdown's estimate
    # restarted from the core's.
    "a_new_reason_is_told_at_once": (
        [(0, _q()), (0.5, _q(reason=LIMIT)), (0.6, _q(reason=LIMIT, pool="b"))],
        [(0, 8.0, "a", QUOTA), (0, 8.0, "a", LIMIT), (0, 8.0, "b", LIMIT)],
    ),
    # The core's estimate for the same place moved by a quarter (capacity doubled): told at once.
    "a_new_estimate_for_the_place_is_told_at_once": (
        [(0, _q()), (0.5, _q(estimate=7.0)), (1, _q(estimate=4.0))],
        [(0, 8.0, "a", QUOTA), (0, 4.0, "a", QUOTA)],
    ),
    # No estimate yet (no hold observed): nothing to count down; the first estimate is told.
    "no_estimate_then_one": (
        [(0, _q(estimate=None)), (5, _q(estimate=None)), (6, _q(estimate=3.0))],
        [(0, None, "a", QUOTA), (0, 3.0, "a", QUOTA)],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_what_a_waiter_is_told(name: str) -> None:
    offers, want = CASES[name]

    async def go() -> list[tuple[int, float | None, str, str]]:
        loop = _Loop(offers[0][1])
        stream = LeaseStream(KEY)
        stream.patience = loop
        for at, q in offers:
            loop.t = float(at)
            stream.offer(q, loop.t, 0.0)
        stream.disarm()
        return _told(stream)

    assert asyncio.run(go()) == want


def test_the_constants_say_a_quarter_and_a_second() -> None:
    assert (ESTIMATE_CHANGE, ESTIMATE_MIN_STEP_S) == (0.25, 1.0)


def test_the_countdown_retells_with_nothing_else_happening() -> None:
    """The stream's own timer re-tells the falling estimate: 1.2 s told at 0; at 1.0 (a step of
    a second) 0.2; at 1.2 zero; then its timer stops."""

    async def go() -> LeaseStream:
        loop = _Loop(_q(estimate=1.2))
        stream = LeaseStream(KEY)
        stream.patience = loop
        stream.offer(_q(estimate=1.2), 0.0, 0.0)
        for t, n in ((1.0, 2), (1.2, 3)):
            loop.t = t  # the loop's clock moves; the timer (real, ~1 s then ~0.2 s) fires
            for _ in range(2000):  # a bound, not a timing: the loop may be slow
                if len(stream.items) >= n:
                    break
                await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        return stream

    stream = asyncio.run(go())
    assert _told(stream) == [(0, 1.2, "a", QUOTA), (0, 0.2, "a", QUOTA), (0, 0.0, "a", QUOTA)]
    assert stream._tick is None  # at zero nothing more to count: no timer left
