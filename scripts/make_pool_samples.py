"""Write scheduler/sim/samples/pools-cpu-gpu.csv: the first 40 sessions of the claude-code agent
trace (as scheduler/sim/samples/claude-16x64.csv imported them) spread over two pools by the
trace import's rule (`--pool-rule "gpu|cpu:25%,cpu"`).

Run from the repository root: `python scripts/make_pool_samples.py`. Deterministic.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from scheduler.sim.traces.pools import PoolRule, spread
from scheduler.sim.workload import load_workload, write_workload

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "scheduler" / "sim" / "samples"


def main() -> None:
    # Two tenants (the policy's), alternately; the first 40 sessions of the 16x64 sample.
    base = [
        replace(p, tenant=f"t0{1 + i % 2}")
        for i, p in enumerate(load_workload(SAMPLES / "claude-16x64.csv")[:40])
    ]
    plans = spread(base, PoolRule.parse("gpu|cpu:25%,cpu"))
    write_workload(SAMPLES / "pools-cpu-gpu.csv", plans)
    print(f"wrote {SAMPLES / 'pools-cpu-gpu.csv'}: {len(plans)} sessions", file=sys.stderr)


if __name__ == "__main__":
    main()
