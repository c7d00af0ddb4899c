"""The policy checker: collects every problem (with its key path) instead of stopping at the first."""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from scheduler.policy.errors import DOCUMENT, Problem
from scheduler.policy.schema import (
    POOL_NAME_MAX_LEN,
    POOL_NAME_RE,
    TARGET_MAX_LEN,
    TARGET_RE,
    Num,
    fmt_number,
    label_key_problem,
    label_value_problem,
)


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

    def entries(
        self, value: object, path: str, allowed: Sequence[str], what: str
    ) -> Iterator[tuple[str, dict[str, object]]]:
        """The items of the list of mappings at `path` (`what`: "budgets", say), each as its path
        and its mapping restricted to `allowed`; absent or null is an empty list."""
        if value is None:
            return
        if not isinstance(value, list):
            self.error(path, f"expected a list of {what}, got {describe(value)}")
            return
        for i, item in enumerate(value):
            p = f"{path}[{i}]"
            if not isinstance(item, Mapping):
                self.error(p, f"expected a mapping with keys {keys_text(allowed)}, got {describe(item)}")
                continue
            yield p, self.section(item, p, allowed)

    def once(self, name: str | None, path: str, seen: dict[str, str], what: str) -> str | None:
        """`name` the first time it is seen in its list (`seen`: name to where), else None with
        an error naming the first place (`what`: "budget name", "entry for pool")."""
        if name is None:
            return None
        if name in seen:
            self.error(path, f"duplicate {what} {name!r} (also at {seen[name]})")
            return None
        seen[name] = path
        return name

    def reference(
        self, m: Mapping[str, object], key: str, path: str, known: Collection[str], required: str, listed: str
    ) -> str | None:
        """The name at `m[key]` when it is one of `known`, else None with an error: `required`
        says what the missing key names, `listed` the names an unknown one is told."""
        kp = join(path, key)
        if key not in m:
            self.error(kp, f"required: {required}")
            return None
        name = self.string(m, key, path)
        if name is not None and name not in known:
            self.error(kp, f"unknown {key} {name!r}: the policy's {key}s are {listed}")
            return None
        return name

    def names(
        self, items: Sequence[object], path: str, known: Collection[str], kind: str, listed: str
    ) -> tuple[str, ...]:
        """A list of names of `kind` ("pool"), each one of `known` (told as `listed`) and once."""
        seen: dict[str, str] = {}
        for j, n in enumerate(items):
            p = f"{path}[{j}]"
            if not isinstance(n, str):
                self.error(p, f"expected a {kind} name, got {describe(n)}")
            elif n not in known:
                self.error(p, f"unknown {kind} {n!r}: the policy's {kind}s are {listed}")
            else:
                self.once(n, p, seen, kind)
        return tuple(seen)

    def string(self, m: Mapping[str, object], key: str, path: str) -> str | None:
        if key not in m:
            return None
        v = m[key]
        if not isinstance(v, str):
            self.error(join(path, key), f"expected a string, got {describe(v)}")
            return None
        return v


# --- the fields of a pool among several (spec.pools[i]) ---------------------------------------


def check_pool_name(c: Checker, m: Mapping[str, object], path: str) -> str | None:
    np = join(path, "name")
    if "name" not in m:
        c.error(np, "required: the pool's name (lowercase letters, digits and '-')")
        return None
    name = c.string(m, "name", path)
    if name is not None and (not POOL_NAME_RE.match(name) or len(name) > POOL_NAME_MAX_LEN):
        c.error(
            np,
            f"{name!r} is not a valid pool name: at most {POOL_NAME_MAX_LEN} lowercase letters, digits "
            "and '-', starting and ending with a letter or digit",
        )
        return None
    return name


def pool_labels(c: Checker, value: object, path: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        c.error(path, f"expected a mapping of label keys to values, got {describe(value)}")
        return ()
    out: list[tuple[str, str]] = []
    for k, v in value.items():
        if not isinstance(k, str):
            c.error(path, f"label keys must be strings, got {describe(k)}")
            continue
        kp = join(path, k)
        key_problem = label_key_problem(k)
        if key_problem is not None:
            c.error(kp, f"{k!r} is not a valid label key: {key_problem}")
        elif not isinstance(v, str):
            c.error(kp, f"expected a string value, got {describe(v)} (quote it)")
        elif (value_problem := label_value_problem(v)) is not None:
            c.error(kp, f"{v!r} is not a valid label value: {value_problem}")
        else:
            out.append((k, v))
    return tuple(sorted(out))  # by key: the same labels in another order are the same pool


def compatibility_keys(
    c: Checker, value: object, path: str, labels: tuple[tuple[str, str], ...], labels_path: str
) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        c.error(path, f"expected a list of label keys of this pool, got {describe(value)}")
        return ()
    keys = [k for k, _ in labels]
    seen: dict[str, str] = {}
    for j, k in enumerate(value):
        p = f"{path}[{j}]"
        if not isinstance(k, str):
            c.error(p, f"expected a label key (a string), got {describe(k)}")
        elif k in seen:
            c.error(p, f"duplicate key {k!r} (also at {seen[k]})")
        elif k not in keys and c.ok(labels_path):
            have = ", ".join(keys) if keys else "none"
            c.error(
                p,
                f"{k!r} is not a label of this pool (its labels: {have}): a snapshot taken here "
                "resumes only on a pool with the same value of each compatibility key",
            )
        else:
            seen[k] = p
    return tuple(seen)


def actuator_target(c: Checker, m: Mapping[str, object], path: str) -> str:
    target = c.string(m, "target", path)
    if target is None:
        return ""
    if len(target) > TARGET_MAX_LEN or not TARGET_RE.match(target):
        c.error(
            join(path, "target"),
            f"{describe(target)} is not an actuator target: Deployment/NAME, StatefulSet/NAME or "
            f"PLURAL.GROUP/VERSION/KIND/NAME (no spaces, at most {TARGET_MAX_LEN} characters)",
        )
        return ""
    return target
