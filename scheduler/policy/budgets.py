"""Token budgets in the policy: spec.budgets, each tenant's share of them
(spec.tenants[i].budgets) and the budgets a pool's sessions draw on (spec.pool.budgets,
spec.pools[i].budgets). Parsed after the rest of the document, so that every budget a tenant or a
pool names is known, and checked with the same key paths as every other key.

The rules (docs/design.md, "Token budgets"):

* a budget limits at least one dimension (tokens, input tokens, output tokens, requests);
* a tenant names each budget once, and only budgets the policy has; a rate names only dimensions
  its budget limits;
* a Guaranteed or Burstable nominal rate covers every dimension of its budget (a value or a
  percent): a dimension left out would be 0, and a permit (one request, some tokens) could never
  fit in it;
* Burstable nominal <= limit, dimension by dimension;
* the Guaranteed rates of all tenants add up to at most the budget's limit in each dimension: an
  error, not a warning as an over-committed slot floor is, because the budget is the provider's
  (the pool may grow into a floor; nothing grows a provider's limit), and a reserved rate that
  cannot be refilled is a promise broken at every minute;
* a warning when Guaranteed and Burstable nominal rates leave no shared remainder (BestEffort can
  starve), as for slots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.policy.checker import Checker, describe, join, keys_text
from scheduler.policy.model import (
    BUDGET_DIMENSIONS,
    BudgetFeedback,
    BudgetRate,
    BudgetSpec,
    Policy,
    PoolSpec,
    TenantBudgetQuota,
    TenantSpec,
)
from scheduler.policy.schema import (
    BEST_EFFORT_KEYS,
    BUDGET_FEEDBACK_FIELDS,
    BUDGET_FIELDS,
    BUDGET_KEYS,
    BUDGET_LIMIT_FIELDS,
    BUDGET_RATE_FIELDS,
    BURSTABLE_KEYS,
    POOL_NAME_MAX_LEN,
    POOL_NAME_RE,
    TENANT_BUDGET_KEYS,
    Num,
    fmt_number,
)

_RATE_KEYS = tuple(f.key for f in BUDGET_RATE_FIELDS)
# A rate's key of each dimension, in BUDGET_DIMENSIONS' order (for messages).
_DIM_KEYS = ("requestsPerMinute", "inputTokensPerMinute", "outputTokensPerMinute", "tokensPerMinute")
_WEIGHT = Num("weight", "weight", False, exclusive=True)


def _names(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in names) if names else "none (spec.budgets is empty)"


def parse_budgets(c: Checker, value: object, path: str = "spec.budgets") -> tuple[BudgetSpec, ...]:
    out: list[BudgetSpec] = []
    seen: dict[str, str] = {}
    for p, m in c.entries(value, path, BUDGET_KEYS, "budgets"):
        np = join(p, "name")
        name = c.string(m, "name", p)
        if "name" not in m:
            c.error(np, "required: the budget's name (lowercase letters, digits and '-')")
        elif name is not None and (not POOL_NAME_RE.match(name) or len(name) > POOL_NAME_MAX_LEN):
            c.error(
                np,
                f"{name!r} is not a valid budget name: at most {POOL_NAME_MAX_LEN} lowercase letters, "
                "digits and '-', starting and ending with a letter or digit",
            )
            name = None
        name = c.once(name, np, seen, "budget name")
        limits = c.numbers(m, BUDGET_LIMIT_FIELDS, p)
        if not any(f.key in m for f in BUDGET_LIMIT_FIELDS):
            c.error(
                p,
                "a budget limits at least one of "
                + ", ".join(f.key for f in BUDGET_LIMIT_FIELDS)
                + " (the provider's limits per minute)",
            )
        changes = c.numbers(m, BUDGET_FIELDS, p)
        fp = join(p, "feedback")
        fm = c.section(m.get("feedback"), fp, [f.key for f in BUDGET_FEEDBACK_FIELDS])
        feedback = dataclasses.replace(BudgetFeedback(), **c.numbers(fm, BUDGET_FEEDBACK_FIELDS, fp))
        if name is not None:
            out.append(BudgetSpec(name, **limits, **changes, feedback=feedback))
    return tuple(out)


def _rate(c: Checker, value: object, path: str, budget: BudgetSpec | None) -> BudgetRate | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        c.error(
            path,
            f"expected a rate: a mapping with keys {keys_text(_RATE_KEYS)} (per minute, or percent of "
            f"the budget), got {describe(value)}",
        )
        return None
    m = c.section(value, path, _RATE_KEYS)
    if not m:
        c.error(path, f"empty: give percent or a rate per minute ({keys_text(_RATE_KEYS[1:])})")
        return None
    rate = BudgetRate(**c.numbers(m, BUDGET_RATE_FIELDS, path))
    if budget is not None:
        for key, own, limit in zip(_DIM_KEYS, rate.given(), budget.limits(), strict=True):
            if own is not None and limit is None:
                c.error(
                    join(path, key),
                    f"budget {budget.name!r} does not limit {key}: give only the ones it does",
                )
    return rate


def _complete(c: Checker, rate: BudgetRate | None, path: str, budget: BudgetSpec, what: str) -> None:
    """A reserved or nominal rate covers every dimension its budget limits."""
    if rate is None or rate.percent is not None:
        return
    for key, own, limit in zip(_DIM_KEYS, rate.given(), budget.limits(), strict=True):
        if limit is not None and own is None:
            c.error(
                join(path, key),
                f"required: budget {budget.name!r} limits {key}, and a {what} without it would be 0 there "
                "(no permit could fit); give it, or percent",
            )


def _tenant_budget(
    c: Checker, m: Mapping[str, object], p: str, budgets: Mapping[str, BudgetSpec], seen: dict[str, str]
) -> TenantBudgetQuota | None:
    bp = join(p, "budget")
    listed = _names(list(budgets))
    name = c.once(
        c.reference(m, "budget", p, budgets, "the budget this share is of", listed),
        bp,
        seen,
        "entry for budget",
    )
    budget = None if name is None else budgets[name]
    weight = c.number(m, _WEIGHT, p)
    gp, burst_p, ep = join(p, "guaranteed"), join(p, "burstable"), join(p, "bestEffort")
    reserved = _rate(c, m.get("guaranteed"), gp, budget)
    bm = c.section(m.get("burstable"), burst_p, BURSTABLE_KEYS)
    nominal = _rate(c, bm.get("nominal"), join(burst_p, "nominal"), budget)
    limit = _rate(c, bm.get("limit"), join(burst_p, "limit"), budget)
    em = c.section(m.get("bestEffort"), ep, BEST_EFFORT_KEYS)
    be = _rate(c, em.get("limit"), join(ep, "limit"), budget)
    if budget is None or name is None:
        return None
    _complete(c, reserved, gp, budget, "Guaranteed rate")
    _complete(c, nominal, join(burst_p, "nominal"), budget, "Burstable nominal rate")
    if nominal is not None and limit is not None and c.ok(burst_p):
        for key, n, lim in zip(_DIM_KEYS, nominal.resolve(budget), limit.resolve(budget), strict=True):
            if n is not None and lim is not None and n > lim:
                c.error(
                    join(join(burst_p, "nominal"), key),
                    f"nominal {fmt_number(n)} a minute is greater than limit {fmt_number(lim)}",
                )
    return TenantBudgetQuota(
        name,
        weight=None if weight is None else float(weight),
        reserved=reserved,
        burstable_nominal=nominal,
        burstable_limit=limit,
        best_effort_limit=be,
    )


def attach_tenant_budgets(
    c: Checker, value: object, tenants: Sequence[TenantSpec], budgets: Sequence[BudgetSpec]
) -> tuple[TenantSpec, ...]:
    """spec.tenants[i].budgets read into the tenants already built (`value` is spec.tenants)."""
    if not isinstance(value, list):
        return tuple(tenants)
    by_name = {b.name: b for b in budgets}
    by_tenant = {t.name: t for t in tenants}
    shares: dict[str, tuple[TenantBudgetQuota, ...]] = {}
    for i, item in enumerate(value):
        raw = item.get("budgets") if isinstance(item, Mapping) else None
        if raw is None:
            continue
        path = f"spec.tenants[{i}].budgets"
        seen: dict[str, str] = {}
        entries = c.entries(raw, path, TENANT_BUDGET_KEYS, "shares of budgets")
        found = [_tenant_budget(c, m, p, by_name, seen) for p, m in entries]
        name = item.get("name")
        if isinstance(name, str) and name in by_tenant:
            shares[name] = tuple(q for q in found if q is not None)
    return tuple(dataclasses.replace(t, budgets=shares[t.name]) if t.name in shares else t for t in tenants)


def _pool_budgets(c: Checker, raw: object, path: str, names: Sequence[str]) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.error(path, f"expected a list of budget names (of {_names(names)}), got {describe(raw)}")
        return ()
    return c.names(raw, path, names, "budget", _names(names))


def attach_pool_budgets(c: Checker, spec: Mapping[str, object], policy: Policy) -> Policy:
    """spec.pool.budgets or spec.pools[i].budgets read into the pools already built."""
    names = [b.name for b in policy.budgets]
    if policy.pools:
        raw_pools = spec.get("pools")
        if not isinstance(raw_pools, list) or len(raw_pools) != len(policy.pools):
            return policy
        pools: list[PoolSpec] = []
        for i, (pool, raw) in enumerate(zip(policy.pools, raw_pools, strict=True)):
            own = raw.get("budgets") if isinstance(raw, Mapping) else None
            pools.append(
                dataclasses.replace(pool, budgets=_pool_budgets(c, own, f"spec.pools[{i}].budgets", names))
            )
        return dataclasses.replace(policy, pools=tuple(pools), pool=pools[0])
    raw_pool = spec.get("pool")
    own = raw_pool.get("budgets") if isinstance(raw_pool, Mapping) else None
    if own is None:
        return policy
    pool = dataclasses.replace(policy.pool, budgets=_pool_budgets(c, own, "spec.pool.budgets", names))
    return dataclasses.replace(policy, pool=pool)


def check_budget_commitments(c: Checker, policy: Policy) -> None:
    """Per budget and dimension: Guaranteed rates within the limit (an error), and a shared
    remainder left by Guaranteed and Burstable nominal rates (a warning)."""
    if not policy.budgets or not c.ok("spec.budgets", "spec.tenants"):
        return
    for i, b in enumerate(policy.budgets):
        reserved = [0.0] * len(BUDGET_DIMENSIONS)
        nominal = [0.0] * len(BUDGET_DIMENSIONS)
        for t in policy.tenants:
            q = t.budget(b.name)
            if q is None:
                continue
            for sums, rate in ((reserved, q.reserved), (nominal, q.burstable_nominal)):
                if rate is not None:
                    for d, v in enumerate(rate.resolve(b)):
                        sums[d] += v or 0.0
        for d, limit in enumerate(b.limits()):
            if limit is None:
                continue
            key = _DIM_KEYS[d]
            res, nom = fmt_number(round(reserved[d], 3)), fmt_number(round(nominal[d], 3))
            if reserved[d] > limit:
                c.error(
                    f"spec.budgets[{i}].{key}",
                    f"the tenants' Guaranteed rates of budget {b.name!r} add up to {res} a minute, above its "
                    f"limit {limit}: a reserved rate the provider cannot refill is never kept",
                )
            elif reserved[d] + nominal[d] >= limit and reserved[d] + nominal[d] > 0:
                c.warn(
                    f"spec.budgets[{i}].{key}",
                    f"budget {b.name!r}: Guaranteed ({res}) and Burstable nominal ({nom}) rates add up "
                    f"to its limit {limit} a minute or more: no shared remainder is left, so BestEffort "
                    "can starve",
                )


# --- writing back (policy_to_dict) --------------------------------------------------------------


def _rate_to_dict(r: BudgetRate) -> dict[str, Any]:
    return {f.key: getattr(r, f.attr) for f in BUDGET_RATE_FIELDS if getattr(r, f.attr) is not None}


def budget_to_dict(b: BudgetSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": b.name}
    out |= {f.key: getattr(b, f.attr) for f in BUDGET_LIMIT_FIELDS if getattr(b, f.attr) is not None}
    out |= {f.key: getattr(b, f.attr) for f in BUDGET_FIELDS}
    out["feedback"] = {f.key: getattr(b.feedback, f.attr) for f in BUDGET_FEEDBACK_FIELDS}
    return out


def tenant_budget_to_dict(q: TenantBudgetQuota) -> dict[str, Any]:
    out: dict[str, Any] = {"budget": q.budget}
    if q.weight is not None:
        out["weight"] = q.weight
    if q.reserved is not None:
        out["guaranteed"] = _rate_to_dict(q.reserved)
    burst: dict[str, Any] = {}
    if q.burstable_nominal is not None:
        burst["nominal"] = _rate_to_dict(q.burstable_nominal)
    if q.burstable_limit is not None:
        burst["limit"] = _rate_to_dict(q.burstable_limit)
    if burst:
        out["burstable"] = burst
    if q.best_effort_limit is not None:
        out["bestEffort"] = {"limit": _rate_to_dict(q.best_effort_limit)}
    return out


def with_budgets(c: Checker, spec: Mapping[str, object], policy: Policy) -> Policy:
    """The policy with its budgets, the tenants' shares of them and the pools' budgets read from
    `spec` (the document's spec mapping), and their commitments checked."""
    budgets = parse_budgets(c, spec.get("budgets"))
    tenants = attach_tenant_budgets(c, spec.get("tenants"), policy.tenants, budgets)
    policy = attach_pool_budgets(c, spec, dataclasses.replace(policy, budgets=budgets, tenants=tenants))
    check_budget_commitments(c, policy)
    return policy
