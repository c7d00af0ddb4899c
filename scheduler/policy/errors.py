"""Policy problems: one error or warning located by its key path, and the error that carries them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# Where a problem of the whole document (not of one key) is reported.
DOCUMENT: Final = "(document)"


@dataclass(frozen=True)
class Problem:
    """One error or warning, located by its key path (``spec.tenants[1].burstable.nominal``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class PolicyError(Exception):
    """A policy that cannot be used. Carries every error found, and the warnings seen so far."""

    def __init__(self, problems: Sequence[Problem], warnings: Sequence[Problem] = ()) -> None:
        self.problems: list[Problem] = list(problems)
        self.warnings: list[Problem] = list(warnings)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)
