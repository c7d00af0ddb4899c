"""Where the autoscaler loop reads demand and changes membership: the policy core, via two seams.

Why seams: the server's core lives on its asyncio loop and its membership goes through the
worker registry (which keeps its own bookkeeping); the simulator's core runs in virtual time; a
test drives a bare `Core`. The loop sees only `DemandSource.read(now) -> ScaleInput` and
`Membership.drain/deregister`, and these adapters map the core's `PoolView` and events onto them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from scheduler.core.tenants import CLASSES
from scheduler.core.types import (
    Decision,
    ErrorCode,
    Event,
    Rejected,
    WorkerDraining,
    WorkerId,
    WorkerRemoved,
)
from scheduler.core.views import PoolView
from scheduler.policy.model import Policy
from slots.autoscaler.decision import ScaleConfig, ScaleInput, ScaleWorker, ScaleWorkerState, weighted_demand

CLASS_KEYS: tuple[str, str, str] = (CLASSES[0].value, CLASSES[1].value, CLASSES[2].value)
_IN_POOL = {s.value: s for s in ScaleWorkerState}  # ready, draining; a removed worker is not in the pool


class DemandSource(Protocol):
    def read(self, now: float) -> ScaleInput:
        """Everything `decide` needs, as of `now`."""
        ...


class Membership(Protocol):
    """Changes to pool membership. The server's `WorkerRegistry` has exactly these methods."""

    def drain(self, worker_id: WorkerId, yield_within_s: float | None) -> object:
        """No new grants on this worker; its leases are asked to yield within the deadline."""
        ...

    def deregister(self, worker_id: WorkerId) -> object:
        """The worker is gone; leases still on it are revoked and their sessions re-queued."""
        ...


def scale_input_from_pool(
    view: PoolView,
    slots_per_worker: int,
    now: float,
    ready_since: Mapping[str, float] | None = None,
) -> ScaleInput:
    """The decision's input from the core's view. `ready_since` (first time each worker was seen)
    orders drains newest-first; a worker missing from it counts as new (`now`)."""
    since = ready_since or {}
    workers = tuple(
        ScaleWorker(
            w.worker_id, _IN_POOL[w.state.value], w.busy, w.lease_seconds, since.get(w.worker_id, now)
        )
        for w in view.workers
        if w.state.value in _IN_POOL
    )
    return ScaleInput(
        now=now,
        workers=workers,
        slots_per_worker=slots_per_worker,
        busy_by_class=dict(zip(CLASS_KEYS, view.held, strict=True)),
        pending_by_class=dict(zip(CLASS_KEYS, view.pending, strict=True)),
        oldest_wait_by_class=dict(zip(CLASS_KEYS, view.oldest_wait_s, strict=True)),
        floor_slots=view.floor,
        mean_hold_s=view.mean_hold_s,
        budgets=view.budgets,
        claimed_pending=claimed_pending(view),
    )


def claimed_pending(view: PoolView) -> int:
    """Queued sessions with a quota claim, which the budget cap never withholds a worker from: per
    tenant, its Guaranteed waiters up to what its `guaranteed` leaves free, its Burstable ones up
    to its `nominal` (the slot core's tiers 1 and 2, served by preemption when no slot is free)."""
    return sum(
        min(t.pending[0], max(0, t.guaranteed - t.held[0]))
        + min(t.pending[1], max(0, t.burstable_nominal - t.held[1]))
        for t in view.tenants
    )


def weighted_demand_of_pool(view: PoolView, policy: Policy) -> float:
    """Weighted demand in slots, the number the KEDA external scaler reports."""
    inp = scale_input_from_pool(view, policy.pool.slots_per_worker, 0.0)
    return weighted_demand(inp, ScaleConfig.from_policy(policy))


@dataclass(frozen=True)
class Vitals:
    """What a worker reports of itself with its heartbeat: resident memory, process start."""

    rss_bytes: int = 0
    started_at: float | None = None


class CoreDemand:
    """A DemandSource over `describe()` of a core; remembers when it first saw each worker.
    `vitals` (worker id -> Vitals, from the heartbeats) feeds recycling; None: nothing reported."""

    def __init__(
        self,
        describe: Callable[[], PoolView],
        policy: Callable[[], Policy],
        vitals: Callable[[], Mapping[str, Vitals]] | None = None,
    ) -> None:
        self._describe = describe
        self._policy = policy
        self._vitals = vitals
        self._first_seen: dict[str, float] = {}

    def read(self, now: float) -> ScaleInput:
        view = self._describe()
        seen: dict[str, float] = {w.worker_id: self._first_seen.get(w.worker_id, now) for w in view.workers}
        self._first_seen = seen  # forget workers that left
        inp = scale_input_from_pool(view, self._policy().pool.slots_per_worker, now, seen)
        if self._vitals is None:
            return inp
        vitals = self._vitals()
        workers = tuple(
            replace(w, rss_bytes=v.rss_bytes, started_at=v.started_at)
            if (v := vitals.get(w.worker_id)) is not None
            else w
            for w in inp.workers
        )
        return replace(inp, workers=workers)


class MembershipError(RuntimeError):
    pass


class CoreMembership:
    """Membership as core events through `submit` (a bare Core, the simulator, a test)."""

    def __init__(self, submit: Callable[[Event], Sequence[Decision]]) -> None:
        self._submit = submit

    def drain(self, worker_id: WorkerId, yield_within_s: float | None) -> list[Decision]:
        return self._checked(WorkerDraining(worker_id, yield_within_s), allow_missing=False)

    def deregister(self, worker_id: WorkerId) -> list[Decision]:
        return self._checked(WorkerRemoved(worker_id), allow_missing=True)

    def _checked(self, event: Event, allow_missing: bool) -> list[Decision]:
        decisions = list(self._submit(event))
        for d in decisions:
            if isinstance(d, Rejected) and d.session is None:
                if allow_missing and d.code is ErrorCode.NOT_FOUND:
                    continue  # already gone: what deregister wanted
                raise MembershipError(d.message)
        return decisions
