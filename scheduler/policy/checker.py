"""The policy checker: collects every problem (with its key path) instead of stopping at the first."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.policy.errors import DOCUMENT, Problem
from scheduler.policy.schema import Num, fmt_number


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def where(path: str) -> str:
    return path or DOCUMENT


def keys_text(allowed: Sequence[str]) -> str:
    return ", ".join(allowed)


def describe(value: object) -> str:
    """A value's YAML type (and the value, when short) for a 'wrong type' message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({shown!r})"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


class Checker:
    def __init__(self) -> None:
        self.errors: list[Problem] = []
        self.warnings: list[Problem] = []
        self._bad: list[str] = []

    def error(self, path: str, message: str) -> None:
        self.errors.append(Problem(where(path), message))
        self._bad.append(path)

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(Problem(where(path), message))

    def ok(self, *paths: str) -> bool:
        """No error was reported at, above or below any of `paths` (else cross-checks skip)."""
        for path in paths:
            for bad in self._bad:
                if not bad or path == bad or path.startswith((bad + ".", bad + "[")):
                    return False
                if bad.startswith((path + ".", path + "[")):
                    return False
        return True

    def section(self, value: object, path: str, allowed: Sequence[str]) -> dict[str, object]:
        """The mapping at `path` restricted to `allowed` keys; absent or null counts as empty."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error(path, f"expected a mapping with keys {keys_text(allowed)}, got {describe(value)}")
            return {}
        out: dict[str, object] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                self.error(path, f"keys must be strings, got {describe(key)}")
            elif key not in allowed:
                hint = difflib.get_close_matches(key, allowed, n=1)
                did_you_mean = f" (did you mean {hint[0]}?)" if hint else ""
                self.error(join(path, key), f"unknown key{did_you_mean}; allowed keys: {keys_text(allowed)}")
            else:
                out[key] = item
        return out

    def number(self, m: Mapping[str, object], f: Num, path: str) -> int | float | None:
        """The checked value of field `f` in `m`, or None when absent or invalid."""
        if f.key not in m:
            return None
        p = join(path, f.key)
        v = m[f.key]
        if isinstance(v, bool) or not isinstance(v, int | float):
            kind = "an integer" if f.integer else "a number"
            self.error(p, f"expected {kind}, got {describe(v)}")
            return None
        if f.integer and not isinstance(v, int):
            self.error(p, f"expected an integer, got {describe(v)}")
            return None
        if not math.isfinite(v):
            self.error(p, f"expected a finite number, got {v!r}")
            return None
        if v < f.minimum or (f.exclusive and v == f.minimum):
            if f.minimum == 0 and not f.exclusive:
                self.error(p, f"must not be negative, got {fmt_number(v)}")
            else:
                op = ">" if f.exclusive else ">="
                self.error(p, f"must be {op} {fmt_number(f.minimum)}, got {fmt_number(v)}")
            return None
        if f.maximum is not None and v > f.maximum:
            self.error(p, f"must be <= {fmt_number(f.maximum)}, got {fmt_number(v)}")
            return None
        return v if f.integer else float(v)

    def numbers(self, m: Mapping[str, object], fields: Sequence[Num], path: str) -> dict[str, Any]:
        """dataclasses.replace() changes for every present and valid field of `fields`."""
        changes: dict[str, Any] = {}
        for f in fields:
            v = self.number(m, f, path)
            if v is not None:
                changes[f.attr] = v
        return changes

    def string(self, m: Mapping[str, object], key: str, path: str) -> str | None:
        if key not in m:
            return None
        v = m[key]
        if not isinstance(v, str):
            self.error(join(path, key), f"expected a string, got {describe(v)}")
            return None
        return v
