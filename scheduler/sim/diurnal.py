"""A multi-day diurnal workload, and the elastic pool run on it reactive, scheduled and forecast.

Why: agent load follows the working day (people start at 9). An autoscaler that reacts only to
observed demand meets each morning ramp late by a worker's start-up time; the schedule and the
forecast (slots/autoscaler/ahead.py) raise the minimum ahead of it. This module builds the
workload the comparison runs on and measures what the issue asks: Guaranteed and Burstable p99
waits of the requests made in the ramp hour, and worker-seconds.

The workload (`build_diurnal`, shipped as samples/diurnal-3d.csv.xz by scripts/make_diurnal_sample.py):
`days` days; in hour `h` of each day `round(peak_per_hour * DAY_PROFILE[h])` sessions start, at
times drawn from the shipped Azure arrivals sample's shape (its 58 minutes stretched onto the
hour: its bursts and lulls), and a morning wave of `wave` more in the first `wave_s` of 9:00 (the
same shape squeezed: people start work within minutes of each other); each session is a shipped
Claude Code session (closed-loop periods, `traces/convert.periods`), tenants and classes drawn
as `slotsched trace import` draws them.
Time 0 is a midnight, UTC (a Thursday: the epoch's), so a schedule's windows apply as written.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from scheduler.core.types import Decision, Granted, QoS
from scheduler.policy.model import AutoscalerSpec, ForecastSpec, Policy, ScheduleSpec, ScheduleWindow
from scheduler.sim.decider import Decider
from scheduler.sim.elastic import ElasticPool, ElasticStats
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.stats import percentile
from scheduler.sim.traces.convert import (
    CLASS_ORDER,
    TraceSession,
    _shuffled_labels,
    exact_counts,
    periods,
    pick_sessions,
    tenant_names,
    zipf_weights,
)
from scheduler.sim.workload import SessionPlan

DAY_S = 86400.0
# Share of the peak hour's session starts, by hour of the day: quiet nights, a ramp at 9.
DAY_PROFILE: tuple[float, ...] = (
    0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.1,  # 00-08
    0.2, 1.0, 1.0, 0.9, 0.6, 0.8, 0.9, 0.8,  # 08-16
    0.6, 0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05,  # 16-24
)  # fmt: skip
RAMP_HOUR = 9  # the hour whose requests the ramp figures measure
MODES = ("reactive", "scheduled", "forecast")


def build_diurnal(
    sessions: dict[str, TraceSession],
    arrivals: Sequence[float],
    *,
    days: int = 3,
    peak_per_hour: int = 120,
    wave: int = 60,
    wave_s: float = 600.0,
    tenants: int = 8,
    mix: tuple[float, float, float] = (0.15, 0.45, 0.4),
    gap_threshold_s: float = 120.0,
    seed: int = 45,
) -> list[SessionPlan]:
    rng = random.Random(seed)
    span = arrivals[-1] - arrivals[0]
    starts: list[float] = []
    for d in range(days):
        for h, share in enumerate(DAY_PROFILE):
            n = round(peak_per_hour * share)
            picks = rng.sample(list(arrivals), n)
            starts += [d * DAY_S + h * 3600.0 + (t - arrivals[0]) / span * 3599.0 for t in picks]
        # The morning wave: people start work at 9, within minutes of each other.
        picks = rng.sample(list(arrivals), wave)
        starts += [d * DAY_S + RAMP_HOUR * 3600.0 + (t - arrivals[0]) / span * wave_s for t in picks]
    starts.sort()
    n = len(starts)
    chosen = pick_sessions(list(sessions), n, rng)
    names = tenant_names(tenants)
    who = _shuffled_labels(names, exact_counts(n, zipf_weights(tenants, 1.1)), rng)
    classes = _shuffled_labels([q.value for q in CLASS_ORDER], exact_counts(n, mix), rng)
    plans = []
    for (trace_id, sid), start, tenant, qos in zip(chosen, starts, who, classes, strict=True):
        ps = periods(sessions[trace_id], gap_threshold_s, round(start, 3))
        if ps:
            plans.append(SessionPlan(sid, tenant, QoS(qos), ps))
    return sorted(plans, key=lambda p: (p.arrival_s, p.session_id))


def with_mode(policy: Policy, mode: str, *, peak_workers: int = 0) -> Policy:
    """The policy of one contender: `reactive` as it is; `scheduled` with a window 08:45-18:00 of
    `peak_workers` (an operator's guess: the peak seen); `forecast` looking back 2 days."""
    a: AutoscalerSpec = policy.autoscaler
    if mode == "reactive":
        a = replace(a, schedule=ScheduleSpec(), forecast=ForecastSpec())
    elif mode == "scheduled":
        window = ScheduleWindow(start_min=8 * 60 + 45, end_min=18 * 60, min_workers=peak_workers)
        a = replace(a, schedule=ScheduleSpec("UTC", (window,)), forecast=ForecastSpec())
    elif mode == "forecast":
        a = replace(a, schedule=ScheduleSpec(), forecast=ForecastSpec(lookback_days=2))
    else:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    return replace(policy, autoscaler=a)


class _MarksBeyond(list[float]):
    """SimStats.beyond_quota, which also marks the grant just recorded as beyond quota (the
    simulator appends to it right after recording that Guaranteed grant)."""

    def __init__(self, grants: list[list[object]]) -> None:
        super().__init__()
        self._grants = grants

    def append(self, wait: float) -> None:
        super().append(wait)
        self._grants[-1][3] = True


@dataclass
class DiurnalStats(ElasticStats):
    """ElasticStats that also keep each grant's request time and class (the ramp figures), and
    a series of (time, capacity in slots, demand in slots) for the plot."""

    grants: list[list[object]] = field(default_factory=list)  # [asked at, class, waited, beyond quota]
    series: list[tuple[float, int, int]] = field(default_factory=list)
    min_capacity_after_start: int | None = None

    def __post_init__(self) -> None:
        self.beyond_quota = _MarksBeyond(self.grants)

    def record(self, d: Decision, now: float) -> None:
        super().record(d, now)
        if isinstance(d, Granted):
            self.grants.append([now - d.waited_s, d.lease.qos.value, d.waited_s, False])

    def capacity_changed(self, now: float, capacity: int) -> None:
        super().capacity_changed(now, capacity)
        if now > 0:
            low = self.min_capacity_after_start
            self.min_capacity_after_start = capacity if low is None else min(low, capacity)

    def sample(self, now: float, core: Decider) -> None:
        super().sample(now, core)
        view = core.describe()
        self.series.append((now, view.capacity, sum(view.held) + sum(view.pending)))


def ramp_waits(stats: DiurnalStats, cls: str, days: Sequence[int], hour: int = RAMP_HOUR) -> list[float]:
    """Waits of the `cls` requests made in `hour` of each of `days`. Guaranteed: those within
    their tenant's quota, the ones capacity serves (one beyond quota waits for its tenant's own
    leases to end, however large the pool: design.md, "QoS classes")."""
    out: list[float] = []
    for asked, c, w, beyond in stats.grants:
        assert isinstance(asked, float) and isinstance(w, float)
        if c != cls or beyond:
            continue
        if any(d * DAY_S + hour * 3600 <= asked < d * DAY_S + (hour + 1) * 3600 for d in days):
            out.append(w)
    return out


def ramp_p99(stats: DiurnalStats, cls: str, days: Sequence[int], hour: int = RAMP_HOUR) -> float:
    waits = ramp_waits(stats, cls, days, hour)
    return percentile(waits, 99) if waits else 0.0


def run_mode(
    policy: Policy, plans: list[SessionPlan], mode: str, *, peak_workers: int = 0, period_s: float = 15.0
) -> DiurnalStats:
    pol = with_mode(policy, mode, peak_workers=peak_workers)
    days = math.ceil(max(p.arrival_s for p in plans) / DAY_S)
    sim = Simulator(
        pol, plans, SimConfig(until_s=days * DAY_S, sample_every_s=300.0), hook=ElasticPool(period_s)
    )
    sim.stats = DiurnalStats(pol)
    stats = sim.run()
    assert isinstance(stats, DiurnalStats)
    return stats
