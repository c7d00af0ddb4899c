"""What a budget run needs to know of a budget: its configured limits, the provider's real ones,
each tenant's share (for the gateway's priority reservation and for fair-share attainment).

Vectors are per minute in the budget core's order: requests, input tokens, output tokens, total
tokens (0: that dimension is not limited).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.core.budget.shares import limits_vec, make_share
from scheduler.policy.model import Policy

Vec = tuple[float, float, float, float]
REQUESTS, INPUT, OUTPUT, TOKENS = 0, 1, 2, 3
CLASS_KEYS = ("guaranteed", "burstable", "besteffort")


@dataclass(frozen=True)
class TenantShare:
    """A tenant's share of the budget in input tokens per minute (the dimension that binds for
    agent calls, whose context is resent with every call): Guaranteed reserved rate, Burstable
    nominal and limit, BestEffort limit (None: up to the budget), its weight."""

    weight: float = 1.0
    reserved: float = 0.0
    nominal: float = 0.0
    burstable_limit: float = 0.0
    best_effort_limit: float | None = None
    reserved_vec: Vec = (0.0, 0.0, 0.0, 0.0)  # the reserved rate in every dimension, per minute


@dataclass(frozen=True)
class BudgetSetup:
    name: str
    limits: Vec  # configured, per minute
    # The provider's real limit over the configured one (a key shared with others, a wrong tier):
    # below 1, the configured limit overruns the provider and only its 429s say so.
    real_fraction: float = 1.0
    shares: Mapping[str, TenantShare] = field(default_factory=dict)
    # A call's output estimate: its max tokens (the output it may not pass), or its real output if
    # larger (a call's max tokens is at least what it produced).
    max_tokens: int = 4096
    # The provider states its limit in its response headers and the limiters that read them
    # (slotsched's settle) learn it from there; False: it does not, only its 429s say it.
    headers: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.real_fraction <= 10:
            raise ValueError(f"real_fraction must be in (0, 10], not {self.real_fraction}")
        if not any(x > 0 for x in self.limits):
            raise ValueError(f"budget {self.name}: no limit in any dimension")

    @property
    def real_limits(self) -> Vec:
        f = self.real_fraction
        r, i, o, t = self.limits
        return (r * f, i * f, o * f, t * f)

    @property
    def dim(self) -> int:
        """The token dimension shares and figures are counted in: input tokens where the budget
        limits them, else total tokens."""
        return INPUT if self.limits[INPUT] > 0 else TOKENS

    def class_fractions(self) -> dict[str, float]:
        """The share of the budget's input limit each class reserves (the gateway's priority
        reservation): Guaranteed the tenants' reserved rates, Burstable their nominals, BestEffort
        the rest (never below 0)."""
        limit = self.limits[self.dim] or 1.0
        g = sum(s.reserved for s in self.shares.values()) / limit
        b = sum(s.nominal for s in self.shares.values()) / limit
        g, b = min(1.0, g), min(max(0.0, 1.0 - g), b)
        return {"guaranteed": g, "burstable": b, "besteffort": max(0.0, 1.0 - g - b)}


def setup_of(
    policy: Policy,
    budget: str | None = None,
    real_fraction: float = 1.0,
    max_tokens: int = 4096,
    headers: bool = True,
) -> BudgetSetup:
    """The setup of one of the policy's budgets (default: its first), each tenant's share resolved
    into rates as the budget core resolves them (`scheduler/core/budget/shares.py`)."""
    if not policy.budgets:
        raise ValueError("the policy has no spec.budgets: a budget run needs one")
    spec = policy.budget(budget) if budget else policy.budgets[0]
    if spec is None:
        raise ValueError(
            f"the policy has no budget {budget!r}; its budgets: {', '.join(b.name for b in policy.budgets)}"
        )
    limits = limits_vec(spec)
    dim = INPUT if limits[INPUT] > 0 else TOKENS
    shares: dict[str, TenantShare] = {}
    for t in policy.tenants:
        s = make_share(t, spec, 0.0)
        if s is None:
            continue
        g, b, be = s.limit
        shares[t.name] = TenantShare(
            weight=s.weight,
            reserved=g[dim] if g is not None else 0.0,
            nominal=s.nominal_rate[dim] if s.nominal_rate is not None else 0.0,
            burstable_limit=b[dim] if b is not None else 0.0,
            best_effort_limit=None if be is None or be[dim] >= limits[dim] else be[dim],
            reserved_vec=g if g is not None else (0.0, 0.0, 0.0, 0.0),
        )
    return BudgetSetup(spec.name, limits, real_fraction, shares, max_tokens, headers)
