"""The figures of one comparison run: what the report table, the JSON and the verdicts read.

Why a module of its own: the report, the plots, the `--json` output and bench/policy_compare.py
must agree on every number, so each is computed once, here, from `SimStats`.

- Guaranteed SLA target: `yieldGraceSeconds + checkpoint` — the wait design.md promises a
  Guaranteed request within its tenant's quota; a miss is such a wait above it. A request beyond
  the quota waits for the tenant's own Guaranteed leases to end, which nothing bounds: its waits
  are reported apart (`g_beyond_quota`), and the Guaranteed wait figures cover those within.
- Jain's fairness index over tenants with demand (tenants with at least one session in the
  workload) of `slot-seconds / weight`: 1 when every tenant got the same weighted service, 1/n
  when one got all of it. It rewards equal totals, so it is bounded by how unequal demand is —
  and in a closed-loop workload every session's work is done sooner or later, so totals differ
  between policies only by what is left at the horizon.
- Jain under contention answers the fairness question directly: at each sample where someone
  waits for a slot (queued, or in a client's retry loop), Jain's index of `held slots / weight`
  over the tenants holding or waiting at that moment; averaged over those samples (evenly spaced,
  so weighted by time). Max-min fair sharing raises it; serving by arrival or by retry luck
  hands the pool to whoever has the most sessions in line. With no such sample there is nothing
  to average: None (shown n/a), never a 1.0 that would count as a win.
- Worker-seconds: what the pool cost — reported by an elastic pool hook, else ready capacity
  over time divided by slots per worker (a static pool).
- Utilization: busy slot-seconds over the slot-seconds paid for (worker-seconds x slots per
  worker). For a static pool it is `SimStats.utilization`; for an elastic one it also counts
  workers starting and draining, which `SimStats` leaves out of capacity (so its ratio can pass
  100% while leases finish on a draining worker).
- Per tenant (issue 23; tenants with demand): `simulate --json`'s `tenants.<t>` (first grant,
  time-to-slot, waits by class, slot-seconds), and over them the spread of `slot-seconds /
  weight` (max over min: inf when a tenant got nothing) and the latest first grant (inf when a
  tenant was never granted): whether the pool reached every tenant, and how evenly.
- Fair-share attainment (`scheduler/sim/attainment.py`): per tenant and class, slots held while
  backlogged over its weighted max-min entitlement at the same samples (`tenants.<t>.attainment`),
  and the lowest over tenants with demand (`attainment_min`): whether each tenant got its share.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.policy.model import Policy
from scheduler.sim.attainment import Point, attainment, quotas_of
from scheduler.sim.stats import CLASS_KEYS, SimStats, percentile, waits_json
from scheduler.sim.workload import SessionPlan


def jain(values: Sequence[float]) -> float:
    """(Σx)² / (n·Σx²); 1.0 for no values or all zeros (nothing to be unfair about)."""
    sq = sum(x * x for x in values)
    if not values or sq == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * sq)


def sla_target(policy: Policy, checkpoint_s: float) -> float:
    return policy.timing.yield_grace_s + checkpoint_s


@dataclass(frozen=True)
class RunFigures:
    """One contender's row: waits by class (p50, p99, max; Guaranteed: requests within quota),
    and the pool-level figures."""

    name: str
    waits: dict[str, tuple[float, float, float]]
    sla_misses: int
    be_max_wait: float
    jain: float
    jain_contended: float | None  # None: nobody ever waited, nothing to average
    work_lost: float
    preemptions: int
    utilization: float
    worker_seconds: float
    scale_actions: int
    refusals: int
    completed: int
    unfinished: int
    peak_capacity: int = 0  # most slots the pool had at a sample
    top_tenant_share: float = 0.0  # the largest tenant's share of all slot-seconds
    contended_samples: int = 0  # samples where someone waited: what Jain under contention averages
    grants: dict[str, int] = field(default_factory=dict)  # by class; 0: its waits mean nothing
    stop_note: str = ""  # why the run ended with work left (see SimStats.stop_note), else ""
    # Guaranteed requests beyond their tenant's quota: (grants, p99, max wait).
    g_beyond_quota: tuple[int, float, float] = (0, 0.0, 0.0)
    # Tenants with demand, by name: `SimStats.tenant_json` (first_grant_s, time_to_slot, …).
    tenants: dict[str, dict[str, Any]] = field(default_factory=dict)
    share_spread: float = 1.0  # max / min of slot-seconds / weight over them (inf: one got none)
    first_grant_max: float | None = None  # the latest first grant (inf: one never granted)
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)  # `SimStats.pools_json()`
    # The lowest fair-share attainment over tenants with demand (attainment.py; None: no sample).
    attainment_min: float | None = None

    def granted(self, cls: str) -> bool:
        """Did the class get any grant? (Unknown when built without `grants`: assume it did.)"""
        return self.grants.get(cls, 1) > 0

    def measured(self, metric: str) -> bool:
        """Is there a figure at all? A class without grants has no waits, no request beyond quota
        no such wait, no contended sample no Jain under contention: none counts for or against."""
        cls, _, stat = metric.partition("_")
        if cls in _CLASSES and stat in _STATS:
            return self.granted(_CLASSES[cls])
        if cls == "gq":
            return self.g_beyond_quota[0] > 0
        return metric != "jain_contended" or self.jain_contended is not None

    def value(self, metric: str) -> float:
        """A figure by name: `g_p99`, `gq_max` (beyond quota), `b_max`, `jain`, `work_lost`… (see
        METRICS in the report); NaN when not `measured`."""
        cls, _, stat = metric.partition("_")
        if cls in _CLASSES and stat in _STATS:
            return self.waits[_CLASSES[cls]][_STATS.index(stat)]
        if cls == "gq" and stat in ("p99", "max"):
            return self.g_beyond_quota[1 if stat == "p99" else 2]
        v = getattr(self, metric)
        return math.nan if v is None else float(v)


_CLASSES = {"g": "guaranteed", "b": "burstable", "be": "besteffort"}
_STATS = ("p50", "p99", "max")


def contention_jain(
    stats: SimStats, waiting_by_tenant: Sequence[dict[str, int]], policy: Policy
) -> float | None:
    weights = {t.name: t.weight for t in policy.tenants}
    values = []
    for sample, waiting in zip(stats.samples, waiting_by_tenant, strict=False):
        if sample.pending == 0:
            continue
        tenants = {t for t, n in sample.held_by_tenant.items() if n} | set(waiting)
        values.append(jain([sample.held_by_tenant.get(t, 0) / weights.get(t, 1.0) for t in sorted(tenants)]))
    return sum(values) / len(values) if values else None


def spread(values: Sequence[float]) -> float:
    """max / min; 1.0 for nothing or all zeros, inf when some got nothing and others something."""
    if not values or max(values) == 0:
        return 1.0
    return max(values) / min(values) if min(values) > 0 else math.inf


def latest_first_grant(tenants: dict[str, dict[str, Any]]) -> float | None:
    firsts = [t["first_grant_s"] for t in tenants.values()]
    if not firsts:
        return None
    return math.inf if None in firsts else max(firsts)


def _paid_utilization(stats: SimStats, worker_seconds: float, slots_per_worker: int) -> float:
    paid = worker_seconds * slots_per_worker
    return stats.busy_slot_seconds / paid if paid else 0.0


def pool_figures(stats: SimStats, target: float) -> tuple[int, float, int]:
    """(SLA misses, worker-seconds, scale actions): `elastic_report`'s, when the elastic pool exists."""
    try:
        from scheduler.sim.elastic import elastic_report
    except ModuleNotFoundError:
        misses = sum(1 for w in stats.guaranteed_waits(beyond_quota=False) if w > target + 1e-9)
        return misses, stats.worker_seconds, stats.scale_actions
    rep = elastic_report(stats, target)
    return int(rep["sla_misses"]), float(rep["worker_seconds"]), int(rep["scale_actions"])


def tenant_demand(plans: Iterable[SessionPlan]) -> set[str]:
    return {p.tenant for p in plans}


def figures(
    name: str,
    stats: SimStats,
    policy: Policy,
    plans: Sequence[SessionPlan],
    checkpoint_s: float,
    waiting_by_tenant: Sequence[dict[str, int]] = (),
    points: Sequence[Point] = (),
) -> RunFigures:
    # The promise covers Guaranteed requests within quota: those are the class's wait figures.
    by_class = {k: stats.waits[k] for k in CLASS_KEYS} | {"guaranteed": stats.guaranteed_waits(False)}
    waits = {k: (percentile(w, 50), percentile(w, 99), max(w, default=0.0)) for k, w in by_class.items()}
    beyond = stats.guaranteed_waits(beyond_quota=True)
    target = sla_target(policy, checkpoint_s)
    misses, worker_s, actions = pool_figures(stats, target)
    weights = {t.name: t.weight for t in policy.tenants}
    shares = [
        sum(stats.slot_seconds[t].values()) / weights.get(t, 1.0) if t in stats.slot_seconds else 0.0
        for t in sorted(tenant_demand(plans))
    ]
    static_ws = stats.capacity_slot_seconds / max(1, policy.pool.slots_per_worker)
    per_tenant = {t: stats.tenant_json(t) for t in sorted(tenant_demand(plans))}
    att = attainment(points, quotas_of(policy))
    for t, entry in per_tenant.items():
        entry["attainment"] = att.tenant_json(t)
    return RunFigures(
        name=name,
        waits=waits,
        sla_misses=misses,
        be_max_wait=waits["besteffort"][2],
        jain=jain(shares),
        jain_contended=contention_jain(stats, waiting_by_tenant, policy),
        work_lost=stats.work_lost,
        preemptions=stats.preemptions,
        utilization=_paid_utilization(stats, worker_s or static_ws, policy.pool.slots_per_worker),
        worker_seconds=worker_s or static_ws,
        scale_actions=actions,
        refusals=stats.refusals,
        completed=stats.completed,
        unfinished=stats.unfinished,
        peak_capacity=max((x.capacity for x in stats.samples), default=0),
        top_tenant_share=max(shares, default=0.0) / sum(shares) if sum(shares) else 0.0,
        contended_samples=sum(1 for x in stats.samples if x.pending > 0),
        grants={k: len(w) for k, w in by_class.items()},
        stop_note=stats.stop_note,
        g_beyond_quota=(len(beyond), percentile(beyond, 99), max(beyond, default=0.0)),
        tenants=per_tenant,
        share_spread=spread(shares),
        first_grant_max=latest_first_grant(per_tenant),
        pools=stats.pools_json(),
        attainment_min=att.minimum(sorted(per_tenant)),
    )


def json_entry(stats: SimStats, fig: RunFigures) -> dict[str, Any]:
    """`simulate --json`'s keys (per tenant too) plus worker_seconds, scale_actions, sla_misses
    (within quota), Guaranteed waits by quota and Jain under contention with the samples it
    averages (index null for none)."""
    out = stats.to_json()
    out["worker_seconds"] = round(fig.worker_seconds, 3)
    out["scale_actions"] = fig.scale_actions
    out["sla_misses"] = fig.sla_misses
    out["guaranteed_by_quota"] = {
        "within": waits_json(stats.guaranteed_waits(beyond_quota=False)),
        "beyond": waits_json(stats.guaranteed_waits(beyond_quota=True)),
    }
    for name, entry in fig.tenants.items():
        if name in out["tenants"]:
            out["tenants"][name]["attainment"] = entry["attainment"]
    am = fig.attainment_min
    out["attainment_min"] = None if am is None else round(am, 4)
    jc = fig.jain_contended
    out["jain_under_contention"] = {
        "index": None if jc is None else round(jc, 4),
        "samples": fig.contended_samples,
    }
    return out
