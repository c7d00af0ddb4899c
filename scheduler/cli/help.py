"""The CLI's parser and help formatter, shared by every subcommand: option types that refuse
nonsense values, checks across options, and the flags of the Admin API clients."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

#: A check across a subcommand's options: the problem ("argument --out: ...") or None.
Check = Callable[[argparse.Namespace], str | None]


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
    its subparsers of the parent's class, so modules registering subcommands need not know), and
    `add_check`'s checks run once the options are parsed, before any work: a nonsense
    combination is an argparse error (exit 2, naming the flag), as a bad value is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.checks: list[Check] = []

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, rest = super().parse_known_args(args, namespace)
        for check in self.checks:
            problem = check(ns)
            if problem:
                self.error(problem)
        return ns, rest


def add_check(parser: argparse.ArgumentParser, check: Check) -> None:
    assert isinstance(parser, Parser), "subcommands are registered on the CLI's Parser"
    parser.checks.append(check)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
    return value


def positive(text: str) -> float:
    """An option type: a finite number > 0 (argparse names the flag in its error)."""
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def non_negative(text: str) -> float:
    """An option type: a finite number >= 0."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return value


def add_admin_client_flags(p: argparse.ArgumentParser) -> None:
    """--target, --token and --tls-* of a client of the Admin API (`status`, `policy apply`)."""
    p.add_argument("--target", default="127.0.0.1:50051", help="scheduler gRPC address (default %(default)s)")
    p.add_argument(
        "--token", default=None, help="admin bearer token (secure mode; its hash is in spec.access.admins)"
    )
    p.add_argument(
        "--tls-ca", default=None, metavar="PEM", help="CA that signed the scheduler's certificate (TLS)"
    )
    p.add_argument(
        "--tls-cert", default=None, metavar="PEM", help="client certificate, for a scheduler requiring mTLS"
    )
    p.add_argument("--tls-key", default=None, metavar="PEM", help="the client certificate's private key")
