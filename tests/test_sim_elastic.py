"""The elastic pool in the simulator: the real autoscaler loop, in virtual time."""

from __future__ import annotations

from scheduler.core.types import QoS
from scheduler.policy.model import AutoscalerSpec, Policy, PoolSpec, QueueSpec, TenantSpec
from scheduler.sim.bursty import bursty_policy, bursty_workload
from scheduler.sim.elastic import ElasticPool, ElasticStats, StaticPool, elastic_report
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.workload import Period, SessionPlan


def test_scales_up_under_a_burst_and_back_down_cheaper_than_a_static_max_pool() -> None:
    policy = bursty_policy(max_workers=16)
    plans = bursty_workload(seed=3)
    elastic = Simulator(policy, plans, SimConfig(sample_every_s=30.0), hook=ElasticPool()).run()
    static = Simulator(policy, bursty_workload(seed=3), SimConfig(), hook=StaticPool(16)).run()

    caps = [s.capacity for s in elastic.samples]
    peak = caps.index(max(caps))
    assert caps[0] <= 8 and max(caps) >= 12 * 4  # up near the ceiling during the burst
    assert caps[-1] <= 8 and peak < len(caps) - 1  # and back down after it

    # No session lost: all finished, drained sessions yielded (none revoked), no work lost.
    assert elastic.completed == len(plans) and elastic.unfinished == 0
    assert elastic.revocations == 0 and elastic.expiries == 0 and elastic.work_lost == 0

    e, s = elastic_report(elastic), elastic_report(static)
    assert e["worker_seconds"] < 0.7 * s["worker_seconds"]
    assert s["worker_seconds"] == round(16 * static.end_s, 1)  # the static pool counted alike
    assert e["scale_actions"] >= 2 and s["scale_actions"] == 0
    assert e["sla_misses"] == 0  # Guaranteed arrivals served within the grace


def test_a_new_worker_is_ready_start_delay_after_the_decision() -> None:
    policy = Policy(
        pool=PoolSpec(slots_per_worker=2, workers=1, min_workers=1, max_workers=4, floor=0),
        queue=QueueSpec(max_pending=1000, max_pending_per_tenant=1000),
        autoscaler=AutoscalerSpec(start_delay_s=20.0),
        tenants=(TenantSpec("t", burstable_nominal=8, burstable_limit=8),),
    )
    plans = [SessionPlan(f"s{i}", "t", QoS.BURSTABLE, [Period(100.0, None, 1.0)]) for i in range(6)]
    stats = Simulator(policy, plans, SimConfig(), hook=ElasticPool(period_s=15.0)).run()
    waits = sorted(stats.waits["burstable"])
    # Two served at once on the warm worker; the rest when the tick at 15 s has asked for two
    # more workers and they came up 20 s later.
    assert waits[:2] == [0.0, 0.0]
    assert all(abs(w - (15.0 + 20.0 - 1.0)) < 1e-6 for w in waits[2:])
    assert isinstance(stats, ElasticStats) and stats.completed == 6


def test_sla_misses_count_guaranteed_waits_above_the_target() -> None:
    stats = ElasticStats(Policy())
    stats.waits["guaranteed"] += [0.0, 9.9, 10.0, 10.5, 30.0]
    stats.worker_seconds, stats.scale_actions = 123.45, 3
    assert elastic_report(stats) == {"worker_seconds": 123.5, "sla_misses": 2, "scale_actions": 3}
    assert elastic_report(stats, sla_target_s=5.0)["sla_misses"] == 4
