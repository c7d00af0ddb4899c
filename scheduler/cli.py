"""`slotsched` command line: serve, status, policy validate, simulate, worker, demo, trace.

Each subcommand imports what it needs lazily, so `slotsched policy validate` starts fast and does
not import gRPC.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any


def _simulate(args: argparse.Namespace) -> int:
    from scheduler.policy_load import PolicyError, default_policy, load_policy
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
    if args.compare:
        from scheduler.sim.compare import run_compare

        rc: int = run_compare(policy, plans, args, refused_unknown=unknown)
        return rc
    config = SimConfig(checkpoint_s=args.checkpoint_seconds, until_s=args.until)

    def progress(frac: float) -> None:
        if not args.json and sys.stderr.isatty():
            print(f"\rsimulating… {frac:6.1%}", end="", file=sys.stderr, flush=True)

    stats = Simulator(policy, plans, config).run(progress)
    stats.refusals += refused
    if sys.stderr.isatty() and not args.json:
        print("\r" + " " * 30 + "\r", end="", file=sys.stderr)
    result = stats.to_json()
    text = render_text(result)
    if unknown:
        text += f"\nrefused as unknown tenants (in refusals): {describe_tenants(unknown)}"
    print(json.dumps(result) if args.json else text)
    return 0


def _policy_validate(args: argparse.Namespace) -> int:
    from scheduler.policy_load import validate_main

    rc: int = validate_main(args.file)
    return rc


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from scheduler.serve import StateOptions, serve_forever

    state = StateOptions(
        state=args.state,
        prefix=args.state_prefix,
        replica_id=args.replica_id,
        leader_ttl_s=args.leader_ttl,
        snapshot_every=args.snapshot_every,
        snapshot_interval_s=args.snapshot_interval,
    )
    rc: int = asyncio.run(
        serve_forever(
            policy_path=args.policy,
            listen=args.listen,
            metrics_listen=args.metrics_listen,
            static_pool=not args.no_static_pool,
            autoscaler=args.autoscaler,
            state=state,
        )
    )
    return rc


def _status(args: argparse.Namespace) -> int:
    from scheduler.server.status import status_main

    rc: int = status_main(args.target, args.json, args.token, args.tenant)
    return rc


class HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default in --help, unless its help text already speaks of it.

    Not argparse.ArgumentDefaultsHelpFormatter: that one also prints "(default: None)" and
    "(default: False)" for options and flags without a meaningful default, and repeats defaults
    that help texts already state (as "default: all" or "$SLOTSCHED_STATE or memory")."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "default" in text
            or action.default is None
            or action.default is argparse.SUPPRESS
            or action.nargs == 0  # flags: store_true and the like
            or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
        ):
            return action.help
        return text + " (default %(default)s)"


class Parser(argparse.ArgumentParser):
    """The CLI's parser: defaults shown in --help, by every subcommand too (add_subparsers makes
    its subparsers of the parent's class, so modules registering subcommands need not know)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = Parser(
        prog="slotsched",
        description="A scheduler for agent runtimes: who gets the next warm slot, who waits, who yields.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the scheduler service (embedded defaults with no flags)")
    s.add_argument("--policy", help="SchedulingPolicy YAML; without it: built-in policy, INSECURE dev mode")
    s.add_argument("--listen", default="127.0.0.1:50051", help="gRPC address (default %(default)s)")
    s.add_argument(
        "--metrics-listen", default="127.0.0.1:9464", help="Prometheus /metrics address (default %(default)s)"
    )
    s.add_argument(
        "--autoscaler",
        choices=("off", "local", "kubernetes", "dry-run"),
        default=None,
        help="companion autoscaler actuator (default: $SLOTSCHED_AUTOSCALER or off); see deploy/",
    )
    s.add_argument(
        "--no-static-pool",
        action="store_true",
        help="register no local-N workers: workers join with `slotsched worker` (or the autoscaler)",
    )
    s.add_argument(
        "--state",
        default=os.environ.get("SLOTSCHED_STATE", "memory"),
        help="memory, or redis://HOST:PORT/DB: journal, snapshots and leader election in Redis "
        "(default %(default)s, from $SLOTSCHED_STATE if set)",
    )
    s.add_argument("--state-prefix", default="slotsched", help="Redis key namespace (default %(default)s)")
    s.add_argument(
        "--replica-id", default=None, help="this replica's name in the leader key (default host-pid)"
    )
    s.add_argument(
        "--leader-ttl",
        type=float,
        default=5.0,
        help="seconds a leader lease lasts unrenewed: the failover time (default %(default)s)",
    )
    s.add_argument(
        "--snapshot-every",
        type=int,
        default=1000,
        help="snapshot the state and trim the journal every N events (default %(default)s)",
    )
    s.add_argument(
        "--snapshot-interval",
        type=float,
        default=60.0,
        help="... or every this many seconds with events since the last (default %(default)s)",
    )
    s.set_defaults(func=_serve)

    st = sub.add_parser(
        "status", help="show pool, workers (state, leases), floor, classes, tenants and queue"
    )
    st.add_argument(
        "--target", default="127.0.0.1:50051", help="scheduler gRPC address (default %(default)s)"
    )
    st.add_argument("--json", action="store_true", help="print the pool description as JSON")
    st.add_argument(
        "--token", default=None, help="admin bearer token (secure mode; its hash is in spec.access.admins)"
    )
    st.add_argument(
        "--tenant", default=None, help="x-slotsched-tenant header (dev mode; Admin needs none there)"
    )
    st.set_defaults(func=_status)

    pol = sub.add_parser("policy", help="policy file tools")
    polsub = pol.add_subparsers(dest="policy_command", required=True)
    v = polsub.add_parser("validate", help="check a SchedulingPolicy file; non-zero exit on any error")
    v.add_argument("file")
    v.set_defaults(func=_policy_validate)

    sim = sub.add_parser("simulate", help="run the policy core in virtual time on a workload CSV")
    sim.add_argument("--policy", help="SchedulingPolicy YAML (default: the built-in policy)")
    sim.add_argument(
        "--workload", required=True, help="CSV: arrival_s,session_id,tenant,qos_class,hold_s[,…]"
    )
    sim.add_argument("--checkpoint-seconds", type=float, default=2.0, help="holder's checkpoint time")
    sim.add_argument(
        "--until", type=float, default=None, help="stop at this virtual time; the rest is unfinished"
    )
    sim.add_argument("--json", action="store_true", help="print the result as JSON")
    sim.add_argument("--compare", action="store_true", help="run every baseline too and write a report")
    sim.add_argument("--out", default="out/compare", help="report folder for --compare")
    sim.add_argument(
        "--unknown-tenants",
        choices=("error", "refuse"),
        default="error",
        help="workload tenants the policy lacks: error (default: name them, exit 2) or refuse "
        "(count their sessions as refused, and say so)",
    )
    sim.set_defaults(func=_simulate)

    _add_optional(sub)
    return p


def _add_optional(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Subcommands whose modules land with later work; each registers itself if present."""
    for module in ("scheduler.worker_cli", "scheduler.demo_cli", "scheduler.trace_cli"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        mod.register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
