"""A tiny script language for driving the core in tests: steps in, readable summaries out.

Steps are tuples: ("add", worker, slots), ("acquire", session, tenant, class[, snapshot uri]),
("release", session), ("withdraw", session), ("renew", session), ("yield", session[, uri]),
("stale", session) (a release quoting the previous epoch), ("drain", worker[, within_s]),
("remove", worker), ("tick",). Each step may be prefixed by a time: (t, step...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.core.engine import Core
from scheduler.core.types import (
    Acquire,
    Decision,
    Ended,
    Event,
    Expired,
    Granted,
    LeaseId,
    QoS,
    Queued,
    Refused,
    Rejected,
    Release,
    Renew,
    Renewed,
    Resumed,
    Revoked,
    SessionId,
    SnapshotRef,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerDraining,
    WorkerId,
    WorkerRemoved,
    Yield,
    YieldCancelled,
    YieldRequested,
)
from scheduler.policy.model import Policy, PoolSpec, TenantSpec, TimingSpec

CLASS = {"g": QoS.GUARANTEED, "b": QoS.BURSTABLE, "be": QoS.BEST_EFFORT}


def policy(
    *tenants: TenantSpec,
    floor: int = 0,
    grace: float = 10,
    ttl: float = 30,
    min_runtime: float = 30,
    max_pending: int = 10000,
    per_tenant: int = 1000,
) -> Policy:
    from scheduler.policy.model import QueueSpec

    return Policy(
        pool=PoolSpec(floor=floor),
        timing=TimingSpec(yield_grace_s=grace, lease_ttl_s=ttl, min_runtime_s=min_runtime),
        queue=QueueSpec(max_pending=max_pending, max_pending_per_tenant=per_tenant),
        tenants=tenants,
    )


def tenant(
    name: str, weight: float = 1, g: int = 0, nominal: int = 0, limit: int = 0, be: int | None = None
) -> TenantSpec:
    return TenantSpec(
        name,
        weight=weight,
        guaranteed=g,
        burstable_nominal=nominal,
        burstable_limit=limit,
        best_effort_limit=be,
    )


def summary(d: Decision) -> str:
    if isinstance(d, Granted):
        return f"granted {d.lease.session} {d.lease.slot}"
    if isinstance(d, Queued):
        return f"queued {d.session}"
    if isinstance(d, YieldRequested):
        return f"yield {d.lease.session} {d.cause.value}"
    if isinstance(d, YieldCancelled):
        return f"cancelled {d.lease.session}"
    if isinstance(d, Revoked):
        return f"revoked {d.lease.session} {d.reason.value}"
    if isinstance(d, Expired):
        return f"expired {d.lease.session}"
    if isinstance(d, Ended):
        return f"ended {d.session} {d.reason.value}"
    if isinstance(d, Renewed):
        return f"renewed {d.lease.session}"
    if isinstance(d, Refused):
        return f"refused {d.session} {d.reason.value}"
    if isinstance(d, Rejected):
        return f"rejected {d.session} {d.code.value}"
    raise AssertionError(d)


class Driver:
    def __init__(self, pol: Policy) -> None:
        self.core = Core(pol)
        self.now = 0.0
        self.log: list[tuple[float, Event]] = []
        self.previous: dict[str, tuple[LeaseId, int]] = {}

    def event(self, step: Sequence[Any]) -> Event:
        kind, *rest = step
        if kind == "add":
            return WorkerAdded(WorkerId(rest[0]), rest[1])
        if kind == "acquire":
            snap = SnapshotRef(rest[3]) if len(rest) > 3 else None
            return Acquire(SessionId(rest[0]), TenantName(rest[1]), CLASS[rest[2]], snap)
        if kind == "withdraw":
            return Release(SessionId(rest[0]))
        if kind == "tick":
            return Tick()
        if kind == "resumed":  # a new leader took over; the outage began at rest[0]
            return Resumed(rest[0])
        if kind == "drain":
            return WorkerDraining(WorkerId(rest[0]), rest[1] if len(rest) > 1 else None)
        if kind == "remove":
            return WorkerRemoved(WorkerId(rest[0]))
        s = SessionId(rest[0])
        if kind == "bogus":
            return Release(s, LeaseId("nope#1"), 1)
        if kind == "steal":  # quote another session's lease
            view = self.core.session(SessionId(rest[1]))
            assert view is not None and view.lease is not None
            return Release(s, view.lease.lease_id, view.lease.epoch)
        if kind == "stale":
            lid, epoch = self.previous[s]
            return Release(s, lid, epoch)
        view = self.core.session(s)
        assert view is not None and view.lease is not None, f"{s} holds no lease"
        lid, epoch = view.lease.lease_id, view.lease.epoch
        if kind == "release":
            return Release(s, lid, epoch)
        if kind == "renew":
            return Renew(s, lid, epoch)
        if kind == "yield":
            return Yield(s, lid, epoch, SnapshotRef(rest[1]) if len(rest) > 1 else None)
        raise AssertionError(step)

    def step(self, step: Sequence[Any]) -> list[Decision]:
        if isinstance(step[0], int | float):
            self.now = float(step[0])
            step = step[1:]
        ev = self.event(step)
        self.log.append((self.now, ev))
        out = self.core.handle(ev, self.now)
        for d in out:
            if isinstance(d, Granted):
                self.previous[d.lease.session] = (d.lease.lease_id, d.lease.epoch)
        return out

    def run(self, steps: Sequence[Sequence[Any]]) -> list[str]:
        """Run every step; return the summaries of the last step's decisions."""
        out: list[Decision] = []
        for st in steps:
            out = self.step(st)
        return [summary(d) for d in out]
