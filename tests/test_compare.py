"""`simulate --compare` on a small workload: a report row per contender, non-empty PNGs, --json shape,
and verdicts that say where slotsched loses."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.core.types import QoS
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.policy.yaml_io import policy_to_yaml
from scheduler.sim.compare.contenders import STATIC, roster
from scheduler.sim.compare.metrics import RunFigures, jain
from scheduler.sim.compare.report import verdicts
from scheduler.sim.compare.run import run_compare
from scheduler.sim.workload import Period, SessionPlan, write_workload

ROOT = Path(__file__).resolve().parents[1]
SIMULATE_KEYS = {
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
    "refusals_by_reason",  # an unknown pool's refusal counts here, not as a pool
    "blocked",  # the waits told each blocked reason, over every pool
}


def small() -> tuple[Policy, list[SessionPlan]]:
    tenants = (
        TenantSpec("big", guaranteed=1, burstable_nominal=1, burstable_limit=6),
        TenantSpec("small", guaranteed=1, burstable_nominal=1, burstable_limit=6),
    )
    pol = Policy(
        pool=PoolSpec(slots_per_worker=2, workers=2, min_workers=1, max_workers=4, floor=1),
        timing=TimingSpec(yield_grace_s=5, lease_ttl_s=30, min_runtime_s=10),
        queue=QueueSpec(max_pending=1000, max_pending_per_tenant=1000),
        tenants=tenants,
    )
    plans = []
    for i in range(18):
        tenant = "big" if i % 3 else "small"
        qos = (QoS.GUARANTEED, QoS.BURSTABLE, QoS.BEST_EFFORT)[i % 3]
        plans.append(
            SessionPlan(f"s{i}", tenant, qos, [Period(40.0, None, 3.0 * i), Period(20.0, 15.0, 0.0)])
        )
    return pol, plans


def args(out: Path, as_json: bool) -> argparse.Namespace:
    return argparse.Namespace(out=str(out), json=as_json, checkpoint_seconds=2.0, until=None)


def test_report_has_a_row_per_policy_and_non_empty_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pol, plans = small()
    assert run_compare(pol, plans, args(tmp_path, False)) == 0
    report = (tmp_path / "report.md").read_text()
    rows = [ln for ln in report.splitlines() if ln.startswith("| ")][1:]  # the main table alone
    names = [c.name for c in roster()]
    assert len(rows) == len(names)
    for name, row in zip(names, rows, strict=True):
        assert row.split("|")[1].strip().strip("*") == name
    assert "## Where slotsched does not win" in report
    for png in ("time_to_slot_cdf.png", "slots_by_tenant.png", "pool_vs_demand.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"]({png})" in report
    captured = capsys.readouterr()
    assert "compare" in captured.err  # the progress bar goes to stderr
    assert "slotsched" in captured.out


def test_json_shape_is_simulate_keys_plus_pool_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler.sim.compare import run as compare_run

    # The JSON alone: the same run's plots are drawn and checked by the test above.
    monkeypatch.setattr(compare_run, "draw_plots", lambda results, out: ([], ""))
    pol, plans = small()
    run_compare(pol, plans, args(tmp_path, True))
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"policies"}
    assert set(doc["policies"]) == {c.name for c in roster()}
    for entry in doc["policies"].values():
        assert set(entry) == SIMULATE_KEYS | {
            "worker_seconds",
            "scale_actions",
            "sla_misses",
            "guaranteed_by_quota",
            "jain_under_contention",
            "attainment_min",
        }
        assert entry["completed"] == len(plans)
    assert doc["policies"]["fifo"]["preemptions"] == 0
    assert doc["policies"]["priority-kill"]["work_lost_slot_seconds"] > 0


def test_cli_simulate_compare_json(tmp_path: Path) -> None:
    pol, plans = small()
    wl, pf = tmp_path / "w.csv", tmp_path / "p.yaml"
    write_workload(wl, plans)
    pf.write_text(policy_to_yaml(pol))
    cmd = [sys.executable, "-m", "scheduler.cli", "simulate", "--compare", "--workload", str(wl)]
    cmd += ["--policy", str(pf), "--out", str(tmp_path / "out"), "--json", "--until", "600"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    doc = json.loads(r.stdout)
    assert doc["policies"]["slotsched"]["completed"] == len(plans)
    assert (tmp_path / "out" / "report.md").exists()


def test_jain_index() -> None:
    assert jain([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain([]) == 1.0


def _fig(name: str, g_p99: float, work_lost: float, jain_c: float) -> RunFigures:
    waits = {"guaranteed": (0.0, g_p99, g_p99), "burstable": (1.0, 2.0, 3.0), "besteffort": (1.0, 2.0, 3.0)}
    return RunFigures(name, waits, 0, 3.0, 0.5, jain_c, work_lost, 10, 0.8, 100.0, 0, 0, 10, 0)


def test_verdicts_name_the_winner_and_the_price_where_slotsched_loses() -> None:
    contenders = [c for c in STATIC if c.name in ("slotsched", "priority-kill", "fifo")]
    figs = [
        _fig("slotsched", 4.0, 0.0, 0.7),
        _fig("priority-kill", 0.0, 900.0, 0.4),
        _fig("fifo", 50.0, 0.0, 0.4),
    ]
    wins, losses = verdicts(contenders, figs, target=12.0, checkpoint_s=2.0)
    (g_loss,) = [ln for ln in losses if "Guaranteed" in ln]
    assert "priority-kill" in g_loss and "900 slot-s" in g_loss and "4.0 s" in g_loss
    assert any("Jain under contention" in w and "slotsched 0.700" in w for w in wins)
    assert not any("work lost" in ln for ln in losses)


def test_progress_bar_draws_in_place_on_a_terminal() -> None:
    from scheduler.sim.compare.run import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    s = Tty()
    bar = Progress(2, s)
    bar.start("a")
    bar.update(0.5)
    bar.finish()
    assert "\rcompare [" in s.getvalue() and "25.0%" in s.getvalue()
