"""SchedulingPolicy YAML in and out: a strict reader (duplicate keys refused) and the writer.

``policy_to_dict`` is the inverse of ``policy_from_dict`` so a policy round-trips through the Admin
API. Only ``load_policy`` does I/O.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from typing import Any

import yaml

from scheduler.policy.access import serving_warnings
from scheduler.policy.autoscaler_keys import autoscaler_to_dict
from scheduler.policy.budgets import budget_to_dict, tenant_budget_to_dict
from scheduler.policy.errors import DOCUMENT, PolicyError, Problem
from scheduler.policy.model import (
    AccessSpec,
    AutoscalerSpec,
    FairnessSpec,
    LimitsSpec,
    Policy,
    PoolSpec,
    RateLimit,
    TenantPoolQuota,
)
from scheduler.policy.schema import (
    API_VERSION,
    FAIRNESS_FIELDS,
    KIND,
    LIMITS_FIELDS,
    POOL_FIELDS,
    QUEUE_FIELDS,
    TENANT_POOL_FIELDS,
    TIMING_FIELDS,
    Num,
    fmt_number,
)
from scheduler.policy.validate import policy_from_dict
from scheduler.policy.yaml_limits import MAX_POLICY_DEPTH, size_problem, yaml_limit_problem


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: the base class reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep)


def parse_policy(text: str) -> tuple[Policy, list[Problem]]:
    """Parse a policy from YAML text. Returns (policy, warnings); raises PolicyError, also for a
    text past the depth or node limits (yaml_limits.py), which the loader below would recurse
    on or expand."""
    size = size_problem(text)  # first, before any parsing: a large text takes seconds to parse
    if size is not None:
        raise PolicyError([Problem(DOCUMENT, size)])
    limit = yaml_limit_problem(text)
    if limit is not None:
        raise PolicyError([Problem(DOCUMENT, f"invalid YAML: {limit}")])
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: builds plain data only
    except RecursionError:  # a depth the scan did not foresee: never a traceback
        raise PolicyError(
            [
                Problem(
                    DOCUMENT,
                    f"invalid YAML: nests too deep to parse: the policy depth limit is {MAX_POLICY_DEPTH}",
                )
            ]
        ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}" if mark is not None else DOCUMENT
        column = f" (column {mark.column + 1})" if mark is not None else ""
        context = f"{e.context}: " if e.context else ""
        raise PolicyError([Problem(where, f"invalid YAML: {context}{e.problem}{column}")]) from e
    except yaml.YAMLError as e:
        raise PolicyError([Problem(DOCUMENT, f"invalid YAML: {e}")]) from e
    return policy_from_dict(doc)


def load_policy(path: str | os.PathLike[str]) -> tuple[Policy, list[Problem]]:
    """Read and parse a policy file. Returns (policy, warnings); raises PolicyError."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise PolicyError([Problem(os.fspath(path), f"cannot read policy file: {reason}")]) from e
    return parse_policy(text)


def check_policy_file(path: str | os.PathLike[str]) -> tuple[Policy, list[Problem]]:
    """The one validator of a policy a scheduler is to serve: `policy validate`, `policy apply`
    (before it sends) and `serve` run it, so they hold a file to the same limits (size first, then
    depth and nodes; ApplyPolicy's the same, yaml_limits.py) and say the same warnings, those of
    serving it included (access.serving_warnings). Raises PolicyError."""
    policy, warnings = load_policy(path)
    return policy, [*warnings, *serving_warnings(policy)]


# ---------------------------------------------------------------------------------------------
# Policy -> dict / YAML (the inverse of policy_from_dict)


def _numbers_to_dict(spec: object, fields: Sequence[Num]) -> dict[str, Any]:
    return {f.key: getattr(spec, f.attr) for f in fields}


def _pool_to_dict(pool: PoolSpec) -> dict[str, Any]:
    """A pool's size, bounds and floor: spec.pool, or those keys of a spec.pools entry."""
    pool_d = _numbers_to_dict(pool, POOL_FIELDS)
    pool_d["floor"] = f"{fmt_number(pool.floor_percent)}%" if pool.floor_percent is not None else pool.floor
    if pool.budgets:
        pool_d["budgets"] = list(pool.budgets)
    return pool_d


def _autoscaler_to_dict(a: AutoscalerSpec) -> dict[str, Any]:
    return autoscaler_to_dict(a)


def _only_changed(own: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The keys of `own` whose values differ from `base`'s (nested mappings likewise)."""
    out: dict[str, Any] = {}
    for k, v in own.items():
        if isinstance(v, dict):
            sub = _only_changed(v, base.get(k, {}))
            if sub:
                out[k] = sub
        elif base.get(k) != v:
            out[k] = v
    return out


def _pools_entry(pool: PoolSpec, autoscaler: AutoscalerSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": pool.name}
    if pool.labels:
        entry["labels"] = dict(pool.labels)
    if pool.compatibility:
        entry["compatibility"] = list(pool.compatibility)
    entry |= _pool_to_dict(pool)
    if pool.autoscaler is not None:
        # What the pool's own autoscaler changes of spec.autoscaler's (the reader starts from it).
        entry["autoscaler"] = _only_changed(
            _autoscaler_to_dict(pool.autoscaler), _autoscaler_to_dict(autoscaler)
        )
    if pool.target:
        entry["target"] = pool.target
    return entry


def _tenant_pool_to_dict(q: TenantPoolQuota) -> dict[str, Any]:
    out: dict[str, Any] = {"pool": q.pool}
    out |= {f.key: getattr(q, f.attr) for f in TENANT_POOL_FIELDS if getattr(q, f.attr) is not None}
    if q.best_effort_limit_set:
        out["bestEffortLimit"] = q.best_effort_limit
    return out


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The policy in its YAML shape (camelCase keys); policy_from_dict(policy_to_dict(p)) == p.
    A policy of one pool (no spec.pools) writes `pool:` as it always has; one with spec.pools
    writes `pools:`."""
    pools: dict[str, Any]
    if policy.pools:
        pools = {"pools": [_pools_entry(p, policy.autoscaler) for p in policy.pools]}
    else:
        pools = {"pool": _pool_to_dict(policy.pool)}
    autoscaler_d = _autoscaler_to_dict(policy.autoscaler)
    tenants = []
    for t in policy.tenants:
        be: dict[str, Any] = {} if t.best_effort_limit is None else {"limit": t.best_effort_limit}
        tenant: dict[str, Any] = {
            "name": t.name,
            "weight": t.weight,
            "guaranteed": t.guaranteed,
            "burstable": {"nominal": t.burstable_nominal, "limit": t.burstable_limit},
            "bestEffort": be,
            "tokens": list(t.tokens),
        }
        if t.identities:
            tenant["identities"] = list(t.identities)
        if t.rate_limit is not None:
            tenant["rateLimit"] = _rate_limit_to_dict(t.rate_limit)
        if t.pools:
            tenant["pools"] = [_tenant_pool_to_dict(q) for q in t.pools]
        if t.budgets:
            tenant["budgets"] = [tenant_budget_to_dict(q) for q in t.budgets]
        tenants.append(tenant)
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": policy.name},
        "spec": {
            **pools,
            "timing": _numbers_to_dict(policy.timing, TIMING_FIELDS),
            "queue": _numbers_to_dict(policy.queue, QUEUE_FIELDS),
            "autoscaler": autoscaler_d,
            "tenants": tenants,
            "access": _access_to_dict(policy.access),
        },
    }
    limits = {
        k: _rate_limit_to_dict(v)
        for k, v in (
            ("tenant", policy.rate_limits.tenant),
            ("renewals", policy.rate_limits.renewals),
            ("admin", policy.rate_limits.admin),
            ("worker", policy.rate_limits.worker),
        )
        if v is not None
    }
    if limits:
        doc["spec"]["rateLimits"] = limits
    if policy.limits != LimitsSpec():  # the defaults are not written (older readers know no key)
        doc["spec"]["limits"] = _numbers_to_dict(policy.limits, LIMITS_FIELDS)
    if policy.fairness != FairnessSpec():
        doc["spec"]["fairness"] = _numbers_to_dict(policy.fairness, FAIRNESS_FIELDS)
    if policy.budgets:  # absent when none (older readers know no key)
        doc["spec"]["budgets"] = [budget_to_dict(b) for b in policy.budgets]
    return doc


def _rate_limit_to_dict(r: RateLimit) -> dict[str, Any]:
    return {"qps": r.qps, "burst": r.burst}


def _access_to_dict(access: AccessSpec) -> dict[str, Any]:
    admins: list[Any] = [*access.admins, *({"identity": n} for n in access.admin_identities)]
    workers: list[dict[str, Any]] = []
    for w in access.workers:
        entry: dict[str, Any] = {}
        if w.tokens:
            entry["tokens"] = list(w.tokens)
        if w.identities:
            entry["identities"] = list(w.identities)
        if w.worker_id_prefix is not None:
            entry["workerIdPrefix"] = w.worker_id_prefix
        else:
            entry["workerIds"] = list(w.worker_ids)
        entry["maxSlots"] = w.max_slots
        if w.pools:
            entry["pools"] = list(w.pools)
        workers.append(entry)
    return {"admins": admins, "workers": workers}


def policy_to_yaml(policy: Policy) -> str:
    """The policy as a YAML document that parse_policy reads back to an equal Policy."""
    return yaml.safe_dump(policy_to_dict(policy), sort_keys=False, default_flow_style=False)
