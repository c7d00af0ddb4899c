"""Worker-seconds against Guaranteed waits: the elastic pool on a bursty day, beside static pools.

The workload (`scheduler/sim/bursty.py`): quiet, a burst of Burstable and BestEffort sessions
with Guaranteed arrivals during it, quiet again. The elastic pool is the autoscaler loop the
server runs (`slots/autoscaler/loop.py`, deciding every `--period` seconds), in virtual time; new
workers are ready `startDelaySeconds` after being asked for. The static pools are the sizes one
would otherwise pick: the maximum (never short, always paid for) and the quiet-hours size.

    python bench/autoscale.py     # last line: worker_seconds=X sla_misses=N scale_actions=N
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.sim.bursty import bursty_policy, bursty_workload  # noqa: E402
from scheduler.sim.elastic import ElasticPool, StaticPool, elastic_report  # noqa: E402
from scheduler.sim.simulator import PoolHook, SimConfig, Simulator  # noqa: E402
from scheduler.sim.stats import SimStats  # noqa: E402


def run(hook: PoolHook, seed: int, max_workers: int, start_delay: float, checkpoint: float) -> SimStats:
    policy = bursty_policy(max_workers=max_workers, start_delay_s=start_delay)
    return Simulator(policy, bursty_workload(seed), SimConfig(checkpoint_s=checkpoint), hook=hook).run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--max-workers", type=int, default=16)
    p.add_argument("--quiet-workers", type=int, default=2, help="the static pool sized for quiet hours")
    p.add_argument("--period", type=float, default=15.0, help="seconds between autoscaler decisions")
    p.add_argument("--start-delay", type=float, default=20.0, help="seconds for a new worker to be ready")
    p.add_argument("--checkpoint", type=float, default=2.0, help="a holder's checkpoint time")
    p.add_argument("--sla", type=float, default=None, help="Guaranteed wait target (default: yield grace)")
    a = p.parse_args(argv)

    t0 = time.perf_counter()
    rows = []
    runs: list[tuple[str, PoolHook]] = [
        (f"static {a.max_workers} (max)", StaticPool(a.max_workers)),
        (f"static {a.quiet_workers} (quiet)", StaticPool(a.quiet_workers)),
        ("elastic", ElasticPool(a.period)),
    ]
    for name, hook in runs:
        stats = run(hook, a.seed, a.max_workers, a.start_delay, a.checkpoint)
        rep = elastic_report(stats, a.sla)
        g = stats.to_json()["classes"]["guaranteed"]["time_to_slot"]
        rows.append((name, rep, g, stats))
    print(
        f"{'pool':<18} {'worker_s':>9} {'G_misses':>8} {'G_p99_s':>8} {'G_max_s':>8} {'B_p95_s':>8} "
        f"{'actions':>7} {'util':>5} {'lost':>5} {'done':>5}"
    )
    for name, rep, g, s in rows:
        b95 = s.to_json()["classes"]["burstable"]["time_to_slot"]["p95"]
        ws, misses, actions = rep["worker_seconds"], rep["sla_misses"], rep["scale_actions"]
        print(
            f"{name:<18} {ws:>9.0f} {misses:>8} {g['p99']:>8.1f} {g['max']:>8.1f} {b95:>8.1f} "
            f"{actions:>7} {s.utilization:>5.2f} {s.work_lost:>5.0f} {s.completed:>5}"
        )
    static_max = rows[0][1]["worker_seconds"]
    elastic = rows[-1][1]
    saved = 1 - elastic["worker_seconds"] / static_max if static_max else 0.0
    print(
        f"elastic saves {saved:.0%} of the max-size pool's worker-seconds ({time.perf_counter() - t0:.2f} s)"
    )
    print(
        f"worker_seconds={elastic['worker_seconds']:.0f} sla_misses={elastic['sla_misses']} "
        f"scale_actions={elastic['scale_actions']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
