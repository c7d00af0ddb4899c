"""What changes between two policies: pools and tenants added and removed, and every other value
that moved, named by its key path in the policy file's shape (`pool.workers`,
`tenants[acme].guaranteed`; with several pools `pools[gpu].workers` and a tenant's quota in one
pool `tenants[acme].pools[gpu].guaranteed`).

Pure: `slotsched policy apply` prints it (against the server's GetPolicy), and the server logs
its one-line `summary` for every policy put in force. Both sides are compared in the canonical
shape `policy_to_dict` writes, so a file and the server's YAML of the same policy compare equal.
Lists of credentials are shown by their length only: a diff line never carries a token hash.
A key read only at start (schema.RESTART_ONLY) is marked "takes effect at restart", so an apply
never reports as done what changes nothing yet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from scheduler.policy.model import Policy
from scheduler.policy.schema import RESTART_ONLY, fmt_number
from scheduler.policy.yaml_io import policy_to_dict

#: Changes a summary names one by one; the rest are counted.
SUMMARY_CHANGES = 6
_UNSET = "(unset)"
RESTART_NOTE = "takes effect at restart"
_POOL_KEY = re.compile(r"^(?:pool|pools\[[^\]]+\])\.(\w+)$")  # pool.workers, pools[gpu].workers


@dataclass(frozen=True)
class Change:
    path: str
    old: str
    new: str

    @property
    def restart(self) -> str | None:
        """Why this change waits for a restart (schema.RESTART_ONLY), or None: it is live."""
        m = _POOL_KEY.match(self.path)
        return RESTART_ONLY.get(m.group(1)) if m else None

    def __str__(self) -> str:
        line = f"{self.path}: {self.old} -> {self.new}"
        why = self.restart
        return f"{line} ({RESTART_NOTE}: {why})" if why else line


@dataclass(frozen=True)
class PolicyDiff:
    added: tuple[str, ...]  # tenants new in the second policy
    removed: tuple[str, ...]  # tenants it no longer has
    changes: tuple[Change, ...]  # every other value that differs, by key path
    pools_added: tuple[str, ...] = ()  # pools new in the second policy (either has spec.pools)
    pools_removed: tuple[str, ...] = ()  # pools it no longer has

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changes or self.pools_added or self.pools_removed)


def _new_and_gone(old: list[str], new: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(n for n in new if n not in old), tuple(n for n in old if n not in new)


def diff_policies(old: Policy, new: Policy) -> PolicyDiff:
    # Pools by name as soon as either policy has spec.pools (the one pool of the other is `default`).
    by_name = bool(old.pools or new.pools)
    before, after = _flat(old, by_name), _flat(new, by_name)
    added, removed = _new_and_gone([t.name for t in old.tenants], [t.name for t in new.tenants])
    pools_added, pools_removed = (
        _new_and_gone(list(old.pool_names()), list(new.pool_names())) if by_name else ((), ())
    )
    # An added or removed tenant or pool is one line, not one per field; so are the quotas of a
    # pool removed (they went with it).
    gone = tuple(f"tenants[{n}]." for n in added + removed)
    gone += tuple(f"pools[{n}]." for n in pools_added + pools_removed)
    gone += tuple(f"tenants[{t.name}].pools[{n}]." for t in old.tenants for n in pools_removed)
    changes = []
    for path in sorted(before.keys() | after.keys(), key=_order(before, after)):
        a, b = before.get(path), after.get(path)
        if a != b and not path.startswith(gone):
            empty = () if isinstance(a, tuple) or isinstance(b, tuple) else None  # a list left out
            changes.append(Change(path, _show(empty if a is None else a), _show(empty if b is None else b)))
    return PolicyDiff(added, removed, tuple(changes), pools_added, pools_removed)


def summary(d: PolicyDiff) -> str:
    """One line: what a log reader needs to know an apply by."""
    if d.empty:
        return "no change"
    parts = []
    if d.pools_added:
        parts.append("pools added: " + ", ".join(d.pools_added))
    if d.pools_removed:
        parts.append("pools removed: " + ", ".join(d.pools_removed))
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
    """One line per pool and tenant added or removed and per value changed ("+", "-", "~")."""
    return (
        [f"+ pool {n}" for n in d.pools_added]
        + [f"- pool {n}" for n in d.pools_removed]
        + [f"+ tenant {n}" for n in d.added]
        + [f"- tenant {n}" for n in d.removed]
        + [f"~ {c}" for c in d.changes]
    )


def _flat(policy: Policy, by_name: bool = False) -> dict[str, Any]:
    """The policy's values by key path (without the `spec.` prefix); tenants keyed by name, and so
    are pools (`pools[NAME]`, the one pool of spec.pool as `default` when `by_name`) and a
    tenant's quotas per pool."""
    doc = policy_to_dict(policy)
    out: dict[str, Any] = {"name": doc["metadata"]["name"]}
    for key, value in doc["spec"].items():
        if key == "pool" and by_name:
            _walk(value, f"pools[{policy.pool.name}]", out)
        elif key == "pools":
            for pool in value:
                _walk({k: v for k, v in pool.items() if k != "name"}, f"pools[{pool['name']}]", out)
        elif key == "tenants":
            for tenant in value:
                path = f"tenants[{tenant['name']}]"
                _walk({k: v for k, v in tenant.items() if k not in ("name", "pools")}, path, out)
                for q in tenant.get("pools", ()):
                    _walk({k: v for k, v in q.items() if k != "pool"}, f"{path}.pools[{q['pool']}]", out)
        else:
            _walk(value, key, out)
    return out


# Lists of names, shown as they are (other lists hold credentials: shown by their length only).
_NAMES = (".compatibility", ".pools")


def _walk(value: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _walk(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):  # entries of spec.access.workers: by position
            _walk(v, f"{path}[{i}]", out)
    elif isinstance(value, list) and value and path.endswith(_NAMES):
        out[path] = "[" + ", ".join(sorted(map(str, value))) + "]"
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
