"""The Prometheus metrics of a Redis-backed replica: journal appends, leadership, recoveries, the
hot standby's following and take-overs (replica.py updates them).

Per-pool leadership runs one replica per pool in a process: `StateMetrics(registry, pools=True)`
makes every metric carry a `pool` label (one registry holds each metric once) and `for_pool`
gives one pool's replica its children, which have the same methods."""

from __future__ import annotations

import copy

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class StateMetrics:
    def __init__(self, registry: CollectorRegistry, *, pools: bool = False) -> None:
        labels = ("pool",) if pools else ()
        self.flush = Histogram(
            "slotsched_journal_flush_seconds",
            "Time to append one batch of events to the Redis journal.",
            labels,
            buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0),
            registry=registry,
        )
        self.errors = Counter(
            "slotsched_journal_errors",
            "Journal appends that failed (replica stepped down).",
            labels,
            registry=registry,
        )
        self.leader = Gauge(
            "slotsched_is_leader",
            "1 while this replica is the serving leader (of the pool, with per-pool leadership).",
            labels,
            registry=registry,
        )
        self.recoveries = Counter(
            "slotsched_recoveries",
            "State recoveries from Redis (start-up or takeover).",
            labels,
            registry=registry,
        )
        self.standby_applied = Counter(
            "slotsched_standby_applied_entries",
            "Journal entries a standby applied to its live core while following the leader.",
            labels,
            registry=registry,
        )
        self.takeover_entries = Counter(
            "slotsched_takeover_journal_entries",
            "Journal entries read at take-over (a hot standby reads only the last few).",
            labels,
            registry=registry,
        )
        self.takeover = Histogram(
            "slotsched_takeover_seconds",
            "From winning the leader lease to serving (catch-up or recovery, Resumed journaled).",
            labels,
            buckets=(1e-3, 5e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=registry,
        )

    def for_pool(self, pool: str) -> StateMetrics:
        """One pool's metrics (of a `pools=True` instance): the same names, its label."""
        child = copy.copy(self)
        for name, metric in vars(self).items():
            setattr(child, name, metric.labels(pool=pool))
        return child
