"""What every baseline decider shares: the slot table, lease records, TTL expiry, drains, views.

Why: each baseline should read as its documented order of service and victim rule and nothing
else, so a comparison is between policies, not between five copies of lease bookkeeping. The
plumbing keeps the core's contract — the same decision types, lease ids `worker/index#epoch`,
an epoch bumped at every grant and revoke, TTL expiry of unrenewed leases, drains that ask
holders to yield — so the simulator and `SimStats` treat a baseline exactly as they treat `Core`.

A subclass implements `_admit` (a request arrives or comes back) and `_schedule` (a pass after
every event: hand out free slots, perhaps kill a victim). Waiting requests live in `Lanes`: heaps
with lazy deletion, ordered by a key the subclass chooses.

Kill preemption is expressed with the core's decisions: a victim is asked to yield with a deadline
of *now* (`YieldRequested`, counted as a preemption) and revoked at once (`Revoked`, reason
`yield_deadline`, with the slot-seconds since its grant as work lost) — a yield with zero grace
and no checkpoint, which is what a kill is.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from scheduler.core.lifecycle import LeaseState, WorkerState
from scheduler.core.types import (
    Acquire,
    Decision,
    Ended,
    EndReason,
    ErrorCode,
    Event,
    Expired,
    Granted,
    Lease,
    LeaseId,
    QoS,
    Queued,
    Refused,
    RefuseReason,
    Rejected,
    Release,
    Renew,
    Renewed,
    Revoked,
    RevokeReason,
    SessionId,
    SlotId,
    SnapshotRef,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerDraining,
    WorkerId,
    WorkerRemoved,
    Yield,
    YieldCause,
    YieldRequested,
)
from scheduler.core.views import PoolView, TenantView, WorkerView
from scheduler.policy.model import Policy

CLASSES = ("guaranteed", "burstable", "besteffort")
PRIORITY = {"guaranteed": 2, "burstable": 1, "besteffort": 0}  # higher is more important


@dataclass(slots=True)
class Request:
    session: SessionId
    tenant: TenantName
    qos: str  # QoS value
    arrival: float  # original arrival: a requeued victim keeps its place in line
    seq: int
    enqueued_at: float  # when this wait began (time-to-slot counts every wait)
    resume_from: SnapshotRef | None = None

    @property
    def priority(self) -> int:
        return PRIORITY[self.qos]


@dataclass(slots=True)
class LeaseRec:
    lease: Lease
    request: Request
    state: LeaseState = LeaseState.ACTIVE

    @property
    def priority(self) -> int:
        return PRIORITY[self.lease.qos.value]


@dataclass(slots=True)
class _Worker:
    worker_id: WorkerId
    address: str
    slots: int
    seq: int
    state: WorkerState = WorkerState.READY
    leases: dict[int, LeaseId] = field(default_factory=dict)


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


class Baseline:
    """The shared plumbing; subclasses decide (see the module docstring)."""

    name = "baseline"

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.waiting: dict[SessionId, Request] = {}
        self.holders: dict[SessionId, LeaseRec] = {}
        self._leases: dict[LeaseId, LeaseRec] = {}
        self._workers: dict[WorkerId, _Worker] = {}
        self._free: list[tuple[int, int, WorkerId]] = []
        self._in_heap: set[tuple[WorkerId, int]] = set()
        self._epochs: dict[SlotId, int] = {}
        self._expiries: list[tuple[float, LeaseId, int]] = []
        self._yield_deadlines: list[tuple[float, LeaseId, int]] = []
        self._to_report: list[Request] = []
        self._seq = 0
        self._worker_seq = 0
        self._now = float("-inf")
        self._mean_hold = 60.0
        self.capacity = 0
        self.free_slots = 0
        self.held_by_tenant: dict[str, int] = defaultdict(int)

    # ------------------------------------------------------------------ for subclasses

    def _admit(self, req: Request, now: float, out: list[Decision]) -> None:
        """A request arrives or comes back (after a revoke or a drain-yield): queue it."""
        raise NotImplementedError

    def _schedule(self, now: float, out: list[Decision]) -> None:
        """After every event: hand out free slots (and, for some, kill victims)."""
        raise NotImplementedError

    def wait(self, req: Request) -> None:
        """Record `req` as waiting; the subclass pushes it into its lanes."""
        self.waiting[req.session] = req
        self._to_report.append(req)

    def grant(self, req: Request, now: float, out: list[Decision]) -> None:
        """Give `req` the next free slot (lowest worker first, like the core); there must be one."""
        self.waiting.pop(req.session, None)
        slot = self._pop_free()
        epoch = self._epochs.get(slot, 0) + 1
        self._epochs[slot] = epoch
        lid = LeaseId(f"{slot.worker}/{slot.index}#{epoch}")
        ttl = self.policy.timing.lease_ttl_s
        lease = Lease(
            lid, req.session, req.tenant, QoS(req.qos), slot, epoch, now, now + ttl, req.resume_from
        )
        rec = LeaseRec(lease, req)
        self._leases[lid] = rec
        self.holders[req.session] = rec
        self.held_by_tenant[req.tenant] += 1
        self._workers[slot.worker].leases[slot.index] = lid
        heapq.heappush(self._expiries, (lease.expires_at, lid, epoch))
        out.append(Granted(lease, now - req.enqueued_at))

    def kill(
        self, victim: LeaseRec, cause: YieldCause, for_session: SessionId, now: float, out: list[Decision]
    ) -> None:
        """Preempt without checkpoint: a zero-grace yield request, revoked at once, requeued."""
        victim.state = LeaseState.YIELDING
        out.append(YieldRequested(victim.lease, now, cause, for_session))
        self._revoke(victim, RevokeReason.YIELD_DEADLINE, now, out)

    def active_leases(self) -> Iterator[LeaseRec]:
        """Leases that could be preempted: active, on a ready worker."""
        for rec in self._leases.values():
            if (
                rec.state is LeaseState.ACTIVE
                and self._workers[rec.lease.slot.worker].state is WorkerState.READY
            ):
                yield rec

    # ------------------------------------------------------------------ the Decider protocol

    def handle(self, event: Event, now: float) -> list[Decision]:
        now = max(now, self._now)
        self._now = now
        out: list[Decision] = []
        self._advance(now, out)
        # A renewal or an idle tick changes nothing a pass could act on: skip the pass.
        quiet = isinstance(event, Renew | Tick) and not out
        if isinstance(event, Acquire):
            self._acquire(event, now, out)
        elif isinstance(event, Release):
            self._release(event, now, out)
        elif isinstance(event, Renew):
            rec = self._check(event.session, event.lease_id, event.epoch, out)
            if rec is not None:
                rec.lease = rec.lease._replace(expires_at=now + self.policy.timing.lease_ttl_s)
                out.append(Renewed(rec.lease))
        elif isinstance(event, Yield):
            rec = self._check(event.session, event.lease_id, event.epoch, out)
            if rec is not None:
                self._end(rec, LeaseState.YIELDED, now)
                out.append(Ended(event.session, EndReason.YIELDED, rec.lease))
                self._requeue(rec, event.snapshot or rec.lease.resume_from, now, out)
        elif isinstance(event, WorkerAdded):
            self._worker_added(event)
        elif isinstance(event, WorkerDraining):
            self._worker_draining(event, now, out)
        elif isinstance(event, WorkerRemoved):
            self._worker_removed(event, now, out)
        if not quiet:
            self._schedule(now, out)
        for req in self._to_report:
            if self.waiting.get(req.session) is req:
                pos = len(self.waiting) - 1
                out.append(Queued(req.session, pos, (pos + 1) * self._mean_hold / max(1, self.capacity)))
        self._to_report.clear()
        return out

    def next_deadline(self) -> float | None:
        times = [h[0][0] for h in (self._expiries, self._yield_deadlines) if h]
        return min(times) if times else None

    def leases(self) -> Iterator[tuple[Lease, LeaseState]]:
        for rec in self._leases.values():
            yield rec.lease, rec.state

    def describe(self) -> PoolView:
        now = self._now
        held: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        pending: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        oldest = [0.0, 0.0, 0.0]
        for rec in self._leases.values():
            held[rec.lease.tenant][CLASSES.index(rec.lease.qos.value)] += 1
        for req in self.waiting.values():
            c = CLASSES.index(req.qos)
            pending[req.tenant][c] += 1
            oldest[c] = max(oldest[c], now - req.enqueued_at)
        specs = {t.name: t for t in self.policy.tenants}
        tenants = []
        for name in sorted(set(specs) | set(held) | set(pending)):
            spec = specs.get(name)
            h, p = held[name], pending[name]
            nominal = spec.burstable_nominal if spec else 0
            weight = spec.weight if spec else 1.0
            borrowed = max(0, h[1] - nominal) + h[2]
            tenants.append(
                TenantView(
                    name,
                    weight,
                    (h[0], h[1], h[2]),
                    (p[0], p[1], p[2]),
                    borrowed,
                    borrowed / weight,
                    spec.guaranteed if spec else 0,
                    nominal,
                    spec.burstable_limit if spec else 0,
                    spec.best_effort_limit if spec else None,
                )
            )
        workers = tuple(
            WorkerView(
                w.worker_id,
                w.address,
                w.slots,
                len(w.leases),
                w.state,
                sum(now - self._leases[lid].lease.granted_at for lid in w.leases.values()),
            )
            for w in self._workers.values()
        )
        tot_h = [sum(v[c] for v in held.values()) for c in range(3)]
        tot_p = [sum(v[c] for v in pending.values()) for c in range(3)]
        yielding = sum(1 for r in self._leases.values() if r.state is LeaseState.YIELDING)
        return PoolView(
            self.capacity,
            self.free_slots,
            0,  # no baseline reserves a floor
            (tot_h[0], tot_h[1], tot_h[2]),
            (tot_p[0], tot_p[1], tot_p[2]),
            tot_h[1] + tot_h[2],
            yielding,
            workers,
            tuple(tenants),
            (oldest[0], oldest[1], oldest[2]),
            self._mean_hold,
        )

    # ------------------------------------------------------------------ events

    def _acquire(self, ev: Acquire, now: float, out: list[Decision]) -> None:
        s = ev.session
        if s in self.waiting or s in self.holders:
            out.append(Refused(s, RefuseReason.DUPLICATE_SESSION, f"session {s} already holds or waits"))
            return
        self._seq += 1
        self._admit(Request(s, ev.tenant, ev.qos.value, now, self._seq, now, ev.resume_from), now, out)

    def _release(self, ev: Release, now: float, out: list[Decision]) -> None:
        if ev.lease_id is None:
            if self.waiting.pop(ev.session, None) is None:
                out.append(Rejected(ev.session, ErrorCode.NOT_FOUND, f"session {ev.session} is not queued"))
            else:
                out.append(Ended(ev.session, EndReason.WITHDRAWN))
            return
        rec = self._check(ev.session, ev.lease_id, ev.epoch, out)
        if rec is not None:
            self._end(rec, LeaseState.RELEASED, now)
            out.append(Ended(ev.session, EndReason.RELEASED, rec.lease))

    def _check(
        self, session: SessionId, lease_id: LeaseId, epoch: int, out: list[Decision]
    ) -> LeaseRec | None:
        rec = self.holders.get(session)
        if rec is not None and rec.lease.lease_id == lease_id and rec.lease.epoch == epoch:
            return rec
        out.append(Rejected(session, ErrorCode.STALE_EPOCH, f"lease {lease_id} epoch {epoch} is not current"))
        return None

    def _worker_added(self, ev: WorkerAdded) -> None:
        self._worker_seq += 1
        w = _Worker(ev.worker, ev.address, ev.slots, self._worker_seq)
        self._workers[ev.worker] = w
        for i in range(ev.slots):
            self._push_free(w, i)
        self.capacity += ev.slots
        self.free_slots += ev.slots

    def _worker_draining(self, ev: WorkerDraining, now: float, out: list[Decision]) -> None:
        w = self._workers.get(ev.worker)
        if w is None or w.state is not WorkerState.READY:
            return
        w.state = WorkerState.DRAINING
        self.capacity -= w.slots
        self.free_slots -= w.slots - len(w.leases)
        if ev.yield_within_s is None:
            return
        deadline = now + ev.yield_within_s
        for lid in w.leases.values():
            rec = self._leases[lid]
            if rec.state is LeaseState.ACTIVE:
                rec.state = LeaseState.YIELDING
                heapq.heappush(self._yield_deadlines, (deadline, lid, rec.lease.epoch))
                out.append(YieldRequested(rec.lease, deadline, YieldCause.DRAIN, None))

    def _worker_removed(self, ev: WorkerRemoved, now: float, out: list[Decision]) -> None:
        w = self._workers.pop(ev.worker, None)
        if w is None:
            return
        if w.state is WorkerState.READY:
            self.capacity -= w.slots
            self.free_slots -= w.slots - len(w.leases)
        w.state = WorkerState.REMOVED
        for lid in list(w.leases.values()):
            self._revoke(self._leases[lid], RevokeReason.WORKER_REMOVED, now, out, worker=w)

    # ------------------------------------------------------------------ timers and lease ends

    def _advance(self, now: float, out: list[Decision]) -> None:
        deadlines = self._yield_deadlines
        while deadlines and deadlines[0][0] <= now:
            _, lid, epoch = heapq.heappop(deadlines)
            rec = self._leases.get(lid)
            if rec is not None and rec.lease.epoch == epoch and rec.state is LeaseState.YIELDING:
                self._revoke(rec, RevokeReason.YIELD_DEADLINE, now, out)
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            _, lid, epoch = heapq.heappop(expiries)
            rec = self._leases.get(lid)
            if rec is None or rec.lease.epoch != epoch:
                continue
            if rec.lease.expires_at > now:
                heapq.heappush(expiries, (rec.lease.expires_at, lid, epoch))  # renewed meanwhile
                continue
            self._end(rec, LeaseState.EXPIRED, now)
            out.append(Expired(rec.lease, now - rec.lease.granted_at))

    def _end(self, rec: LeaseRec, state: LeaseState, now: float, worker: _Worker | None = None) -> None:
        rec.state = state
        lease = rec.lease
        del self._leases[lease.lease_id]
        del self.holders[lease.session]
        self.held_by_tenant[lease.tenant] -= 1
        w = worker or self._workers[lease.slot.worker]
        del w.leases[lease.slot.index]
        if w.state is WorkerState.READY:
            self.free_slots += 1
            self._push_free(w, lease.slot.index)
        if state in (LeaseState.RELEASED, LeaseState.YIELDED):
            self._mean_hold = 0.9 * self._mean_hold + 0.1 * max(0.0, now - lease.granted_at)

    def _revoke(
        self,
        rec: LeaseRec,
        reason: RevokeReason,
        now: float,
        out: list[Decision],
        worker: _Worker | None = None,
    ) -> None:
        self._end(rec, LeaseState.REVOKED, now, worker)
        slot = rec.lease.slot
        self._epochs[slot] = self._epochs.get(slot, 0) + 1  # fence: the old epoch is dead
        out.append(Revoked(rec.lease, reason, now - rec.lease.granted_at))
        self._requeue(rec, rec.lease.resume_from, now, out)

    def _requeue(self, rec: LeaseRec, snap: SnapshotRef | None, now: float, out: list[Decision]) -> None:
        r = rec.request
        self._admit(Request(r.session, r.tenant, r.qos, r.arrival, r.seq, now, snap), now, out)

    def _push_free(self, w: _Worker, index: int) -> None:
        if (w.worker_id, index) not in self._in_heap:
            self._in_heap.add((w.worker_id, index))
            heapq.heappush(self._free, (w.seq, index, w.worker_id))

    def _pop_free(self) -> SlotId:
        while True:
            _, index, wid = heapq.heappop(self._free)
            self._in_heap.discard((wid, index))
            w = self._workers.get(wid)
            if w is not None and w.state is WorkerState.READY and index not in w.leases:
                self.free_slots -= 1
                return SlotId(wid, index)
