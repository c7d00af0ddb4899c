"""Scaling ahead of a known peak, and recycling, on the shipped multi-day diurnal sample.

The workload (scheduler/sim/samples/diurnal-3d.csv.xz, `scheduler/sim/diurnal.py`): three days of
Claude Code sessions with a morning wave at 9:00, on an elastic pool of 2 to 40 workers that take
120 s to start. The autoscaler loop the server runs (in virtual time) sizes it three ways:

- reactive: on observed demand only (the default);
- scheduled: a window 08:45-18:00 UTC of at least the peak the reactive pool reached on day 0;
- forecast: the highest demand recorded at the same time of day over the last 2 days, looking
  the start-up time plus one period ahead (`spec.autoscaler.forecast: {lookbackDays: 2}`).

Day 0 is the forecast's first record, so the ramp figures are of days 1 and 2: the p99 wait of
the requests made between 9:00 and 10:00 (Guaranteed within quota; Burstable), and the
worker-seconds of the whole run. Then recycling (`scheduler/sim/recycling.py`): a pool pinned at
8 workers, one leaking 1 MiB/s past `recycle.memoryBytes` 1 GiB, replaced.

    python bench/autoscale_diurnal.py [--plot diurnal.png] [--report out/diurnal]
    # last line: ramp_g_p99_ratio=X ramp_b_p99_ratio=X worker_seconds_ratio=X recycle_work_lost=X
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.policy.yaml_io import load_policy  # noqa: E402
from scheduler.sim.diurnal import MODES, RAMP_HOUR, DiurnalStats, ramp_p99, run_mode  # noqa: E402
from scheduler.sim.recycling import run_recycle  # noqa: E402
from scheduler.sim.stats import percentile  # noqa: E402
from scheduler.sim.traces.convert import samples_dir  # noqa: E402
from scheduler.sim.workload import load_workload  # noqa: E402

RAMP_DAYS = (1, 2)


def _ratio(a: float, b: float) -> float:
    return a / b if b else (0.0 if a == 0 else float("inf"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plot", default=None, help="write the figure of pool size against demand here (PNG)")
    p.add_argument("--report", default=None, help="write report.md and diurnal.png into this folder")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    s = samples_dir()
    policy, _ = load_policy(s / "diurnal-3d-policy.yaml")
    plans = load_workload(s / "diurnal-3d.csv.xz")
    spw = policy.pool.slots_per_worker

    runs: dict[str, DiurnalStats] = {"reactive": run_mode(policy, plans, "reactive")}
    day0 = [c for t, c, _ in runs["reactive"].series if RAMP_HOUR * 3600 <= t < (RAMP_HOUR + 2) * 3600]
    peak = max(day0) // spw
    for mode in MODES[1:]:
        runs[mode] = run_mode(policy, plans, mode, peak_workers=peak)

    print(f"diurnal-3d: {len(plans)} sessions over 3 days; ramp hour {RAMP_HOUR}:00 of days 1 and 2")
    print(
        f"{'mode':<10} {'G_p99_s':>8} {'B_p99_s':>8} {'BE_p99_s':>8} {'worker_h':>9} {'peak':>5} {'lost':>5}"
    )
    for name, st in runs.items():
        g, b, be = (ramp_p99(st, c, RAMP_DAYS) for c in ("guaranteed", "burstable", "besteffort"))
        top = max(c for _, c, _ in st.series) // spw
        print(
            f"{name:<10} {g:>8.1f} {b:>8.1f} {be:>8.1f} {st.worker_seconds / 3600:>9.1f} {top:>5} "
            f"{st.work_lost:>5.0f}"
        )
    all_g = percentile(runs["reactive"].guaranteed_waits(beyond_quota=False), 99)
    print(
        f"(scheduled: at least {peak} workers 08:45-18:00; reactive G p99 over the whole run {all_g:.1f} s)"
    )

    rec = run_recycle(policy, plans)
    print(
        f"recycle: replaced {','.join(rec.recycled) or 'none'}; sessions drained {rec.drained_sessions}, "
        f"resumed from their snapshot {rec.resumed_sessions}; revocations {rec.revocations}; "
        f"capacity never below {rec.min_capacity_slots} slots (floor {rec.floor_slots})"
    )
    if a.plot:
        from scheduler.sim.compare.diurnal_plot import plot_diurnal

        print(f"plot: {plot_diurnal(runs, spw, RAMP_DAYS, a.plot)}")
    if a.report:
        from scheduler.sim.compare.diurnal_plot import plot_diurnal
        from scheduler.sim.compare.diurnal_report import render_diurnal

        out = Path(a.report)
        out.mkdir(parents=True, exist_ok=True)
        plot_diurnal(runs, spw, RAMP_DAYS, out / "diurnal.png")
        (out / "report.md").write_text(render_diurnal(runs, RAMP_DAYS, "diurnal.png"), encoding="utf-8")
        print(f"report: {out / 'report.md'}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    re, fc = runs["reactive"], runs["forecast"]
    g_ratio = _ratio(ramp_p99(fc, "guaranteed", RAMP_DAYS), ramp_p99(re, "guaranteed", RAMP_DAYS))
    b_ratio = _ratio(ramp_p99(fc, "burstable", RAMP_DAYS), ramp_p99(re, "burstable", RAMP_DAYS))
    ws_ratio = _ratio(fc.worker_seconds, re.worker_seconds)
    print(
        f"ramp_g_p99_ratio={g_ratio:.3f} ramp_b_p99_ratio={b_ratio:.3f} "
        f"worker_seconds_ratio={ws_ratio:.3f} recycle_work_lost={rec.work_lost_slot_s:g}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
