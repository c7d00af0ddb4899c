"""bench/pools_failover.py end to end, small (3 pools, 60 sessions, one kill, one Redis): three
real replica processes, a kill -9, a rejoin, a fourth replica and both decision-rate phases run,
and the last line says nothing was lost. (The issue's sizes and bars are the full run's, in
bench/README.md.)"""

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


def test_pools_failover_bench_small_run() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "pools_failover.py"), "--topology", "single"]
    cmd += ["--pools", "3", "--sessions", "60", "--kills", "1", "--decide-s", "1"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "kill 1/1" in r.stderr, r.stderr[-3000:]  # progress
    figures = dict(kv.split("=", 1) for kv in r.stdout.strip().splitlines()[-1].split())
    for key in ("leases_lost", "double_grants", "waiters_lost", "other_pool_errors", "leases_lost_on_join"):
        assert figures[key] == "0", (key, figures)
    assert float(figures["pools_per_replica_max_over_min"]) == 1.0  # 3 pools on 3 replicas
    assert 0 < float(figures["pool_failover_ms_p50"]) < 30_000
    assert figures["pools_moved_on_join"] in ("0", "1"), figures  # 3 pools, 4 replicas: at most one
    assert float(figures["decisions_per_s_1"]) > 0 and float(figures["decisions_per_s_3"]) > 0
