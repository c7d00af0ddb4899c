"""Two tenants, 4 slots each after a split: no preemption ping-pong (docs/design.md, "Checkpoint-
and-yield preemption": a fairness preemption leaves the preemptor below the victim's tenant by at
least one min runtime of a slot).

Eight slots; tenant a's 8 long sessions take them all at t=0, tenant b's 8 arrive at t=1. Once a's
leases have run min runtime (30 s) b takes 4 by fairness preemption, and from then on the split is
fair: 4 each. With recent usage counted and no margin, b's usage then grows past a's lead and each
takes slots back from the other in turn (8 checkpoints in 400 s, b 1,600 slot-s); each yield is a
checkpoint and a restore for nothing."""

from __future__ import annotations

from scheduler.core.types import QoS
from scheduler.policy.model import FairnessSpec, Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.workload import Period, SessionPlan

RUN_S = 400.0
MIN_RUNTIME_S = 30.0


def split_policy(usage_half_life_s: float = 600.0) -> Policy:
    return Policy(
        pool=PoolSpec(slots_per_worker=2, workers=4, min_workers=4, max_workers=4, floor=0),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=30, min_runtime_s=MIN_RUNTIME_S),
        queue=QueueSpec(max_pending=100, max_pending_per_tenant=100),
        tenants=(TenantSpec("a"), TenantSpec("b")),
        fairness=FairnessSpec(usage_half_life_s=usage_half_life_s),
    )


def split_workload() -> list[SessionPlan]:
    return [
        SessionPlan(f"{t}{i}", t, QoS.BEST_EFFORT, [Period(5000.0, None, arrival)])
        for t, arrival in (("a", 0.0), ("b", 1.0))
        for i in range(8)
    ]


def test_two_tenants_at_their_fair_split_stop_preempting_each_other() -> None:
    stats = Simulator(split_policy(), split_workload(), SimConfig(checkpoint_s=2.0, until_s=RUN_S)).run()
    got = {t: sum(by.values()) for t, by in stats.slot_seconds.items()}
    # Fair: b is owed 4 slots from the moment a's leases may be taken (min runtime), a the rest.
    fair_b = 4 * (RUN_S - MIN_RUNTIME_S)
    fair = {"a": 8 * RUN_S - fair_b, "b": fair_b}
    assert stats.preemptions <= 4
    for t in ("a", "b"):
        assert abs(got[t] - fair[t]) <= 0.05 * fair[t], (t, got, fair)


def test_without_usage_the_split_is_the_same() -> None:
    """The instantaneous share (no usage half-life) has no margin and needs none: 4 preemptions."""
    stats = Simulator(split_policy(0.0), split_workload(), SimConfig(checkpoint_s=2.0, until_s=RUN_S)).run()
    got = {t: sum(by.values()) for t, by in stats.slot_seconds.items()}
    assert stats.preemptions == 4
    assert abs(got["b"] - 4 * (RUN_S - MIN_RUNTIME_S)) <= 0.05 * 4 * (RUN_S - MIN_RUNTIME_S)
