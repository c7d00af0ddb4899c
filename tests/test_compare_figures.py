"""Figures of `simulate --compare` that a reader could misread (issue 20 items 16 and 17): Jain's
index under contention with nothing to average over, and Guaranteed waits beyond the tenant's
quota, which the promise does not cover."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from scheduler.core.types import QoS
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.sim.compare.contenders import STATIC
from scheduler.sim.compare.metrics import RunFigures, contention_jain, figures
from scheduler.sim.compare.report import table, verdicts
from scheduler.sim.compare.run import run_compare
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.stats import Sample, SimStats
from scheduler.sim.workload import Period, SessionPlan

WAITS = {"guaranteed": (0.0, 4.0, 4.0), "burstable": (1.0, 2.0, 3.0), "besteffort": (1.0, 2.0, 3.0)}


def fig(name: str, jain_c: float | None, beyond: tuple[int, float, float] = (0, 0.0, 0.0)) -> RunFigures:
    return RunFigures(
        name, WAITS, 0, 3.0, 0.5, jain_c, 0.0, 10, 0.8, 100.0, 0, 0, 10, 0, g_beyond_quota=beyond
    )


CONTENDERS = [c for c in STATIC if c.name in ("slotsched", "priority-kill", "fifo")]


# ---------------------------------------------------------------- item 16: Jain under contention


def test_jain_under_contention_over_no_contended_sample_is_not_a_number() -> None:
    s = SimStats(Policy())
    s.samples = [Sample(float(i), 4, 1, 0, {"a": 1}) for i in range(5)]  # nobody ever waited
    assert contention_jain(s, [{}] * 5, Policy()) is None
    s.samples.append(Sample(5.0, 4, 4, 1, {"a": 4}))  # 'b' waits, 'a' holds all: 1/2
    assert contention_jain(s, [{}] * 5 + [{"b": 1}], Policy()) == pytest.approx(0.5)


def test_an_empty_contention_average_counts_for_and_against_nobody() -> None:
    def lines(*figs: RunFigures) -> list[str]:
        wins, losses = verdicts(CONTENDERS, list(figs), target=12.0, checkpoint_s=2.0)
        return [ln for ln in wins + losses if "Jain under contention (held/weight)" in ln]

    # slotsched had nothing to average: no win (1.000 would beat 0.4), no loss.
    assert lines(fig("slotsched", None), fig("priority-kill", 0.4), fig("fifo", 0.3)) == []
    # Nor may an empty average of another contender beat slotsched's measured one.
    (only,) = lines(fig("slotsched", 0.6), fig("priority-kill", None), fig("fifo", 0.3))
    assert "best other fifo 0.300" in only
    assert lines(fig("slotsched", 0.6), fig("priority-kill", None), fig("fifo", None)) == []


def test_the_table_shows_an_empty_contention_average_as_n_a() -> None:
    rows = table([fig("slotsched", None), fig("fifo", 0.3)], 12.0)
    head = [c.strip() for c in rows[0].split("|")]
    col = head.index("Jain under contention")
    assert rows[2].split("|")[col].strip() == "n/a"
    assert rows[3].split("|")[col].strip() == "0.300"


def small() -> tuple[Policy, list[SessionPlan]]:
    pol = Policy(
        pool=PoolSpec(slots_per_worker=2, workers=1, min_workers=1, max_workers=2, floor=2),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=30, min_runtime_s=10),
        queue=QueueSpec(max_pending=100, max_pending_per_tenant=100),
        tenants=(TenantSpec("sre", guaranteed=1), TenantSpec("batch")),
    )
    plans = [
        SessionPlan("g1", "sre", QoS.GUARANTEED, [Period(100.0, None, 0.0)]),
        SessionPlan("g2", "sre", QoS.GUARANTEED, [Period(10.0, None, 1.0)]),  # beyond quota 1
        SessionPlan("x", "batch", QoS.BEST_EFFORT, [Period(30.0, None, 2.0)]),
    ]
    return pol, plans


def test_compare_json_has_jain_under_contention_and_its_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pol, plans = small()
    ns = argparse.Namespace(out=str(tmp_path), json=True, checkpoint_seconds=2.0, until=None)
    run_compare(pol, plans, ns)
    doc = json.loads(capsys.readouterr().out)["policies"]
    for entry in doc.values():
        j = entry["jain_under_contention"]
        assert set(j) == {"index", "samples"} and isinstance(j["samples"], int)
        assert (j["index"] is None) == (j["samples"] == 0)
    assert doc["slotsched"]["jain_under_contention"]["samples"] > 0  # g2 waited


# ---------------------------------------------------------------- item 17: Guaranteed and quota


def test_a_guaranteed_request_beyond_quota_is_measured_apart() -> None:
    pol, plans = small()
    stats = Simulator(pol, plans, SimConfig(checkpoint_s=2.0)).run()
    # g2 arrives while its tenant holds its whole quota (g1): it waits for g1's end, 99 s.
    assert sorted(stats.waits["guaranteed"]) == [0.0, 99.0]
    assert stats.guaranteed_waits(beyond_quota=True) == [99.0]
    assert stats.guaranteed_waits(beyond_quota=False) == [0.0]
    f = figures("slotsched", stats, pol, plans, 2.0)
    # The promise (grace + checkpoint, 12 s) covers requests within quota: no miss here.
    assert f.sla_misses == 0
    assert f.waits["guaranteed"] == (0.0, 0.0, 0.0)
    assert f.g_beyond_quota == (1, 99.0, 99.0)


def test_the_report_shows_guaranteed_waits_within_and_beyond_quota_and_which_is_promised() -> None:
    figs = [fig("slotsched", 0.6, (2, 270.0, 272.0)), fig("priority-kill", 0.4, (2, 0.0, 0.0))]
    rows = table(figs, 17.0)
    head = [c.strip() for c in rows[0].split("|")]
    assert "Guaranteed within quota p50/p99/max (s)" in head
    beyond = head.index("G beyond quota: n, p99/max (s)")
    assert rows[2].split("|")[beyond].strip() == "2: 270.0 / 272.0"
    assert "G SLA misses (within quota, > 17 s)" in head
    contenders = [c for c in CONTENDERS if c.name != "fifo"]
    _, losses = verdicts(contenders, figs, target=17.0, checkpoint_s=2.0)
    (q,) = [ln for ln in losses if "beyond quota" in ln]
    assert "272.0 s" in q and "quota" in q.split("Why:")[1]
    assert "not covered" in q


def test_no_request_beyond_quota_shows_a_dash_and_is_no_verdict() -> None:
    figs = [fig("slotsched", 0.6), fig("priority-kill", 0.4, (1, 0.0, 0.0))]
    rows = table(figs, 17.0)
    head = [c.strip() for c in rows[0].split("|")]
    assert rows[2].split("|")[head.index("G beyond quota: n, p99/max (s)")].strip() == "0"
    wins, losses = verdicts(CONTENDERS[:2], figs, target=17.0, checkpoint_s=2.0)
    assert not any("beyond quota" in ln for ln in wins + losses)


def test_compare_json_splits_guaranteed_waits_by_quota(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler.sim.compare import run as compare_run

    # No plots: the jain test above draws this very run's (same workload and arguments).
    monkeypatch.setattr(compare_run, "draw_plots", lambda results, out: ([], ""))
    pol, plans = small()
    ns = argparse.Namespace(out=str(tmp_path), json=True, checkpoint_seconds=2.0, until=None)
    run_compare(pol, plans, ns)
    entry = json.loads(capsys.readouterr().out)["policies"]["slotsched"]
    by = entry["guaranteed_by_quota"]
    assert by["within"]["count"] == 1 and by["within"]["max"] == 0.0
    assert by["beyond"]["count"] == 1 and by["beyond"]["max"] == 99.0
    assert entry["sla_misses"] == 0
    report = (tmp_path / "report.md").read_text()
    assert "within quota" in report and "beyond" in report
