"""`slotsched trace import`: public traces → a simulator workload CSV (and a policy sized to it).

Why a subcommand: the comparison in bench/ must be reproducible from the shell with one command
per step — import, then `slotsched simulate --compare`. The rules of the conversion are in
`scheduler/sim/traces/convert.py`; the sizing of the optional policy in
`scheduler/sim/traces/policy.py`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections import Counter
from pathlib import Path


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
    from scheduler.policy.yaml_io import policy_to_yaml
    from scheduler.sim.traces.convert import ImportConfig, TraceError, import_files
    from scheduler.sim.traces.policy import policy_for
    from scheduler.sim.workload import write_workload

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
            calls=args.calls,
        )
        plans = import_files(args.sessions, args.arrivals, cfg)
        if args.pool_rule:
            from scheduler.sim.traces.pools import PoolRule, PoolRuleError, spread

            try:
                plans = spread(plans, PoolRule.parse(args.pool_rule, args.pool_by))
            except PoolRuleError as e:
                print(f"error: argument --pool-rule: {e}", file=sys.stderr)
                return 2
        for out in (args.out, args.policy_out):
            if out:
                Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_workload(args.out, plans)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the output side: a read error is a TraceError naming the trace
        print(f"error: cannot write {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 2
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


# Commands that run the shipped samples ($S: the samples folder); README "Sample workloads" too.
SAMPLE_COMMANDS: tuple[str, ...] = (
    "simulate --policy $S/policy.yaml --workload $S/two-incidents.csv",
    "simulate --policy $S/policy.yaml --workload $S/busy-300.csv",
    "simulate --compare --policy $S/policy.yaml --workload $S/two-incidents.csv --until 14400 --out out",
    "trace import --sessions $S/claude_code_agent_sessions_sample.csv"
    " --arrivals $S/azure_llm_conv_2023_sample.csv --tenants 6 --seed 1 --workers 6 --max-workers 12"
    " --out w.csv --policy-out p.yaml",
    "simulate --policy $S/agent-sessions-policy.yaml --workload $S/agent-sessions.csv --until 14400",
    # The fairness samples (issue 23; the samples README says how each was derived):
    "simulate --policy $S/be-12x4-policy.yaml --workload $S/be-12x4.csv --until 3000",
    "simulate --compare --policy $S/be-12x4-policy.yaml --workload $S/be-12x4.csv --until 3000"
    " --out out/be-12x4",
    "simulate --compare --policy $S/many-tenants-policy.yaml --workload $S/many-tenants.csv --until 14400"
    " --out out/many-tenants",
    "simulate --compare --policy $S/claude-16x64-policy.yaml --workload $S/claude-16x64.csv --until 14400"
    " --out out/claude-16x64",
)


def _samples(args: argparse.Namespace) -> int:
    from scheduler.sim.traces.convert import samples_dir

    src = samples_dir()
    files = sorted(p for p in src.iterdir() if p.is_file())
    if not files:
        print(f"error: no samples found in {src} (an install without package data?)", file=sys.stderr)
        return 2
    if args.path:
        print(src)
        return 0
    where = src
    if args.out:
        where = Path(args.out)
        try:
            where.mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copyfile(f, where / f.name)
        except OSError as e:
            print(f"error: cannot write {e.filename or where}: {e.strerror or e}", file=sys.stderr)
            return 2
        print(f"copied {len(files)} files to {where}")
    else:
        print(f"samples in {where} (README.md there: what each is, licences, citations)")
    for f in files:
        print(f"  {f.name}")
    print(f"run them with S={where}:")
    for cmd in SAMPLE_COMMANDS:
        print(f"  slotsched {cmd}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tr = sub.add_parser("trace", help="import public traces as simulator workloads")
    trsub = tr.add_subparsers(dest="trace_command", required=True)
    im = trsub.add_parser(
        "import",
        help="coding-agent sessions (+ an arrival process) → workload CSV",
        description="Convert per-LLM-call agent traces into closed-loop sessions "
        "(see scheduler/sim/traces/convert.py).",
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
    im.add_argument(
        "--pool-rule",
        default=None,
        help="spread sessions over pools: comma-separated POOL[|FALLBACK...][:PERCENT%%], e.g. "
        "'gpu:10%%,cpu' or 'gpu|cpu:25%%,cpu'; each session falls in one entry by a stable hash "
        "(sha256) of its session id (--pool-by tenant: of its tenant), entries without a percent "
        "share the rest evenly; it asks for the entry's first pool, then the others as fallbacks "
        "(writes the workload's pool and fallback columns). Default: no pool column",
    )
    im.add_argument(
        "--pool-by",
        choices=("session", "tenant"),
        default="session",
        help="what --pool-rule hashes (tenant: all of a tenant's sessions in one pool)",
    )
    im.add_argument(
        "--calls",
        action="store_true",
        help="keep every LLM call (offset, input/output tokens, API time) in column calls, "
        "for the token-budget simulator",
    )
    im.add_argument("--out", required=True, help="workload CSV to write")
    im.add_argument("--policy-out", default=None, help="also write a SchedulingPolicy sized to the workload")
    im.add_argument("--workers", type=int, default=16, help="pool workers of --policy-out (default 16)")
    im.add_argument("--slots-per-worker", type=int, default=2, help="slots per worker (default 2)")
    im.add_argument("--max-workers", type=int, default=None, help="autoscaler ceiling (default: 2 x workers)")
    im.set_defaults(func=_import)
    sa = trsub.add_parser(
        "samples",
        help="where the shipped sample traces and workloads are (or copy them with --out)",
        description="The sample traces (with their licences) and ready-to-run workloads shipped with "
        "slotsched; without --out, print where they are installed.",
    )
    sa.add_argument("--out", default=None, help="copy the samples into this folder")
    sa.add_argument("--path", action="store_true", help="print only the samples folder (for S=$(…))")
    sa.set_defaults(func=_samples)
