"""What every baseline decider shares: the core itself, with its decisions swapped out.

Why: each baseline should read as its documented order of service and victim rule and nothing
else, so a comparison is between policies, not between copies of lease bookkeeping. So a
baseline is a `Core` (engine.py): the core's ledger (grants, lease ids `worker/index#epoch`, an
epoch bumped at every grant and revoke, free slots lowest worker first, the end of a lease),
its timers (TTL expiry of unrenewed leases, yield deadlines), its records (model.py), its checks
of a holder's calls, its drains that ask holders to yield and its views (`describe`, `leases`).
The simulator and `SimStats` treat a baseline exactly as they treat `Core`.

What a baseline replaces, on purpose:
- admission (`_acquire`): every request is taken — tenants, quotas and queue caps are ignored;
  a tenant the policy lacks is accounted under an empty spec;
- the pass (`_schedule`): the subclass's `_pass`, after every event but an idle tick;
- the timers (`_advance`): all that are due fire before the event — yield deadlines, then
  expiries — and the one pass after it hands out what they freed (the core serves each instant
  before the next); nothing matures into a victim, so maturity is no deadline;
- the floor: none is reserved (`describe().floor` is 0); nor are the core's per-tenant queue
  heaps kept (`_Tenant`), which only the core's order of service reads;
- a newcomer's place (`Queued`): last in line, as a baseline's order is not the core's.

A subclass implements `_admit` (a request arrives or comes back) and `_pass` (hand out free
slots, perhaps kill a victim). Waiting requests live in `Lanes`: heaps with lazy deletion,
ordered by a key the subclass chooses.

Kill preemption is expressed with the core's decisions: a victim is asked to yield with a deadline
of *now* (`YieldRequested`, counted as a preemption) and revoked at once (`Revoked`, reason
`yield_deadline`, with the slot-seconds since its grant as work lost) — a yield with zero grace
and no checkpoint, which is what a kill is.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from scheduler.core.engine import Core
from scheduler.core.lifecycle import LeaseState, WorkerState
from scheduler.core.model import LeaseRec, Request
from scheduler.core.tenants import CLASS_INDEX, QueueEntry, TenantState
from scheduler.core.types import (
    Acquire,
    Decision,
    Event,
    Expired,
    Queued,
    RevokeReason,
    SessionId,
    SnapshotRef,
    Tick,
    YieldCause,
    YieldRequested,
)
from scheduler.policy.model import Policy, TenantSpec

K = TypeVar("K", bound=Hashable)


class Lanes(Generic[K]):
    """Heaps of waiting requests by lane (one lane, a class, a tenant…), lazily cleaned: an entry
    is live only while `waiting[session]` is that very request."""

    def __init__(self, waiting: dict[SessionId, Request]) -> None:
        self._waiting = waiting
        self._heaps: dict[K, list[tuple[tuple[float, ...], int, int, Request]]] = defaultdict(list)
        self._pushes = 0  # breaks ties between a request and its stale earlier entries

    def push(self, lane: K, key: tuple[float, ...], req: Request) -> None:
        self._pushes += 1
        heapq.heappush(self._heaps[lane], (key, req.seq, self._pushes, req))

    def head(self, lane: K) -> Request | None:
        heap = self._heaps.get(lane)
        while heap:
            req = heap[0][3]
            if self._waiting.get(req.session) is req:
                return req
            heapq.heappop(heap)
        return None

    def heads(self) -> Iterator[tuple[K, Request]]:
        for lane in list(self._heaps):
            req = self.head(lane)
            if req is not None:
                yield lane, req


class _Tenant(TenantState):
    """A tenant's accounting without the core's queue heaps, which only the core's order of
    service reads (and empties): a baseline orders its waiting requests in its own lanes."""

    __slots__ = ()

    def push_request(self, cls: int, entry: QueueEntry) -> None:
        return


class Baseline(Core):
    """The core's bookkeeping; subclasses decide (see the module docstring)."""

    name = "baseline"

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        for name, t in self._tenants.items():  # in place: the ledger's indexes share the dict
            self._tenants[name] = _Tenant(t.spec)
        self._idle_tick = False  # this event is a tick, and no timer has fired

    # ------------------------------------------------------------------ for subclasses

    def _admit(self, req: Request, now: float, out: list[Decision]) -> None:
        """A request arrives or comes back (after a revoke or a drain-yield): queue it."""
        raise NotImplementedError

    def _pass(self, now: float, out: list[Decision]) -> None:
        """After every event: hand out free slots (and, for some, kill victims)."""
        raise NotImplementedError

    @property
    def waiting(self) -> dict[SessionId, Request]:
        """The waiting requests by session (read it; `wait` and `grant` change it)."""
        return self._requests

    @property
    def free_slots(self) -> int:
        return self._free_ready

    def wait(self, req: Request) -> None:
        """Record `req` as waiting; the subclass pushes it into its lanes."""
        self._enqueue(req)
        self._to_report.append(req)

    def grant(self, req: Request, now: float, out: list[Decision]) -> None:
        """Give `req` the next free slot (lowest worker first, like the core); there must be one."""
        self._grant(req, self._pop_free(), now, out, queued=self._requests.get(req.session) is req)

    def kill(
        self, victim: LeaseRec, cause: YieldCause, for_session: SessionId, now: float, out: list[Decision]
    ) -> None:
        """Preempt without checkpoint: a zero-grace yield request, revoked at once, requeued."""
        out.append(YieldRequested(victim.lease, now, cause, for_session))
        self._revoke(victim, RevokeReason.YIELD_DEADLINE, now, out)

    def active_leases(self) -> Iterator[LeaseRec]:
        """Leases that could be preempted: active, on a ready worker."""
        for rec in self._leases.values():
            if rec.state is LeaseState.ACTIVE and rec.worker.state is WorkerState.READY:
                yield rec

    # ------------------------------------------------------------------ the core's steps, replaced

    def _acquire(self, ev: Acquire, now: float, out: list[Decision]) -> bool:
        s = ev.session
        if s in self._requests or s in self._holders:
            return super()._acquire(ev, now, out)  # the core's first check: it refuses a duplicate
        self._seq += 1
        req = Request(s, self._tenant(ev.tenant), CLASS_INDEX[ev.qos], now, self._seq, now, ev.resume_from)
        self._admit(req, now, out)
        return True

    def _tenant(self, name: str) -> TenantState:
        t = self._tenants.get(name)
        if t is None:  # baselines ignore tenants: one the policy lacks is served like any other
            t = self._tenants[name] = _Tenant(TenantSpec(name))
        return t

    def _requeue(self, rec: LeaseRec, snap: SnapshotRef | None, now: float, out: list[Decision]) -> None:
        # Back through `_admit` (which may grant or refuse), at its original place in line.
        req = Request(rec.lease.session, rec.tenant, rec.cls, rec.arrival, rec.seq, now, snap)
        self._admit(req, now, out)

    def handle(self, event: Event, now: float) -> list[Decision]:
        self._idle_tick = isinstance(event, Tick)
        return super().handle(event, now)

    def _schedule(self, now: float, out: list[Decision], preempt: bool = True) -> None:
        # Only `handle` calls it here (`_advance` below runs no pass). An idle tick changes nothing
        # a pass could act on: skipped (the core passes on every tick).
        if not self._idle_tick:
            self._pass(now, out)

    def _advance(self, now: float, out: list[Decision]) -> bool:
        timers, before = self._timers, len(out)
        for rec in timers.overdue(now):
            self._revoke(rec, RevokeReason.YIELD_DEADLINE, now, out)
        for rec in timers.expired(now):
            self._end_lease(rec, LeaseState.EXPIRED)
            out.append(Expired(rec.lease, now - rec.lease.granted_at))
        for _ in timers.matured(now):
            pass  # dropped: no baseline preempts for fairness
        fired = len(out) > before
        self._idle_tick = self._idle_tick and not fired
        return fired

    def _fairness_waiter(self) -> bool:
        return False  # no baseline preempts for fairness: maturity changes nothing

    def _set_capacity(self, capacity: int) -> None:
        self._capacity = capacity  # no floor: it stays 0

    def _report_queued(self, req: Request, out: list[Decision]) -> None:
        if self._requests.get(req.session) is req:
            pos = len(self._requests) - 1
            out.append(Queued(req.session, pos, self._estimate(pos), self._pool_name))
