"""Fair-share attainment per tenant and class: did each tenant get its share while it wanted more?

Why: a pooled percentile is the heaviest tenant's tail, and Jain's index rewards equal slots
whatever each tenant asked for. What a platform promises a tenant is its weighted max-min fair
share of the pool while it has work waiting; this measures that promise, per tenant and class.

At each sample (evenly spaced, so a count of samples is time) every tenant's demand is what it
holds plus what waits (queued, or in a client's retry loop), by class, capped by its quotas (work
beyond a limit is not a claim on the pool). Its **entitlement** is the policy's contract applied
to everyone's demand at that sample (`entitlements`):

1. Guaranteed demand within quota, then Burstable demand within nominal: what a tenant can count
   on (if these alone exceed the capacity, they are shared by weighted max-min among themselves);
2. the remainder of the capacity is split by weighted max-min fairness (water-filling,
   `water_fill`) over what each tenant wants beyond that (Burstable beyond nominal within its
   limit, BestEffort within its limit), and within a tenant it goes to its Burstable work before
   its BestEffort work (the order a tenant's own classes are served in).

A tenant is **backlogged** in a class at a sample when it has work of that class in the system,
held or waiting (as a flow is backlogged in generalized processor sharing while it has work queued
or in service; counting only the samples where something waits would count a one-session tenant
only while it holds nothing, whatever its wait). Its
attainment in a class is the slots it held in that class summed over the samples where it was
backlogged in that class, over its entitlement in that class summed over the same samples (`all`:
over every class, at the samples where it had any work). 1 is exactly its share; below 1 it
got less while it waited; above 1 more (a heavy tenant served beyond its share). None when the
entitlement over those samples is zero (never backlogged, or all its claim went to other classes).
`attainment_min` is the lowest `all` over tenants: the tenant worst served against its share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.policy.model import Policy

CLASS_KEYS = ("guaranteed", "burstable", "besteffort")
ALL = "all"

# Per class (G, B, BE): held slots, and requests waiting.
Triple = tuple[int, int, int]


@dataclass(frozen=True)
class Quotas:
    """What the entitlement reads of a tenant's spec."""

    weight: float
    guaranteed: int
    nominal: int
    burstable_limit: int
    best_effort_limit: int | None


@dataclass(frozen=True)
class Point:
    """One sample: the capacity, and per tenant its (held, waiting) by class."""

    capacity: int
    tenants: Mapping[str, tuple[Triple, Triple]]


def quotas_of(policy: Policy) -> dict[str, Quotas]:
    return {
        t.name: Quotas(t.weight, t.guaranteed, t.burstable_nominal, t.burstable_limit, t.best_effort_limit)
        for t in policy.tenants
    }


def water_fill(
    capacity: float, demands: Mapping[str, float], weights: Mapping[str, float]
) -> dict[str, float]:
    """Weighted max-min fair allocation of `capacity` over `demands`: each gets
    `min(demand, level * weight)`, the level the highest at which the total fits (everyone's demand
    if it all fits). Tenants are filled in order of `demand / weight`, so it is exact (no search)."""
    out = {name: 0.0 for name in demands}
    left = max(0.0, capacity)
    order = sorted((d / weights[n], n) for n, d in demands.items() if d > 0)
    weight_left = sum(weights[n] for _, n in order)
    for i, (level, name) in enumerate(order):
        if left <= 0 or weight_left <= 0:
            break
        fill = left / weight_left  # the level if everyone left took the same per weight
        if level <= fill:
            out[name] = demands[name]
        else:
            # No one left fits: every remaining tenant gets the common level.
            for _, rest in order[i:]:
                out[rest] = fill * weights[rest]
            return out
        left -= out[name]
        weight_left -= weights[name]
    return out


def entitlements(point: Point, quotas: Mapping[str, Quotas]) -> dict[str, tuple[float, float, float]]:
    """Each tenant's fair entitlement by class at one sample (the rules in the module docstring)."""
    demand: dict[str, tuple[float, float, float]] = {}
    for name, (held, waiting) in point.tenants.items():
        q = quotas.get(name, Quotas(1.0, 0, 0, 0, None))
        g = min(held[0] + waiting[0], q.guaranteed)
        b = min(held[1] + waiting[1], q.burstable_limit)
        be = held[2] + waiting[2]
        if q.best_effort_limit is not None:
            be = min(be, q.best_effort_limit)
        demand[name] = (float(g), float(b), float(be))
    weights = {n: quotas[n].weight if n in quotas else 1.0 for n in demand}
    nominal = {n: min(d[1], float(quotas[n].nominal if n in quotas else 0)) for n, d in demand.items()}
    cap = float(point.capacity)
    eg = water_fill(cap, {n: d[0] for n, d in demand.items()}, weights)
    cap -= sum(eg.values())
    en = water_fill(cap, nominal, weights)
    cap -= sum(en.values())
    extra = {n: d[1] - nominal[n] + d[2] for n, d in demand.items()}
    ex = water_fill(cap, extra, weights)
    out = {}
    for n, d in demand.items():
        b_extra = min(ex[n], d[1] - nominal[n])
        out[n] = (eg[n], en[n] + b_extra, ex[n] - b_extra)
    return out


@dataclass
class Attainment:
    """Slots held and entitled, summed over the samples where each tenant was backlogged."""

    received: dict[str, dict[str, float]]
    entitled: dict[str, dict[str, float]]

    def ratio(self, tenant: str, cls: str) -> float | None:
        e = self.entitled.get(tenant, {}).get(cls, 0.0)
        return self.received[tenant][cls] / e if e > 1e-9 else None

    def tenant_json(self, tenant: str) -> dict[str, float | None]:
        """`tenants.<t>.attainment`: per class and `all`, rounded; None where nothing was owed."""
        out: dict[str, float | None] = {}
        for cls in (*CLASS_KEYS, ALL):
            r = self.ratio(tenant, cls) if tenant in self.received else None
            out[cls] = None if r is None else round(r, 4)
        return out

    def minimum(self, tenants: Sequence[str] | None = None) -> float | None:
        """The lowest `all` attainment over `tenants` (default: every tenant measured)."""
        names = self.received if tenants is None else tenants
        values = [r for n in names if n in self.received and (r := self.ratio(n, ALL)) is not None]
        return min(values) if values else None


def attainment(points: Sequence[Point], quotas: Mapping[str, Quotas]) -> Attainment:
    received: dict[str, dict[str, float]] = {}
    entitled: dict[str, dict[str, float]] = {}
    for point in points:
        fair = entitlements(point, quotas)
        for name, (held, waiting) in point.tenants.items():
            rec = received.setdefault(name, dict.fromkeys((*CLASS_KEYS, ALL), 0.0))
            ent = entitled.setdefault(name, dict.fromkeys((*CLASS_KEYS, ALL), 0.0))
            e = fair[name]
            for i, cls in enumerate(CLASS_KEYS):
                if held[i] + waiting[i] > 0:
                    rec[cls] += held[i]
                    ent[cls] += e[i]
            if sum(held) + sum(waiting) > 0:
                rec[ALL] += sum(held)
                ent[ALL] += sum(e)
    return Attainment(received, entitled)


__all__ = ["ALL", "Attainment", "Point", "Quotas", "attainment", "entitlements", "quotas_of", "water_fill"]
