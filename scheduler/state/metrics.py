"""The Prometheus metrics of a Redis-backed replica: journal appends, leadership, recoveries, the
hot standby's following and take-overs (replica.py updates them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class StateMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.flush = Histogram(
            "slotsched_journal_flush_seconds",
            "Time to append one batch of events to the Redis journal.",
            buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0),
            registry=registry,
        )
        self.errors = Counter(
            "slotsched_journal_errors",
            "Journal appends that failed (replica stepped down).",
            registry=registry,
        )
        self.leader = Gauge(
            "slotsched_is_leader", "1 while this replica is the serving leader.", registry=registry
        )
        self.recoveries = Counter(
            "slotsched_recoveries", "State recoveries from Redis (start-up or takeover).", registry=registry
        )
        self.standby_applied = Counter(
            "slotsched_standby_applied_entries",
            "Journal entries a standby applied to its live core while following the leader.",
            registry=registry,
        )
        self.takeover_entries = Counter(
            "slotsched_takeover_journal_entries",
            "Journal entries read at take-over (a hot standby reads only the last few).",
            registry=registry,
        )
        self.takeover = Histogram(
            "slotsched_takeover_seconds",
            "From winning the leader lease to serving (catch-up or recovery, Resumed journaled).",
            buckets=(1e-3, 5e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=registry,
        )
