"""`slotsched simulate`: run the policy core in virtual time on a workload CSV (and, with
`--compare`, every baseline too, with a report).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scheduler.cli.help import add_check, non_negative, positive

DEFAULT_OUT = "out/compare"


def _simulate(args: argparse.Namespace) -> int:
    from scheduler.policy.defaults import default_policy
    from scheduler.policy.errors import PolicyError
    from scheduler.policy.yaml_io import load_policy
    from scheduler.sim.render import render_text
    from scheduler.sim.simulator import SimConfig, Simulator
    from scheduler.sim.workload import WorkloadError, describe_tenants, load_workload, unknown_tenants

    try:
        policy = load_policy(args.policy)[0] if args.policy else default_policy()
        plans = load_workload(args.workload)
    except (PolicyError, WorkloadError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # A tenant the policy lacks is refused every request: silently, the run would print zeroes.
    known = [t.name for t in policy.tenants]
    unknown = unknown_tenants(plans, known)
    if unknown and args.unknown_tenants != "refuse":
        which = f"the policy {args.policy}" if args.policy else "the built-in policy (no --policy)"
        print(
            f"error: the workload names tenants {which} lacks: {describe_tenants(unknown)}; its tenants: "
            f"{', '.join(known)}. Give a --policy that lists them, or --unknown-tenants=refuse to count "
            "their sessions as refused",
            file=sys.stderr,
        )
        return 2
    refused = sum(unknown.values())
    if unknown:
        print(
            f"note: {refused} session(s) of tenants the policy lacks counted as refused, not simulated: "
            f"{describe_tenants(unknown)}",
            file=sys.stderr,
        )
        plans = [p for p in plans if p.tenant not in unknown]
    if args.advise:
        from scheduler.sim.budget.advise import DEFAULT_TARGET, advise, parse_target, render
        from scheduler.sim.budget.run import has_budget_run

        if not has_budget_run(policy, plans):
            print(
                "error: --advise needs a policy with spec.budgets and a workload with calls", file=sys.stderr
            )
            return 2
        try:
            target = parse_target(args.target) if args.target else dict(DEFAULT_TARGET)
            advice = advise(policy, plans, target, args.until, args.provider_limit or 1.0, args.budget)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(json.dumps(advice) if args.json else render(advice))
        return 0
    if args.compare:
        from scheduler.sim.compare.run import run_compare

        args.out = args.out or DEFAULT_OUT
        rc: int = run_compare(policy, plans, args, refused_unknown=unknown)
        return rc
    from scheduler.sim.attainment import attainment, quotas_of
    from scheduler.sim.compare.run import sample_every

    # Samples for each tenant's fair-share attainment (scheduler/sim/attainment.py).
    config = SimConfig(
        checkpoint_s=args.checkpoint_seconds,
        until_s=args.until,
        sample_every_s=sample_every(plans, args.until),
    )

    def progress(frac: float) -> None:
        if not args.json and sys.stderr.isatty():
            print(f"\rsimulating… {frac:6.1%}", end="", file=sys.stderr, flush=True)

    sim = Simulator(policy, plans, config)
    stats = sim.run(progress)
    stats.refusals += refused
    if sys.stderr.isatty() and not args.json:
        print("\r" + " " * 30 + "\r", end="", file=sys.stderr)
    result = stats.to_json()
    att = attainment(sim.points, quotas_of(policy))
    for name, entry in result["tenants"].items():
        entry["attainment"] = att.tenant_json(name)
    lowest = att.minimum(sorted({p.tenant for p in plans}))
    result["attainment_min"] = None if lowest is None else round(lowest, 4)
    text = render_text(result)
    if unknown:
        text += f"\nrefused as unknown tenants (in refusals): {describe_tenants(unknown)}"
    print(json.dumps(result) if args.json else text)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser("simulate", help="run the policy core in virtual time on a workload CSV")
    sim.add_argument("--policy", help="SchedulingPolicy YAML (default: the built-in policy)")
    sim.add_argument(
        "--workload",
        required=True,
        help="CSV: arrival_s,session_id,tenant,qos_class,hold_s[,…][,pool,fallback] "
        "(pool gpu|cpu: gpu, falling back to cpu)",
    )
    sim.add_argument("--checkpoint-seconds", type=non_negative, default=2.0, help="holder's checkpoint time")
    sim.add_argument(
        "--until", type=positive, default=None, help="stop at this virtual time; the rest is unfinished"
    )
    sim.add_argument("--json", action="store_true", help="print the result as JSON")
    sim.add_argument("--compare", action="store_true", help="run every baseline too and write a report")
    sim.add_argument("--out", default=None, help=f"report folder for --compare (default {DEFAULT_OUT})")
    sim.add_argument(
        "--provider-limit",
        type=_fraction,
        default=None,
        help="with --compare on a workload with calls and a policy with a budget: the provider's real "
        "limit as a fraction of the configured one (default 1; 0.8333: configured 20%% above it)",
    )
    sim.add_argument(
        "--no-provider-headers",
        action="store_true",
        help="with --compare on a budget run: the provider states no limit in its answers (as "
        "Anthropic's and OpenAI's rate-limit headers do), so slotsched learns it from its 429s only",
    )
    sim.add_argument("--budget", default=None, help="the spec.budgets entry to compare (default: the first)")
    sim.add_argument(
        "--advise",
        action="store_true",
        help="the smallest budget and pool (max workers) meeting --target on the workload, with the curves",
    )
    sim.add_argument(
        "--target",
        default=None,
        help="with --advise: p99 time to call per class, e.g. guaranteed=2,burstable=30 (the default)",
    )
    sim.add_argument(
        "--unknown-tenants",
        choices=("error", "refuse"),
        default="error",
        help="workload tenants the policy lacks: error (default: name them, exit 2) or refuse "
        "(count their sessions as refused, and say so)",
    )
    sim.set_defaults(func=_simulate)
    add_check(sim, _check_out)


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < v <= 10:
        raise argparse.ArgumentTypeError(f"expected a fraction above 0 (at most 10), got {v:g}")
    return v


def _check_out(args: argparse.Namespace) -> str | None:
    """--out only with --compare, and a folder it can be: refused before any contender runs."""
    if args.out is not None and not args.compare:
        return "argument --out: only with --compare (the report folder)"
    if not args.compare:
        return None
    out = Path(args.out or DEFAULT_OUT)
    for p in (out, *out.parents):  # the nearest that exists must be a folder
        if p.exists():
            if p.is_dir():
                return None
            what = "is a file" if p == out else f"is under {p}, a file"
            return f"argument --out: {out} {what}: give a folder for the report"
    return None
