"""When tenants outnumber slots, does the pool rotate? 12 equal-weight BestEffort tenants on 4
slots for 3,000 s of virtual time, the same workload and core run twice side by side: with the
share counting recent usage (spec.fairness.usageHalfLifeSeconds, the default 600 s) and with the
instantaneous share only (0). Each tenant has 6 sessions of 1,800 s of work from t = 0..12 s, so
demand (72 sessions) is far above the 4 slots for the whole run.

Figures per run: each tenant's slot-seconds (max / min over tenants; a tenant with none counts
as 0.001 so the ratio shows it), the latest first grant over tenants (from a 1 s time series),
preemptions, revocations and lost work. Bars (issue 23): slot-seconds within 1.5x of each
other and every first grant within 600 s, with usage on.

    python bench/fair_rotation.py      # last line: usage_slot_seconds_max_over_min=R ...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.core.types import QoS  # noqa: E402
from scheduler.policy.model import FairnessSpec, Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec  # noqa: E402
from scheduler.sim.simulator import SimConfig, Simulator  # noqa: E402
from scheduler.sim.workload import Period, SessionPlan  # noqa: E402

TENANTS, SLOTS, UNTIL, MIN_RUNTIME = 12, 4, 3000.0, 60.0


def run(half_life: float) -> dict[str, float]:
    tenants = tuple(TenantSpec(f"t{i:02d}") for i in range(TENANTS))
    pol = Policy(
        pool=PoolSpec(slots_per_worker=1, workers=SLOTS, min_workers=1, max_workers=SLOTS, floor=0),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=30, min_runtime_s=MIN_RUNTIME),
        queue=QueueSpec(max_pending=100000, max_pending_per_tenant=100000),
        tenants=tenants,
        fairness=FairnessSpec(usage_half_life_s=half_life),
    )
    plans = [
        SessionPlan(
            f"{t.name}-{k}", t.name, QoS.BEST_EFFORT, [Period(1800.0, None, i + 0.01 * k, 1024, None)]
        )
        for i, t in enumerate(tenants)
        for k in range(6)
    ]
    stats = Simulator(pol, plans, SimConfig(checkpoint_s=3.0, until_s=UNTIL, sample_every_s=1.0)).run()
    seconds = {t.name: sum(stats.slot_seconds.get(t.name, {}).values()) for t in tenants}
    first: dict[str, float] = {}
    for s in stats.samples:
        for name, held in s.held_by_tenant.items():
            if held and name not in first:
                first[name] = s.t
    return {
        "slot_seconds_max_over_min": max(seconds.values()) / max(0.001, min(seconds.values())),
        "first_grant_max_s": max(first.get(t.name, float("inf")) for t in tenants),
        "tenants_served": float(len(first)),
        "preemptions": float(stats.preemptions),
        "revocations": float(stats.revocations),
        "work_lost_s": stats.work_lost,
    }


def main() -> int:
    results = {}
    for label, half_life in (("usage", 600.0), ("instant", 0.0)):
        print(f"running {label} (half-life {half_life:g} s) ...", flush=True)
        results[label] = r = run(half_life)
        print("  " + " ".join(f"{k}={v:.2f}" for k, v in r.items()), flush=True)
    print(" ".join(f"{label}_{k}={v:.2f}" for label, r in results.items() for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
