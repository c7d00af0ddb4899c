"""The comparison's plots as a reader sees them (issue 10 items 5 and 6): what is drawn is
checked through the pure helpers that choose it (units, curves, legends), not pixels; and a
missing matplotlib costs the plots only, not the report or the JSON."""

from __future__ import annotations

import argparse
import builtins
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.types import QoS
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec
from scheduler.sim.stats import Sample, SimStats
from scheduler.sim.workload import Period, SessionPlan


def stats(waits: dict[str, list[float]] | None = None, held: list[dict[str, int]] | None = None) -> SimStats:
    s = SimStats(Policy())
    for k, v in (waits or {}).items():
        s.waits[k] = list(v)
    for i, h in enumerate(held or []):
        s.samples.append(Sample(float(i), 8, sum(h.values()), 0, h))
        for t, n in h.items():
            s.slot_seconds[t]["burstable"] += n
    return s


def test_time_unit_follows_the_span() -> None:
    from scheduler.sim.compare.plots import time_unit

    assert time_unit(90) == (1.0, "seconds")
    assert time_unit(300) == (60.0, "minutes")  # a 5-minute run, not 0.08 hours
    assert time_unit(2 * 3600) == (60.0, "minutes")
    assert time_unit(4 * 3600) == (3600.0, "hours")


def test_a_single_grant_draws_a_visible_step_and_nothing_is_a_blank() -> None:
    from scheduler.sim.compare.plots import cdf_lines, cdf_xlim

    (line,) = cdf_lines([("slotsched", stats({"guaranteed": [48.0]}))], "guaranteed")
    assert line.xs == [48.0, 48.0] and line.ys == [0.0, 1.0]  # from 0 to 1 at 48 s
    assert cdf_lines([("slotsched", stats())], "guaranteed") == []  # -> "no guaranteed grants"
    assert cdf_xlim([0.0, 0.0]) == (-0.2, 10.0)  # not ±0.055
    lo, hi = cdf_xlim([0.0, 48.0])
    assert lo < 0 < 48.0 < hi


def test_identical_curves_are_one_line_naming_every_contender() -> None:
    from scheduler.sim.compare.plots import cdf_lines

    same = {"burstable": [0.0, 3.0]}
    lines = cdf_lines(
        [("fifo", stats(same)), ("strict-priority", stats(same)), ("slotsched", stats({"burstable": [1.0]}))],
        "burstable",
    )
    assert sorted(line.names for line in lines) == [("fifo", "strict-priority"), ("slotsched",)]


def test_legend_lists_others_only_when_there_are_other_tenants() -> None:
    from scheduler.sim.compare.plots import OTHERS, POOL, TOP_TENANTS, tenant_legend

    two = [("a", stats(held=[{"big": 3, "small": 1}])), ("b", stats(held=[{"big": 2}]))]
    assert tenant_legend(two) == ["big", "small", POOL]
    many = {f"t{i}": i + 1 for i in range(TOP_TENANTS + 2)}
    legend = tenant_legend([("a", stats(held=[many]))])
    assert legend[:2] == [f"t{TOP_TENANTS + 1}", f"t{TOP_TENANTS}"] and legend[-2:] == [OTHERS, POOL]
    assert len(legend) == TOP_TENANTS + 2


def test_plots_of_a_tiny_run_are_drawn(tmp_path: Path) -> None:
    from scheduler.sim.compare.plots import draw_all

    runs = [("slotsched", stats({"guaranteed": [48.0]}, [{"sre": 1}, {"sre": 0}])), ("fifo", stats())]
    for p in draw_all(runs, tmp_path, {"slotsched": "static", "fifo": "static"}):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_without_matplotlib_writes_report_and_json_and_says_how_to_get_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    for mod in [m for m in sys.modules if m.startswith("matplotlib") or m == "scheduler.sim.compare.plots"]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    monkeypatch.delitem(sys.modules, "scheduler.sim.compare.run", raising=False)
    from scheduler.sim.compare.run import run_compare

    pol = Policy(
        pool=PoolSpec(slots_per_worker=1, workers=1, min_workers=1, max_workers=2, floor=0),
        queue=QueueSpec(max_pending=10, max_pending_per_tenant=10),
        tenants=(TenantSpec("t", burstable_nominal=1, burstable_limit=2),),
    )
    plans = [SessionPlan(f"s{i}", "t", QoS.BURSTABLE, [Period(20.0, None, float(i))]) for i in range(3)]
    ns = argparse.Namespace(out=str(tmp_path), json=True, checkpoint_seconds=2.0, until=None)
    assert run_compare(pol, plans, ns) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["policies"]["slotsched"]["completed"] == 3
    assert "plots not drawn" in out.err and "pip install 'slotsched[sim]'" in out.err
    report = (tmp_path / "report.md").read_text()
    assert "plots not drawn" in report and "![" not in report
    assert not list(tmp_path.glob("*.png"))


# ---------------------------------------------------------------- issue 20 item 18


def test_waiting_beside_idle_slots_is_a_band_of_its_own_and_the_legend_says_why() -> None:
    from scheduler.sim.compare.plots import POOL_LEGEND, pool_bands

    s = [Sample(0.0, 8, 5, 4, {}), Sample(1.0, 8, 8, 3, {}), Sample(2.0, 8, 2, 1, {})]
    held, beside_idle, demand = pool_bands(s)
    assert held == [5, 8, 2]
    # 3 of the 4 waiting at t=0 could have had an idle slot; at t=1 the pool was full.
    assert beside_idle == [8, 8, 3]
    assert demand == [9, 11, 3]
    (entry,) = [e for e in POOL_LEGEND if "idle" in e]
    assert "quota" in entry and "limit" in entry


def test_a_stopped_contender_does_not_stretch_the_shared_time_axis() -> None:
    from scheduler.sim.compare.plots import shared_span

    done, stopped = stats(), stats()
    done.end_s, stopped.end_s = 100.0, 1000.0
    stopped.stopped_at_s = 1000.0
    assert shared_span([("a", done), ("b", stopped)]) == (100.0, ["b"])
    assert shared_span([("b", stopped)]) == (1000.0, [])  # nobody finished: nothing to clip to


def test_the_pool_y_axis_keeps_the_held_line_visible_beside_a_huge_queue() -> None:
    from scheduler.sim.compare.plots import pool_ylim

    huge = [Sample(0.0, 24, 24, 186, {}), Sample(1.0, 24, 20, 0, {})]
    top, peak = pool_ylim(huge)
    assert 24 * 1.5 <= top <= 24 * 3 and peak == 210  # held and pool in view, the peak named
    small = [Sample(0.0, 24, 24, 6, {})]
    top, peak = pool_ylim(small)
    assert top >= 30 and peak is None


def test_the_guaranteed_cdf_draws_waits_within_quota() -> None:
    from scheduler.sim.compare.plots import cdf_lines

    s = stats({"guaranteed": [0.0, 99.0, 2.0]})
    s.beyond_quota = [99.0]
    (line,) = cdf_lines([("slotsched", s)], "guaranteed")
    assert line.xs == [0.0, 0.0, 2.0]


def test_no_contender_is_named_like_a_slotsched_subcommand() -> None:
    import argparse

    from scheduler.cli import build_parser
    from scheduler.sim.compare.contenders import roster

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert "demo" in sub.choices  # `slotsched demo`: a baseline must not read as it
    names = {c.name for c in roster()}
    assert not names & set(sub.choices) and "queue-step" in names


# ---------------------------------------------------------------- read as a reader would (issue 39)


def test_every_tenant_up_to_16_has_a_colour_of_its_own_and_no_others() -> None:
    from scheduler.sim.compare.plots import OTHERS, PALETTE, POOL, TOP_TENANTS, tenant_legend

    assert TOP_TENANTS == len(PALETTE) == len(set(PALETTE)) == 16
    sixteen = {f"t{i:02d}": i + 1 for i in range(16)}
    legend = tenant_legend([("a", stats(held=[sixteen]))])
    assert OTHERS not in legend and legend[-1] == POOL and len(legend) == 17


def test_identical_and_near_curves_are_said_in_the_legend() -> None:
    from scheduler.sim.compare.plots import same_as, same_note

    base = {"besteffort": [0.0, 1799.0, 28790.0]}
    near = {"besteffort": [0.0, 1790.0, 28799.5]}  # a retry loop's jitter: each within 1%
    runs = [
        ("slotsched", stats({"besteffort": [0.0, 200.0, 250.0]})),
        ("reject-retry", stats(near)),
        ("fifo", stats(base)),
        ("strict-priority", stats(base)),
        ("priority-kill", stats(base)),
        ("kueue-classic", stats(base)),
        ("idle", stats()),
    ]
    same = same_as(runs)
    assert same == {
        "fifo": "≈ reject-retry",
        "strict-priority": "= fifo",
        "priority-kill": "= fifo",
        "kueue-classic": "= fifo",
    }
    note = same_note(same)
    assert "fifo = strict-priority =" in note[0] and "kueue-classic" in note[0]
    assert "fifo ≈ reject-retry" in note
    # Same in one class, not in another: no shared curve in the legend.
    other = [("a", stats({"burstable": [1.0], "besteffort": [5.0]})), ("b", stats({"burstable": [1.0]}))]
    assert same_as(other) == {} and same_as(other, ["burstable"]) == {"b": "= a"}
    # Short waits half a second apart are apart on the plot (linear below 1 s): not "≈".
    short = [
        ("polling", stats({"guaranteed": [0.0, 0.0, 0.5]})),
        ("formula", stats({"guaranteed": [0.0, 0.5, 0.5]})),
    ]
    assert same_as(short) == {}


def test_identical_panels_name_the_first_and_rows_share_their_top() -> None:
    from scheduler.sim.compare.plots import identical_to, row_tops

    assert identical_to([("fifo", (1, 2)), ("strict", (1, 2)), ("slotsched", (3,)), ("kill", (1, 2))]) == {
        "strict": "fifo",
        "kill": "fifo",
    }
    assert row_tops([40.0, 35.0, 45.0, 10.0, 12.0], 3) == [45.0, 45.0, 45.0, 12.0, 12.0]


def test_smooth_is_a_centred_mean_that_keeps_the_total_level() -> None:
    from scheduler.sim.compare.plots import smooth

    assert smooth([0, 4, 0, 4], 1) == [0.0, 4.0, 0.0, 4.0]
    assert smooth([0, 3, 0, 3, 0], 3) == [1.5, 1.0, 2.0, 1.0, 1.5]


def test_a_class_no_run_granted_is_named_not_drawn_empty() -> None:
    from scheduler.sim.compare.plots import drawn_classes

    assert drawn_classes([("a", stats({"besteffort": [1.0]}))]) == (
        ["besteffort"],
        ["guaranteed", "burstable"],
    )
    assert drawn_classes([("a", stats())]) == (["guaranteed", "burstable", "besteffort"], [])


def test_several_pools_are_named_and_idle_slots_count_for_their_own_pool_only() -> None:
    from scheduler.sim.compare.plots import pool_bands, pools_note

    two = Policy(
        pools=(
            PoolSpec(name="cpu", slots_per_worker=4, workers=2),
            PoolSpec(name="gpu", slots_per_worker=1, workers=2),
        )
    )
    assert pools_note([("a", SimStats(two))]) == "summed over 2 pools: cpu (8) + gpu (2) slots at start"
    assert pools_note([("a", SimStats(Policy()))]) == ""
    # cpu has 3 idle slots, gpu is full with 2 waiting: they wait in a full pool, not beside idle slots.
    s = Sample(0.0, 10, 7, 2, {}, {"cpu": (8, 5, 0), "gpu": (2, 2, 2)})
    assert pool_bands([s]) == ([7], [7], [9])
    one = Sample(0.0, 10, 7, 2, {})
    assert pool_bands([one]) == ([7], [9], [9])
