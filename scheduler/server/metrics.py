"""Prometheus metrics of what the scheduler decided, Kueue-style names.

Why plain counters instead of prometheus_client's Counter/Histogram objects: every grant passes
through `observe`, and those objects take a lock and resolve labels on each update, which cost
more than the decision itself. Here the event loop (the only writer) bumps ints and bucket lists;
a custom collector turns them into metric families when /metrics is scraped, on the HTTP server's
thread (reading ints another thread writes is safe under the GIL; a scrape may see a histogram
one observation behind, never a torn value).

Gauges (pending, held, fair share, quotas, capacity, floor) come from `core.describe_all()` at
scrape time, one series per pool (`pool` label). Only the event loop may touch the core, so the
collector asks the loop for the views (run there, as `describe_threadsafe` runs `describe()`).
Each server has its own CollectorRegistry: tests run several servers.

Per-pool series: every gauge, and the counters of decisions that say their pool (grants and time
to slot: the lease's; preemptions: the victim lease's; refusals: `Refused.pool`, none named: the
default pool, and `pool=""` (NO_POOL_LABEL) for a refusal before placement, whatever pool the
caller named; waits: `Queued.pool`) carry `pool`, bounded by the pools of the core (the policy's,
and retired ones still draining). A server of one pool exports `pool="default"`.

Per-tenant series, as Kueue labels per queue: grants, time to slot, refusals and preemptions (victim
and preemptor) carry `tenant` labels, bounded by the policy's tenants, spelt as in the policy. A
tenant the policy does not list counts as `_other` (no policy name can start with `_`); a tenant
an ApplyPolicy removes is dropped from the series. A preemption with no waiter behind it (a drain,
a policy change) has `preemptor_tenant=""`.
"""

from __future__ import annotations

import platform
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler.api import reasons
from scheduler.core.types import (
    Acquire,
    BlockedReason,
    Decision,
    Ended,
    EndReason,
    Expired,
    Granted,
    LateSnapshot,
    QoS,
    Queued,
    Refused,
    RefuseReason,
    Revoked,
    RevokeReason,
    YieldCancelled,
    YieldCause,
    YieldRequested,
)
from scheduler.core.views import PoolView, SessionView
from scheduler.policy.model import Policy

CLASS_ORDER: tuple[QoS, ...] = tuple(QoS)  # the index order of PoolView/TenantView tuples

TIME_TO_SLOT_BUCKETS = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0
)  # fmt: skip
LATENCY_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)

Describe = Callable[[], "PoolView | None"]
DescribeAll = Callable[[], "Mapping[str, PoolView] | None"]
DEFAULT_POOL: Final = "default"  # the one pool of a policy without spec.pools

OTHER_TENANT: Final = "_other"  # a tenant the policy does not list
#: The pool label of a refusal before placement (no pool named of several, no pool matching a
#: selector or a snapshot, a pool the policy does not have): it is in no pool. One value, never
#: the name a caller sent, so a caller naming random pools cannot grow the label set.
NO_POOL_LABEL: Final = ""
#: The refusals placement makes (scheduler/core/placement.py), counted under NO_POOL_LABEL.
NO_POOL_REASONS: Final = frozenset(
    {RefuseReason.UNKNOWN_POOL, RefuseReason.NO_POOL_NAMED, RefuseReason.NO_ELIGIBLE_POOL}
)
NO_TENANT: Final = ""  # a preemption no waiter asked for


class CoreLike(Protocol):
    """What observe() reads of the core (on the loop): the policy in force, a session's tenant."""

    @property
    def policy(self) -> Policy: ...

    def session(self, session: Any) -> SessionView | None: ...

    def names(self) -> tuple[str, ...]: ...


def _version(package: str) -> str:
    # From the installed metadata, not `import grpc`: the loop imports this module and no wire.
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


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
        # Keyed by (pool, tenant, ...): the core's pools and the policy's tenants, each with every
        # label value.
        self.grants: dict[tuple[str, str, QoS], int] = {}
        self.time_to_slot: dict[tuple[str, str, QoS], _Histogram] = {}
        self.refusals: dict[tuple[str, str, RefuseReason], int] = {}
        # pool, cause, victim, preemptor
        self.preemptions: dict[tuple[str, YieldCause, str, str], int] = {}
        self.waits: dict[tuple[str, BlockedReason], int] = {}  # pool, reason
        self.revocations = dict.fromkeys(RevokeReason, 0)
        self.tenants: tuple[str, ...] = ()
        self.pools: tuple[str, ...] = (DEFAULT_POOL,)
        self._default_pool: str = DEFAULT_POOL
        self._known: frozenset[str] = frozenset()
        self._policy: Policy | None = None
        self.yields = 0
        self.yields_cancelled = 0
        self.late_snapshots = 0  # Yields after their lease's revocation whose snapshot was kept
        self.expiries = 0
        self.work_lost = 0.0
        self.latency = _Histogram(LATENCY_BUCKETS)
        # (tenant or role:admin / role:worker, rpc) -> calls refused by a rate limit
        self.rate_limited: dict[tuple[str, str], int] = {}
        # Per flow of the fair admission gate (a tenant, or role:admin / role:worker / role:keda):
        # work admitted (commands), items waiting, refusals by reason (scheduler/server/fairness.py).
        self.flow_admitted: dict[str, int] = {}
        self.flow_queued: dict[str, int] = {}
        self.flow_refused: dict[tuple[str, str], int] = {}
        self.describe: Describe = lambda: None
        self.describe_all: DescribeAll = lambda: None
        self._set_tenants(())
        self.registry.register(_Collector(self))
        # The token budgets' series (budget_metrics.py, which imports this module's histogram).
        from scheduler.server.budget_metrics import BudgetCollector, BudgetMetrics

        self.budget = BudgetMetrics(self._tenant)
        self.registry.register(BudgetCollector(self.budget))
        self.registry.register(_BuildInfo())
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, resident memory, fds
        PlatformCollector(registry=self.registry)  # python_info

    def _set_tenants(self, names: Iterable[str], pools: Sequence[str] | None = None) -> None:
        """Series for exactly these tenants (and OTHER_TENANT) in these pools (None: as before):
        counts of those kept, the rest dropped."""
        names = tuple(dict.fromkeys((*names, OTHER_TENANT)))
        peers = (*names, NO_TENANT)
        if pools:
            self.pools = tuple(dict.fromkeys(pools))
            self._default_pool = DEFAULT_POOL if DEFAULT_POOL in self.pools else self.pools[0]
        ps = self.pools
        self.tenants, self._known = names, frozenset(names)
        self.grants = {(o, t, q): self.grants.get((o, t, q), 0) for o in ps for t in names for q in QoS}
        self.time_to_slot = {
            (o, t, q): self.time_to_slot.get((o, t, q)) or _Histogram(TIME_TO_SLOT_BUCKETS)
            for o in ps
            for t in names
            for q in QoS
        }
        self.refusals = {
            (o, t, r): self.refusals.get((o, t, r), 0)
            for o in (*ps, NO_POOL_LABEL)
            for t in names
            for r in RefuseReason
            if (o == NO_POOL_LABEL) == (r in NO_POOL_REASONS)  # before placement: no pool
        }
        self.preemptions = {
            (o, c, v, p): self.preemptions.get((o, c, v, p), 0)
            for o in ps
            for c in YieldCause
            for v in names
            for p in peers
        }
        self.waits = {(o, r): self.waits.get((o, r), 0) for o in ps for r in BlockedReason}

    def _pool(self, name: str) -> str:
        """A decision's pool as a label value: none named (a refusal before placement), the default."""
        if name in self.pools:
            return name
        if not name:
            return self._default_pool
        self._set_tenants((t for t in self.tenants if t != OTHER_TENANT), (*self.pools, name))
        return name  # a pool the core added since the policy was seen: series of its own

    def policy_tenants(self) -> frozenset[str] | None:
        """The policy's tenant names (None before the first event showed the policy)."""
        return None if self._policy is None else self._known

    def _tenant(self, name: str | None) -> str:
        return name if name is not None and name in self._known else OTHER_TENANT

    def bind(self, describe: Describe, describe_all: DescribeAll | None = None) -> None:
        """Where the pool gauges come from: the loop's thread-safe describe, and every pool's views
        (`describe_all`; unset: describe's one pool)."""
        self.describe = describe
        self.describe_all = describe_all or _one_pool(describe)

    def count_rate_limited(self, tenant: str, rpc: str) -> None:
        key = (tenant, rpc)
        self.rate_limited[key] = self.rate_limited.get(key, 0) + 1
        self.count_flow_refused(tenant, "rate_limited")

    def count_flow_admitted(self, flow: str, cost: int) -> None:
        self.flow_admitted[flow] = self.flow_admitted.get(flow, 0) + cost

    def set_flow_queued(self, flow: str, n: int) -> None:
        self.flow_queued[flow] = n

    def count_flow_refused(self, flow: str, reason: str, n: int = 1) -> None:
        key = (flow, reason)
        self.flow_refused[key] = self.flow_refused.get(key, 0) + n

    def observe(
        self,
        decisions: Sequence[Decision],
        latency_s: float,
        event: object = None,
        core: CoreLike | None = None,
    ) -> None:
        """Count one handled event's decisions; `event` and `core` (on the loop) name the tenants."""
        self.latency.observe(latency_s)
        if core is not None and core.policy is not self._policy:
            self._policy = core.policy  # an ApplyPolicy: series follow its tenants and pools
            names = getattr(core, "names", None)
            pools = names() if callable(names) else core.policy.pool_names()
            self._set_tenants((t.name for t in core.policy.tenants), pools)
        for d in decisions:
            if isinstance(d, Granted):
                key = (self._pool(d.lease.pool), self._tenant(d.lease.tenant), d.lease.qos)
                self.grants[key] += 1
                self.time_to_slot[key].observe(d.waited_s)
            elif isinstance(d, Queued):
                self.waits[(self._pool(d.pool), d.reason)] += 1
            elif isinstance(d, YieldRequested):
                preemptor = NO_TENANT
                if d.for_session is not None:
                    if isinstance(event, Acquire) and event.session == d.for_session:
                        preemptor = self._tenant(event.tenant)
                    else:
                        view = core.session(d.for_session) if core is not None else None
                        preemptor = self._tenant(view.tenant if view is not None else None)
                key4 = (self._pool(d.lease.pool), d.cause, self._tenant(d.lease.tenant), preemptor)
                self.preemptions[key4] += 1
            elif isinstance(d, YieldCancelled):
                self.yields_cancelled += 1
            elif isinstance(d, Ended):
                if d.reason is EndReason.YIELDED:
                    self.yields += 1
            elif isinstance(d, LateSnapshot):
                self.late_snapshots += 1
            elif isinstance(d, Revoked):
                self.revocations[d.reason] += 1
                self.work_lost += d.lost_slot_seconds
            elif isinstance(d, Expired):
                self.expiries += 1
                self.work_lost += d.lost_slot_seconds
            elif isinstance(d, Refused):
                tenant = event.tenant if isinstance(event, Acquire) and event.session == d.session else None
                self.count_refused(d, tenant)

    def count_refused(self, r: Refused, tenant: str | None) -> None:
        """One Acquire refused: in its pool, or NO_POOL_LABEL when placement refused it (also
        called for a refusal made before any loop: per-pool leadership's routing)."""
        pool = NO_POOL_LABEL if r.reason in NO_POOL_REASONS else self._pool(r.pool)
        key = (pool, self._tenant(tenant), r.reason)
        self.refusals[key] = self.refusals.get(key, 0) + 1


class _BuildInfo(Collector):
    def __init__(self) -> None:
        self._labels = [_version("slotsched"), platform.python_version(), _version("grpcio")]

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "slotsched_build_info",
            "Always 1: the versions this scheduler runs.",
            labels=["version", "python", "grpc"],
        )
        info.add_metric(self._labels, 1)
        yield info


class _Collector(Collector):
    def __init__(self, m: Metrics) -> None:
        self.m = m

    def describe(self) -> list[Metric]:
        return []  # so register() does not run collect(), which would call into the loop

    def collect(self) -> Iterator[Metric]:
        m = self.m
        grants = CounterMetricFamily(
            "slotsched_grants", "Leases granted.", labels=["pool", "class", "tenant"]
        )
        for (o, t, q), n in list(m.grants.items()):
            grants.add_metric([o, q.value, t], n)
        yield grants
        tts = HistogramMetricFamily(
            "slotsched_time_to_slot_seconds",
            "Wait from entering the queue (or re-queue) to a grant.",
            labels=["pool", "class", "tenant"],
        )
        for (o, t, q), h in list(m.time_to_slot.items()):
            buckets, total = h.family_samples()
            tts.add_metric([o, q.value, t], buckets, total)
        yield tts
        pre = CounterMetricFamily(
            "slotsched_preemptions",
            "Holders asked to yield, by pool, cause, the holder's tenant and the waiter's (if any).",
            labels=["pool", "cause", "victim_tenant", "preemptor_tenant"],
        )
        for (o, c, v, p), n in list(m.preemptions.items()):
            pre.add_metric([o, c.value, v, p], n)
        yield pre
        waits = CounterMetricFamily(
            "slotsched_waits",
            "Requests queued (entering or re-entering a pool's queue), by pool and why they wait.",
            labels=["pool", "reason"],
        )
        for (o, why), n in list(m.waits.items()):
            waits.add_metric([o, why.value], n)
        yield waits
        yield CounterMetricFamily("slotsched_yields", "Leases given up by Yield.", value=m.yields)
        yield CounterMetricFamily(
            "slotsched_yields_cancelled",
            "Yield requests called off: the waiter left and no other waiter had a right to the lease.",
            value=m.yields_cancelled,
        )
        yield CounterMetricFamily(
            "slotsched_late_snapshots",
            "Snapshots that came with a Yield after their lease was revoked at its yield deadline, "
            "kept: the session resumes from them (the work counted lost at the revocation was not).",
            value=m.late_snapshots,
        )
        yield _counter(
            "slotsched_revocations",
            "Leases revoked without a yield.",
            "reason",
            m.revocations,
        )
        yield CounterMetricFamily("slotsched_expiries", "Leases expired (not renewed).", value=m.expiries)
        refusals = CounterMetricFamily(
            "slotsched_refusals", "Acquires refused.", labels=["pool", "reason", "tenant"]
        )
        for (o, t, r), n in list(m.refusals.items()):
            refusals.add_metric([o, reasons.of(r).metric, t], n)  # the label: the reason's row
        yield refusals
        limited = CounterMetricFamily(
            "slotsched_rate_limited",
            "Calls refused by a rate limit (spec.rateLimits), by tenant (or role:admin/role:worker), rpc.",
            labels=["tenant", "rpc"],
        )
        for (tenant, rpc), n in list(m.rate_limited.items()):
            limited.add_metric([tenant, rpc], n)
        yield limited
        yield from _flow_metrics(m)
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
        yield from _pool_gauges(m.describe_all() or {}, m.policy_tenants())


def _flow_metrics(m: Metrics) -> Iterator[Metric]:
    """The fair admission gate's flows: `tenant` is the tenant's name or role:admin, role:worker,
    role:keda (bounded by the policy's tenants)."""
    admitted = CounterMetricFamily(
        "slotsched_flow_admitted",
        "Work admitted by the fair admission gate (commands), per flow (a tenant, or role:*).",
        labels=["tenant"],
    )
    for flow, n in list(m.flow_admitted.items()):
        admitted.add_metric([flow], n)
    yield admitted
    queued = GaugeMetricFamily(
        "slotsched_flow_queued",
        "Work items waiting for a seat of the fair admission gate, per flow.",
        labels=["tenant"],
    )
    for flow, n in list(m.flow_queued.items()):
        queued.add_metric([flow], n)
    yield queued
    refused = CounterMetricFamily(
        "slotsched_flow_refused",
        "Work refused on its flow's side (queue full, rate limited, streams over a bound), by flow, reason.",
        labels=["tenant", "reason"],
    )
    for (flow, reason), n in list(m.flow_refused.items()):
        refused.add_metric([flow, reason], n)
    yield refused


def _counter(name: str, doc: str, label: str, values: dict[Any, int]) -> CounterMetricFamily:
    """One counter family with one sample per enum member (label value = the member's value)."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in values.items():
        family.add_metric([key.value], n)
    return family


def _one_pool(describe: Describe) -> DescribeAll:
    def one() -> Mapping[str, PoolView] | None:
        view = describe()
        return None if view is None else {view.name: view}

    return one


def _pool_gauges(views: Mapping[str, PoolView], policy_tenants: frozenset[str] | None) -> Iterator[Metric]:
    if not views:
        return
    pending = GaugeMetricFamily(
        "slotsched_pending_sessions", "Requests waiting for a slot.", labels=["pool", "class", "tenant"]
    )
    held = GaugeMetricFamily(
        "slotsched_held_leases", "Leases held (incl. yielding).", labels=["pool", "class", "tenant"]
    )
    share = GaugeMetricFamily(
        "slotsched_fair_share", "Borrowed capacity / weight, per tenant.", labels=["pool", "tenant"]
    )
    # The policy's quotas, as Kueue's nominal quota / borrowing limit gauges.
    weight = GaugeMetricFamily("slotsched_tenant_weight", "Fair-share weight.", labels=["pool", "tenant"])
    guaranteed = GaugeMetricFamily(
        "slotsched_tenant_guaranteed_quota_slots",
        "Guaranteed quota: most Guaranteed leases held.",
        labels=["pool", "tenant"],
    )
    nominal = GaugeMetricFamily(
        "slotsched_tenant_nominal_quota_slots",
        "Burstable nominal: Burstable leases it can count on.",
        labels=["pool", "tenant"],
    )
    limit = GaugeMetricFamily(
        "slotsched_tenant_limit_slots",
        "Most leases of a class, borrowing included (best_effort: absent when uncapped).",
        labels=["pool", "class", "tenant"],
    )
    capacity = GaugeMetricFamily("slotsched_capacity_slots", "Slots on ready workers.", labels=["pool"])
    floor = GaugeMetricFamily("slotsched_floor_slots", "The reserved floor, in slots.", labels=["pool"])
    free = GaugeMetricFamily("slotsched_free_slots", "Slots free for a grant now.", labels=["pool"])
    for pool, view in views.items():
        for t in view.tenants:
            for i, q in enumerate(CLASS_ORDER):
                pending.add_metric([pool, q.value, t.name], t.pending[i])
                held.add_metric([pool, q.value, t.name], t.held[i])
            share.add_metric([pool, t.name], t.share)
            if policy_tenants is not None and t.name not in policy_tenants:
                continue  # removed by ApplyPolicy, still draining: no quota any more
            weight.add_metric([pool, t.name], t.weight)
            guaranteed.add_metric([pool, t.name], t.guaranteed)
            nominal.add_metric([pool, t.name], t.burstable_nominal)
            limit.add_metric([pool, QoS.BURSTABLE.value, t.name], t.burstable_limit)
            if t.best_effort_limit is not None:
                limit.add_metric([pool, QoS.BEST_EFFORT.value, t.name], t.best_effort_limit)
        capacity.add_metric([pool], view.capacity)
        floor.add_metric([pool], view.floor)
        free.add_metric([pool], view.free)
    yield from (pending, held, share, weight, guaranteed, nominal, limit, capacity, floor, free)
