"""Per-tenant figures of `simulate --json` and of the compare report (issue 23 part 4): each
tenant's first grant, its time-to-slot and its waits by class, computed by hand on tiny
workloads (one slot, two tenants) and checked against the simulator."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.types import QoS
from scheduler.policy.model import FairnessSpec, Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.policy.yaml_io import policy_to_yaml
from scheduler.sim.compare.contenders import STATIC
from scheduler.sim.compare.metrics import figures, json_entry, latest_first_grant, spread
from scheduler.sim.compare.run import run_compare
from scheduler.sim.compare.tenants import tenant_cell, tenant_tables
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.stats import SimStats
from scheduler.sim.workload import Period, SessionPlan, write_workload

ROOT = Path(__file__).resolve().parents[1]
G, B, BE = QoS.GUARANTEED, QoS.BURSTABLE, QoS.BEST_EFFORT
NOTHING = {"count": 0, "p50": None, "p99": None, "max": None}


def one_slot(usage_half_life_s: float = 0.0) -> Policy:
    """One slot (also the floor), tenant a BestEffort only, tenant b with one Guaranteed slot of
    quota; `idle` has no sessions. Usage off by default, so the order is the instantaneous share's."""
    return Policy(
        pool=PoolSpec(slots_per_worker=1, workers=1, min_workers=1, max_workers=1, floor=1),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=30, min_runtime_s=60),
        queue=QueueSpec(max_pending=100, max_pending_per_tenant=100),
        tenants=(TenantSpec("a"), TenantSpec("b", guaranteed=1), TenantSpec("idle")),
        fairness=FairnessSpec(usage_half_life_s=usage_half_life_s),
    )


def plan(sid: str, tenant: str, qos: QoS, arrival: float, hold: float) -> SessionPlan:
    return SessionPlan(sid, tenant, qos, [Period(hold, None, arrival)])


def yielding_workload() -> list[SessionPlan]:
    """By hand, checkpoint 2 s:
    t=0   a1 (BE, 100 s) granted at once: a waits 0.
    t=10  b1 (BE, 50 s) queues behind it.
    t=20  b2 (Guaranteed within quota, 30 s): a1 asked to yield, checkpoints, yields at 22;
          b2 granted at 22 (waited 2 s): b's first grant, 12 s after its first request (10).
          a1 re-queued at 22 with 80 s left.
    t=52  b2 ends. a1 and b1 both BestEffort, both tenants hold nothing: the older arrival, a1
          (0 < 10), is granted: its second wait, 52 - 22 = 30 s (a re-queue is a wait of its own).
    t=132 a1 ends; b1 granted after 122 s."""
    return [plan("a1", "a", BE, 0, 100), plan("b1", "b", BE, 10, 50), plan("b2", "b", G, 20, 30)]


def run(policy: Policy, plans: list[SessionPlan], **cfg: Any) -> SimStats:
    return Simulator(policy, plans, SimConfig(checkpoint_s=2.0, **cfg)).run()


def test_two_tenants_on_one_slot_by_hand() -> None:
    doc = run(one_slot(), yielding_workload()).to_json()["tenants"]
    a, b = doc["a"], doc["b"]
    assert a["first_grant_s"] == 0.0
    assert a["time_to_slot"] == {"count": 2, "p50": 15.0, "p99": 29.7, "max": 30.0}
    assert a["waits_by_class"] == {
        "guaranteed": NOTHING,
        "burstable": NOTHING,
        "besteffort": {"count": 2, "p50": 15.0, "p99": 29.7, "max": 30.0},
    }
    assert a["slot_seconds"] == 102.0  # 0..22 (to the yield), then 52..132
    assert b["first_grant_s"] == 12.0
    # waits 2 (G) and 122 (BE): p50 halfway, p99 = 2 + 0.99 * 120
    assert b["time_to_slot"] == {"count": 2, "p50": 62.0, "p99": 120.8, "max": 122.0}
    assert b["waits_by_class"]["guaranteed"] == {"count": 1, "p50": 2.0, "p99": 2.0, "max": 2.0}
    assert b["waits_by_class"]["besteffort"] == {"count": 1, "p50": 122.0, "p99": 122.0, "max": 122.0}
    assert b["by_class"] == {"guaranteed": 30.0, "burstable": 0.0, "besteffort": 50.0}


def test_a_tenant_never_granted_has_null_first_grant_and_null_waits() -> None:
    """Cut off at 60 s: b1 still waits; b2 was never asked. `idle` never asked at all."""
    plans = [plan("a1", "a", BE, 0, 100), plan("b1", "b", BE, 10, 50)]
    doc = run(one_slot(), plans, until_s=60.0).to_json()["tenants"]
    for name in ("b", "idle"):
        assert doc[name]["first_grant_s"] is None
        assert doc[name]["time_to_slot"] == NOTHING
        assert doc[name]["slot_seconds"] == 0.0
    assert doc["a"]["first_grant_s"] == 0.0 and doc["a"]["slot_seconds"] == 60.0


@pytest.mark.parametrize(
    ("arrivals", "first_grant"),
    [
        # b's first session arrives at 5 and waits for a1 (ends at 40): 35 s.
        ((5.0, 7.0), 35.0),
        # b's first request at 40, as a1 ends: at once.
        ((40.0, 41.0), 0.0),
        # b asks at 50 and 20: the earlier counts, whichever session it is; granted at 40.
        ((50.0, 20.0), 20.0),
    ],
)
def test_first_grant_counts_from_the_tenants_first_request(
    arrivals: tuple[float, float], first_grant: float
) -> None:
    plans = [
        plan("a1", "a", BE, 0, 40),
        plan("b1", "b", BE, arrivals[0], 10),
        plan("b2", "b", BE, arrivals[1], 10),
    ]
    doc = run(one_slot(), plans).to_json()["tenants"]
    assert doc["b"]["first_grant_s"] == first_grant


def test_a_retry_loop_wait_counts_from_the_first_refusal() -> None:
    """A refused holder retries (compare's reject-retry): its wait, and its tenant's first grant,
    run from its first attempt, not from the retry that lands."""
    reject = next(c for c in STATIC if c.name == "reject-retry")
    plans = [plan("a1", "a", BE, 0, 40), plan("b1", "b", BE, 10, 10)]
    sim = Simulator(one_slot(), plans, SimConfig(retry_refused=True, seed=1), decider=reject.decider)
    b = sim.run().to_json()["tenants"]["b"]
    assert b["first_grant_s"] is not None and 30.0 <= b["first_grant_s"] <= 33.0
    assert b["time_to_slot"]["max"] == b["first_grant_s"]


def test_without_arrivals_first_grant_counts_from_the_earliest_wait() -> None:
    """A driver that does not report arrivals (the demo): the start of the tenant's earliest
    granted wait. b's waits began at 20 (b2, granted at 22) and 10 (b1, granted at 132): from 10,
    as with arrivals."""
    stats = run(one_slot(), yielding_workload())
    stats.first_arrival.clear()
    doc = stats.to_json()["tenants"]
    assert doc["a"]["first_grant_s"] == 0.0
    assert doc["b"]["first_grant_s"] == 12.0


def test_usage_rotates_six_tenants_on_two_slots_and_every_one_gets_a_first_grant() -> None:
    """More tenants than slots with usage on: the per-tenant figures show every tenant served."""
    tenants = tuple(TenantSpec(f"t{i:02d}") for i in range(6))
    pol = Policy(
        pool=PoolSpec(slots_per_worker=1, workers=2, min_workers=1, max_workers=2, floor=0),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=30, min_runtime_s=60),
        queue=QueueSpec(max_pending=1000, max_pending_per_tenant=1000),
        tenants=tenants,
        fairness=FairnessSpec(usage_half_life_s=600),
    )
    plans = [
        plan(f"{t.name}-{k}", t.name, BE, i + 0.01 * k, 900) for i, t in enumerate(tenants) for k in range(2)
    ]
    doc = run(pol, plans, until_s=1500.0).to_json()["tenants"]
    firsts = [doc[t.name]["first_grant_s"] for t in tenants]
    assert all(f is not None for f in firsts) and max(firsts) <= 600


# ---------------------------------------------------------------- the compare report


def test_spread_and_latest_first_grant() -> None:
    assert spread([]) == 1.0 and spread([0.0, 0.0]) == 1.0
    assert spread([2.0, 4.0]) == 2.0
    assert math.isinf(spread([0.0, 4.0]))
    assert latest_first_grant({}) is None
    assert latest_first_grant({"a": {"first_grant_s": 3.0}, "b": {"first_grant_s": 9.0}}) == 9.0
    never = latest_first_grant({"a": {"first_grant_s": 3.0}, "b": {"first_grant_s": None}})
    assert never is not None and math.isinf(never)


def test_figures_carry_tenants_with_demand_and_the_table_shows_them() -> None:
    pol, plans = one_slot(), yielding_workload()
    stats = run(pol, plans)
    fig = figures("slotsched", stats, pol, plans, 2.0)
    assert sorted(fig.tenants) == ["a", "b"]  # `idle` has no session: no row
    assert fig.tenants["b"] == stats.tenant_json("b") | {"attainment": fig.tenants["b"]["attainment"]}
    assert fig.first_grant_max == 12.0
    assert fig.share_spread == pytest.approx(102.0 / 80.0)
    assert tenant_cell(fig.tenants["a"]) == "0.0 · 15.0/29.7/30.0 · 102"
    assert tenant_cell(None).endswith("never granted")
    lines = tenant_tables([fig])
    assert lines[0] == "## Per tenant"
    rows = [ln for ln in lines if ln.startswith(("a |", "b |"))]
    assert rows[0] == "a | 0.0 · 15.0/29.7/30.0 · 102"
    assert rows[1] == "b | 12.0 · 62.0/120.8/122.0 · 80"
    assert rows[3] == "b | 2.0 / — / 122.0"  # p99 per class, G / B / BE
    assert "*latest first grant (s)* | 12.0" in lines
    assert "*slot-s / weight, max / min* | 1.27" in lines
    assert not any(ln.startswith("|") for ln in lines)  # the main table stays the only `|` block


def test_a_tenant_never_granted_reads_infinite_in_the_summary() -> None:
    pol = one_slot()
    plans = [plan("a1", "a", BE, 0, 100), plan("b1", "b", BE, 10, 50)]
    stats = run(pol, plans, until_s=60.0)
    lines = tenant_tables([figures("slotsched", stats, pol, plans, 2.0)])
    assert "b | — never granted" in lines
    assert "*latest first grant (s)* | ∞ (1 never granted)" in lines
    assert "*slot-s / weight, max / min* | ∞ (1 got none)" in lines


def test_compare_report_json_and_stdout_have_the_per_tenant_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pol, plans = one_slot(), yielding_workload()
    ns = argparse.Namespace(out=str(tmp_path), json=False, checkpoint_seconds=2.0, until=None)
    assert run_compare(pol, plans, ns) == 0
    out = capsys.readouterr().out
    report = (tmp_path / "report.md").read_text()
    section = report.split("## Per tenant\n", 1)[1].split("\n## ", 1)[0]
    header = next(ln for ln in section.splitlines() if ln.startswith("tenant | "))
    assert header.split(" | ")[1:4] == ["**slotsched**", "reject-retry", "fifo"]
    (a_row, _, _) = [
        ln for ln in section.splitlines() if ln.startswith("a | ")
    ]  # first grant, p99, attainment
    assert a_row.split(" | ")[1] == "0.0 · 15.0/29.7/30.0 · 102"  # slotsched: the hand figures
    assert "per tenant: first grant" in out and "a | 0.0 · 15.0/29.7/30.0 · 102" in out
    from scheduler.sim.compare import run as compare_run

    # The same run again for its JSON: its plots are the ones just drawn.
    monkeypatch.setattr(compare_run, "draw_plots", lambda results, out: ([], ""))
    ns.json = True
    run_compare(pol, plans, ns)
    doc = json.loads(capsys.readouterr().out)["policies"]
    for entry in doc.values():  # every contender runs through the same simulator: all have them
        assert set(entry["tenants"]["a"]) >= {"first_grant_s", "time_to_slot", "waits_by_class"}
    assert doc["slotsched"]["tenants"]["b"]["first_grant_s"] == 12.0
    assert doc["fifo"]["tenants"]["b"]["time_to_slot"]["count"] >= 2


def test_cli_simulate_json_has_the_per_tenant_keys(tmp_path: Path) -> None:
    wl, pf = tmp_path / "w.csv", tmp_path / "p.yaml"
    write_workload(wl, yielding_workload())
    pf.write_text(policy_to_yaml(one_slot()))
    cmd = [
        sys.executable,
        "-m",
        "scheduler.cli",
        "simulate",
        "--policy",
        str(pf),
        "--workload",
        str(wl),
        "--json",
    ]
    doc = json.loads(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    assert doc["tenants"]["b"]["first_grant_s"] == 12.0
    assert doc["tenants"]["b"]["time_to_slot"]["p99"] == 120.8
    assert doc["tenants"]["idle"]["first_grant_s"] is None


def test_attainment_reaches_the_figures_the_json_and_the_table() -> None:
    """With the run's samples, `figures` carries each tenant's attainment (`tenants.<t>.attainment`
    of the JSON) and its lowest (`attainment_min`), and the per-tenant section prints them."""
    pol, plans = one_slot(), yielding_workload()
    sim = Simulator(pol, plans, SimConfig(checkpoint_s=2.0, sample_every_s=1.0))
    stats = sim.run()
    fig = figures("slotsched", stats, pol, plans, 2.0, sim.waiting_by_tenant, sim.points)
    a = fig.tenants["a"]["attainment"]
    assert set(a) == {"guaranteed", "burstable", "besteffort", "all"}
    assert a["besteffort"] is not None and a["guaranteed"] is None
    lowest = min(fig.tenants[t]["attainment"]["all"] for t in ("a", "b"))
    assert fig.attainment_min == pytest.approx(lowest, abs=1e-4)  # the per-tenant figures are rounded
    entry = json_entry(stats, fig)
    assert entry["tenants"]["a"]["attainment"] == a and entry["attainment_min"] == pytest.approx(
        lowest, abs=1e-4
    )
    lines = tenant_tables([fig])
    assert f"a | {a['all']:.2f} (— / — / {a['besteffort']:.2f})" in lines
    assert f"*lowest (attainment_min)* | {lowest:.2f}" in lines


def test_simulate_json_has_each_tenants_attainment(tmp_path: Path) -> None:
    """`slotsched simulate --json` (no --compare) samples the run too: `tenants.<t>.attainment`
    and `attainment_min` over the tenants with sessions, as a contender's entry has them."""
    pol, plans = one_slot(), yielding_workload()
    wl, pf = tmp_path / "w.csv", tmp_path / "p.yaml"
    write_workload(wl, plans)
    pf.write_text(policy_to_yaml(pol))
    cmd = [sys.executable, "-m", "scheduler.cli", "simulate", "--policy", str(pf), "--workload", str(wl)]
    doc = json.loads(
        subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    )
    a, b = doc["tenants"]["a"]["attainment"], doc["tenants"]["b"]["attainment"]
    assert a["besteffort"] is not None and a["guaranteed"] is None and b["guaranteed"] is not None
    assert doc["tenants"]["idle"]["attainment"]["all"] is None  # no sessions: nothing owed
    assert doc["attainment_min"] == pytest.approx(min(a["all"], b["all"]), abs=1e-4)
