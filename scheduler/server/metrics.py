"""Prometheus metrics of what the scheduler decided, Kueue-style names.

Why plain counters instead of prometheus_client's Counter/Histogram objects: every grant passes
through `observe`, and those objects take a lock and resolve labels on each update, which cost
more than the decision itself. Here the event loop (the only writer) bumps ints and bucket lists;
a custom collector turns them into metric families when /metrics is scraped, on the HTTP server's
thread (reading ints another thread writes is safe under the GIL; a scrape may see a histogram
one observation behind, never a torn value).

Gauges (pending, held, fair share, capacity, floor) come from `core.describe()` at scrape time.
Only the event loop may touch the core, so the collector asks the loop for the view
(`describe_threadsafe`). Each server has its own CollectorRegistry: tests run several servers.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

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
    YieldCancelled,
    YieldCause,
    YieldRequested,
)
from scheduler.core.views import PoolView

CLASS_ORDER: tuple[QoS, ...] = tuple(QoS)  # the index order of PoolView/TenantView tuples

TIME_TO_SLOT_BUCKETS = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0
)  # fmt: skip
LATENCY_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)

Describe = Callable[[], "PoolView | None"]


class _Histogram:
    """Bucket counts (non-cumulative, last one +Inf) and a sum; written by one thread only."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # first bound >= value: `le` semantics
        self.total += value

    def family_samples(self) -> tuple[list[tuple[str, float]], float]:
        counts, total = list(self.counts), self.total
        buckets, running = [], 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), counts, strict=True):
            running += n
            buckets.append((bound, float(running)))
        return buckets, total


class Metrics:
    """Counters and histograms of one server, exported through its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.grants = dict.fromkeys(QoS, 0)
        self.time_to_slot = {q: _Histogram(TIME_TO_SLOT_BUCKETS) for q in QoS}
        self.preemptions = dict.fromkeys(YieldCause, 0)
        self.revocations = dict.fromkeys(RevokeReason, 0)
        self.refusals = dict.fromkeys(RefuseReason, 0)
        self.yields = 0
        self.yields_cancelled = 0
        self.expiries = 0
        self.work_lost = 0.0
        self.latency = _Histogram(LATENCY_BUCKETS)
        # (tenant or role:admin / role:worker, rpc) -> calls refused by a rate limit
        self.rate_limited: dict[tuple[str, str], int] = {}
        self.describe: Describe = lambda: None
        self.registry.register(_Collector(self))

    def bind(self, describe: Describe) -> None:
        """Where the pool gauges come from (the loop's thread-safe describe)."""
        self.describe = describe

    def count_rate_limited(self, tenant: str, rpc: str) -> None:
        key = (tenant, rpc)
        self.rate_limited[key] = self.rate_limited.get(key, 0) + 1

    def observe(self, decisions: Sequence[Decision], latency_s: float) -> None:
        self.latency.observe(latency_s)
        for d in decisions:
            if isinstance(d, Granted):
                q = d.lease.qos
                self.grants[q] += 1
                self.time_to_slot[q].observe(d.waited_s)
            elif isinstance(d, YieldRequested):
                self.preemptions[d.cause] += 1
            elif isinstance(d, YieldCancelled):
                self.yields_cancelled += 1
            elif isinstance(d, Ended):
                if d.reason is EndReason.YIELDED:
                    self.yields += 1
            elif isinstance(d, Revoked):
                self.revocations[d.reason] += 1
                self.work_lost += d.lost_slot_seconds
            elif isinstance(d, Expired):
                self.expiries += 1
                self.work_lost += d.lost_slot_seconds
            elif isinstance(d, Refused):
                self.refusals[d.reason] += 1


class _Collector(Collector):
    def __init__(self, m: Metrics) -> None:
        self.m = m

    def describe(self) -> list[Metric]:
        return []  # so register() does not run collect(), which would call into the loop

    def collect(self) -> Iterator[Metric]:
        m = self.m
        yield _counter("slotsched_grants", "Leases granted.", "class", m.grants)
        tts = HistogramMetricFamily(
            "slotsched_time_to_slot_seconds",
            "Wait from entering the queue (or re-queue) to a grant.",
            labels=["class"],
        )
        for q, h in m.time_to_slot.items():
            buckets, total = h.family_samples()
            tts.add_metric([q.value], buckets, total)
        yield tts
        yield _counter("slotsched_preemptions", "Holders asked to yield, by cause.", "cause", m.preemptions)
        yield CounterMetricFamily("slotsched_yields", "Leases given up by Yield.", value=m.yields)
        yield CounterMetricFamily(
            "slotsched_yields_cancelled",
            "Yield requests called off: the waiter left and no other waiter had a right to the lease.",
            value=m.yields_cancelled,
        )
        yield _counter(
            "slotsched_revocations",
            "Leases revoked without a yield.",
            "reason",
            m.revocations,
        )
        yield CounterMetricFamily("slotsched_expiries", "Leases expired (not renewed).", value=m.expiries)
        yield _counter("slotsched_refusals", "Acquires refused.", "reason", m.refusals)
        limited = CounterMetricFamily(
            "slotsched_rate_limited",
            "Calls refused by a rate limit (spec.rateLimits), by tenant (or role:admin/role:worker), rpc.",
            labels=["tenant", "rpc"],
        )
        for (tenant, rpc), n in list(m.rate_limited.items()):
            limited.add_metric([tenant, rpc], n)
        yield limited
        yield CounterMetricFamily(
            "slotsched_work_lost_slot_seconds",
            "Slot-seconds of work lost to revocations and expiries.",
            value=m.work_lost,
        )
        lat = HistogramMetricFamily(
            "slotsched_decision_latency_seconds", "Time spent in Core.handle per event."
        )
        buckets, total = m.latency.family_samples()
        lat.add_metric([], buckets, total)
        yield lat
        yield from _pool_gauges(m.describe())


def _counter(name: str, doc: str, label: str, values: Mapping[Any, int]) -> CounterMetricFamily:
    """One counter family with one sample per enum member (label value = the member's value)."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in values.items():
        family.add_metric([key.value], n)
    return family


def _pool_gauges(view: PoolView | None) -> Iterator[Metric]:
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
