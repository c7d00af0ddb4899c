"""Prometheus metrics of what the scheduler decided, Kueue-style names.

Two kinds, two paths:

* counters and histograms are observed from each decision as `submit` returns (label children are
  resolved once, so the hot path is a dict lookup and an increment);
* gauges (pending, held, fair share, capacity, floor) are read from `core.describe()` at scrape
  time by a custom collector. The scrape runs on the HTTP server's thread while only the event
  loop may touch the core, so the collector asks the loop for the view (`describe_threadsafe`).

Each server has its own CollectorRegistry: tests run several servers in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler.core.engine import PoolView
from scheduler.core.types import (
    Decision,
    Ended,
    EndReason,
    Expired,
    Granted,
    QoS,
    Refused,
    RefuseReason,
    Revoked,
    RevokeReason,
    YieldCause,
    YieldRequested,
)

CLASS_ORDER: tuple[QoS, ...] = tuple(QoS)  # the index order of PoolView/TenantView tuples

TIME_TO_SLOT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
LATENCY_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)

Describe = Callable[[], "PoolView | None"]


class _PoolCollector(Collector):
    """Gauges computed from the pool view at scrape time (never stale, no label leftovers)."""

    def __init__(self) -> None:
        self.source: Describe = lambda: None

    def describe(self) -> list[Metric]:
        return []  # so register() does not run collect(), which would call into the loop

    def collect(self) -> Iterator[Metric]:
        view = self.source()
        if view is None:
            return
        pending = GaugeMetricFamily(
            "slotsched_pending_sessions", "Requests waiting for a slot.", labels=["class", "tenant"]
        )
        held = GaugeMetricFamily(
            "slotsched_held_leases", "Leases held (incl. yielding).", labels=["class", "tenant"]
        )
        share = GaugeMetricFamily(
            "slotsched_fair_share", "Borrowed capacity / weight, per tenant.", labels=["tenant"]
        )
        for t in view.tenants:
            for i, q in enumerate(CLASS_ORDER):
                pending.add_metric([q.value, t.name], t.pending[i])
                held.add_metric([q.value, t.name], t.held[i])
            share.add_metric([t.name], t.share)
        yield pending
        yield held
        yield share
        yield GaugeMetricFamily("slotsched_capacity_slots", "Slots on ready workers.", value=view.capacity)
        yield GaugeMetricFamily("slotsched_floor_slots", "The reserved floor, in slots.", value=view.floor)
        yield GaugeMetricFamily("slotsched_free_slots", "Slots free for a grant now.", value=view.free)


class Metrics:
    """Counters, histograms and the pool collector of one server, in its own registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        grants = Counter("slotsched_grants", "Leases granted.", ["class"], registry=r)
        ttslot = Histogram(
            "slotsched_time_to_slot_seconds",
            "Wait from entering the queue (or re-queue) to a grant.",
            ["class"],
            buckets=TIME_TO_SLOT_BUCKETS,
            registry=r,
        )
        preempt = Counter("slotsched_preemptions", "Holders asked to yield, by cause.", ["cause"], registry=r)
        revoke = Counter("slotsched_revocations", "Leases revoked without a yield.", ["reason"], registry=r)
        refuse = Counter("slotsched_refusals", "Acquires refused.", ["reason"], registry=r)
        self.yields = Counter("slotsched_yields", "Leases given up by Yield.", registry=r)
        self.expiries = Counter("slotsched_expiries", "Leases expired (not renewed).", registry=r)
        self.work_lost = Counter(
            "slotsched_work_lost_slot_seconds",
            "Slot-seconds of work lost to revocations and expiries.",
            registry=r,
        )
        self.latency = Histogram(
            "slotsched_decision_latency_seconds",
            "Time spent in Core.handle per event.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # Label children resolved once: .labels() takes a lock and hashes on every call.
        self._grants = {q: grants.labels(q.value) for q in QoS}
        self._ttslot = {q: ttslot.labels(q.value) for q in QoS}
        self._preempt = {c: preempt.labels(c.value) for c in YieldCause}
        self._revoke = {c: revoke.labels(c.value) for c in RevokeReason}
        self._refuse = {c: refuse.labels(c.value) for c in RefuseReason}
        self._pool = _PoolCollector()
        r.register(self._pool)

    def bind(self, describe: Describe) -> None:
        """Where the pool gauges come from (the loop's thread-safe describe)."""
        self._pool.source = describe

    def observe(self, decisions: Sequence[Decision], latency_s: float) -> None:
        self.latency.observe(latency_s)
        for d in decisions:
            if isinstance(d, Granted):
                q = d.lease.qos
                self._grants[q].inc()
                self._ttslot[q].observe(d.waited_s)
            elif isinstance(d, YieldRequested):
                self._preempt[d.cause].inc()
            elif isinstance(d, Ended):
                if d.reason is EndReason.YIELDED:
                    self.yields.inc()
            elif isinstance(d, Revoked):
                self._revoke[d.reason].inc()
                self.work_lost.inc(d.lost_slot_seconds)
            elif isinstance(d, Expired):
                self.expiries.inc()
                self.work_lost.inc(d.lost_slot_seconds)
            elif isinstance(d, Refused):
                self._refuse[d.reason].inc()
