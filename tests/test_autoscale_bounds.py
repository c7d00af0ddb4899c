"""The decision's bounds added to the HPA's: scale-down policies per period (the more
conservative applied), the oldest wait as a reason to scale up, and a worker being recycled."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.policy.model import Policy
from slots.autoscaler.decision import (
    Reason,
    ScaleConfig,
    ScaleHistory,
    ScaleInput,
    ScaleWorker,
    ScaleWorkerState,
    decide,
)

G, B, BE = "guaranteed", "burstable", "besteffort"
# No stabilization window nor cooldown: what bounds a scale-down here is the scale-down policies.
BASE = replace(
    ScaleConfig.from_policy(Policy()),
    min_workers=1,
    max_workers=20,
    stabilization_s=0.0,
    scale_down_cooldown_s=0.0,
)


def idle(n: int, first: int = 0) -> tuple[ScaleWorker, ...]:
    return tuple(
        ScaleWorker(f"w{i}", ScaleWorkerState.READY, 0, 0.0, float(i)) for i in range(first, first + n)
    )


def drop(
    cfg: ScaleConfig, start: int = 10, every_s: float = 15.0, until_s: float = 600.0
) -> list[tuple[float, int]]:
    """Demand gone at once: the pool's size after each tick (drained workers leave at once)."""
    hist, n, t, sizes = ScaleHistory(), start, 0.0, []
    while t <= until_s:
        d = decide(ScaleInput(t, idle(n), 2, {}, {}, {}, 0, 60.0), cfg, hist)
        hist, n = d.history, n - len(d.drain)
        sizes.append((t, n))
        t += every_s
    return sizes


def test_without_scale_down_policies_ten_workers_drop_to_one_in_one_tick() -> None:
    """The behaviour before: no bound on a step (scaleDown.percent 100, no pods policy)."""
    assert drop(BASE)[0] == (0.0, 1)


@pytest.mark.parametrize(
    ("pods", "percent", "period", "want"),
    [
        # 2 pods or 50 % per 60 s, the smaller: 10 -> 8 -> 6 -> 4 -> 2 (50 % of 4) -> 1.
        (2, 50.0, 60.0, [10, 8, 6, 4, 2, 1]),
        # 50 % alone: 10 -> 5 -> 3 (floor of 2.5 removed: 2) -> 2 -> 1.
        (0, 50.0, 60.0, [10, 5, 3, 2, 1]),
        # one pod per 30 s: nine steps.
        (1, 100.0, 30.0, [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]),
    ],
)
def test_a_10_to_1_drop_goes_in_bounded_steps(
    pods: int, percent: float, period: float, want: list[int]
) -> None:
    cfg = replace(BASE, scale_down_pods=pods, scale_down_percent=percent, scale_down_period_s=period)
    sizes = drop(cfg, until_s=period * 12)
    seen = [10] + [n for _, n in sizes]
    steps = [n for i, n in enumerate(seen) if i == 0 or n != seen[i - 1]]
    assert steps == want
    # Within any period, never more removed than the policies allow from the size at its start.
    history = [(-1e9, 10), *sizes]
    for t, n in sizes:
        base = max(
            m for u, m in history if u > t - period or u == max(v for v, _ in history if v <= t - period)
        )
        allowed = min(pods or base, int(base * percent / 100))
        assert base - n <= allowed, (t, base, n)
    assert seen[-1] == 1


def test_a_rate_limited_scale_down_says_so() -> None:
    cfg = replace(BASE, scale_down_pods=2, scale_down_period_s=60.0)
    d = decide(ScaleInput(0.0, idle(10), 2, {}, {}, {}, 0, 60.0), cfg, ScaleHistory())
    assert (d.desired, d.reason, len(d.drain)) == (8, Reason.SCALE_DOWN_RATE_LIMITED, 2)


@pytest.mark.parametrize(
    ("threshold", "oldest", "want_desired", "want_reason"),
    [
        (0.0, 600.0, 2, Reason.STEADY),  # off
        (120.0, 60.0, 2, Reason.STEADY),  # not waited long enough
        (120.0, 120.0, 3, Reason.OLDEST_WAIT),  # at the threshold: one more worker
        (120.0, 900.0, 3, Reason.OLDEST_WAIT),  # one at a time, however long
    ],
)
def test_the_oldest_wait_scales_up_where_weighted_demand_would_not(
    threshold: float, oldest: float, want_desired: int, want_reason: Reason
) -> None:
    """Two full workers and one BestEffort request queued, weighted 0: weighted demand (4 slots)
    asks for the two there are; the request waits unseen unless its wait counts."""
    cfg = replace(BASE, oldest_wait_s=threshold, weights={G: 3.0, B: 1.0, BE: 0.0})
    busy = tuple(ScaleWorker(f"w{i}", ScaleWorkerState.READY, 2, 10.0, 0.0) for i in range(2))
    inp = ScaleInput(1000.0, busy, 2, {B: 4}, {BE: 1}, {BE: oldest}, 0, 60.0)
    d = decide(inp, cfg, ScaleHistory())
    assert (d.desired, d.reason) == (want_desired, want_reason)


def test_the_oldest_wait_of_an_empty_class_does_not_count() -> None:
    cfg = replace(BASE, oldest_wait_s=60.0)
    inp = ScaleInput(1000.0, idle(2), 2, {B: 4}, {}, {BE: 600.0}, 0, 60.0)
    assert decide(inp, cfg, ScaleHistory()).reason is not Reason.OLDEST_WAIT


@pytest.mark.parametrize("where", ["floor", "between", "ceiling"])
def test_a_recycling_worker_asks_for_its_replacement_first_and_is_never_drained_by_the_decision(
    where: str,
) -> None:
    """Four workers busy at steady demand, one RECYCLING: the decision counts three and wants
    four (past the tolerance band and any cooldown: a replacement is no change in demand)."""
    lo, hi = {"floor": (4, 20), "between": (1, 20), "ceiling": (1, 4)}[where]
    cfg = replace(BASE, min_workers=lo, max_workers=hi, tolerance=0.5, scale_up_cooldown_s=600.0)
    workers = tuple(
        ScaleWorker(f"w{i}", ScaleWorkerState.RECYCLING if i == 0 else ScaleWorkerState.READY, 2, 9.0, 0.0)
        for i in range(4)
    )
    hist = ScaleHistory(last_scale_up_at=990.0)
    d = decide(ScaleInput(1000.0, workers, 2, {B: 8}, {}, {}, 0, 60.0), cfg, hist)
    assert d.desired == 4 and d.drain == ()
    assert d.reason is Reason.RECYCLE
