"""`slotsched demo`: one command that shows checkpoint-and-yield scheduling on a pool too small.

Lazy imports, so the rest of the CLI does not pay for gRPC.
"""

from __future__ import annotations

import argparse
import sys

from scheduler.cli.help import positive
from snapshots.config import URL_FORMS


def _demo(args: argparse.Namespace) -> int:
    try:
        from scheduler.demo.run import demo_main

        rc: int = demo_main(args.duration, args.snapshots, args.seed, args.json)
    except KeyboardInterrupt:
        # Once running, the demo handles Ctrl-C itself (shuts down, prints the partial outcome);
        # this is a Ctrl-C while it was still importing, before anything was measured.
        print("slotsched demo: interrupted before it started", file=sys.stderr)
        return 130
    return rc


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser(
        "demo",
        help="run a scheduler, 3 in-process reference workers and a multi-tenant workload; show the outcome",
    )
    d.add_argument("--duration", type=positive, default=60.0, help="seconds to run (default %(default)s)")
    d.add_argument(
        "--snapshots",
        default=None,
        help=f"snapshot store URL: {URL_FORMS} (default: a temporary directory, removed afterwards)",
    )
    d.add_argument("--seed", type=int, default=1, help="workload seed (default %(default)s)")
    d.add_argument("--json", action="store_true", help="print the outcome as JSON on stdout")
    d.set_defaults(func=_demo)
