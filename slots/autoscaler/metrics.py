"""Prometheus metrics of the autoscaler loop, in a registry the caller passes in.

Why the caller's registry: the server exports one registry per server (tests run several in one
process), and the simulator passes none at all. Label children are created lazily: a reason that
never happened is absent, not a row of zeros.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from slots.autoscaler.decision import ScaleDecision


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.desired = Gauge(
            "slotsched_autoscaler_desired_workers",
            "Ready workers the autoscaler wants (after damping, within min and max).",
            registry=registry,
        )
        self.decisions = Counter(
            "slotsched_autoscaler_decisions",
            "Autoscaler decisions by direction (up, down, none) and the rule that set them.",
            ["direction", "reason"],
            registry=registry,
        )
        self.at_ceiling = Gauge(
            "slotsched_autoscaler_at_ceiling",
            "1 while weighted demand exceeds what maxWorkers can hold: scheduling, not scaling, decides.",
            registry=registry,
        )
        self.estimated_drain = Gauge(
            "slotsched_autoscaler_estimated_drain_seconds",
            "Estimated time to serve today's queue at the desired size.",
            registry=registry,
        )
        self.weighted_demand = Gauge(
            "slotsched_autoscaler_weighted_demand_slots",
            "Busy slots plus weighted pending requests plus floor headroom, in slots.",
            registry=registry,
        )
        self.actuator_errors = Counter(
            "slotsched_autoscaler_actuator_errors",
            "Failed calls to the actuator or the pool membership, retried on a later tick.",
            registry=registry,
        )

    def observe(self, decision: ScaleDecision, direction: str) -> None:
        self.desired.set(decision.desired)
        self.decisions.labels(direction, decision.reason.value).inc()
        self.at_ceiling.set(1 if decision.at_ceiling else 0)
        self.estimated_drain.set(decision.estimated_drain_s)
        self.weighted_demand.set(decision.weighted_demand_slots)
