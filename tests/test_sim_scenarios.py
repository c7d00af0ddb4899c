"""Scenarios of DESIGN.md through the simulator, which drives the real core in virtual time."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.core.types import QoS
from scheduler.policy.model import FairnessSpec, Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.workload import Period, SessionPlan, write_workload


def plan(
    sid: str, tenant: str, qos: QoS, arrival: float, hold: float, crash: float | None = None
) -> SessionPlan:
    return SessionPlan(sid, tenant, qos, [Period(hold, None, arrival, 1024, crash)])


def pool_policy(
    *tenants: TenantSpec,
    workers: int,
    slots: int = 2,
    floor: int = 0,
    grace: float = 10,
    ttl: float = 30,
    min_runtime: float = 30,
) -> Policy:
    return Policy(
        pool=PoolSpec(
            slots_per_worker=slots, workers=workers, min_workers=1, max_workers=workers, floor=floor
        ),
        timing=TimingSpec(yield_grace_s=grace, lease_ttl_s=ttl, min_runtime_s=min_runtime),
        queue=QueueSpec(max_pending=100000, max_pending_per_tenant=100000),
        tenants=tenants,
    )


def test_a_guaranteed_served_within_grace_plus_checkpoint_under_besteffort_flood() -> None:
    pol = pool_policy(TenantSpec("sre", guaranteed=4), TenantSpec("batch"), workers=4, floor=4, grace=10)
    plans = [plan(f"x{i}", "batch", QoS.BEST_EFFORT, 0.0, 600.0) for i in range(200)]
    plans += [plan(f"g{i}", "sre", QoS.GUARANTEED, 100.0 + 37.0 * i, 60.0) for i in range(12)]
    checkpoint = 3.0
    stats = Simulator(pol, plans, SimConfig(checkpoint_s=checkpoint, until_s=1200)).run()
    g = stats.waits["guaranteed"]
    assert len(g) == 12
    assert max(g) <= 10 + checkpoint + 1e-9
    assert stats.preemptions >= 1 and stats.revocations == 0 and stats.work_lost == 0


@pytest.mark.parametrize("min_share", [0.1, 1 / 3])
def test_b_besteffort_gets_its_minimum_share_of_the_remainder_beside_burstable(min_share: float) -> None:
    # 20 slots; A and B each count on 3 (nominal) and keep the pool full with 60 s sessions.
    # The remainder is 20 - 6 = 14 borrowed slots, shared by weight across tenants whatever the
    # class: C, BestEffort only, holds its third of them (14 / 3), or its minimum share of them
    # (min_share x 14, rounded up to a whole slot) where that is more, A and B the rest.
    tenants = (
        TenantSpec("a", burstable_nominal=3, burstable_limit=20),
        TenantSpec("b", burstable_nominal=3, burstable_limit=20),
        TenantSpec("c"),
    )
    pol = dataclasses.replace(
        pool_policy(*tenants, workers=10, min_runtime=30),
        fairness=FairnessSpec(best_effort_min_share=min_share),
    )
    # Each tenant submits a 60 s session every 2 s: 30 slots of demand each, far above the pool.
    plans = [plan(f"{t}{i}", t, QoS.BURSTABLE, 2.0 * i, 60.0) for t in "ab" for i in range(1800)]
    plans += [plan(f"c{i}", "c", QoS.BEST_EFFORT, 2.0 * i, 60.0) for i in range(1800)]
    until = 3600.0
    stats = Simulator(pol, plans, SimConfig(checkpoint_s=2.0, until_s=until)).run()
    assert stats.unfinished > 1000  # saturated to the end
    c_slots = sum(stats.slot_seconds["c"].values()) / until
    expected = max(14 / 3, math.ceil(min_share * 14))
    assert abs(c_slots - expected) / expected <= 0.10, (c_slots, expected)
    a_slots = sum(stats.slot_seconds["a"].values()) / until
    b_slots = sum(stats.slot_seconds["b"].values()) / until
    assert abs(a_slots - b_slots) <= 0.1 * a_slots and a_slots > c_slots


def test_c_besteffort_weights_1_1_2_under_saturation() -> None:
    tenants = (TenantSpec("t1", weight=1), TenantSpec("t2", weight=1), TenantSpec("t4", weight=2))
    pol = pool_policy(*tenants, workers=4, min_runtime=30)
    plans = [
        plan(f"{t}-{i}", t, QoS.BEST_EFFORT, float(i % 7), 45.0)
        for t in ("t1", "t2", "t4")
        for i in range(500)
    ]
    stats = Simulator(pol, plans, SimConfig(until_s=3600)).run()
    got = {t: sum(stats.slot_seconds[t].values()) for t in ("t1", "t2", "t4")}
    total = sum(got.values())
    for t, w in (("t1", 0.25), ("t2", 0.25), ("t4", 0.5)):
        assert abs(got[t] / total - w) / w <= 0.05, got


def test_d_holder_that_stops_renewing_loses_its_slot_after_ttl() -> None:
    pol = pool_policy(TenantSpec("t"), workers=1, slots=1, ttl=30)
    plans = [
        plan("dead", "t", QoS.BEST_EFFORT, 0.0, 500.0, crash=5.0),
        plan("next", "t", QoS.BEST_EFFORT, 1.0, 10.0),
    ]
    sim = Simulator(pol, plans, SimConfig())
    stats = sim.run()
    assert stats.expiries == 1
    # The dead holder's lease ran out at its last grant + TTL (it never renewed): next waited 29 s.
    assert stats.waits["besteffort"] == [0.0, 29.0]
    assert stats.to_json()["completed"] == 1


def test_simulate_cli_json_has_exactly_the_documented_keys(tmp_path: Path) -> None:
    wl = tmp_path / "w.csv"
    write_workload(wl, [plan("s1", "sre", QoS.GUARANTEED, 0, 5), plan("s2", "batch", QoS.BEST_EFFORT, 1, 5)])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.cli",
            "simulate",
            "--workload",
            str(wl),
            "--json",
            "--until",
            "100",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out)
    assert set(result) == {
        "classes",
        "tenants",
        "preemptions",
        "revocations",
        "expiries",
        "refusals",
        "work_lost_slot_seconds",
        "utilization",
        "completed",
        "unfinished",
        "stopped",
        "pools",  # issue 24: per-pool figures beside the totals
        "attainment_min",  # the lowest fair-share attainment over tenants (tenants.<t>.attainment)
        "refusals_by_reason",  # an unknown pool's refusal counts here, not as a pool
        "blocked",  # the waits told each blocked reason, over every pool
    }
    assert result["stopped"] is None
    assert set(result["classes"]) == {"guaranteed", "burstable", "besteffort"}
    assert set(result["classes"]["guaranteed"]["time_to_slot"]) == {"p50", "p95", "p99", "max"}
    assert result["completed"] == 2 and result["tenants"]["sre"]["by_class"]["guaranteed"] == 5.0


def test_until_counts_what_is_left_as_unfinished() -> None:
    pol = pool_policy(TenantSpec("t"), workers=1, slots=1)
    plans = [plan(f"s{i}", "t", QoS.BEST_EFFORT, 0.0, 100.0) for i in range(3)]
    result = Simulator(pol, plans, SimConfig(until_s=150)).run().to_json()
    assert result["completed"] == 1 and result["unfinished"] == 2
