"""The diurnal sample: shipped, rebuilt from the shipped traces byte for byte, and the forecast
meeting the morning wave that reactive scaling meets late (day 0 recorded, day 1 measured)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scheduler.policy.yaml_io import load_policy
from scheduler.sim.diurnal import DAY_S, RAMP_HOUR, DiurnalStats, ramp_p99, with_mode
from scheduler.sim.elastic import ElasticPool
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.traces.convert import samples_dir
from scheduler.sim.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_sample_is_what_the_script_builds() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_diurnal_sample.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


def _run(mode: str) -> DiurnalStats:
    s = samples_dir()
    policy, _ = load_policy(s / "diurnal-3d-policy.yaml")
    end = DAY_S + (RAMP_HOUR + 1) * 3600
    plans = [p for p in load_workload(s / "diurnal-3d.csv.xz") if p.arrival_s < end]
    pol = with_mode(policy, mode)
    sim = Simulator(pol, plans, SimConfig(until_s=end, sample_every_s=300.0), hook=ElasticPool(15.0))
    sim.stats = DiurnalStats(pol)
    sim.run()
    assert isinstance(sim.stats, DiurnalStats)
    return sim.stats


def test_the_forecast_meets_the_morning_wave_that_reactive_scaling_meets_late() -> None:
    reactive, forecast = _run("reactive"), _run("forecast")
    b_reactive, b_forecast = ramp_p99(reactive, "burstable", [1]), ramp_p99(forecast, "burstable", [1])
    assert b_reactive > 30.0  # the start-up time of the workers asked for at 9:00, and more
    assert b_forecast <= b_reactive / 2
    assert ramp_p99(forecast, "guaranteed", [1]) <= ramp_p99(reactive, "guaranteed", [1]) / 2

    # Ready before the wave: at 9:00 the forecast pool is already larger than the reactive one.
    def at_nine(st: DiurnalStats) -> int:
        return next(c for t, c, _ in st.series if t >= DAY_S + RAMP_HOUR * 3600)

    assert at_nine(forecast) > at_nine(reactive)


def test_the_report_puts_the_modes_side_by_side() -> None:
    from scheduler.policy.model import Policy
    from scheduler.sim.compare.diurnal_report import render_diurnal

    def stats(b_wait: float, worker_s: float) -> DiurnalStats:
        st = DiurnalStats(Policy())
        st.grants.append([DAY_S + RAMP_HOUR * 3600 + 60.0, "burstable", b_wait, False])
        st.grants.append([DAY_S + 3600.0, "burstable", 999.0, False])  # at 1:00: not the ramp hour
        st.worker_seconds = worker_s
        return st

    text = render_diurnal({"reactive": stats(120.0, 3600e3), "forecast": stats(0.0, 3672e3)}, [1], "d.png")
    assert "| reactive | 0.0 s | 120.0 s | 0.0 s | 1,000 | 1.000x |" in text
    assert "| forecast | 0.0 s | 0.0 s | 0.0 s | 1,020 | 1.020x |" in text
    assert "![pool size against demand](d.png)" in text
