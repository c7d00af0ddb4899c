"""slotsched against the baselines on real agent sessions: import a trace, compare, print the table.

Steps, each the library call behind a CLI command (bench/README.md gives the commands):
  1. `slotsched trace import`: 300 coding-agent sessions (claude_code_agent_sessions.csv with
     --sessions; by default the shipped 60-session sample, each drawn five times) started
     by the Azure LLM conversation arrival process over its 58 minutes, 12 Zipf-sized tenants,
     classes 10% Guaranteed / 50% Burstable / 40% BestEffort, 30 s idle threshold, seed 1; and a
     policy sized to it (scheduler/sim/traces/policy.py) for 24 workers x 2 slots, at most 48 workers.
  2. `slotsched simulate --compare --until 14400`: every contender on that workload and pool for
     four virtual hours; report.md and PNGs in --out.
Runs in well under 3 minutes on 2 cores (about 15 s of CPU).

    python bench/policy_compare.py     # last line: slotsched_g_p99=… best_baseline_g_p99=… …
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.policy.yaml_io import policy_to_yaml  # noqa: E402
from scheduler.sim.compare.metrics import RunFigures  # noqa: E402
from scheduler.sim.compare.run import compare, sample_every, write_outputs  # noqa: E402
from scheduler.sim.simulator import SimConfig  # noqa: E402
from scheduler.sim.traces.convert import (  # noqa: E402
    SAMPLE_ARRIVALS,
    SAMPLE_SESSIONS,
    ImportConfig,
    import_files,
    samples_dir,
)
from scheduler.sim.traces.policy import policy_for  # noqa: E402
from scheduler.sim.workload import write_workload  # noqa: E402


def _best(figs: list[RunFigures], key: str, lower: bool = True) -> RunFigures:
    """The best contender on `key` among those that have the figure (an empty average has none)."""
    have = [f for f in figs if f.measured(key)] or figs
    return min(have, key=lambda f: f.value(key) if lower else -f.value(key))


def _jc(f: RunFigures) -> str:
    return "n/a" if f.jain_contended is None else f"{f.jain_contended:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # The shipped samples by default, so a clone runs it; bench/README.md's figures are from the
    # full traces, given with --sessions and --arrivals.
    p.add_argument(
        "--sessions",
        default=str(samples_dir() / SAMPLE_SESSIONS),
        help="agent-sessions trace (default: the shipped 60-session sample)",
    )
    p.add_argument(
        "--arrivals",
        default=str(samples_dir() / SAMPLE_ARRIVALS),
        help="arrival-process trace (default: the shipped sample, every 10th request)",
    )
    p.add_argument("--limit", type=int, default=300, help="sessions drawn from the trace")
    p.add_argument("--tenants", type=int, default=12)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=24, help="static pool, and the elastic pools' start")
    p.add_argument("--max-workers", type=int, default=48)
    p.add_argument("--until", type=float, default=14400.0, help="virtual seconds simulated")
    p.add_argument("--checkpoint", type=float, default=2.0)
    p.add_argument("--out", default=str(ROOT / "out" / "policy_compare"))
    a = p.parse_args(argv)

    t0 = time.perf_counter()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = ImportConfig(
        tenants=a.tenants, mix=(0.1, 0.5, 0.4), limit=a.limit, seed=a.seed, gap_threshold_s=30.0
    )
    plans = import_files(a.sessions, a.arrivals, cfg)
    policy = policy_for(plans, a.workers, 2, a.max_workers)
    write_workload(out / "workload.csv", plans)
    (out / "policy.yaml").write_text(policy_to_yaml(policy))

    config = SimConfig(
        checkpoint_s=a.checkpoint,
        until_s=a.until,
        sample_every_s=sample_every(plans, a.until),
        retry_refused=True,
    )
    results = compare(policy, plans, config)
    cli = argparse.Namespace(policy=out / "policy.yaml", workload=out / "workload.csv", out=out)
    report = write_outputs(results, policy, plans, config, out, cli)
    print("\n".join(ln for ln in report.read_text().splitlines() if ln.startswith("|")))
    print(f"\nreport: {report}")

    figs = {c.name: f for c, _, f in results}
    static = [f for c, _, f in results if c.group == "static" and c.name != "slotsched"]
    elastic = [f for c, _, f in results if c.group == "elastic" and c.family != "slotsched"]
    s = figs["slotsched"]
    g = _best(static, "g_p99")
    fair = _best(static, "jain_contended", lower=False)
    b = _best(static, "b_p99")
    fields = {
        "slotsched_g_p99": f"{s.value('g_p99'):.1f}",
        "best_baseline_g_p99": f"{g.value('g_p99'):.1f}",
        "best_baseline": g.name,
        "best_baseline_work_lost": f"{g.work_lost:.0f}",
        "slotsched_b_p99": f"{s.value('b_p99'):.0f}",
        "best_baseline_b_p99": f"{b.value('b_p99'):.0f}({b.name})",
        "slotsched_be_max": f"{s.be_max_wait:.0f}",
        "slotsched_jain": f"{s.jain:.3f}",
        "slotsched_jain_contended": _jc(s),
        "best_baseline_jain_contended": _jc(fair),
        "work_lost": f"{s.work_lost:.0f}",
        "sla_misses": str(s.sla_misses),
    }
    if elastic:
        auto = figs["slotsched+autoscaler"]
        cheap = _best(elastic, "worker_seconds")
        fields |= {
            "autoscaler_worker_s": f"{auto.worker_seconds:.0f}",
            "autoscaler_b_p99": f"{auto.value('b_p99'):.0f}",
            "cheapest_autoscaler_worker_s": f"{cheap.worker_seconds:.0f}({cheap.name})",
            "cheapest_autoscaler_b_p99": f"{cheap.value('b_p99'):.0f}",
        }
    fields["seconds"] = f"{time.perf_counter() - t0:.0f}"
    print(" ".join(f"{k}={v}" for k, v in fields.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
