"""A tenant's share of one budget, resolved from the policy into rates per dimension, with the
buckets that enforce it (docs/design.md, "Token budgets"):

* `leaf`: its Guaranteed reserved rate, a bucket of its own refilled at that rate; a full leaf's
  refill overflows to the budget's shared bucket (lent), which a waiting owner's never is (it
  waits because its leaf lacks its estimate);
* `nominal`: a meter at its Burstable nominal rate: a Burstable permit it covers is served in the
  tier "within nominal", ahead of those beyond;
* `ceilings`: per class, a meter at the class `limit` rate (Guaranteed's is its leaf): a permit
  never borrows past it;
* the meters start full (they count a tenant's own rate, not the provider's tokens: the leaves
  and the shared bucket, which start empty, keep the provider's window);
* its fair-share usage: the tokens it borrowed in the shared tier (beyond its nominal, or
  BestEffort), decayed with the policy's usage half-life (spec.fairness), and the tokens of its
  open permits of that tier.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduler.core.budget.buckets import Bucket
from scheduler.core.budget.types import Vec
from scheduler.core.types import QoS, TenantName
from scheduler.policy.model import BudgetRate, BudgetSpec, TenantSpec

if TYPE_CHECKING:
    from scheduler.core.budget.book import Permit

G, B, BE = 0, 1, 2
CLASS_OF: dict[QoS, int] = {QoS.GUARANTEED: G, QoS.BURSTABLE: B, QoS.BEST_EFFORT: BE}
CLASSES: tuple[QoS, QoS, QoS] = (QoS.GUARANTEED, QoS.BURSTABLE, QoS.BEST_EFFORT)


def limits_vec(spec: BudgetSpec) -> Vec:
    """The configured limit per minute (0 where the budget has none: `on` leaves it out)."""
    a, b, c, d = (float(v) if v is not None else 0.0 for v in spec.limits())
    return (a, b, c, d)


def dims_on(spec: BudgetSpec) -> tuple[int, ...]:
    return tuple(d for d, v in enumerate(spec.limits()) if v is not None)


def _resolve(rate: BudgetRate, spec: BudgetSpec, absent: Vec) -> Vec:
    r = rate.resolve(spec)
    a, b, c, d = (absent[i] if r[i] is None else float(r[i] or 0.0) for i in range(4))
    return (a, b, c, d)


@dataclass(slots=True, eq=False)
class Share:
    tenant: TenantName
    weight: float
    # Per minute, per class: the rate a permit of the class may draw at most (None: no share in
    # that class); Guaranteed's is also its reserved rate.
    limit: list[Vec | None]
    nominal_rate: Vec | None
    leaf: Bucket | None
    nominal: Bucket | None
    ceilings: list[Bucket | None]
    queues: list[deque[Permit]] = field(default_factory=lambda: [deque(), deque(), deque()])
    waiting: int = 0
    usage: float = 0.0  # borrowed tokens, decayed to `usage_at`
    usage_at: float = 0.0
    in_flight: float = 0.0  # borrowed tokens of its open permits

    def allowed(self, cls: int, on: tuple[int, ...]) -> bool:
        lim = self.limit[cls]
        if lim is None:
            return False
        for d in on:  # noqa: SIM110 - a loop, not all(...): the generator costs more (hot path)
            if not lim[d] > 0:
                return False
        return True

    def bucket(self, cls: int) -> Bucket | None:
        """What a permit of the class draws its own rate from: the leaf, or its class ceiling."""
        return self.leaf if cls == G else self.ceilings[cls]

    def share(self, now: float, half_life: float) -> float:
        """Its weighted share: recent borrowed tokens (or, without a half-life, those it holds
        now) per unit of weight."""
        if half_life <= 0:
            return self.in_flight / self.weight
        return self.decayed(now, half_life) / self.weight

    def decayed(self, now: float, half_life: float) -> float:
        if half_life <= 0:
            return 0.0
        if now > self.usage_at:
            self.usage *= math.pow(2.0, -(now - self.usage_at) / half_life)
            self.usage_at = now
        return self.usage


def make_share(t: TenantSpec, spec: BudgetSpec, now: float) -> Share | None:
    """The tenant's share of `spec` as rates and empty buckets, or None: it names no share."""
    q = t.budget(spec.name)
    if q is None:
        return None
    on = dims_on(spec)
    full = limits_vec(spec)
    zero: Vec = (0.0, 0.0, 0.0, 0.0)
    reserved = None if q.reserved is None else _resolve(q.reserved, spec, zero)
    nominal = None if q.burstable_nominal is None else _resolve(q.burstable_nominal, spec, zero)
    b_limit = None
    if q.burstable_limit is not None:
        b_limit = _resolve(q.burstable_limit, spec, full)
    elif nominal is not None:
        b_limit = nominal  # as slots: an absent limit is the nominal (no bursting)
    be_limit = full if q.best_effort_limit is None else _resolve(q.best_effort_limit, spec, full)
    leaf = None
    if reserved is not None and any(reserved[d] > 0 for d in on):
        leaf = Bucket.per_minute(on, reserved, now)
    nominal_meter = None
    if nominal is not None and all(nominal[d] > 0 for d in on):
        nominal_meter = Bucket.per_minute(on, nominal, now, full=True)
    ceilings: list[Bucket | None] = [None, None, None]
    if b_limit is not None:
        ceilings[B] = Bucket.per_minute(on, b_limit, now, full=True)
    if q.best_effort_limit is not None:
        ceilings[BE] = Bucket.per_minute(on, be_limit, now, full=True)  # uncapped: the budget bounds it
    return Share(
        tenant=TenantName(t.name),
        weight=q.weight if q.weight is not None else t.weight,
        limit=[reserved, b_limit, be_limit],
        nominal_rate=nominal,
        leaf=leaf,
        nominal=nominal_meter,
        ceilings=ceilings,
        usage_at=now,
    )


def carry(old: Share, new: Share) -> None:
    """A policy change: the new share keeps what the old one had spent and borrowed (clamped to
    its new caps), so that changing a policy never mints tokens."""

    def keep(o: Bucket | None, n: Bucket | None) -> None:
        if o is not None and n is not None:
            n.last = o.last
            n.tokens = [min(t, c) for t, c in zip(o.tokens, n.cap, strict=True)]

    keep(old.leaf, new.leaf)
    keep(old.nominal, new.nominal)
    for cls in (B, BE):
        keep(old.ceilings[cls], new.ceilings[cls])
    new.usage, new.usage_at, new.in_flight = old.usage, old.usage_at, old.in_flight
