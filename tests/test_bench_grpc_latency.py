"""bench/grpc_latency.py end to end in a tiny configuration (seconds): its servers and its
c128 load generator of several client processes start, every block runs, the script ends, and
its last line carries today's keys and the c128 ones, positive. (The issue's bar, a c128 ratio of
at least 2.0, is the full run's, in bench/README.md.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = [
    *("p50_ratio_c1", "pairs_per_s_c64", "noop_calls_per_s_c64", "channel_pairs_ratio_c64"),
    *("channel_p50_ratio_c1", "channel_pairs_per_s_c64", "channel_pairs_ratio_c128"),
    *("channel_pairs_per_s_c128", "noop_calls_per_s_c128", "server_cpu_pct_channel"),
    *("server_cpu_pct_noop", "client_cpu_pct_max"),
]


def test_grpc_latency_bench_tiny_run() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "grpc_latency.py"), "--no-floor", "--rounds", "1",
           "--seconds", "0.6", "--iterations", "20", "--clients", "2"]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "round 1/1 c128 channel" in r.stdout, r.stdout  # progress, per block
    last = r.stdout.strip().splitlines()[-1]
    figures = dict(kv.split("=", 1) for kv in last.split())
    assert list(figures) == KEYS, last
    for key in KEYS:
        assert float(figures[key]) > 0, (key, last)
