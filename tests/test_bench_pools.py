"""bench/pools.py end to end with --quick (about a second): the decision-rate rounds, the memory
figure and both restores run, and the last line carries every key, positive. (The issue's bars,
pools_cost_ratio <= 1.3 and restore_100_pools_s < 2, are the full run's, in bench/README.md.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KEYS = [
    *("many_pools_decisions_per_s", "one_pool_decisions_per_s", "bare_core_decisions_per_s"),
    *("many_cores_direct_decisions_per_s", "pools_cost_ratio", "pools_cost_ratio_rounds_min"),
    *("pools_cost_ratio_rounds_max", "pools_cost_ratio_best_rounds", "single_pool_overhead_ratio"),
    "pools_routing_ratio",
    *("per_pool_cores_ratio", "memory_per_pool_kb", "restore_100_pools_s", "restore_1_pool_s"),
    *("state_bytes_100_pools", "state_bytes_1_pool", "seconds"),
]


@pytest.mark.parametrize("flags", [[], ["--no-nominal"]])
def test_pools_bench_quick_run(flags: list[str]) -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "pools.py"), "--quick", *flags]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "round 2/2" in r.stderr, r.stderr  # progress, per round
    last = r.stdout.strip().splitlines()[-1]
    figures = dict(kv.split("=", 1) for kv in last.split())
    assert list(figures) == KEYS, last
    for key in KEYS[:-1]:
        assert float(figures[key]) > 0, (key, last)
