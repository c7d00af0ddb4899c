"""The autoscaler's pure decision: one table row per rule, then properties over random worlds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.views import BudgetFeed
from scheduler.policy.model import AutoscalerSpec, Policy, PoolSpec
from slots.autoscaler.decision import (
    Reason,
    ScaleConfig,
    ScaleDecision,
    ScaleHistory,
    ScaleInput,
    ScaleUp,
    ScaleWorker,
    ScaleWorkerState,
    decide,
)

NOW = 1000.0


def feed(tokens: float, per_session: float, requests: tuple[float, float] = (0.0, 0.0)) -> BudgetFeed:
    """A budget of `tokens` a minute (and requests, if given) and an active session's rate."""
    return BudgetFeed("llm", (requests[0], 0.0, 0.0, tokens), (requests[1], 0.0, 0.0, per_session))


G, B, BE = "guaranteed", "burstable", "besteffort"
CFG = replace(ScaleConfig.from_policy(Policy()), min_workers=1, max_workers=20)


def w(
    wid: str,
    busy: int = 0,
    cost: float = 0.0,
    since: float = 0.0,
    state: ScaleWorkerState = ScaleWorkerState.READY,
) -> ScaleWorker:
    return ScaleWorker(wid, state, busy, cost, since)


def idle(n: int) -> tuple[ScaleWorker, ...]:
    """n idle ready workers w0..w{n-1}, the higher the id the newer."""
    return tuple(w(f"w{i}", since=float(i)) for i in range(n))


@dataclass(frozen=True)
class Case:
    workers: tuple[ScaleWorker, ...]
    want_desired: int
    want_reason: Reason
    busy: dict[str, int] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)
    floor: int = 0
    cfg: ScaleConfig = CFG
    hist: ScaleHistory = ScaleHistory()
    want_drain: tuple[str, ...] = ()
    want_ceiling: bool = False
    budgets: tuple[BudgetFeed, ...] = ()


def run(c: Case) -> ScaleDecision:
    inp = ScaleInput(NOW, c.workers, 2, c.busy, c.pending, {}, c.floor, 60.0, c.budgets)
    return decide(inp, c.cfg, c.hist)


CASES = [
    pytest.param(Case(idle(2), 2, Reason.STEADY, busy={B: 4}), id="steady"),
    # 4 busy + 4 pending = 8 slots = 4 workers, at once.
    pytest.param(Case(idle(2), 4, Reason.SCALE_UP, busy={B: 4}, pending={B: 4}), id="fast_up"),
    # Wants 20; from 2 one period allows max(4 pods, 100% of 2) = +4.
    pytest.param(
        Case(idle(2), 6, Reason.SCALE_UP_RATE_LIMITED, busy={B: 4}, pending={B: 36}),
        id="up_rate_limited_pods",
    ),
    # From 10 at 50%: max(2 pods, 5) = +5.
    pytest.param(
        Case(
            idle(10),
            15,
            Reason.SCALE_UP_RATE_LIMITED,
            busy={B: 20},
            pending={B: 40},
            cfg=replace(CFG, max_workers=40, scale_up_pods=2, scale_up_percent=50.0),
        ),
        id="up_rate_limited_percent",
    ),
    # 2 -> 6 happened 5 s ago: the period's +4 is spent.
    pytest.param(
        Case(
            idle(6),
            6,
            Reason.SCALE_UP_RATE_LIMITED,
            busy={B: 12},
            pending={B: 28},
            hist=ScaleHistory(scale_ups=(ScaleUp(NOW - 5, 2, 6),), last_scale_up_at=NOW - 5),
        ),
        id="up_rate_counts_period",
    ),
    pytest.param(
        Case(
            idle(6),
            12,
            Reason.SCALE_UP_RATE_LIMITED,
            busy={B: 12},
            pending={B: 28},
            hist=ScaleHistory(scale_ups=(ScaleUp(NOW - 20, 2, 6),), last_scale_up_at=NOW - 20),
        ),
        id="up_period_expired",
    ),
    pytest.param(
        Case(
            idle(2),
            4,
            Reason.COOLDOWN,
            pending={B: 16},
            cfg=replace(CFG, scale_up_cooldown_s=60.0),
            hist=ScaleHistory(scale_ups=(ScaleUp(NOW - 10, 2, 4),), last_scale_up_at=NOW - 10),
        ),
        id="cooldown_up_keeps_in_flight",
    ),
    # Demand fell to 2 workers, but 6 was recommended 100 s ago: hold.
    pytest.param(
        Case(idle(6), 6, Reason.SCALE_DOWN_STABILIZED, busy={B: 4}, hist=ScaleHistory(((NOW - 100, 6),))),
        id="slow_down_stabilized",
    ),
    pytest.param(
        Case(
            idle(6),
            4,
            Reason.SCALE_DOWN_STABILIZED,
            busy={B: 4},
            hist=ScaleHistory(((NOW - 100, 4),)),
            want_drain=("w5", "w4"),
        ),
        id="down_partly_stabilized",
    ),
    pytest.param(
        Case(
            (w("w0", busy=2), w("w1", busy=2), *idle(6)[2:]),
            2,
            Reason.SCALE_DOWN,
            busy={B: 4},
            hist=ScaleHistory(((NOW - 301, 6),)),
            want_drain=("w5", "w4", "w3", "w2"),
        ),
        id="down_after_window",
    ),
    # 22 slots = 11 workers: 10% off 10, inside the band.
    pytest.param(
        Case(idle(10), 10, Reason.WITHIN_TOLERANCE, busy={B: 20}, pending={B: 2}), id="tolerance_band"
    ),
    pytest.param(Case(idle(10), 12, Reason.SCALE_UP, busy={B: 20}, pending={B: 4}), id="beyond_tolerance"),
    pytest.param(
        Case(idle(6), 6, Reason.COOLDOWN, busy={B: 4}, hist=ScaleHistory(last_scale_down_at=NOW - 30)),
        id="cooldown",
    ),
    # 16 busy + 10 pending = 13 workers wanted, max 8.
    pytest.param(
        Case(
            idle(8),
            8,
            Reason.AT_MAX,
            busy={B: 16},
            pending={B: 10},
            cfg=replace(CFG, max_workers=8),
            want_ceiling=True,
        ),
        id="ceiling_signal",
    ),
    pytest.param(
        Case(
            idle(4),
            8,
            Reason.AT_MAX,
            busy={B: 8},
            pending={B: 18},
            cfg=replace(CFG, max_workers=8),
            want_ceiling=True,
        ),
        id="max_clamp",
    ),
    # max lowered to 4 under a window that still says 6: max wins.
    pytest.param(
        Case(
            idle(6),
            4,
            Reason.AT_MAX,
            cfg=replace(CFG, max_workers=4),
            hist=ScaleHistory(((NOW - 10, 6),)),
            want_drain=("w5", "w4"),
        ),
        id="above_max",
    ),
    pytest.param(Case(idle(1), 3, Reason.AT_MIN, cfg=replace(CFG, min_workers=3)), id="min_clamp"),
    pytest.param(Case(idle(3), 3, Reason.AT_MIN, cfg=replace(CFG, min_workers=3)), id="held_at_min"),
    # floor 4, 1 Guaranteed held: 3 floor slots must stay free beyond the 3 busy -> 6 slots.
    pytest.param(Case(idle(2), 3, Reason.SCALE_UP, busy={G: 1, B: 2}, floor=4), id="floor_headroom"),
    # A waiting Guaranteed session claims its floor slot already (counted once, at weight 3).
    pytest.param(
        Case(idle(2), 3, Reason.SCALE_UP, busy={G: 1}, pending={G: 1}, floor=4), id="floor_headroom_pending"
    ),
    pytest.param(Case(idle(2), 2, Reason.STEADY, busy={G: 4}, floor=4), id="floor_all_held"),
    pytest.param(Case(idle(1), 3, Reason.SCALE_UP, pending={G: 2}), id="weights_default"),
    pytest.param(
        Case(idle(2), 2, Reason.STEADY, busy={B: 2}, pending={BE: 4}), id="weights_best_effort_half"
    ),
    pytest.param(
        Case(idle(2), 4, Reason.SCALE_UP, pending={BE: 4}, cfg=replace(CFG, weights={BE: 2.0})),
        id="weights_configurable",
    ),
    pytest.param(
        Case(
            (w("w0", 1, 1.0, 1), w("w1", 0, 0.0, 5), w("w2", 1, 0.5, 9), w("w3", 0, 0.0, 3)),
            1,
            Reason.SCALE_DOWN,
            busy={B: 2},
            want_drain=("w1", "w3", "w2"),
        ),
        id="drain_idle_first",
    ),
    pytest.param(
        Case(
            (w("w0", 1, 30.0), w("w1", 1, 10.0), w("w2", 1, 20.0)),
            2,
            Reason.SCALE_DOWN,
            busy={B: 3},
            want_drain=("w1",),
        ),
        id="drain_least_cost",
    ),
    pytest.param(
        Case(
            (w("w0", since=5), w("w2", since=9), w("w1", since=9)), 1, Reason.AT_MIN, want_drain=("w1", "w2")
        ),
        id="drain_newest_then_id",
    ),
    # 2 draining workers are already leaving: 4 ready -> 3 drains one more, not three.
    pytest.param(
        Case(
            (
                *(w(f"w{i}", busy=1, cost=float(i)) for i in range(4)),
                w("d0", 1, state=ScaleWorkerState.DRAINING),
                w("d1", 1, state=ScaleWorkerState.DRAINING),
            ),
            3,
            Reason.SCALE_DOWN,
            busy={B: 6},
            want_drain=("w0",),
        ),
        id="already_draining_counted",
    ),
    pytest.param(
        Case((), 1, Reason.SCALE_UP, pending={B: 1}, cfg=replace(CFG, min_workers=0)), id="zero_to_one"
    ),
    pytest.param(Case((), 0, Reason.STEADY, cfg=replace(CFG, min_workers=0)), id="zero_stays_zero"),
    # The pool's token budgets (2 slots a worker): 60k tokens a minute at 10k per active session
    # feed 6 sessions, 3 workers: the rate-limited 2 -> 6 stops at 3.
    pytest.param(
        Case(idle(2), 3, Reason.BUDGET, busy={B: 4}, pending={B: 16}, budgets=(feed(60_000, 10_000),)),
        id="budget_caps_scale_up",
    ),
    # A cap below the ready workers adds none and drains none (a budget is not demand).
    pytest.param(
        Case(idle(4), 4, Reason.BUDGET, busy={B: 8}, pending={B: 8}, budgets=(feed(20_000, 10_000),)),
        id="budget_cap_below_ready_drains_none",
    ),
    pytest.param(
        Case(idle(2), 4, Reason.SCALE_UP, busy={B: 4}, pending={B: 4}, budgets=(feed(60_000, 5_000),)),
        id="budget_cap_above_demand_binds_not",
    ),
    # No session was charged lately (rate 0): no cap.
    pytest.param(
        Case(idle(2), 4, Reason.SCALE_UP, busy={B: 4}, pending={B: 4}, budgets=(feed(60_000, 0),)),
        id="budget_without_observed_rate_no_cap",
    ),
    # The fewest over budgets and dimensions: b's 100 requests a minute at 25 per session feed 4
    # sessions (2 workers), though a's tokens would feed 12 workers.
    pytest.param(
        Case(
            idle(1),
            2,
            Reason.BUDGET,
            busy={B: 2},
            pending={B: 6},
            budgets=(feed(240_000, 10_000), feed(10**9, 1.0, requests=(100, 25))),
        ),  # fmt: skip
        id="budget_cap_fewest_over_budgets_and_dimensions",
    ),
    # min_workers beats the cap; a scale-down is the demand's, the cap has no say.
    pytest.param(
        Case(
            idle(2),
            5,
            Reason.BUDGET,
            busy={B: 4},
            pending={B: 36},
            cfg=replace(CFG, min_workers=5),
            budgets=(feed(10_000, 10_000),),
        ),  # fmt: skip
        id="budget_cap_never_below_min",
    ),
    pytest.param(
        Case(
            idle(6),
            1,
            Reason.SCALE_DOWN,
            busy={B: 2},
            want_drain=("w5", "w4", "w3", "w2", "w1"),
            budgets=(feed(10_000, 10_000),),
        ),  # fmt: skip
        id="budget_cap_leaves_scale_down_alone",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_rule(case: Case) -> None:
    d = run(case)
    assert (d.desired, d.drain, d.reason, d.at_ceiling) == (
        case.want_desired,
        case.want_drain,
        case.want_reason,
        case.want_ceiling,
    )
    if case.budgets:
        assert d.budget_workers is not None or all(max(b.per_session_per_minute) == 0 for b in case.budgets)


def test_from_policy_maps_every_knob() -> None:
    a = AutoscalerSpec(
        weight_guaranteed=5,
        weight_burstable=2,
        weight_best_effort=0.25,
        tolerance=0.2,
        scale_up_pods=3,
        scale_up_percent=50,
        scale_up_period_s=30,
        scale_down_stabilization_s=120,
        scale_up_cooldown_s=7,
        scale_down_cooldown_s=9,
    )
    cfg = ScaleConfig.from_policy(Policy(pool=PoolSpec(min_workers=2, max_workers=9), autoscaler=a))
    assert cfg == ScaleConfig(2, 9, {G: 5, B: 2, BE: 0.25}, 0.2, 3, 50, 30, 120, 7, 9)


def test_demand_and_estimated_drain() -> None:
    inp = ScaleInput(NOW, idle(5), 2, {B: 6}, {G: 1, B: 2, BE: 4}, {G: 3.0}, 0, 60.0)
    d = decide(inp, CFG, ScaleHistory())
    assert d.weighted_demand_slots == 6 + 3 + 2 + 2
    # 7 queued sessions, 7 workers * 2 slots each free once a minute.
    assert (d.desired, d.estimated_drain_s) == (7, 30.0)


def test_history_prunes_and_records() -> None:
    hist = ScaleHistory(((NOW - 400, 9), (NOW - 10, 3)), (ScaleUp(NOW - 20, 1, 3),), NOW - 20, NOW - 99)
    d = decide(ScaleInput(NOW, idle(2), 2, {}, {B: 8}, {}, 0, 1.0), CFG, hist)
    assert d.desired == 4
    assert d.history == ScaleHistory(((NOW - 10, 3), (NOW, 4)), (ScaleUp(NOW, 2, 4),), NOW, NOW - 99)


def test_in_flight_scale_up_is_not_a_new_event() -> None:
    """Workers asked for 3 s ago are not ready yet: the same target again, not a second step."""
    hist = ScaleHistory(scale_ups=(ScaleUp(NOW - 3, 2, 6),), last_scale_up_at=NOW - 3)
    d = decide(ScaleInput(NOW, idle(2), 2, {}, {B: 12}, {}, 0, 1.0), CFG, hist)
    assert (d.desired, d.reason) == (6, Reason.SCALE_UP)
    assert (d.history.scale_ups, d.history.last_scale_up_at) == (hist.scale_ups, NOW - 3)


def test_spike_then_quiet_up_fast_down_after_window() -> None:
    """A loop over virtual time: up within one tick, down only once the window forgets the spike."""
    hist, n, sizes = ScaleHistory(), 2, []
    for t in range(0, 400, 15):
        pending = {B: 12} if t < 30 else {}
        inp = ScaleInput(float(t), idle(n), 2, {B: 2 * min(n, 3)} if t < 30 else {}, pending, {}, 0, 1.0)
        d = decide(inp, CFG, hist)
        hist, n = d.history, d.desired
        sizes.append(n)
    assert sizes[0] == 6 and sizes[1] == 9  # rate-limited steps of +4 / +100%
    assert all(s == 9 for s in sizes[2:21])  # held through the 300 s window
    assert sizes[-1] == 1


# ---------------------------------------------------------------- properties

classes = st.sampled_from([G, B, BE])
counts = st.dictionaries(classes, st.integers(0, 60))


@st.composite
def worlds(draw: st.DrawFn) -> tuple[ScaleInput, ScaleConfig, ScaleHistory]:
    lo = draw(st.integers(0, 5))
    cfg = replace(
        CFG,
        min_workers=lo,
        max_workers=draw(st.integers(lo, 20)),
        tolerance=draw(st.floats(0, 0.5)),
        scale_up_pods=draw(st.integers(0, 5)),
        scale_up_percent=draw(st.floats(0, 200)),
        stabilization_s=draw(st.floats(0, 600)),
        scale_up_cooldown_s=draw(st.floats(0, 120)),
        scale_down_cooldown_s=draw(st.floats(0, 120)),
    )
    spw = draw(st.integers(1, 4))
    states = draw(st.lists(st.sampled_from(ScaleWorkerState), max_size=25))
    workers = tuple(
        w(f"w{i}", draw(st.integers(0, spw)), draw(st.floats(0, 100)), draw(st.floats(0, NOW)), s)
        for i, s in enumerate(states)
    )
    times = st.floats(NOW - 600, NOW)
    hist = ScaleHistory(
        tuple(draw(st.lists(st.tuples(times, st.integers(0, 25)), max_size=5))),
        tuple(
            ScaleUp(t, a, a + b)
            for t, a, b in draw(st.lists(st.tuples(times, st.integers(0, 20), st.integers(1, 8)), max_size=3))
        ),
        draw(st.none() | times),
        draw(st.none() | times),
    )
    inp = ScaleInput(NOW, workers, spw, draw(counts), draw(counts), {}, draw(st.integers(0, 10)), 30.0)
    return inp, cfg, hist


@given(worlds())
def test_properties(world: tuple[ScaleInput, ScaleConfig, ScaleHistory]) -> None:
    inp, cfg, hist = world
    d = decide(inp, cfg, hist)
    ready = [x.worker_id for x in inp.workers if x.state is ScaleWorkerState.READY]
    current = len(ready)
    assert cfg.min_workers <= d.desired <= cfg.max_workers
    assert set(d.drain) <= set(ready) and len(set(d.drain)) == len(d.drain) == max(0, current - d.desired)
    assert d.at_ceiling == (d.weighted_demand_slots > cfg.max_workers * inp.slots_per_worker)
    if d.desired < current:  # never below the window's highest recommendation, unless max says so
        high = max([r for t, r in hist.recommendations if t > NOW - cfg.stabilization_s], default=0)
        assert d.desired >= min(high, cfg.max_workers)
    if d.desired > max(current, cfg.min_workers):  # never more than one period's step
        step = max(cfg.scale_up_pods, math.ceil(current * cfg.scale_up_percent / 100))
        assert d.desired <= current + step
    # Deterministic, whatever order the mappings were built in.
    again = replace(inp, pending_by_class=dict(reversed(list(inp.pending_by_class.items()))))
    assert decide(again, cfg, hist) == d
