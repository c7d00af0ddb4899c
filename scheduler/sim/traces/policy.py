"""A SchedulingPolicy sized to an imported workload, the way a platform team would size one.

Why: an imported trace names tenants (`t01`, …) that no hand-written policy knows, and a
Guaranteed quota that is too small makes Guaranteed sessions wait on their own tenant — a policy
error, not a scheduling result. The rules, from the workload's unconstrained timeline (every
period starts on time, as if the pool were infinite):

- a tenant's Guaranteed quota is its peak concurrent Guaranteed demand (0 if it has none);
- the floor is the peak of all Guaranteed demand together (smaller than the sum of the quotas,
  since tenants do not peak at once), capped at `floor_cap` of capacity;
- `nominal_fraction` of the capacity outside the floor is split into Burstable nominals in
  proportion to each tenant's Burstable slot-seconds (largest remainder); a Burstable limit is
  the whole pool at `max_workers`; BestEffort is uncapped;
- every tenant weighs 1; timing is the policy default; queue caps are far above any backlog of
  the workload (a refusal would measure the cap, not the policy).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Sequence

from scheduler.core.types import QoS
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.sim.traces.convert import exact_counts
from scheduler.sim.workload import SessionPlan


def intervals(plan: SessionPlan) -> Iterator[tuple[float, float]]:
    """The plan's holds on its unconstrained timeline."""
    t = plan.arrival_s
    for i, p in enumerate(plan.periods):
        if i > 0:
            t = t + p.think_s if p.think_s is not None else max(t, p.arrival_s)
        yield t, t + p.hold_s
        t += p.hold_s


def peak_concurrency(spans: Sequence[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])  # ends first at a tie
    peak = cur = 0
    for _, d in edges:
        cur += d
        peak = max(peak, cur)
    return peak


def policy_for(
    plans: Sequence[SessionPlan],
    workers: int,
    slots_per_worker: int = 2,
    max_workers: int | None = None,
    nominal_fraction: float = 0.4,
    floor_cap: float = 0.5,
    timing: TimingSpec | None = None,
    name: str = "trace",
) -> Policy:
    capacity = workers * slots_per_worker
    g_spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    b_work: dict[str, float] = defaultdict(float)
    names = sorted({p.tenant for p in plans})
    for p in plans:
        if p.qos is QoS.GUARANTEED:
            g_spans[p.tenant] += list(intervals(p))
        elif p.qos is QoS.BURSTABLE:
            b_work[p.tenant] += p.total_hold_s
    quotas = {t: peak_concurrency(g_spans[t]) for t in names}
    all_g = [s for spans in g_spans.values() for s in spans]
    floor = min(peak_concurrency(all_g), math.floor(capacity * floor_cap))
    nominal_total = math.floor((capacity - floor) * nominal_fraction)
    weights = [b_work[t] for t in names]
    nominals = exact_counts(nominal_total, weights) if sum(weights) > 0 else [0] * len(names)
    top = max(workers, max_workers or workers)
    tenants = tuple(
        TenantSpec(
            t,
            guaranteed=quotas[t],
            burstable_nominal=n,
            burstable_limit=top * slots_per_worker if b_work[t] > 0 or n > 0 else 0,
        )
        for t, n in zip(names, nominals, strict=True)
    )
    return Policy(
        name=name,
        pool=PoolSpec(
            slots_per_worker=slots_per_worker, workers=workers, min_workers=1, max_workers=top, floor=floor
        ),
        timing=timing or TimingSpec(),
        queue=QueueSpec(max_pending=1_000_000, max_pending_per_tenant=1_000_000),
        tenants=tenants,
    )
