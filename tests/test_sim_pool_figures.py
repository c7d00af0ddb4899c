"""The simulator says what the server would, pool by pool: Guaranteed quota per pool (with the
pool's override), an unknown pool's refusal as a refusal (not a pool), a workload `selector`
placed by the core's placement, snapshots carrying their pool's compatibility labels, and per
pool why waiters waited, the longest wait and each tenant's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.core.placement import candidates
from scheduler.core.types import QoS
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import parse_policy
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.workload import Period, SessionPlan, WorkloadError, parse_rows, write_workload

POLICY = """
apiVersion: slotsched.dev/v1alpha1
kind: SchedulingPolicy
metadata: {name: two}
spec:
  pools:
    - {name: a, labels: {kind: cpu, cpuModel: icelake, tier: t}, compatibility: [cpuModel],
       slotsPerWorker: 4, workers: 1, minWorkers: 1, maxWorkers: 1, floor: 0}
    - {name: b, labels: {kind: gpu, cpuModel: skylake, tier: t}, compatibility: [cpuModel],
       slotsPerWorker: 1, workers: 1, minWorkers: 1, maxWorkers: 1, floor: 0}
  tenants:
    - name: t
      weight: 1
      guaranteed: 1
      burstable: {nominal: 1, limit: 4}
      pools: [{pool: a, guaranteed: 2}]
    - {name: u, weight: 1, guaranteed: 0, burstable: {nominal: 0, limit: 4}}
"""


def policy() -> Policy:
    return parse_policy(POLICY)[0]


def plan(
    sid: str,
    at: float,
    hold: float,
    pool: str = "",
    qos: QoS = QoS.GUARANTEED,
    selector: tuple[tuple[str, str], ...] = (),
    tenant: str = "t",
) -> SessionPlan:
    return SessionPlan(sid, tenant, qos, [Period(hold, None, at)], pool=pool, selector=selector)


def run(plans: list[SessionPlan]) -> Simulator:
    sim = Simulator(policy(), plans, SimConfig())
    sim.run()
    return sim


# ---------------------------------------------------------------- Guaranteed quota per pool

QUOTA_CASES = [
    # (name, sessions as (id, pool), how many are beyond their pool's quota)
    ("within each pool's own quota (a: 2 by override, b: 1)", [("g1", "a"), ("g2", "a"), ("g3", "b")], 0),
    ("a third in a is beyond a's quota of 2", [("g1", "a"), ("g2", "a"), ("g3", "b"), ("g4", "a")], 1),
    ("a second in b is beyond b's quota of 1", [("g1", "b"), ("g2", "b"), ("g3", "a")], 1),
]


@pytest.mark.parametrize(("name", "sessions", "beyond"), QUOTA_CASES, ids=[c[0] for c in QUOTA_CASES])
def test_guaranteed_quota_is_counted_per_pool_with_its_override(
    name: str, sessions: list[tuple[str, str]], beyond: int
) -> None:
    sim = run([plan(sid, i * 0.1, 10.0, pool) for i, (sid, pool) in enumerate(sessions)])
    assert len(sim.stats.waits["guaranteed"]) == len(sessions)
    assert len(sim.stats.beyond_quota) == beyond, name


def test_an_unknown_pool_is_counted_as_a_refusal_with_its_reason_not_as_a_pool() -> None:
    sim = run([plan("s1", 0.0, 5.0, "nosuch"), plan("s2", 0.0, 5.0, "a")])
    doc = sim.stats.to_json()
    assert set(doc["pools"]) == {"a", "b"}
    assert doc["refusals"] == 1
    assert doc["refusals_by_reason"] == {"unknown_pool": 1}


# ---------------------------------------------------------------- the selector column


def rows(*lines: str) -> list[SessionPlan]:
    header = ["arrival_s", "session_id", "tenant", "qos_class", "hold_s", "pool", "fallback", "selector"]
    return parse_rows([dict(zip(header, ln.split(","), strict=True)) for ln in lines], header)


def test_the_selector_column_is_placed_by_the_core_and_unmatched_is_no_eligible_pool() -> None:
    plans = rows(
        "0,gpu1,t,burstable,5,,,kind=gpu",
        "0,any1,t,burstable,5,,,tier=t;cpuModel=icelake",
        "0,tpu1,t,burstable,5,,,kind=tpu",
    )
    assert plans[0].selector == (("cpuModel", "icelake"), ("tier", "t"))  # sorted, as the SDK sends
    sim = run(plans)
    doc = sim.stats.to_json()
    assert doc["refusals_by_reason"] == {"no_eligible_pool": 1}
    assert doc["pools"]["b"]["sessions"] == 1 and doc["pools"]["a"]["sessions"] == 1
    assert doc["pools"]["a"]["tenants"]["t"]["grants"] == 1


@pytest.mark.parametrize(
    ("selector", "pool", "error"),
    [
        ("kind", "", "'kind' is not key=value"),
        ("kind=gpu;kind=cpu", "", "names 'kind' twice"),
        ("kind=gpu", "a", "a pool or a selector, not both"),
    ],
)
def test_a_bad_selector_is_named_with_its_line(selector: str, pool: str, error: str) -> None:
    with pytest.raises(WorkloadError, match=f"line 2: .*{error}"):
        rows(f"0,s,t,burstable,5,{pool},,{selector}")


def test_a_selector_workload_writes_back_the_same(tmp_path: Path) -> None:
    plans = rows("0,s,t,burstable,5,,b,kind=cpu;tier=t")
    assert plans[0].fallback == ("b",)
    path = tmp_path / "w.csv"
    write_workload(path, plans)
    assert path.read_text().splitlines()[0].endswith(",pool,fallback,selector")
    from scheduler.sim.workload import load_workload

    assert load_workload(path) == plans


# ---------------------------------------------------------------- snapshots carry their labels


def test_a_holders_snapshot_carries_its_pools_labels_and_resumes_only_where_compatible() -> None:
    # s1 holds b's one slot; g, Guaranteed within b's quota, has it yield (checkpoint, snapshot).
    plans = [plan(f"f{i}", 0.0, 100.0, "a", QoS.BURSTABLE) for i in range(4)]
    plans += [plan("s1", 0.1, 300.0, "b", QoS.BURSTABLE, tenant="u"), plan("g", 100.0, 10.0, "b")]
    sim = run(plans)
    assert sim.stats.preemptions >= 1  # g, within b's quota, had s1 yield
    snap = sim._live["s1"].snapshot
    assert snap is not None and snap.pool == "b" and snap.labels == (("cpuModel", "skylake"),)
    # A resume quoting it (a retry) may go only where cpuModel=skylake, whatever it selects:
    again = SessionPlan("s1", "u", QoS.BURSTABLE, [Period(1.0, None, 0.0)], selector=(("tier", "t"),))
    assert candidates(sim.policy, sim.acquire(again, snap)) == ["b"]
    assert candidates(sim.policy, sim.acquire(again)) == ["a", "b"]


# ---------------------------------------------------------------- per pool: why, how long, who


def test_per_pool_blocked_reasons_max_wait_and_tenants() -> None:
    # b has one slot: s2 waits for s1; beyond its nominal of 1 it is told tenant_quota.
    sim = run([plan("s1", 0.0, 10.0, "b", QoS.BURSTABLE), plan("s2", 1.0, 5.0, "b", QoS.BURSTABLE)])
    doc = sim.stats.to_json()
    b = doc["pools"]["b"]
    assert b["blocked"] == {"tenant_quota": 1}
    assert doc["blocked"] == {"tenant_quota": 1}
    assert b["max_wait_s"] == 9.0
    assert b["waits"]["burstable"]["max"] == 9.0
    assert b["tenants"]["t"] == {
        "grants": 2,
        "slot_seconds": 15.0,
        "time_to_slot": {"count": 2, "p50": 4.5, "p99": 8.91, "max": 9.0},
    }
    assert doc["pools"]["a"]["max_wait_s"] is None and doc["pools"]["a"]["tenants"] == {}


# ---------------------------------------------------------------- the report lists every pool


def test_the_compare_header_lists_every_pool_with_its_own_size_and_floor() -> None:
    from scheduler.sim.compare.run import pools_line

    assert pools_line(policy()) == (
        "Pools (2, 5 slots in all): `a` 1 worker x 4 slots, floor 0; `b` 1 worker x 1 slot, floor 0"
    )
    one = Policy()
    spec = one.pool
    assert pools_line(one) == (
        f"Pool: {spec.workers} workers x {spec.slots_per_worker} slots, "
        f"floor {spec.floor_slots(spec.workers * spec.slots_per_worker)}"
    )
