"""A synthetic bursty day for the elastic pool: quiet, a burst, quiet again.

Why this shape: it is the case an autoscaler exists for and the one a static pool handles worst.
A static pool sized for the burst idles through the quiet hours; one sized for the quiet hours
makes the burst wait. Guaranteed sessions arrive during the burst, when the pool is busiest, so
the run shows whether scaling kept their promise (a slot within the yield grace) or not.

    quiet   [0, burst_at)             a trickle of Burstable sessions (one every `trickle_every_s`)
    burst   [burst_at, +burst_len_s)  Burstable and BestEffort floods; Guaranteed arrivals
    quiet   until `end_s`             the trickle again

Deterministic for a seed; tenants: `oncall` (Guaranteed), `team` (Burstable), `batch` (BestEffort).
"""

from __future__ import annotations

import random

from scheduler.core.types import QoS
from scheduler.policy.model import AutoscalerSpec, Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.sim.workload import Period, SessionPlan


def bursty_workload(
    seed: int = 7,
    *,
    burst_at: float = 600.0,
    burst_len_s: float = 300.0,
    end_s: float = 2400.0,
    burstable: int = 60,
    best_effort: int = 80,
    guaranteed_every_s: float = 30.0,
    trickle_every_s: float = 30.0,
) -> list[SessionPlan]:
    rng = random.Random(seed)
    plans: list[SessionPlan] = []

    def add(prefix: str, tenant: str, qos: QoS, arrival: float, hold: float) -> None:
        sid = f"{prefix}{len(plans):05d}"
        plans.append(SessionPlan(sid, tenant, qos, [Period(round(hold, 3), None, round(arrival, 3), 4096)]))

    t = 0.0
    while t < end_s:
        if not burst_at <= t < burst_at + burst_len_s:
            add("q", "team", QoS.BURSTABLE, t, rng.uniform(30.0, 90.0))
        t += trickle_every_s
    for _ in range(burstable):
        add("b", "team", QoS.BURSTABLE, burst_at + rng.uniform(0, burst_len_s), rng.uniform(120.0, 300.0))
    for _ in range(best_effort):
        add("x", "batch", QoS.BEST_EFFORT, burst_at + rng.uniform(0, burst_len_s), rng.uniform(120.0, 400.0))
    t = burst_at + 20.0
    while t < burst_at + 2 * burst_len_s:  # the burst and its tail
        add("g", "oncall", QoS.GUARANTEED, t, rng.uniform(60.0, 120.0))
        t += guaranteed_every_s
    return sorted(plans, key=lambda p: (p.arrival_s, p.session_id))


def bursty_policy(max_workers: int = 16, start_delay_s: float = 20.0) -> Policy:
    """4 slots per worker, a 4-slot floor for `oncall`, 1 to `max_workers` workers."""
    return Policy(
        name="bursty",
        pool=PoolSpec(slots_per_worker=4, workers=1, min_workers=1, max_workers=max_workers, floor=4),
        timing=TimingSpec(yield_grace_s=10.0, lease_ttl_s=30.0, min_runtime_s=30.0),
        queue=QueueSpec(max_pending=100_000, max_pending_per_tenant=100_000),
        autoscaler=AutoscalerSpec(start_delay_s=start_delay_s, drain_timeout_s=120.0),
        tenants=(
            TenantSpec("oncall", weight=2.0, guaranteed=4),
            TenantSpec("team", weight=1.0, burstable_nominal=8, burstable_limit=64),
            TenantSpec("batch", weight=1.0),
        ),
    )
