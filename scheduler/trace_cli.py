"""`slotsched trace import`: public traces → a simulator workload CSV (and a policy sized to it).

Why a subcommand: the comparison in bench/ must be reproducible from the shell with one command
per step — import, then `slotsched simulate --compare`. The rules of the conversion are in
`scheduler/traces.py`; the sizing of the optional policy in `scheduler/trace_policy.py`.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter


def _mix(text: str) -> tuple[float, float, float]:
    parts = [p.strip() for p in text.split(",")]
    try:
        g, b, be = (float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--mix takes three fractions g,b,be like 0.1,0.5,0.4, not {text!r}"
        ) from None
    return g, b, be


def _import(args: argparse.Namespace) -> int:
    from scheduler.policy_load import policy_to_yaml
    from scheduler.sim.workload import write_workload
    from scheduler.trace_policy import policy_for
    from scheduler.traces import ImportConfig, TraceError, import_files

    try:
        cfg = ImportConfig(
            gap_threshold_s=args.gap_threshold,
            tenants=args.tenants,
            mix=args.mix,
            limit=args.limit,
            seed=args.seed,
            duration_s=args.duration,
            rate_per_s=args.rate,
            zipf_s=args.zipf,
        )
        plans = import_files(args.sessions, args.arrivals, cfg)
    except (TraceError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_workload(args.out, plans)
    periods = sum(len(p.periods) for p in plans)
    classes = Counter(p.qos.value for p in plans)
    tenants = Counter(p.tenant for p in plans)
    print(
        f"wrote {args.out}: {len(plans)} sessions, {periods} periods, "
        f"{sum(p.total_hold_s for p in plans):.0f} slot-seconds of holds; "
        f"classes {dict(sorted(classes.items()))}; {len(tenants)} tenants, largest "
        + ", ".join(f"{t} {n}" for t, n in tenants.most_common(3))
    )
    if args.policy_out:
        policy = policy_for(plans, args.workers, args.slots_per_worker, args.max_workers or 2 * args.workers)
        with open(args.policy_out, "w") as f:
            f.write(policy_to_yaml(policy))
        print(
            f"wrote {args.policy_out}: {args.workers} workers x {args.slots_per_worker} slots, "
            f"floor {policy.pool.floor}, {len(policy.tenants)} tenants"
        )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tr = sub.add_parser("trace", help="import public traces as simulator workloads")
    trsub = tr.add_subparsers(dest="trace_command", required=True)
    im = trsub.add_parser(
        "import",
        help="coding-agent sessions (+ an arrival process) → workload CSV",
        description="Convert per-LLM-call agent traces into closed-loop sessions (see scheduler/traces.py).",
    )
    im.add_argument("--sessions", required=True, help="CSV with trace_id,agent,t_s,api_time_s,think_time_s,…")
    im.add_argument(
        "--arrivals", default=None, help="CSV with TIMESTAMP (session start process); else Poisson"
    )
    im.add_argument("--tenants", type=int, default=20, help="tenants, Zipf-sized (default %(default)s)")
    im.add_argument(
        "--mix", type=_mix, default=(0.1, 0.5, 0.4), help="class fractions g,b,be (default 0.1,0.5,0.4)"
    )
    im.add_argument(
        "--gap-threshold",
        type=float,
        default=30.0,
        help="idle seconds before a session releases (default 30)",
    )
    im.add_argument("--limit", type=int, default=None, help="sessions to draw (default: all, once)")
    im.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    im.add_argument(
        "--duration", type=float, default=None, help="window of session starts, s (default: trace span)"
    )
    im.add_argument("--rate", type=float, default=None, help="session starts per second (sets the window)")
    im.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of tenant sizes (default 1.1)")
    im.add_argument("--out", required=True, help="workload CSV to write")
    im.add_argument("--policy-out", default=None, help="also write a SchedulingPolicy sized to the workload")
    im.add_argument("--workers", type=int, default=16, help="pool workers of --policy-out (default 16)")
    im.add_argument("--slots-per-worker", type=int, default=2, help="slots per worker (default 2)")
    im.add_argument("--max-workers", type=int, default=None, help="autoscaler ceiling (default: 2 x workers)")
    im.set_defaults(func=_import)
