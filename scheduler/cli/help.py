"""The CLI's parser and help formatter, shared by every subcommand."""

from __future__ import annotations

import argparse
from typing import Any


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
