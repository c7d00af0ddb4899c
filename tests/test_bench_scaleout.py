"""bench/scaleout.py end to end, small (3 pools, 1 s phases, one Redis): 1, 2 and 3 real replica
processes, the load generator in its own process, a memory-mode server, a single and a double
failure, the SDK phase and the holding phase; the last line carries every key the issue names
and says nothing was lost, and one pool is followed by one replica only. (The sizes and figures
are the full run's, in bench/README.md.)"""

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


#: After the issue's keys: the SDK phase's projection and the holding phase's (bench/scaleout_hold.py).
MORE_KEYS = (
    "sdk_channel_pairs_ratio_c64_one_core",
    "sessions_held",
    "hold_cpu_share_memory",
    "hold_cpu_share_redis",
    "sessions_per_core_memory",
    "sessions_per_core_redis",
    "hold_cpu_share_100k_memory",
    "hold_cpu_share_100k_redis",
    "hold_renewal_pace",
    "hold_leases_lost",
)


def test_scaleout_bench_small_run() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "scaleout.py"), "--pools", "3", "--idle", "1"]
    cmd += ["--seconds", "1", "--renew-sessions", "5"]
    cmd += ["--sdk-seconds", "1", "--sdk-rounds", "1", "--sdk-iterations", "20"]
    cmd += ["--hold-sessions", "300", "--hold-seconds", "2", "--hold-settle-seconds", "1"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    figures = dict(kv.split("=", 1) for kv in r.stdout.strip().splitlines()[-1].split())
    assert tuple(figures) == KEYS + MORE_KEYS, figures
    # The SDK phase ran (a number, not `na`), and the holding phase held every session it opened.
    assert float(figures["sdk_channel_pairs_ratio_c64"]) > 0 and float(figures["sdk_p50_ratio_c1"]) > 0
    assert figures["sessions_held"] == "300" and figures["hold_leases_lost"] == "0", r.stderr[-3000:]
    assert float(figures["hold_cpu_share_memory"]) >= 0 and float(figures["hold_cpu_share_redis"]) >= 0
    assert figures["leases_lost"] == "0", r.stderr[-3000:]
    assert 0 < float(figures["pool_failover_ms_max"]) < 30_000
    assert 0 < float(figures["double_failure_ms_max"]) < 30_000
    assert float(figures["capacity_ratio_n4"]) > 0
    assert "followers_per_pool_n3 = 1" in r.stderr, r.stderr[-3000:]  # one successor, not two
