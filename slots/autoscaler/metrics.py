"""Prometheus metrics of the autoscaler loop, in a registry the caller passes in.

Why the caller's registry: the server exports one registry per server (tests run several in one
process), and the simulator passes none at all. Label children are created lazily: a reason that
never happened is absent, not a row of zeros.

Many pools: one set of metrics for every pool's loop (`pooled`), each series with a `pool`
label; a policy of one pool keeps the unlabelled series of before pools.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from slots.autoscaler.decision import ScaleDecision, ScaleInput


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry, *, pooled: bool = False) -> None:
        self.pooled = pooled
        pool = ["pool"] if pooled else []
        self.desired = Gauge(
            "slotsched_autoscaler_desired_workers",
            "Ready workers the autoscaler wants (after damping, within min and max).",
            pool,
            registry=registry,
        )
        self.decisions = Counter(
            "slotsched_autoscaler_decisions",
            "Autoscaler decisions by direction (up, down, none) and the rule that set them.",
            [*pool, "direction", "reason"],
            registry=registry,
        )
        self.at_ceiling = Gauge(
            "slotsched_autoscaler_at_ceiling",
            "1 while weighted demand exceeds what maxWorkers can hold: scheduling, not scaling, decides.",
            pool,
            registry=registry,
        )
        self.estimated_drain = Gauge(
            "slotsched_autoscaler_estimated_drain_seconds",
            "Estimated time to serve today's queue at the desired size.",
            pool,
            registry=registry,
        )
        self.weighted_demand = Gauge(
            "slotsched_autoscaler_weighted_demand_slots",
            "Busy slots plus weighted pending requests plus floor headroom, in slots.",
            pool,
            registry=registry,
        )
        self.budget_cap = Gauge(
            "slotsched_autoscaler_budget_cap_workers",
            "Workers the pool's token budgets can feed (effective limit over an active session's "
            "rate, in workers); -1 while no cap is known (no budget, or none charged lately).",
            pool,
            registry=registry,
        )
        self.actuator_errors = Counter(
            "slotsched_autoscaler_actuator_errors",
            "Failed calls to the actuator or the pool membership, retried on a later tick.",
            pool,
            registry=registry,
        )
        self.dry_run_actions = Counter(
            "slotsched_autoscaler_dry_run_actions",
            "What a dry run would have done, in workers: action drain (then removed) or start.",
            [*pool, "action"],
            registry=registry,
        )

        self.oldest_wait = Gauge(
            "slotsched_autoscaler_oldest_wait_seconds",
            "How long the oldest queued request of each QoS class has waited (0: none queued).",
            [*pool, "class"],
            registry=registry,
        )
        self.ahead_workers = Gauge(
            "slotsched_autoscaler_ahead_workers",
            "The minimum of workers the schedule or the forecast raised ahead of a known peak (0: none).",
            pool,
            registry=registry,
        )
        self.direction_changes = Counter(
            "slotsched_autoscaler_direction_changes",
            "Decisions that reversed the pool's direction (up after down, or down after up): flapping.",
            pool,
            registry=registry,
        )
        self._last_direction: dict[str, str] = {}
        self.recycles = Counter(
            "slotsched_autoscaler_recycles",
            "Workers drained to be replaced (spec.autoscaler.recycle), by cause: memory or age.",
            [*pool, "cause"],
            registry=registry,
        )

    def observe_input(self, inp: ScaleInput, ahead: int, pool: str | None = None) -> None:
        by = (pool or "",) if self.pooled else ()
        for cls, wait in sorted(inp.oldest_wait_by_class.items()):
            waiting = inp.pending_by_class.get(cls, 0) > 0
            self.oldest_wait.labels(*by, cls).set(wait if waiting else 0.0)
        (self.ahead_workers.labels(*by) if by else self.ahead_workers).set(ahead)

    def count_recycle(self, cause: str, n: int, pool: str | None = None) -> None:
        by = (pool or "",) if self.pooled else ()
        self.recycles.labels(*by, cause).inc(n)

    def observe(self, decision: ScaleDecision, direction: str, pool: str | None = None) -> None:
        by = (pool or "",) if self.pooled else ()
        self.decisions.labels(*by, direction, decision.reason.value).inc()
        if direction != "none":
            last = self._last_direction.get(pool or "")
            if last is not None and last != direction:
                (self.direction_changes.labels(*by) if by else self.direction_changes).inc()
            self._last_direction[pool or ""] = direction
        gauges = (
            (self.desired, decision.desired),
            (self.at_ceiling, 1 if decision.at_ceiling else 0),
            (self.estimated_drain, decision.estimated_drain_s),
            (self.weighted_demand, decision.weighted_demand_slots),
            (self.budget_cap, -1 if decision.budget_workers is None else decision.budget_workers),
        )
        for gauge, value in gauges:
            (gauge.labels(*by) if by else gauge).set(value)

    def count_errors(self, n: int, pool: str | None = None) -> None:
        counter = self.actuator_errors.labels(pool or "") if self.pooled else self.actuator_errors
        counter.inc(n)

    def count_would(self, action: str, n: int, pool: str | None = None) -> None:
        if n:
            by = (pool or "",) if self.pooled else ()
            self.dry_run_actions.labels(*by, action).inc(n)


class DemandGauges(Collector):
    """The drain estimate and the oldest waits, read at each scrape, for a scheduler that runs no
    built-in loop (KEDA's HPA sizes the pool): the same series the loop exports, each with its
    `pool`, so the alerts on them hold in either mode. A pool that cannot be read (a standby's
    stale core) is left out of the scrape."""

    def __init__(
        self, pools: Callable[[], Sequence[str]], read: Callable[[str], tuple[ScaleInput, ScaleDecision]]
    ) -> None:
        self._pools = pools
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        drain = GaugeMetricFamily(
            "slotsched_autoscaler_estimated_drain_seconds",
            "Estimated time to serve today's queue at the desired size.",
            labels=["pool"],
        )
        oldest = GaugeMetricFamily(
            "slotsched_autoscaler_oldest_wait_seconds",
            "How long the oldest queued request of each QoS class has waited (0: none queued).",
            labels=["pool", "class"],
        )
        for pool in self._pools():
            try:
                inp, d = self._read(pool)
            except Exception:  # not readable here now (a standby): absent, not wrong
                continue
            drain.add_metric([pool], d.estimated_drain_s)
            for cls, wait in sorted(inp.oldest_wait_by_class.items()):
                oldest.add_metric([pool, cls], wait if inp.pending_by_class.get(cls, 0) > 0 else 0.0)
        yield drain
        yield oldest
