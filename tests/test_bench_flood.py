"""bench/flood.py end to end in a tiny configuration (a few seconds): it starts the server, the
worker, the quiet tenant and the flooders as processes, ends, and prints its figures; the quiet
tenant was granted under the flood. (The issue's bars are the full run's, in bench/README.md.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = [
    *("quiet_p50_ms_alone", "quiet_p99_ms_alone", "quiet_p50_ms_flood", "quiet_p99_ms_flood"),
    *("quiet_p99_ratio", "quiet_grants_missed", "quiet_granted", "worker_heartbeats_missed"),
    *("flooder_commands", "flooder_refused", "flooder_errors", "flooder_cmds_per_s"),
    *("server_cpu_s", "flooder_cpu_s"),
]


def test_flood_bench_tiny_run() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "flood.py"), "--mode", "both", "--rate-limits", "deploy",
           "--seconds", "1", "--quiet-samples", "10", "--channels", "4", "--connections", "2",
           "--flood-procs", "2", "--batch", "20", "--ramp", "0.2"]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    figures = dict(kv.split("=", 1) for kv in last.split())
    for mode in ("renew", "churn"):
        missing = [k for k in KEYS if f"{mode}_{k}" not in figures]
        assert not missing, (missing, last)
        assert int(figures[f"{mode}_quiet_granted"]) > 0, last
        assert float(figures[f"{mode}_quiet_p50_ms_flood"]) > 0, last
        assert int(figures[f"{mode}_flooder_commands"]) > 0, last
        # The deploy's buckets (renewals 200/s burst 400, tenant 50/s burst 100) refuse the flood.
        assert int(figures[f"{mode}_flooder_refused"]) > 0, last
