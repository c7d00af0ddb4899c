"""The companion autoscaler's decision: how many workers the pool wants, and which to drain.

Why a pure function: the loop around it gathers every input first, calls `decide`, then acts (the
shape of Ray autoscaler v2's `schedule`). The decision reads no clock and does no I/O — `now` and
the history are passed in and a new history is handed back — so the simulator, a replay and a
table test call the very same code and compare decisions with `==`.

The recommendation is weighted demand (DESIGN.md, "The companion autoscaler"):

    demand = busy + sum over classes of weight * pending + floor headroom        (in slots)
    recommendation = clamp(ceil(demand / slots_per_worker), min_workers, max_workers)

Floor headroom is `max(0, floor - Guaranteed busy - Guaranteed pending)`: the part of the floor
that no Guaranteed session holds or waits for. It must exist as capacity beyond `busy` (idle, or
lent to preemptible work, which `busy` already counts), so a Guaranteed arrival is served without
a preemption; Guaranteed work already in busy or pending is not counted twice. Free slots are not
subtracted: they depend on the very pool size being decided, and subtracting them would make the
recommendation shrink as the pool grows, so the loop would oscillate.

A pool's token budgets cap what it adds (spec.pools[].budgets; docs/design.md, "Token budgets"):
the sessions its budgets can feed are the fewest, over its budgets and their dimensions, of
effective limit ÷ what an active session was charged a minute lately; the workers to hold them,
`ceil(sessions / slots_per_worker)`, bound a scale-up (reason `budget`), never below the ready
workers or min_workers: the cap adds no worker the provider's limit cannot feed (it would sit
warm and idle) and drains none (a budget is not demand, and its effective limit moves with 429s).

The damping rules are the Kubernetes HPA's, borrowed as pure steps (see `decide`). `current` is
the ready workers: draining ones are already leaving, give no capacity and are never drained again.
`desired` is a target for ready workers; workers only leave through `drain`, so an actuator starts
workers while ready + starting < desired and never cancels a starting one because desired is lower.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.core.types import QoS
from scheduler.core.views import BudgetFeed
from scheduler.policy.model import Policy

# Demand is a float sum of weights; this keeps 2.0000000000000004 slots from asking for a worker.
_EPS = 1e-9


class ScaleWorkerState(enum.StrEnum):
    """A worker's state as the decision sees it (not the core's `lifecycle.WorkerState`)."""

    READY = "ready"
    DRAINING = "draining"  # no new grants; its sessions checkpoint-and-yield or finish
    # Serving, but to be replaced (past spec.autoscaler.recycle): the decision counts it as gone
    # already (not in `current`, never drained by it), so `desired` asks for its replacement;
    # the loop drains it once the others make up `desired` (loop.py).
    RECYCLING = "recycling"


class Reason(enum.StrEnum):
    """The rule that set `desired` (the last one that bound it)."""

    STEADY = "steady"  # the recommendation is the current size
    WITHIN_TOLERANCE = "within_tolerance"  # HPA: |recommendation / current - 1| <= tolerance
    SCALE_UP = "scale_up"
    SCALE_UP_RATE_LIMITED = "scale_up_rate_limited"  # HPA scale-up policies capped the step
    SCALE_DOWN = "scale_down"
    SCALE_DOWN_STABILIZED = "scale_down_stabilized"  # HPA: a higher recommendation in the window
    COOLDOWN = "cooldown"  # too soon after the last scale-up (or scale-down)
    AT_MIN = "at_min"  # demand is below min_workers
    AT_MAX = "at_max"  # demand is above max_workers
    SCALE_DOWN_RATE_LIMITED = "scale_down_rate_limited"  # HPA scale-down policies capped the step
    OLDEST_WAIT = "oldest_wait"  # a request waited past scaleUp.oldestWaitSeconds: one more worker
    SCHEDULED = "scheduled"  # a schedule window's minimum (ahead.py) set the size
    FORECAST = "forecast"  # the forecast of recorded demand (ahead.py) set the size
    RECYCLE = "recycle"  # a replacement for a worker past spec.autoscaler.recycle (loop.py)
    BUDGET = "budget"  # the pool's token budgets cannot feed more active sessions (budget_cap)


@dataclass(frozen=True)
class ScaleWorker:
    """One worker as the decision sees it (not the core's `WorkerView`)."""

    worker_id: str
    state: ScaleWorkerState
    busy_slots: int
    lease_cost_s: float  # slot-seconds of work that would need to checkpoint/move if drained
    ready_since: float
    rss_bytes: int = 0  # resident memory the worker last reported (0: not reported)
    started_at: float | None = None  # when its process started, as it reported (None: unknown)


@dataclass(frozen=True)
class ScaleInput:
    now: float
    workers: tuple[ScaleWorker, ...]
    slots_per_worker: int
    busy_by_class: Mapping[str, int]  # leases held per QoS class, on draining workers too
    pending_by_class: Mapping[str, int]  # queued sessions per QoS class
    oldest_wait_by_class: Mapping[str, float]  # carried for the loop's report; no rule reads it yet
    floor_slots: int  # the floor in slots (PoolSpec.floor_slots of the current capacity)
    mean_hold_s: float  # mean time a lease holds its slot
    budgets: tuple[BudgetFeed, ...] = ()  # the pool's token budgets, for the cap (budget_cap)
    # Queued sessions with a quota claim (Guaranteed within its tenant's guaranteed, Burstable
    # below its nominal): the budget cap never withholds their workers (budget_cap).
    claimed_pending: int = 0

    def __post_init__(self) -> None:
        if self.slots_per_worker < 1:
            raise ValueError(f"slots_per_worker must be at least 1, not {self.slots_per_worker}")


@dataclass(frozen=True)
class ScaleConfig:
    min_workers: int
    max_workers: int
    weights: Mapping[str, float]  # by QoS class value; a class not listed weighs 1
    tolerance: float
    scale_up_pods: int
    scale_up_percent: float
    scale_up_period_s: float
    stabilization_s: float
    scale_up_cooldown_s: float
    scale_down_cooldown_s: float
    scale_down_pods: int = 0  # HPA scale-down policies: at most this many per period (0: no limit)
    scale_down_percent: float = 100.0  # ... and at most this percent of the pool (100: no limit)
    scale_down_period_s: float = 15.0
    oldest_wait_s: float = 0.0  # scale up by one while a request waited this long (0: off)
    ahead_workers: int = 0  # a minimum raised ahead of a known peak (ahead.py), bounded by max
    ahead_reason: Reason = Reason.SCHEDULED  # SCHEDULED or FORECAST: which raised it

    def __post_init__(self) -> None:
        if not 0 <= self.min_workers <= self.max_workers:
            raise ValueError(f"need 0 <= min <= max workers, not {self.min_workers} and {self.max_workers}")

    @classmethod
    def from_policy(cls, policy: Policy) -> ScaleConfig:
        a, pool = policy.autoscaler, policy.pool
        weights = {
            QoS.GUARANTEED.value: a.weight_guaranteed,
            QoS.BURSTABLE.value: a.weight_burstable,
            QoS.BEST_EFFORT.value: a.weight_best_effort,
        }
        return cls(
            min_workers=pool.min_workers,
            max_workers=pool.max_workers,
            weights=weights,
            tolerance=a.tolerance,
            scale_up_pods=a.scale_up_pods,
            scale_up_percent=a.scale_up_percent,
            scale_up_period_s=a.scale_up_period_s,
            stabilization_s=a.scale_down_stabilization_s,
            scale_up_cooldown_s=a.scale_up_cooldown_s,
            scale_down_cooldown_s=a.scale_down_cooldown_s,
            scale_down_pods=a.scale_down_pods,
            scale_down_percent=a.scale_down_percent,
            scale_down_period_s=a.scale_down_period_s,
            oldest_wait_s=a.scale_up_oldest_wait_s,
        )


@dataclass(frozen=True)
class ScaleUp:
    at: float
    from_workers: int  # ready workers when the scale-up was decided
    to_workers: int


@dataclass(frozen=True)
class ScaleDown:
    at: float
    from_workers: int  # ready workers when the scale-down was decided
    to_workers: int


@dataclass(frozen=True)
class ScaleHistory:
    """What past decisions left behind; `decide` returns the next one, nothing is mutated."""

    recommendations: tuple[tuple[float, int], ...] = ()  # (time, recommendation) in the window
    scale_ups: tuple[ScaleUp, ...] = ()  # within the scale-up period, for the rate policies
    last_scale_up_at: float | None = None
    last_scale_down_at: float | None = None
    scale_downs: tuple[ScaleDown, ...] = ()  # within the scale-down period, for its policies

    def downs_in_period(self, now: float, cfg: ScaleConfig) -> tuple[ScaleDown, ...]:
        return tuple(d for d in self.scale_downs if d.at > now - cfg.scale_down_period_s)

    def ups_in_period(self, now: float, cfg: ScaleConfig) -> tuple[ScaleUp, ...]:
        return tuple(u for u in self.scale_ups if u.at > now - cfg.scale_up_period_s)

    def target_in_flight(self, now: float, cfg: ScaleConfig, current: int) -> int:
        """The highest scale-up target of the period: workers asked for, perhaps not ready yet."""
        return max([current, *(u.to_workers for u in self.ups_in_period(now, cfg))])

    def window_high(self, now: float, cfg: ScaleConfig) -> int | None:
        """The highest recommendation within the stabilization window, if any."""
        return max((r for t, r in self.recommendations if t > now - cfg.stabilization_s), default=None)

    def updated(
        self, now: float, cfg: ScaleConfig, recommendation: int, current: int, desired: int
    ) -> ScaleHistory:
        ups = self.ups_in_period(now, cfg)
        # A scale-up already asked for but not ready yet is asked for again each tick; only a
        # higher target is a new event (else the rate limit and the cooldown would count it twice).
        new_up = desired > self.target_in_flight(now, cfg, current)
        window = tuple((t, r) for t, r in self.recommendations if t > now - cfg.stabilization_s)
        downs = self.downs_in_period(now, cfg)
        return ScaleHistory(
            recommendations=(*window, (now, recommendation)),
            scale_ups=(*ups, ScaleUp(now, current, desired)) if new_up else ups,
            last_scale_up_at=now if new_up else self.last_scale_up_at,
            last_scale_down_at=now if desired < current else self.last_scale_down_at,
            scale_downs=(*downs, ScaleDown(now, current, desired)) if desired < current else downs,
        )


@dataclass(frozen=True)
class ScaleDecision:
    desired: int  # ready workers wanted
    drain: tuple[str, ...]  # ready workers to drain now, in drain order
    reason: Reason
    weighted_demand_slots: float
    at_ceiling: bool  # demand exceeds what max_workers can hold: scheduling, not scaling, decides
    estimated_drain_s: float  # time to serve today's queue at the desired size
    history: ScaleHistory
    budget_workers: int | None = None  # the cap of the pool's token budgets (None: no cap known)


def floor_headroom(inp: ScaleInput) -> int:
    """Floor slots no Guaranteed session holds or waits for (see the module docstring)."""
    g = QoS.GUARANTEED.value
    return max(0, inp.floor_slots - inp.busy_by_class.get(g, 0) - inp.pending_by_class.get(g, 0))


def weighted_demand(inp: ScaleInput, cfg: ScaleConfig) -> float:
    # Sorted so that equal mappings built in another order give the very same float.
    pending = sum(cfg.weights.get(c, 1.0) * n for c, n in sorted(inp.pending_by_class.items()))
    return sum(inp.busy_by_class.values()) + pending + floor_headroom(inp)


def budget_sessions(budgets: tuple[BudgetFeed, ...]) -> float | None:
    """Active sessions the budgets can feed: the fewest, over budgets and the dimensions each
    limits, of effective limit ÷ one active session's rate; None where no rate is observed yet."""
    fewest: float | None = None
    for b in budgets:
        for limit, rate in zip(b.effective_per_minute, b.per_session_per_minute, strict=True):
            if limit > 0 and rate > 0:
                n = limit / rate
                fewest = n if fewest is None else min(fewest, n)
    return fewest


def budget_cap(inp: ScaleInput) -> int | None:
    """Workers the pool's budgets can feed (see the module docstring), at least 1, and at least
    the workers for the sessions held and the queued ones with a quota claim; None: no cap."""
    sessions = budget_sessions(inp.budgets)
    if sessions is None:
        return None
    claimed = sum(inp.busy_by_class.values()) + inp.claimed_pending
    return max(1, math.ceil(max(sessions, claimed) / inp.slots_per_worker - _EPS))


def drain_order(w: ScaleWorker) -> tuple[bool, float, float, str]:
    """Which ready worker goes first: idle before busy, then the least lease work to checkpoint
    and move, then the newest (the oldest keep their warm caches), then id, for determinism."""
    return (w.busy_slots > 0, w.lease_cost_s, -w.ready_since, w.worker_id)


def oldest_wait_due(inp: ScaleInput, cfg: ScaleConfig) -> bool:
    """A request of some class has waited past scaleUp.oldestWaitSeconds (off at 0). Why: demand
    hidden by quotas, or by weights that make it look small, can wait long with no scale-up."""
    if cfg.oldest_wait_s <= 0:
        return False
    return any(
        inp.pending_by_class.get(c, 0) > 0 and wait >= cfg.oldest_wait_s
        for c, wait in inp.oldest_wait_by_class.items()
    )


def scale_down_limit(now: float, cfg: ScaleConfig, hist: ScaleHistory, current: int) -> int:
    """The fewest ready workers the HPA's scale-down policies allow now (selectPolicy Min, the
    most conservative): within one period the pool may shrink from its size at the period's start
    by at most `pods` and at most `percent` of it."""
    downs = hist.downs_in_period(now, cfg)
    base = max([current, *(d.from_workers for d in downs)])
    steps = [math.floor(base * cfg.scale_down_percent / 100 + _EPS)]
    if cfg.scale_down_pods > 0:
        steps.append(cfg.scale_down_pods)
    return max(0, min(current, base - min(steps)))


def decide(inp: ScaleInput, cfg: ScaleConfig, hist: ScaleHistory) -> ScaleDecision:
    now, hi = inp.now, cfg.max_workers
    # A minimum raised ahead of a known peak is a higher floor, never above max (ahead.py).
    lo = min(max(cfg.min_workers, cfg.ahead_workers), hi)
    at_min = cfg.ahead_reason if lo > cfg.min_workers else Reason.AT_MIN
    ready = [w for w in inp.workers if w.state is ScaleWorkerState.READY]
    # A replacement is no change in demand: neither the tolerance band nor a cooldown holds it.
    recycling = any(w.state is ScaleWorkerState.RECYCLING for w in inp.workers)
    current = len(ready)
    demand = weighted_demand(inp, cfg)
    raw = math.ceil(demand / inp.slots_per_worker - _EPS)
    waited = oldest_wait_due(inp, cfg) and raw <= current < hi
    if waited:
        raw = current + 1
    rec = min(max(raw, lo), hi)
    bound = Reason.AT_MAX if raw > hi else at_min if raw < lo else None
    desired, reason = rec, bound or Reason.STEADY

    # 1. Tolerance (HPA): no action while |rec / current - 1| <= tolerance (multiplied out, so that
    #    11 vs 10 is inside a 0.1 band). Not applied outside [min, max], nor from zero workers.
    band = cfg.tolerance * current + _EPS
    held = rec != current and current > 0 and lo <= current <= hi and abs(rec - current) <= band
    if held and not (waited or recycling):
        rec = desired = current
        reason = Reason.WITHIN_TOLERANCE
    elif rec > current:
        # 2. Scale up at once, bounded by HPA's rate policies with selectPolicy Max: within one
        #    period the pool may grow from its size at the period's start by max(pods, percent).
        ups = hist.ups_in_period(now, cfg)
        base = min([current, *(u.from_workers for u in ups)])
        step = max(cfg.scale_up_pods, math.ceil(base * cfg.scale_up_percent / 100))
        limit = max(current, base + step)
        last_up = hist.last_scale_up_at
        if last_up is not None and now - last_up < cfg.scale_up_cooldown_s and not recycling:
            # In cooldown no target beyond the one already in flight.
            limit = min(limit, hist.target_in_flight(now, cfg, current))
            desired, reason = min(rec, limit), Reason.COOLDOWN
        else:
            desired, reason = min(rec, limit), Reason.SCALE_UP_RATE_LIMITED
        if desired == rec:
            reason = bound or (Reason.OLDEST_WAIT if waited else Reason.SCALE_UP)
        if recycling and reason in (Reason.SCALE_UP, Reason.AT_MIN, Reason.AT_MAX):
            reason = Reason.RECYCLE
    elif rec < current:
        # 3. Scale down slowly (HPA stabilization): to the highest recommendation of the window,
        #    the current one included, so a brief dip in demand does not drain warm workers; then
        #    no second scale-down within the cooldown after the last one.
        high = max(rec, hist.window_high(now, cfg) or 0)
        desired = min(current, high)
        reason = Reason.SCALE_DOWN_STABILIZED if high > rec else bound or Reason.SCALE_DOWN
        last_down = hist.last_scale_down_at
        if desired < current and last_down is not None and now - last_down < cfg.scale_down_cooldown_s:
            desired, reason = current, Reason.COOLDOWN
        floor_now = scale_down_limit(now, cfg, hist, current)
        if desired < floor_now:
            # 3b. HPA scale-down policies: at most `pods` / `percent` per period, the smaller.
            desired, reason = floor_now, Reason.SCALE_DOWN_RATE_LIMITED

    # 4. min and max are hard bounds: they beat rate limits, windows and cooldowns.
    if not lo <= desired <= hi:
        desired, reason = min(max(desired, lo), hi), (at_min if desired < lo else Reason.AT_MAX)

    # 4b. The token budgets cap what is added (module docstring): never below ready or min.
    cap = budget_cap(inp)
    if cap is not None and desired > max(current, cfg.min_workers, cap):
        desired, reason = max(current, cfg.min_workers, cap), Reason.BUDGET

    # 5. Drain before removal: the `current - desired` cheapest ready workers.
    drain = tuple(w.worker_id for w in sorted(ready, key=drain_order)[: max(0, current - desired)])
    # Each slot frees once per mean hold, so the queue drains at capacity / mean_hold_s sessions
    # a second (start-up delay ignored).
    queued = sum(inp.pending_by_class.values())
    return ScaleDecision(
        desired=desired,
        drain=drain,
        reason=reason,
        weighted_demand_slots=demand,
        at_ceiling=demand > hi * inp.slots_per_worker + _EPS,
        estimated_drain_s=queued * inp.mean_hold_s / max(1, desired * inp.slots_per_worker),
        history=hist.updated(now, cfg, rec, current, desired),
        budget_workers=cap,
    )
