"""Which pool an Acquire goes to: the candidates it names, then the first with room for it.

Placement is never silent: a session goes only to a pool it named (`pool`, then `fallback` in
order) or that its `selector` matches (in the policy's order), and a session resuming from a
snapshot only to a pool whose labels match the snapshot's compatibility labels. Of those
candidates, the pools where the tenant has no quota for the class are left out; the request is
granted in the first with a slot free for it, otherwise it queues in the first and stays there
(docs/design.md, "Pools"). Pure: the caller says which pools have room.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.core.types import Acquire, QoS, Refused, RefuseReason, SnapshotRef
from scheduler.policy.model import DEFAULT_POOL, Policy, PoolSpec, TenantSpec


@dataclass(frozen=True)
class Catalog:
    """A policy's pools, indexed once per policy (an Acquire must not cost a scan of them)."""

    policy: Policy
    names: tuple[str, ...]
    specs: dict[str, PoolSpec]
    default: str | None

    @classmethod
    def of(cls, policy: Policy) -> Catalog:
        specs = {p.name: p for p in policy.pool_specs()}
        return cls(policy, tuple(specs), specs, default_pool(policy))


def selector_text(selector: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector)


def _names(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(repr(n) for n in names)


def default_pool(policy: Policy) -> str | None:
    """The pool a request or a worker naming none goes to: the only pool, or `default`."""
    names = policy.pool_names()
    if len(names) == 1:
        return names[0]
    return DEFAULT_POOL if DEFAULT_POOL in names else None


def compatible(spec: PoolSpec, labels: tuple[tuple[str, str], ...]) -> bool:
    return all(spec.label(k) == v for k, v in labels)


def snapshot_labels(policy: Policy, ref: SnapshotRef) -> tuple[tuple[str, str], ...]:
    """The labels a snapshot needs: those it recorded, else those of the pool it names now."""
    if ref.labels:
        return ref.labels
    spec = policy.pool_spec(ref.pool) if ref.pool else None
    return spec.compat_labels() if spec is not None else ()


def _allowed(tenant: TenantSpec, pool: str, qos: QoS) -> bool:
    t = tenant.in_pool(pool)
    quota = {
        QoS.GUARANTEED: t.guaranteed,
        QoS.BURSTABLE: t.burstable_limit,
        QoS.BEST_EFFORT: t.best_effort_limit,
    }[qos]
    return quota is None or quota > 0


def candidates(policy: Policy | Catalog, ev: Acquire) -> list[str] | Refused:
    """The pools `ev` may go to, in the order tried; a Refused naming what is wrong if none."""
    cat = policy if isinstance(policy, Catalog) else Catalog.of(policy)
    policy = cat.policy
    s = ev.session
    known = cat.names
    if ev.pool:
        if ev.pool not in cat.specs:
            msg = f"unknown pool {ev.pool!r}; the policy's pools are {_names(known)}"
            return Refused(s, RefuseReason.UNKNOWN_POOL, msg, pool=ev.pool, field="pool")
        cands = [ev.pool]
    elif ev.selector:
        cands = [name for name, spec in cat.specs.items() if spec.matches(ev.selector)]
        if not cands and not ev.fallback:
            msg = f"no pool matches selector {selector_text(ev.selector)!r}"
            return Refused(s, RefuseReason.NO_ELIGIBLE_POOL, msg)
    else:
        first = cat.default
        if first is None:
            msg = f"the policy has pools {_names(known)}, none named {DEFAULT_POOL!r}: name one or a selector"
            return Refused(s, RefuseReason.NO_POOL_NAMED, msg)
        cands = [first]
    for name in ev.fallback:
        if name not in cat.specs:
            msg = f"unknown fallback pool {name!r}; the policy's pools are {_names(known)}"
            return Refused(s, RefuseReason.UNKNOWN_POOL, msg, pool=name, field="fallback_pools")
        if name not in cands:
            cands.append(name)
    if ev.resume_from is not None:
        need = snapshot_labels(policy, ev.resume_from)
        if need:
            fit = [p for p in cands if compatible(cat.specs[p], need)]
            if not fit:
                msg = (
                    f"snapshot taken on pool {ev.resume_from.pool!r} needs {selector_text(need)!r}, "
                    f"which none of {_names(cands)} has"
                )
                return Refused(s, RefuseReason.NO_ELIGIBLE_POOL, msg)
            cands = fit
    if len(cands) > 1:
        tenant = policy.tenant(ev.tenant)
        if tenant is not None:  # an unknown tenant is the first pool's core's to refuse
            usable = [p for p in cands if _allowed(tenant, p, ev.qos)]
            if not usable:
                msg = f"tenant {ev.tenant!r} has no {ev.qos.value} quota in pools {_names(cands)}"
                return Refused(s, RefuseReason.NO_QUOTA, msg, pool=cands[0])
            cands = usable
    return cands


def place(policy: Policy | Catalog, ev: Acquire, room: Callable[[str], bool]) -> str | Refused:
    """The pool `ev` goes to: the first candidate `room` says has a slot free for it, else the
    first candidate (where it queues)."""
    cands = candidates(policy, ev)
    if isinstance(cands, Refused) or len(cands) == 1:
        return cands if isinstance(cands, Refused) else cands[0]
    for name in cands:
        if room(name):
            return name
    return cands[0]
