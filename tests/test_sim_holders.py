"""Simulated holders as the workload describes them (issue 20 items 14 and 15): a holder with
`crash_after_s` lives, renews and yields until it dies, and `--until` counts held time up to the
cut-off, not to the last event before it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scheduler.core.types import QoS
from scheduler.policy.model import TenantSpec
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.workload import write_workload
from tests.test_sim_scenarios import plan, pool_policy


def test_a_crashing_holder_renews_until_it_dies_and_expires_where_its_last_renewal_put_it() -> None:
    pol = pool_policy(TenantSpec("t"), workers=1, slots=1, ttl=30)
    plans = [
        plan("dead", "t", QoS.BEST_EFFORT, 0.0, 500.0, crash=50.0),
        plan("next", "t", QoS.BEST_EFFORT, 1.0, 10.0),
    ]
    stats = Simulator(pol, plans, SimConfig()).run()
    # Alive until 50 s: renewed at 15 s (expiry to 15 + 30 + a step of 15 = 60), at 30 s (60
    # already covers 30 + 30: unchanged) and at 45 s (to 90); the lease runs out at 90 s, so the
    # next session (arrived at 1 s) waits 89 s — not 29 s, as if it had died at its grant.
    assert stats.expiries == 1
    assert stats.waits["besteffort"] == [0.0, 89.0]
    assert stats.completed == 1 and stats.unfinished == 1


def test_a_holder_that_will_crash_answers_a_yield_while_it_is_alive() -> None:
    pol = pool_policy(TenantSpec("sre", guaranteed=1), TenantSpec("batch"), workers=1, slots=1, floor=1)
    plans = [
        plan("dying", "batch", QoS.BEST_EFFORT, 0.0, 500.0, crash=50.0),
        plan("g", "sre", QoS.GUARANTEED, 10.0, 5.0),
    ]
    stats = Simulator(pol, plans, SimConfig(checkpoint_s=2.0)).run()
    # Asked at 10 s, it checkpoints (2 s) and yields: the Guaranteed request waits 2 s, no revoke
    # (a holder ignoring the request would be revoked at the grace, 10 s, its work lost).
    assert stats.waits["guaranteed"] == [2.0]
    assert stats.revocations == 0 and stats.preemptions == 1
    # Re-granted at 17 s (the Guaranteed session held 12-17 s), it dies at 67 s (last renewal
    # 62 s, which moved its expiry to 62 + 30 + a step of 15) and expires at 107 s.
    assert stats.expiries == 1
    assert stats.slot_seconds["batch"]["besteffort"] == 12.0 + (107.0 - 17.0)


def test_until_counts_held_time_up_to_the_cut_off() -> None:
    pol = pool_policy(TenantSpec("t"), workers=1, slots=1, ttl=30)
    stats = Simulator(pol, [plan("s", "t", QoS.BEST_EFFORT, 0.0, 500.0)], SimConfig(until_s=100)).run()
    # Renewals at 15, 30, …, 90 s: the last event before 100 s is at 90 s; the lease is held to 100.
    assert stats.slot_seconds["t"]["besteffort"] == 100.0
    assert stats.end_s == 100.0
    assert stats.utilization == 1.0


def test_simulate_until_reports_slot_seconds_to_the_cut_off(tmp_path: Path) -> None:
    wl = tmp_path / "w.csv"
    write_workload(wl, [plan("s1", "batch", QoS.BEST_EFFORT, 0, 500)])
    cmd = [sys.executable, "-m", "scheduler.cli", "simulate", "--workload", str(wl), "--json"]
    out = subprocess.run([*cmd, "--until", "100"], check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    assert result["tenants"]["batch"]["slot_seconds"] == 100.0
    assert result["unfinished"] == 1


def test_a_run_that_ends_before_until_is_not_stretched_to_it() -> None:
    pol = pool_policy(TenantSpec("t"), workers=1, slots=1)
    stats = Simulator(pol, [plan("s", "t", QoS.BEST_EFFORT, 0.0, 40.0)], SimConfig(until_s=100)).run()
    assert stats.slot_seconds["t"]["besteffort"] == 40.0
    assert stats.completed == 1
