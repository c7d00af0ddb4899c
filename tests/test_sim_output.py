"""What `slotsched simulate` tells its reader (issue 10 items 3, 4 and the missing workload file):
every tenant of the policy listed, a class with no grant null rather than 0 s, unknown tenants
named (or, on request, counted as refused), and a missing file named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.core.types import QoS
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec
from scheduler.sim.compare.contenders import STATIC
from scheduler.sim.compare.metrics import figures
from scheduler.sim.compare.report import table, verdicts
from scheduler.sim.render import render_text
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.workload import Period, SessionPlan, write_workload

ROOT = Path(__file__).resolve().parents[1]


def plan(sid: str, tenant: str, qos: QoS, arrival: float = 0.0, hold: float = 10.0) -> SessionPlan:
    return SessionPlan(sid, tenant, qos, [Period(hold, None, arrival)])


def policy() -> Policy:
    return Policy(
        pool=PoolSpec(slots_per_worker=2, workers=1, min_workers=1, max_workers=1, floor=0),
        queue=QueueSpec(max_pending=100, max_pending_per_tenant=100),
        tenants=(
            TenantSpec("busy", burstable_nominal=2, burstable_limit=2),
            TenantSpec("denied", guaranteed=0, burstable_nominal=0, burstable_limit=0),
            TenantSpec("idle"),
        ),
    )


def run() -> Simulator:
    plans = [plan("b1", "busy", QoS.BURSTABLE), plan("d1", "denied", QoS.GUARANTEED, 1.0)]
    sim = Simulator(policy(), plans, SimConfig())
    sim.run()
    return sim


# ---------------------------------------------------------------- item 3


def test_json_lists_every_tenant_and_null_waits_for_a_class_never_granted() -> None:
    sim = run()
    doc = sim.stats.to_json()
    assert sim.stats.refusals == 1  # denied's Guaranteed request: no quota
    assert set(doc["tenants"]) == {"busy", "denied", "idle"}
    nothing = {"count": 0, "p50": None, "p99": None, "max": None}
    for name in ("denied", "idle"):
        assert doc["tenants"][name] == {
            "slot_seconds": 0.0,
            "by_class": {"guaranteed": 0.0, "burstable": 0.0, "besteffort": 0.0},
            "first_grant_s": None,  # never granted: null, not 0 s
            "time_to_slot": nothing,
            "waits_by_class": {"guaranteed": nothing, "burstable": nothing, "besteffort": nothing},
        }
    assert doc["tenants"]["busy"]["slot_seconds"] == 10.0
    for cls in ("guaranteed", "besteffort"):
        assert doc["classes"][cls] == {
            "count": 0,
            "time_to_slot": {"p50": None, "p95": None, "p99": None, "max": None},
        }
    assert doc["classes"]["burstable"]["time_to_slot"]["max"] == 0.0  # a real 0 s wait stays 0
    json.dumps(doc)  # null, not NaN


def test_text_and_report_show_a_dash_for_a_class_never_granted() -> None:
    sim = run()
    text = render_text(sim.stats.to_json())
    (g_line,) = [ln for ln in text.splitlines() if ln.strip().startswith("guaranteed")]
    assert "—" in g_line and "no grants" in g_line and "0.00" not in g_line
    (idle,) = [ln for ln in text.splitlines() if ln.strip().startswith("idle")]
    assert "nothing granted" in idle
    fig = figures("slotsched", sim.stats, policy(), [], 2.0)
    (row,) = table([fig], 12.0)[2:]
    assert row.split(" | ")[1] == "— (no grants)"  # Guaranteed column
    # Two contenders with no Guaranteed grant: no Guaranteed verdict, not a "tie at 0.0 s".
    other = figures("fifo", sim.stats, policy(), [], 2.0)
    wins, losses = verdicts([c for c in STATIC if c.name in ("slotsched", "fifo")], [fig, other], 12.0, 2.0)
    assert not any("Guaranteed p99" in ln or "Guaranteed max" in ln for ln in wins + losses)
    assert any("Burstable max" in ln for ln in wins)


# ---------------------------------------------------------------- item 4 and the missing file


def workload(tmp_path: Path) -> Path:
    wl = tmp_path / "w.csv"
    plans = [
        plan("s1", "sre", QoS.GUARANTEED, 0, 5),
        plan("x1", "mystery", QoS.BURSTABLE, 1, 5),
        plan("x2", "mystery", QoS.BURSTABLE, 2, 5),
        plan("y1", "ghost", QoS.BEST_EFFORT, 3, 5),
    ]
    write_workload(wl, plans)
    return wl


def test_unknown_tenants_are_named_and_exit_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wl = workload(tmp_path)
    for extra in ([], ["--compare", "--out", str(tmp_path / "out")]):
        assert main(["simulate", "--workload", str(wl), *extra]) == 2
        err = capsys.readouterr().err
        assert "ghost (1 session), mystery (2 sessions)" in err
        assert "built-in policy" in err and "--unknown-tenants=refuse" in err
    assert not (tmp_path / "out").exists()


def test_unknown_tenants_refused_on_request_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wl = workload(tmp_path)
    assert main(["simulate", "--workload", str(wl), "--unknown-tenants=refuse", "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["refusals"] == 3 and doc["completed"] == 1 and doc["unfinished"] == 0
    assert "3 session(s) of tenants the policy lacks counted as refused" in out.err
    assert main(["simulate", "--workload", str(wl), "--unknown-tenants=refuse"]) == 0
    assert "refused as unknown tenants (in refusals): ghost (1 session), mystery (2 sessions)" in (
        capsys.readouterr().out
    )


def test_compare_counts_unknown_tenants_as_refused_by_every_contender(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wl, out = workload(tmp_path), tmp_path / "out"
    argv = ["simulate", "--compare", "--workload", str(wl), "--out", str(out), "--json"]
    assert main([*argv, "--unknown-tenants=refuse", "--until", "60"]) == 0
    doc = json.loads(capsys.readouterr().out)["policies"]
    assert {e["refusals"] for e in doc.values()} == {3}
    assert "Refused, not simulated (tenants the policy lacks" in (out / "report.md").read_text()


def test_missing_workload_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    r = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "simulate", "--workload", str(missing)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: workload file not found: {missing}"
