"""What changes between two policies: tenants added and removed, and every other value that moved,
named by its key path in the policy file's shape (`pool.workers`, `tenants[acme].guaranteed`).

Pure: `slotsched policy apply` prints it (against the server's GetPolicy), and the server logs
its one-line `summary` for every policy put in force. Both sides are compared in the canonical
shape `policy_to_dict` writes, so a file and the server's YAML of the same policy compare equal.
Lists of credentials are shown by their length only: a diff line never carries a token hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduler.policy.model import Policy
from scheduler.policy.schema import fmt_number
from scheduler.policy.yaml_io import policy_to_dict

#: Changes a summary names one by one; the rest are counted.
SUMMARY_CHANGES = 6
_UNSET = "(unset)"


@dataclass(frozen=True)
class Change:
    path: str
    old: str
    new: str

    def __str__(self) -> str:
        return f"{self.path}: {self.old} -> {self.new}"


@dataclass(frozen=True)
class PolicyDiff:
    added: tuple[str, ...]  # tenants new in the second policy
    removed: tuple[str, ...]  # tenants it no longer has
    changes: tuple[Change, ...]  # every other value that differs, by key path

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changes)


def diff_policies(old: Policy, new: Policy) -> PolicyDiff:
    before, after = _flat(old), _flat(new)
    old_names = [t.name for t in old.tenants]
    new_names = [t.name for t in new.tenants]
    added = tuple(n for n in new_names if n not in old_names)
    removed = tuple(n for n in old_names if n not in new_names)
    # An added or removed tenant is one line, not one per field.
    gone = tuple(f"tenants[{n}]." for n in added + removed)
    changes = []
    for path in sorted(before.keys() | after.keys(), key=_order(before, after)):
        a, b = before.get(path), after.get(path)
        if a != b and not path.startswith(gone):
            empty = () if isinstance(a, tuple) or isinstance(b, tuple) else None  # a list left out
            changes.append(Change(path, _show(empty if a is None else a), _show(empty if b is None else b)))
    return PolicyDiff(added, removed, tuple(changes))


def summary(d: PolicyDiff) -> str:
    """One line: what a log reader needs to know an apply by."""
    if d.empty:
        return "no change"
    parts = []
    if d.added:
        parts.append("tenants added: " + ", ".join(d.added))
    if d.removed:
        parts.append("tenants removed: " + ", ".join(d.removed))
    parts += [str(c) for c in d.changes[:SUMMARY_CHANGES]]
    more = len(d.changes) - SUMMARY_CHANGES
    if more > 0:
        parts.append(f"and {more} more change{'s' if more != 1 else ''}")
    return "; ".join(parts)


def diff_lines(d: PolicyDiff) -> list[str]:
    """One line per tenant added or removed and per value changed ("+", "-", "~")."""
    return (
        [f"+ tenant {n}" for n in d.added]
        + [f"- tenant {n}" for n in d.removed]
        + [f"~ {c}" for c in d.changes]
    )


def _flat(policy: Policy) -> dict[str, Any]:
    """The policy's values by key path (without the `spec.` prefix); tenants keyed by name."""
    doc = policy_to_dict(policy)
    out: dict[str, Any] = {"name": doc["metadata"]["name"]}
    for key, value in doc["spec"].items():
        if key != "tenants":
            _walk(value, key, out)
            continue
        for tenant in value:
            fields = {k: v for k, v in tenant.items() if k != "name"}
            _walk(fields, f"tenants[{tenant['name']}]", out)
    return out


def _walk(value: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _walk(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):  # entries of spec.access.workers: by position
            _walk(v, f"{path}[{i}]", out)
    elif isinstance(value, list) and value:
        # Credentials and names: the same set in another order is no change.
        out[path] = tuple(sorted(map(repr, value)))
    elif isinstance(value, list):
        pass  # empty: as if left out (policy_to_dict writes some empty lists, not others)
    else:
        out[path] = value


def _show(value: Any) -> str:
    if value is None:
        return _UNSET
    if isinstance(value, tuple):
        return f"{len(value)} entr{'y' if len(value) == 1 else 'ies'}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return fmt_number(value)


def _order(before: dict[str, Any], after: dict[str, Any]) -> Any:
    """Paths in the order the file has them (the old policy's, then what is new)."""
    rank = {p: i for i, p in enumerate([*before, *(p for p in after if p not in before)])}
    return rank.__getitem__
