"""`slotsched` command line: serve, status, policy validate, simulate, worker, demo, trace.

One module per subcommand, each with a `register(sub)` that adds its parser; main() builds the
parser from them. Each subcommand imports what it needs lazily, so `slotsched policy validate`
starts fast and does not import gRPC.

Output to a reader that went away (`slotsched status --json | head`) ends the command quietly,
whichever command printed, and so does a backend the install lacks (exit 1, naming the extra to
install: snapshots/extras.py): see main.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from scheduler.cli import demo, policy, serve, simulate, status, trace, worker
from scheduler.cli.help import Parser
from snapshots.extras import MissingExtra


def build_parser() -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = Parser(
        prog="slotsched",
        description="A scheduler for agent runtimes: who gets the next warm slot, who waits, who yields.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    # The order of --help.
    for module in (serve, status, policy, simulate, worker, demo, trace):
        module.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
    except MissingExtra as e:  # a backend the base install lacks: the message names its extra
        print(f"slotsched: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The Python docs' advice for SIGPIPE: point stdout at devnull, so the interpreter's
        # own flush at exit does not fail again, and exit 1 without a traceback.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is not a file (embedded, captured)
            pass
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
