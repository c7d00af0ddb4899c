"""A small language for driving the budget core in tests: a policy from a few keys, steps as
tuples, decisions as short tuples a table can list."""

from __future__ import annotations

from typing import Any

from scheduler.core.budget.core import Budgets
from scheduler.core.budget.types import (
    BudgetDecision,
    BudgetName,
    BudgetTick,
    LimitChanged,
    Outcome,
    PermitEnded,
    PermitGranted,
    PermitId,
    PermitQueued,
    PermitRefused,
    PermitRequest,
    PermitWithdrawn,
    Settle,
    SettleRefused,
    Usage,
    Withdraw,
)
from scheduler.core.types import QoS, TenantName
from scheduler.policy.model import Policy
from scheduler.policy.validate import policy_from_dict

G, B, E = QoS.GUARANTEED, QoS.BURSTABLE, QoS.BEST_EFFORT
BUDGET = "llm"


def policy(
    budget: dict[str, Any] | None = None, tenants: list[dict[str, Any]] | None = None, **spec: Any
) -> Policy:
    """One budget `llm` (6,000 tokens and 6,000 requests a minute: 100 a second each, so tokens
    are what binds) and tenants: g (Guaranteed 10%), b and c (Burstable nominal 20%, limit 60%),
    e (BestEffort only), z (no share of it)."""
    b = {"name": BUDGET, "tokensPerMinute": 6000, "requestsPerMinute": 6000, **(budget or {})}
    share_b = {"budget": BUDGET, "burstable": {"nominal": {"percent": 20}, "limit": {"percent": 60}}}
    default_tenants = [
        {"name": "g", "budgets": [{"budget": BUDGET, "guaranteed": {"percent": 10}}]},
        {"name": "b", "budgets": [share_b]},
        {"name": "c", "budgets": [share_b]},
        {"name": "e", "budgets": [{"budget": BUDGET}]},
        {"name": "z"},
    ]
    doc = {
        "apiVersion": "slotsched.dev/v1alpha1",
        "kind": "SchedulingPolicy",
        "spec": {"budgets": [b], "tenants": tenants if tenants is not None else default_tenants, **spec},
    }
    return policy_from_dict(doc)[0]


def summary(d: BudgetDecision) -> tuple[Any, ...]:
    if isinstance(d, PermitGranted):
        return ("granted", d.permit)
    if isinstance(d, PermitQueued):
        return ("queued", d.permit, d.reason.value, d.position)
    if isinstance(d, PermitRefused):
        return ("refused", d.permit, d.reason.value, d.field)
    if isinstance(d, PermitEnded):
        return ("ended", d.permit, d.reason.value)
    if isinstance(d, SettleRefused):
        return ("settle_refused", d.permit, d.reason.value)
    if isinstance(d, PermitWithdrawn):
        return ("withdrawn", d.permit)
    if isinstance(d, LimitChanged):
        return ("limit", d.reason.value, round(d.factor, 4))
    raise AssertionError(d)


def event(step: tuple[Any, ...]) -> Any:
    """("req", t, id, tenant, qos, input, output) | ("settle", t, id, input, output[, retry_after,
    owner]) | ("withdraw", t, id[, owner]) | ("tick", t)."""
    kind = step[0]
    if kind == "req":
        _, _, pid, tenant, qos, inp, out = step
        return PermitRequest(
            PermitId(pid), "s-" + pid, TenantName(tenant), BudgetName(BUDGET), qos, Usage(inp, out)
        )
    if kind == "settle":
        pid, inp, out = step[2], step[3], step[4]
        retry = step[5] if len(step) > 5 else None
        owner = step[6] if len(step) > 6 else "s-" + pid
        return Settle(PermitId(pid), owner, Usage(inp, out), retry)
    if kind == "withdraw":
        pid = step[2]
        return Withdraw(PermitId(pid), step[3] if len(step) > 3 else "s-" + pid)
    if kind == "tick":
        return BudgetTick()
    raise AssertionError(step)


def run(core: Budgets, steps: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], list[Outcome]]:
    """Every step's decisions, summarized, in order; and the outcomes. Every wake-up asked for is
    after the step that asked (the shell must never be told to tick at once, in a loop)."""
    seen: list[tuple[Any, ...]] = []
    outcomes = []
    for step in steps:
        now = float(step[1])
        o = core.handle(event(step), now)
        assert o.wake_at is None or o.wake_at > now, (step, o.wake_at)
        seen.extend(summary(d) for d in o.decisions)
        outcomes.append(o)
    return seen, outcomes
