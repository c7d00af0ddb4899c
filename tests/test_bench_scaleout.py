"""bench/scaleout.py end to end, small (3 pools, 1 s phases, one Redis): 1, 2 and 3 real replica
processes, the load generator in its own process, a memory-mode server, a single and a double
failure; the last line carries every key the issue names and says nothing was lost, and one pool
is followed by one replica only. (The sizes and figures are the full run's, in bench/README.md.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_state_redis import REDIS_BIN

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_BIN) and not os.environ.get("CI"), reason="redis-server not installed"
)

KEYS = (
    "capacity_ratio_n4",
    "idle_baseline_core_share",
    "durable_renew_ratio",
    "sdk_channel_pairs_ratio_c64",
    "sdk_p50_ratio_c1",
    "pool_failover_ms_max",
    "double_failure_ms_max",
    "leases_lost",
)


def test_scaleout_bench_small_run() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "scaleout.py"), "--pools", "3", "--idle", "1"]
    cmd += ["--seconds", "1", "--renew-sessions", "5"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    figures = dict(kv.split("=", 1) for kv in r.stdout.strip().splitlines()[-1].split())
    assert tuple(figures) == KEYS, figures
    assert figures["leases_lost"] == "0", r.stderr[-3000:]
    assert 0 < float(figures["pool_failover_ms_max"]) < 30_000
    assert 0 < float(figures["double_failure_ms_max"]) < 30_000
    assert float(figures["capacity_ratio_n4"]) > 0
    assert "followers_per_pool_n3 = 1" in r.stderr, r.stderr[-3000:]  # one successor, not two
