"""Prometheus metrics of the autoscaler loop, in a registry the caller passes in.

Why the caller's registry: the server exports one registry per server (tests run several in one
process), and the simulator passes none at all. Label children are created lazily: a reason that
never happened is absent, not a row of zeros.

Many pools: one set of metrics for every pool's loop (`pooled`), each series with a `pool`
label; a policy of one pool keeps the unlabelled series of before pools.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from slots.autoscaler.decision import ScaleDecision


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

    def observe(self, decision: ScaleDecision, direction: str, pool: str | None = None) -> None:
        by = (pool or "",) if self.pooled else ()
        self.decisions.labels(*by, direction, decision.reason.value).inc()
        gauges = (
            (self.desired, decision.desired),
            (self.at_ceiling, 1 if decision.at_ceiling else 0),
            (self.estimated_drain, decision.estimated_drain_s),
            (self.weighted_demand, decision.weighted_demand_slots),
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
