"""Baselines with no notion of pools, run per pool: one instance per pool, results merged.

Why: FIFO, strict priority and the others schedule one homogeneous pool. With a policy of several
pools each runs as many times: one instance per pool under `Policy.for_pool(name)`, its workers
the pool's (`WorkerAdded.pool`), each session sent to the pool it asked for first (its `pool`, or
the policy's only or `default` pool: a baseline tries no fallback), its later calls to that same
instance. The simulator reads the merged views (`describe_all`) and leases, as it reads `Pools`.
With one pool it is that pool's baseline, exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from scheduler.core.lifecycle import LeaseState
from scheduler.core.placement import default_pool
from scheduler.core.types import (
    Acquire,
    Decision,
    Event,
    Lease,
    Refused,
    RefuseReason,
    SessionId,
    WorkerAdded,
    WorkerId,
)
from scheduler.core.views import PoolView
from scheduler.policy.model import Policy
from scheduler.sim.decider import Decider


class PerPool:
    """A Decider of one baseline instance per pool of the policy."""

    def __init__(self, make: Callable[[Policy], Decider], policy: Policy) -> None:
        self.policy = policy
        self.cores: dict[str, Decider] = {name: make(policy.for_pool(name)) for name in policy.pool_names()}
        self._first = default_pool(policy) or next(iter(self.cores))
        self._session: dict[SessionId, str] = {}
        self._worker: dict[WorkerId, str] = {}

    def _route(self, event: Event) -> str | Refused:
        if isinstance(event, Acquire):
            name = event.pool or self._first
            if name not in self.cores:
                return Refused(event.session, RefuseReason.UNKNOWN_POOL, f"unknown pool {name!r}", pool=name)
            self._session.setdefault(event.session, name)
            return self._session[event.session]
        if isinstance(event, WorkerAdded):
            name = event.pool or self._first
            self._worker.setdefault(event.worker, name)
            return name
        worker = getattr(event, "worker", None)
        if worker is not None:
            return self._worker.get(worker, self._first)
        session = getattr(event, "session", None)
        return self._session.get(session, self._first) if session is not None else ""

    def handle(self, event: Event, now: float) -> list[Decision]:
        name = self._route(event)
        if isinstance(name, Refused):
            return [name]
        if name:
            return self.cores[name].handle(event, now)
        out: list[Decision] = []  # a tick, a resume: every pool
        for core in self.cores.values():
            out += core.handle(event, now)
        return out

    def next_deadline(self) -> float | None:
        due = [d for c in self.cores.values() if (d := c.next_deadline()) is not None]
        return min(due, default=None)

    def describe(self, pool: str | None = None) -> PoolView:
        return self.cores[pool or self._first].describe()

    def describe_all(self) -> dict[str, PoolView]:
        return {name: core.describe() for name, core in self.cores.items()}

    def leases(self) -> Iterator[tuple[Lease, LeaseState]]:
        for core in self.cores.values():
            yield from core.leases()


def per_pool(make: Callable[[Policy], Decider]) -> Callable[[Policy], Decider]:
    """`make` one instance per pool; with one pool, `make` itself (exactly today's baseline)."""

    def build(policy: Policy) -> Decider:
        return make(policy) if len(policy.pool_names()) == 1 else PerPool(make, policy)

    return build
