"""The policy core: one deterministic state machine that decides who holds, waits and yields.

`Core.handle(event, now)` applies one event at time `now` and returns the decisions it caused,
in these steps (the methods below follow this order):
  1. timers due by `now` fire in time order, the slots freed at each instant handed out before
     the next (as a tick then would have): lease expiries, maturity for fairness preemption,
     yield deadlines (`_advance`; after an outage, `_resume` first moves them out);
  2. the event itself: acquire (admit, grant at once, queue or refuse), release, renew, yield,
     worker added / draining / removed;
  3. a pass over the queue (`_schedule`), repeated until neither applies:
       a. a free slot on a ready worker goes to the first waiter in the order of service
          (`ServiceOrder.for_free_slot`, order.py);
       b. with no free slot, the first waiter with a right to a slot (`first_with_right`) gets
          one victim asked to yield (`_preempt_for`; the victim order is victims.py's), never
          more than one per waiter;
  4. newcomers the pass did not serve are told their place (`Queued`), and yields no waiter took
     over are cancelled (`YieldCancelled`).
Both pass steps read heads of indexed heaps, so a decision costs O(log queued + log tenants).
The weighted share is `TenantState.share` (tenants.py); the views adapters read are views.py's;
the state as records (`export_records` / `restore`) is records.py's, as JSON state_io.py's.

A yield exists for a waiter. When the waiter leaves (withdrawn, granted another slot, its right
gone with a policy change), its victim is made ACTIVE again at once and the pass runs: a waiter
with a right to that very lease takes the yield over (it stays under way, same deadline, and the
holder hears nothing); otherwise the event ends with `YieldCancelled` for it. So no lease is
revoked, and no yield frees a slot, for a waiter that is not there. When the victim's slot frees,
its waiter keeps its earmark through the pass, so the slot goes to it, not back to the victim's
holder re-queued in the same tier (`_landed`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Any

from scheduler.core import state_io
from scheduler.core.indexes import Fenwick
from scheduler.core.lifecycle import LeaseState, WorkerState, check_lease, check_worker
from scheduler.core.model import LeaseRec, Request, WorkerRec
from scheduler.core.order import TIER_GUARANTEED, TIER_NOMINAL, TIER_SHARED, ServiceOrder
from scheduler.core.records import CoreRecords, LeaseRecord, RequestRecord, WorkerRecord
from scheduler.core.tenants import BE, CLASS_INDEX, CLASSES, B, G, TenantState
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
    Queued,
    Refused,
    RefuseReason,
    Rejected,
    Release,
    Renew,
    Renewed,
    Resumed,
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
    YieldCancelled,
    YieldCause,
    YieldRequested,
)
from scheduler.core.victims import VictimIndex, may_take
from scheduler.core.views import PoolView, SessionView, TenantView, WorkerView
from scheduler.policy.model import Policy

__all__ = ["Core", "PoolView", "SessionView", "TenantView", "WorkerView"]  # views: old import path

_DEFAULT_MEAN_HOLD_S = 60.0
_RETRY_UNKNOWN_S = 5.0  # retry-after for a refusal before any hold has been observed
_CAUSES = {
    TIER_GUARANTEED: YieldCause.GUARANTEED,
    TIER_NOMINAL: YieldCause.NOMINAL,
    TIER_SHARED: YieldCause.FAIR_SHARE,
}


class Core:
    """The scheduler's state machine. Not thread-safe by design: one loop owns it."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._ttl = policy.timing.lease_ttl_s  # read on every grant: kept at hand
        self._min_runtime = policy.timing.min_runtime_s
        self._tenants: dict[str, TenantState] = {}
        self._retired: set[str] = set()
        self._workers: dict[WorkerId, WorkerRec] = {}
        self._worker_seq = 0
        self._epochs: dict[SlotId, int] = {}
        self._free: list[tuple[int, int, WorkerId]] = []
        # Free-slot entries are keyed by the worker's registration seq, not its id: a worker
        # removed and added again under the same id is a new worker (maybe with fewer slots).
        self._free_in_heap: set[tuple[int, int]] = set()
        self._free_ready = 0
        self._capacity = 0
        self._floor = 0
        self._requests: dict[SessionId, Request] = {}
        self._holders: dict[SessionId, LeaseRec] = {}
        self._leases: dict[LeaseId, LeaseRec] = {}
        # Yields whose waiter left during this event, made ACTIVE again: each is taken over by a
        # waiter with a right to it during the pass, or cancelled (`YieldCancelled`) at its end.
        self._cancelled: dict[LeaseId, None] = {}
        # Only from a state exported by an older build, which left such yields running: they are
        # handled like `_cancelled` by the next event.
        self._orphans: dict[LeaseId, None] = {}
        # Waiters whose victim's slot freed in this event, still earmarked until the pass serves
        # them (or puts them back in line): empty between events.
        self._landed: list[Request] = []
        self._gseq = 0
        self._held_g = 0
        self._preemptible = 0
        self._inflight_nominal = 0
        self._waiting_cls = [0, 0, 0]
        self._positions = (Fenwick(), Fenwick(), Fenwick())
        self._seq = 0
        self._now = float("-inf")
        self._mean_hold = _DEFAULT_MEAN_HOLD_S  # a prior for the autoscaler's drain time
        self._holds_seen = False  # until then, waits are not estimated (the prior is no evidence)
        self._to_report: list[Request] = []
        self._mature_n = 0  # mature candidates: none means no fairness preemption is possible

        self._order = ServiceOrder(self._tenants, self._requests)
        self._victims = VictimIndex(self._tenants, self._leases)
        self._maturing: deque[tuple[float, LeaseId, int]] = deque()
        self._yield_deadlines: list[tuple[float, LeaseId, int]] = []
        self._expiries: list[tuple[float, LeaseId, int]] = []
        for spec in policy.tenants:
            self._tenants[spec.name] = TenantState(spec)

    # ------------------------------------------------------------------ public API

    @property
    def policy(self) -> Policy:
        return self._policy

    def export_state(self) -> dict[str, Any]:
        """The logical state as JSON-ready data (no indexes, no policy): see `state_io`."""
        return state_io.to_doc(self.export_records())

    @classmethod
    def from_state(cls, policy: Policy, doc: dict[str, Any]) -> Core:
        """Rebuild a core from `export_state()` and the policy it ran under; ValueError if `doc`
        is of an unknown format or malformed. The rebuilt core decides exactly as the original."""
        return cls.restore(policy, state_io.from_doc(doc))

    def export_records(self) -> CoreRecords:
        """The logical state (records.py), for `restore`. Call between events only."""
        leases = tuple(
            LeaseRecord(
                rec.lease,
                rec.state,
                rec.arrival,
                rec.seq,
                rec.borrowing,
                rec.for_session,
                rec.yield_deadline,
                lid in rec.tenant.candidates[rec.cls],
                lid in rec.tenant.mature[rec.cls],
                rec.matured,
            )
            for lid, rec in self._leases.items()
        )
        requests = tuple(
            RequestRecord(
                r.session,
                TenantName(r.tenant.name),
                CLASSES[r.cls],
                r.arrival,
                r.seq,
                r.enqueued_at,
                r.resume_from,
                r.earmark,
                r.earmark_tier,
            )
            for r in self._requests.values()
        )
        # Earmark entries are kept only for a request that can come back with that seq.
        lineages = {(s, r.seq) for s, r in self._requests.items()}
        lineages.update((s, r.seq) for s, r in self._holders.items())
        earmark_order = tuple(sorted({e for e in self._order.earmarked if (e[3], e[2]) in lineages}))
        return CoreRecords(
            now=self._now,
            seq=self._seq,
            worker_seq=self._worker_seq,
            mean_hold_s=self._mean_hold,
            holds_seen=self._holds_seen,
            tenants=tuple(t.spec for t in self._tenants.values()),
            retired=frozenset(self._retired),
            workers=tuple(
                WorkerRecord(w.worker_id, w.address, w.slots, w.seq, w.state) for w in self._workers.values()
            ),
            epochs=tuple(self._epochs.items()),
            free_slots=tuple(self._free),
            leases=leases,
            orphans=tuple(self._orphans),
            requests=requests,
            earmark_order=earmark_order,
            expiries=tuple(self._expiries),
            yield_deadlines=tuple(self._yield_deadlines),
            maturing=tuple(self._maturing),
        )

    @classmethod
    def restore(cls, policy: Policy, records: CoreRecords) -> Core:
        """A core whose future behaviour is that of the core `records` were exported from, under
        the policy it ran under; ValueError if they do not fit the policy or each other."""
        core = cls(policy)
        core._restore(records)
        return core

    def handle(self, event: Event, now: float) -> list[Decision]:
        """Apply one event at time `now`; return every decision it caused, in order."""
        now = max(now, self._now)
        self._now = now
        out: list[Decision] = []
        if isinstance(event, Resumed):
            self._resume(event.since, now)  # before the timers: the outage must not fire them
        if self._orphans:
            self._adopt_orphans()  # before the timers: no deadline may revoke them now
        # The state is quiescent after every event (the pass ran to completion), so a pass is
        # needed only when timers fired or the event can open a slot or a right to one.
        need_pass = self._advance(now, out) or bool(self._cancelled)
        if isinstance(event, Acquire):
            need_pass = self._acquire(event, now, out) or need_pass
        elif isinstance(event, Release):
            self._release(event, now, out)
            need_pass = True
        elif isinstance(event, Renew):
            self._renew(event, now, out)
        elif isinstance(event, Yield):
            self._yield(event, now, out)
        elif isinstance(event, Tick):
            pass
        elif isinstance(event, WorkerAdded):
            self._worker_added(event, out)
        elif isinstance(event, WorkerDraining):
            self._worker_draining(event, now, out)
        elif isinstance(event, WorkerRemoved):
            self._worker_removed(event, now, out)
        if need_pass or not isinstance(event, Acquire | Renew):
            self._schedule(now, out)
        if self._to_report:
            # Requests that entered the queue in this event and were not served by the pass.
            for req in self._to_report:
                self._report_queued(req, out)
            self._to_report.clear()
        if self._cancelled:
            self._cancel_yields(out)
        return out

    def apply_policy(self, policy: Policy, now: float) -> list[Decision]:
        """Swap in a new policy. Leases over a lowered quota finish normally; none is cut short."""
        self._policy = policy
        self._ttl = policy.timing.lease_ttl_s
        self._min_runtime = policy.timing.min_runtime_s
        names = {t.name for t in policy.tenants}
        for spec in policy.tenants:
            t = self._tenants.get(spec.name)
            if t is None:
                self._tenants[spec.name] = TenantState(spec)
            else:
                t.spec = spec
            self._retired.discard(spec.name)
        for name in self._tenants:
            if name not in names:
                self._retired.add(name)  # keeps its leases and queue; takes no new requests
        for t in self._tenants.values():
            self._refresh(t)
        self._set_capacity(self._capacity)
        # A waiter's right to its victim may be gone with the new quotas: every earmarked waiter
        # goes back in line, and the pass gives each yield under way to a waiter with a right to
        # it or cancels it. (Rare, so a walk over the earmarks is fine.)
        for _, _, seq, s in list(self._order.earmarked):
            req = self._requests.get(s)
            if req is not None and req.seq == seq and req.earmark is not None:
                self._unearmark(req)
                self._refresh_queue(req.tenant)
        return self.handle(Tick(), now)

    def next_deadline(self) -> float | None:
        """The earliest time at which a Tick would change something (timers), if any."""
        times = []
        if self._yield_deadlines:
            times.append(self._yield_deadlines[0][0])
        if self._expiries:
            times.append(self._expiries[0][0])
        if self._maturing:  # flush only when it matters: this runs after every event
            self._order.flush()
            if self._order.tiers[2].peek() is not None:
                times.append(self._maturing[0][0])
        return min(times) if times else None

    def session(self, session: SessionId) -> SessionView | None:
        rec = self._holders.get(session)
        if rec is not None:
            phase = "yielding" if rec.state is LeaseState.YIELDING else "active"
            return SessionView(
                session,
                TenantName(rec.tenant.name),
                CLASSES[rec.cls].value,
                phase,
                rec.lease,
                0,
                0.0,
                rec.lease.resume_from,
                rec.lease.granted_at,
            )
        req = self._requests.get(session)
        if req is None:
            return None
        pos = self._position(req)
        return SessionView(
            session,
            TenantName(req.tenant.name),
            CLASSES[req.cls].value,
            "queued",
            None,
            pos,
            self._estimate(pos),
            req.resume_from,
            req.enqueued_at,
        )

    def leases(self) -> Iterator[tuple[Lease, LeaseState]]:
        for rec in self._leases.values():
            yield rec.lease, rec.state

    def queue(self) -> Iterator[SessionView]:
        for s in self._requests:
            view = self.session(s)
            if view is not None:
                yield view

    def yields_for(self, lease_id: LeaseId) -> SessionId | None:
        """The waiter a yielding lease yields for (None: not yielding, or a drain's yield)."""
        rec = self._leases.get(lease_id)
        return rec.for_session if rec is not None and rec.state is LeaseState.YIELDING else None

    def lease(self, lease_id: LeaseId) -> Lease | None:
        rec = self._leases.get(lease_id)
        return None if rec is None else rec.lease

    def describe(self) -> PoolView:
        now = self._now
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
        tenants = tuple(
            TenantView(
                t.name,
                t.spec.weight,
                (t.held[0], t.held[1], t.held[2]),
                (t.waiting[0], t.waiting[1], t.waiting[2]),
                t.borrowed_effective(),
                t.share(),
                t.spec.guaranteed,
                t.spec.burstable_nominal,
                t.spec.burstable_limit,
                t.spec.best_effort_limit,
            )
            for t in self._tenants.values()
        )
        oldest = [0.0, 0.0, 0.0]
        for r in self._requests.values():
            oldest[r.cls] = max(oldest[r.cls], now - r.enqueued_at)
        held = [0, 0, 0]
        yielding = 0
        for t in self._tenants.values():
            for c in (G, B, BE):
                held[c] += t.held[c]
            yielding += sum(t.yielding)
        return PoolView(
            self._capacity,
            self._free_ready,
            self._floor,
            (held[0], held[1], held[2]),
            (self._waiting_cls[0], self._waiting_cls[1], self._waiting_cls[2]),
            self._preemptible,
            yielding,
            workers,
            tenants,
            (oldest[0], oldest[1], oldest[2]),
            self._mean_hold,
        )

    # ------------------------------------------------------------------ events

    def _acquire(self, ev: Acquire, now: float, out: list[Decision]) -> bool:
        """Admit, grant at once, queue or refuse; True if the pass may now do something."""
        s = ev.session
        if s in self._requests or s in self._holders:
            out.append(Refused(s, RefuseReason.DUPLICATE_SESSION, f"session {s} already holds or waits"))
            return False
        t = self._tenants.get(ev.tenant)
        if t is None or ev.tenant in self._retired:
            out.append(Refused(s, RefuseReason.UNKNOWN_TENANT, f"tenant {ev.tenant!r} is not in the policy"))
            return False
        cls = CLASS_INDEX[ev.qos]
        if not t.class_allowed(cls):
            out.append(Refused(s, RefuseReason.NO_QUOTA, f"tenant {t.name!r} has no {ev.qos.value} quota"))
            return False
        if self._free_ready == 0:
            refusal = self._cap_refusal(s, t, cls)
            if refusal is not None:
                out.append(refusal)
                return False
        self._seq += 1
        req = Request(s, t, cls, now, self._seq, now, ev.resume_from)
        if self._free_ready > 0 and not self._requests and t.held[cls] < (t.quota(cls) or 1 << 62):
            # Nobody waits and a slot is free: this request is first in line and within quota.
            self._grant(req, self._pop_free(), now, out, queued=False)
            return False
        self._enqueue(req)
        self._to_report.append(req)
        # Only the newcomer can act now: on a free slot, or by a right to preempt.
        if self._free_ready > 0 or cls == G:
            return True
        if cls == B and t.b_nominal_held() + t.earmarked[B] < t.spec.burstable_nominal:
            return True
        return self._mature_n > 0  # a fairness preemption needs a victim that ran min_runtime

    def _cap_refusal(self, s: SessionId, t: TenantState, cls: int) -> Refused | None:
        q = self._policy.queue
        frac = q.best_effort_fraction if cls == BE else 1.0
        pending = sum(self._waiting_cls)
        if pending >= q.max_pending * frac:
            reason, msg = RefuseReason.QUEUE_FULL, f"pool queue holds {pending} of {q.max_pending}"
        elif t.pending() >= q.max_pending_per_tenant * frac:
            reason = RefuseReason.TENANT_QUEUE_FULL
            msg = f"tenant {t.name!r} has {t.pending()} queued of {q.max_pending_per_tenant}"
        else:
            return None
        if cls == BE and frac < 1.0:
            msg += f" (BestEffort is refused past {frac:.0%})"
        est = self._estimate(pending)
        # Come back when about half the queue ahead has drained, within sane bounds (and soon
        # when there is no estimate yet).
        retry = min(60.0, max(1.0, est / 2)) if est is not None else _RETRY_UNKNOWN_S
        return Refused(s, reason, msg, retry_after_s=retry, estimated_wait_s=est)

    def _release(self, ev: Release, now: float, out: list[Decision]) -> None:
        if ev.lease_id is None:
            req = self._requests.get(ev.session)
            if req is None:
                out.append(Rejected(ev.session, ErrorCode.NOT_FOUND, f"session {ev.session} is not queued"))
                return
            self._dequeue(req)
            out.append(Ended(ev.session, EndReason.WITHDRAWN))
            return
        rec = self._check_call(ev.session, ev.lease_id, ev.epoch, out)
        if rec is None:
            return
        self._observe_hold(now - rec.lease.granted_at)
        self._end_lease(rec, LeaseState.RELEASED)
        out.append(Ended(ev.session, EndReason.RELEASED, rec.lease))

    def _renew(self, ev: Renew, now: float, out: list[Decision]) -> None:
        rec = self._check_call(ev.session, ev.lease_id, ev.epoch, out)
        if rec is None:
            return
        rec.lease = rec.lease._replace(expires_at=now + self._ttl)
        out.append(Renewed(rec.lease))

    def _resume(self, since: float, now: float) -> None:
        """See `Resumed`. Stale expiry-heap entries re-queue themselves in `_advance`."""
        gap = max(0.0, now - since)
        at_least = now + self._ttl
        for rec in self._leases.values():
            expires = max(rec.lease.expires_at + gap, at_least)
            if expires != rec.lease.expires_at:
                rec.lease = rec.lease._replace(expires_at=expires)
            if gap and rec.yield_deadline is not None:
                rec.yield_deadline += gap  # as its heap entry below: they must stay equal
        if gap and self._yield_deadlines:
            # The same shift for every entry keeps the heap order: no re-heapify needed.
            self._yield_deadlines = [(d + gap, lid, epoch) for d, lid, epoch in self._yield_deadlines]

    def _yield(self, ev: Yield, now: float, out: list[Decision]) -> None:
        rec = self._check_call(ev.session, ev.lease_id, ev.epoch, out)
        if rec is None:
            return
        self._observe_hold(now - rec.lease.granted_at)
        self._end_lease(rec, LeaseState.YIELDED)
        out.append(Ended(ev.session, EndReason.YIELDED, rec.lease))
        self._requeue(rec, ev.snapshot or rec.lease.resume_from, now, out)

    def _worker_added(self, ev: WorkerAdded, out: list[Decision]) -> None:
        if ev.slots <= 0:
            out.append(Rejected(None, ErrorCode.INVALID, f"worker {ev.worker} must offer slots > 0"))
            return
        w = self._workers.get(ev.worker)
        if w is not None:
            out.append(Rejected(None, ErrorCode.INVALID, f"worker {ev.worker} is already registered"))
            return
        self._worker_seq += 1
        w = WorkerRec(ev.worker, ev.address, ev.slots, self._worker_seq)
        self._workers[ev.worker] = w
        for i in range(ev.slots):
            self._push_free(w, i)
        self._set_capacity(self._capacity + ev.slots)

    def _worker_draining(self, ev: WorkerDraining, now: float, out: list[Decision]) -> None:
        w = self._workers.get(ev.worker)
        if w is None:
            out.append(Rejected(None, ErrorCode.NOT_FOUND, f"worker {ev.worker} is not registered"))
            return
        if w.state is WorkerState.DRAINING:
            return  # idempotent: draining twice changes nothing
        w.state = check_worker(w.state, WorkerState.DRAINING)
        self._free_ready -= w.slots - len(w.leases)
        self._set_capacity(self._capacity - w.slots)
        for lid in list(w.leases.values()):
            rec = self._leases[lid]
            t = rec.tenant
            t.candidates[rec.cls].pop(lid, None)  # its slot cannot be handed on: not a victim
            if t.mature[rec.cls].pop(lid, None) is not None:
                self._mature_n -= 1
            if rec.state is LeaseState.YIELDING and rec.for_session is not None:
                # Its slot will not reach the waiter it yields for: the waiter goes back in line
                # (to find a victim on a ready worker), and the yield serves the drain if the
                # drain asks for yields, else it is cancelled (the drain lets leases finish).
                waiter = self._requests.get(rec.for_session)
                rec.for_session = None
                if waiter is not None and waiter.earmark == lid:
                    self._unearmark(waiter)
                    self._refresh_queue(waiter.tenant)
                if ev.yield_within_s is None:
                    self._reinstate(rec)
            elif ev.yield_within_s is not None and rec.state is LeaseState.ACTIVE:
                self._ask_to_yield(rec, now + ev.yield_within_s, YieldCause.DRAIN, None, out)
            self._refresh(t)

    def _worker_removed(self, ev: WorkerRemoved, now: float, out: list[Decision]) -> None:
        w = self._workers.get(ev.worker)
        if w is None:
            out.append(Rejected(None, ErrorCode.NOT_FOUND, f"worker {ev.worker} is not registered"))
            return
        if w.state is WorkerState.READY:
            self._free_ready -= w.slots - len(w.leases)
            self._set_capacity(self._capacity - w.slots)
        # Removed before its leases are revoked, so their slots are not handed out again.
        w.state = check_worker(w.state, WorkerState.REMOVED)
        for lid in list(w.leases.values()):
            self._revoke(self._leases[lid], RevokeReason.WORKER_REMOVED, now, out)
        del self._workers[ev.worker]

    # ------------------------------------------------------------------ timers

    def _advance(self, now: float, out: list[Decision]) -> bool:
        """Fire the timers due by `now`, instant by instant, as ticks at each instant would have;
        True if any did something.

        After each instant the pass hands out the slots it freed (no preemption: a yield asked
        now or after the event has the same deadline, and the event may make it needless), so a
        slot freed at one instant goes to its waiter before a later timer fires or the event
        applies: a yield deadline at 15 revokes for the
        waiter that needed the slot then, even if a lease expiring at 20 (both seen only by an
        event at 20) would have served it, or if the event removes the slot's worker. Within one
        instant, expiries and maturing fire first and the pass runs before the yield deadlines: a
        slot freed without loss serves the waiter, whose yield is then called off, not revoked."""
        fired = False
        while (at := self._next_due(now)) is not None:
            freed = self._fire_expiries(at, now, out)
            matured = self._fire_maturing(at)
            if freed and self._yield_deadlines and self._yield_deadlines[0][0] <= at:
                self._schedule(now, out, preempt=False)
            revoked = self._fire_deadlines(at, now, out)
            if freed or revoked:
                # Served before the event and later timers: the event may take the slot away
                # (its worker removed), as it would have after a tick at `at`.
                self._schedule(now, out, preempt=False)
            fired = fired or freed or matured or revoked
        return fired

    def _next_due(self, now: float) -> float | None:
        """The earliest instant <= `now` at which a timer is due, if any."""
        at = now + 1.0
        if self._maturing:
            at = min(at, self._maturing[0][0])
        if self._yield_deadlines:
            at = min(at, self._yield_deadlines[0][0])
        if self._expiries:
            at = min(at, self._expiries[0][0])
        return at if at <= now else None

    def _fire_maturing(self, at: float) -> bool:
        fired = False
        maturing = self._maturing
        while maturing and maturing[0][0] <= at:
            _, lid, epoch = maturing.popleft()
            rec = self._leases.get(lid)
            if rec is None or rec.lease.epoch != epoch:
                continue
            rec.matured = True  # kept while it yields, for when the yield is cancelled
            t = rec.tenant
            granted = t.candidates[rec.cls].get(lid)
            if granted is not None:
                t.mature[rec.cls][lid] = granted
                self._mature_n += 1
                self._refresh_victims(t)
                fired = True
        return fired

    def _fire_deadlines(self, at: float, now: float, out: list[Decision]) -> bool:
        fired = False
        deadlines = self._yield_deadlines
        while deadlines and deadlines[0][0] <= at:
            deadline, lid, epoch = heapq.heappop(deadlines)
            rec = self._leases.get(lid)
            if (
                rec is not None
                and rec.lease.epoch == epoch
                and rec.state is LeaseState.YIELDING
                and rec.yield_deadline == deadline  # not the entry of an earlier, cancelled yield
            ):
                self._revoke(rec, RevokeReason.YIELD_DEADLINE, now, out)
                fired = True
        return fired

    def _fire_expiries(self, at: float, now: float, out: list[Decision]) -> bool:
        fired = False
        expiries = self._expiries
        while expiries and expiries[0][0] <= at:
            _, lid, epoch = heapq.heappop(expiries)
            rec = self._leases.get(lid)
            if rec is None or rec.lease.epoch != epoch:
                continue
            if rec.lease.expires_at > at:
                heapq.heappush(expiries, (rec.lease.expires_at, lid, epoch))  # renewed meanwhile
                continue
            self._end_lease(rec, LeaseState.EXPIRED)
            out.append(Expired(rec.lease, now - rec.lease.granted_at))
            fired = True
        return fired

    # ------------------------------------------------------------------ the pass

    def _schedule(self, now: float, out: list[Decision], preempt: bool = True) -> None:
        """The pass (step 3); with `preempt` False only free slots are handed out (3a)."""
        while self._requests:  # nobody waits: nothing to grant, no one with a right to preempt
            if self._free_ready > 0:
                req = self._order.for_free_slot()
                if req is not None:
                    self._grant(req, self._pop_free(), now, out)
                    continue
            elif preempt and self._preempt_once(now, out):
                continue
            if not self._back_in_line():
                break
        self._landed.clear()

    def _back_in_line(self) -> bool:
        """Waiters whose victim's slot freed in this event but went to a higher tier: back in line
        (to find another victim); True if there were any."""
        back = False
        for req in self._landed:
            if (
                self._requests.get(req.session) is req
                and req.earmark is not None
                and req.earmark not in self._leases
            ):
                self._unearmark(req)
                self._refresh_queue(req.tenant)
                back = True
        self._landed.clear()
        return back

    def _slack(self) -> int:
        """How far the floor invariant holds above its bound (>= 0 whenever it holds)."""
        return self._free_ready + self._preemptible - max(0, self._floor - self._held_g)

    def _preempt_once(self, now: float, out: list[Decision]) -> bool:
        """Ask one victim to yield for the first waiter with a right to a slot; False if none."""
        first = self._order.first_with_right(
            lambda: self._slack() - self._inflight_nominal >= 1, self._mature_n > 0
        )
        return first is not None and self._preempt_for(first[1], first[0], now, out)

    def _preempt_for(self, req: Request, tier: int, now: float, out: list[Decision]) -> bool:
        fairness = tier == TIER_SHARED
        victim = self._under_way_for(req, fairness) if self._cancelled else None
        if victim is None:
            victim = self._victims.fair_victim(req.tenant) if fairness else self._victims.any_victim()
        if victim is None:
            return False
        self._earmark(req, victim, tier)
        deadline = now + self._policy.timing.yield_grace_s
        self._ask_to_yield(victim, deadline, _CAUSES[tier], req.session, out)
        return True

    # ------------------------------------------------------------------ victims

    def _under_way_for(self, req: Request, fairness: bool) -> LeaseRec | None:
        """A lease whose yield was cancelled in this event and that `req` has a right to
        (`victims.may_take`): taking it over keeps the yield under way instead of starting
        another. Only this event's cancellations are looked at."""
        for lid in self._cancelled:
            rec = self._leases.get(lid)
            if rec is not None and rec.state is LeaseState.ACTIVE and may_take(req.tenant, rec, fairness):
                return rec
        return None

    def _ask_to_yield(
        self,
        rec: LeaseRec,
        deadline: float,
        cause: YieldCause,
        for_session: SessionId | None,
        out: list[Decision],
    ) -> None:
        lid = rec.lease.lease_id
        rec.state = check_lease(rec.state, LeaseState.YIELDING)
        rec.for_session = for_session
        t = rec.tenant
        t.yielding[rec.cls] += 1
        if rec.cls == B and rec.borrowing:
            t.b_borrowing_yielding += 1
        t.candidates[rec.cls].pop(lid, None)
        if t.mature[rec.cls].pop(lid, None) is not None:
            self._mature_n -= 1
        if lid in self._cancelled:
            # Its yield was cancelled in this very event and never told: it goes on, for this
            # waiter now, by the deadline the holder already has.
            del self._cancelled[lid]
        else:
            rec.yield_deadline = deadline
            heapq.heappush(self._yield_deadlines, (deadline, lid, rec.lease.epoch))
            out.append(YieldRequested(rec.lease, deadline, cause, for_session))
        self._refresh(t)

    def _reinstate(self, rec: LeaseRec) -> None:
        """A yielding lease no waiter needs now: ACTIVE again (and a victim candidate again, in
        its grant order), pending `YieldCancelled` unless the pass gives it another waiter."""
        rec.state = check_lease(rec.state, LeaseState.ACTIVE)
        t, cls, lid = rec.tenant, rec.cls, rec.lease.lease_id
        t.yielding[cls] -= 1
        if cls == B and rec.borrowing:
            t.b_borrowing_yielding -= 1
        if rec.worker.state is WorkerState.READY and (cls == BE or rec.borrowing):
            self._insert_in_grant_order(t.candidates[cls], rec)
            if rec.matured:
                self._insert_in_grant_order(t.mature[cls], rec)
                self._mature_n += 1
        self._cancelled[lid] = None
        self._refresh(t)

    def _insert_in_grant_order(self, d: dict[LeaseId, float], rec: LeaseRec) -> None:
        lid = rec.lease.lease_id
        if d:
            leases = self._leases
            last = next(reversed(d))
            if leases[last].gseq > rec.gseq:
                # The tenant was granted leases of this class since: rebuild the dict in grant
                # order (linear in them, and only when a yield is cancelled).
                items = list(d.items())
                i = len(items)
                while i > 0 and leases[items[i - 1][0]].gseq > rec.gseq:
                    i -= 1
                items.insert(i, (lid, rec.lease.granted_at))
                d.clear()
                d.update(items)
                return
        d[lid] = rec.lease.granted_at

    def _cancel_yields(self, out: list[Decision]) -> None:
        """End of an event: the yields no waiter took over are cancelled, and their holders told."""
        for lid in self._cancelled:
            rec = self._leases.get(lid)
            if rec is not None and rec.state is LeaseState.ACTIVE:
                rec.yield_deadline = None
                out.append(YieldCancelled(rec.lease))
        self._cancelled.clear()

    def _adopt_orphans(self) -> None:
        """Yields left running for no one in a state an older build exported: cancel them (or
        let the pass give them a waiter), as this build would have when their waiter left."""
        for lid in self._orphans:
            rec = self._leases.get(lid)
            if rec is not None and rec.state is LeaseState.YIELDING and rec.for_session is None:
                self._reinstate(rec)
        self._orphans.clear()

    def _earmark(self, req: Request, victim: LeaseRec, tier: int) -> None:
        t = req.tenant
        req.earmark = victim.lease.lease_id
        req.earmark_tier = tier
        victim.for_session = req.session
        t.earmarked[req.cls] += 1
        if tier == TIER_SHARED:
            t.earmarked_fair += 1
        elif tier == TIER_NOMINAL:
            self._inflight_nominal += 1
        self._order.push_earmarked(req)
        self._refresh_queue(t)

    def _unearmark(self, req: Request) -> None:
        t = req.tenant
        t.earmarked[req.cls] -= 1
        if req.earmark_tier == TIER_SHARED:
            t.earmarked_fair -= 1
        elif req.earmark_tier == TIER_NOMINAL:
            self._inflight_nominal -= 1
        victim = self._leases.get(req.earmark) if req.earmark is not None else None
        if victim is not None and victim.for_session == req.session:
            victim.for_session = None
            if victim.state is LeaseState.YIELDING:
                self._reinstate(victim)  # the pass may give it another waiter, else cancelled
        req.earmark = None
        req.earmark_tier = 0
        t.push_request(req.cls, (req.arrival, req.seq, req.session))

    # ------------------------------------------------------------------ lease and queue changes

    def _grant(
        self, req: Request, slot: SlotId, now: float, out: list[Decision], queued: bool = True
    ) -> None:
        t = req.tenant
        if queued:
            self._dequeue(req, refresh=False)
        epoch = self._epochs.get(slot, 0) + 1
        self._epochs[slot] = epoch
        lid = LeaseId(f"{slot.worker}/{slot.index}#{epoch}")
        lease = Lease(
            lid,
            req.session,
            TenantName(t.name),
            CLASSES[req.cls],
            slot,
            epoch,
            now,
            now + self._ttl,
            req.resume_from,
        )
        w = self._workers[slot.worker]
        # A Burstable lease within nominal is unpreemptible, so it is one only if the floor still
        # holds with this slot taken (slack >= 0 now); otherwise the slot is lent as borrowing.
        borrowing = req.cls == BE or (
            req.cls == B and not (t.b_nominal_held() < t.spec.burstable_nominal and self._slack() >= 0)
        )
        self._gseq += 1
        rec = LeaseRec(
            lease, t, req.cls, LeaseState.ACTIVE, req.arrival, req.seq, w, None, borrowing, self._gseq
        )
        w.leases[slot.index] = lid
        self._leases[lid] = rec
        self._holders[req.session] = rec
        t.held[req.cls] += 1
        if req.cls == G:
            self._held_g += 1
        elif req.cls == B and not borrowing:
            pass
        else:
            if req.cls == B:
                t.b_borrowing += 1
            t.candidates[req.cls][lid] = now
            self._maturing.append((now + self._min_runtime, lid, epoch))
        heapq.heappush(self._expiries, (lease.expires_at, lid, epoch))
        self._refresh(t)
        out.append(Granted(lease, now - req.enqueued_at))

    def _end_lease(self, rec: LeaseRec, state: LeaseState) -> None:
        was_yielding = rec.state is LeaseState.YIELDING
        rec.state = check_lease(rec.state, state)
        t, cls, lid = rec.tenant, rec.cls, rec.lease.lease_id
        t.held[cls] -= 1
        if was_yielding:
            t.yielding[cls] -= 1
        if cls == B and rec.borrowing:
            t.b_borrowing -= 1
            if was_yielding:
                t.b_borrowing_yielding -= 1
        t.candidates[cls].pop(lid, None)
        if t.mature[cls].pop(lid, None) is not None:
            self._mature_n -= 1
        if cls == G:
            self._held_g -= 1
        del self._leases[lid]
        del self._holders[rec.lease.session]
        self._cancelled.pop(lid, None)  # it ends: its own decision says so
        self._orphans.pop(lid, None)
        w = rec.worker
        del w.leases[rec.lease.slot.index]
        if w.state is WorkerState.READY:
            self._push_free(w, rec.lease.slot.index)
        if rec.for_session is not None:
            waiter = self._requests.get(rec.for_session)
            if waiter is not None and waiter.earmark == lid:
                if w.state is WorkerState.READY:
                    # The slot it waited for is free now: the waiter keeps its earmark through
                    # the pass, so it goes ahead of its own tier and the tiers after it (back in
                    # line, an older session of its tier, the holder re-queued among them,
                    # would take the slot back). If a higher tier takes it, the pass puts the
                    # waiter back in line (`_schedule`).
                    self._landed.append(waiter)
                else:
                    self._unearmark(waiter)  # the slot goes with its worker
                    self._refresh_queue(waiter.tenant)
        if cls == B and not rec.borrowing:
            self._promote(t)
        self._refresh(t)

    def _promote(self, t: TenantState) -> None:
        """A nominal lease ended: the tenant's oldest borrowing Burstable lease becomes nominal,
        if the floor can spare it (it stops being preemptible)."""
        cands = t.candidates[B]
        if not cands or t.b_nominal_held() >= t.spec.burstable_nominal or self._slack() < 1:
            return
        lid = next(iter(cands))
        del cands[lid]
        if t.mature[B].pop(lid, None) is not None:
            self._mature_n -= 1
        self._leases[lid].borrowing = False
        t.b_borrowing -= 1
        self._preemptible -= 1
        t.preemptible_contrib -= 1

    def _revoke(self, rec: LeaseRec, reason: RevokeReason, now: float, out: list[Decision]) -> None:
        self._end_lease(rec, LeaseState.REVOKED)
        slot = rec.lease.slot
        self._epochs[slot] = self._epochs.get(slot, 0) + 1  # fence: the old epoch is dead now
        out.append(Revoked(rec.lease, reason, now - rec.lease.granted_at))
        self._requeue(rec, rec.lease.resume_from, now, out)

    def _requeue(self, rec: LeaseRec, snap: SnapshotRef | None, now: float, out: list[Decision]) -> None:
        req = Request(rec.lease.session, rec.tenant, rec.cls, rec.arrival, rec.seq, now, snap)
        self._enqueue(req)
        self._to_report.append(req)

    def _report_queued(self, req: Request, out: list[Decision]) -> None:
        if self._requests.get(req.session) is req:
            pos = self._position(req)
            out.append(Queued(req.session, pos, self._estimate(pos)))

    def _enqueue(self, req: Request) -> None:
        t = req.tenant
        self._requests[req.session] = req
        t.waiting[req.cls] += 1
        self._waiting_cls[req.cls] += 1
        self._positions[req.cls].add(req.seq, 1)
        t.push_request(req.cls, (req.arrival, req.seq, req.session))
        self._refresh_queue(t)

    def _dequeue(self, req: Request, refresh: bool = True) -> None:
        t = req.tenant
        if req.earmark is not None:
            self._unearmark(req)
        del self._requests[req.session]
        t.waiting[req.cls] -= 1
        self._waiting_cls[req.cls] -= 1
        self._positions[req.cls].add(req.seq, -1)
        if refresh:
            self._refresh_queue(t)

    def _check_call(
        self, session: SessionId, lease_id: LeaseId, epoch: int, out: list[Decision]
    ) -> LeaseRec | None:
        rec = self._holders.get(session)
        if rec is not None and rec.lease.lease_id == lease_id and rec.lease.epoch == epoch:
            return rec
        other = self._leases.get(lease_id)
        if other is not None and other.lease.session != session:
            out.append(Rejected(session, ErrorCode.NOT_HOLDER, f"lease {lease_id} is not held by {session}"))
        elif rec is not None or session in self._requests:
            now_holds = f"holds {rec.lease.lease_id}" if rec is not None else "is queued"
            out.append(
                Rejected(
                    session,
                    ErrorCode.STALE_EPOCH,
                    f"lease {lease_id} epoch {epoch} is stale: session {session} {now_holds}",
                )
            )
        else:
            out.append(Rejected(session, ErrorCode.NOT_FOUND, f"session {session} holds no lease"))
        return None

    # ------------------------------------------------------------------ slots and accounting

    def _push_free(self, w: WorkerRec, index: int) -> None:
        self._free_ready += 1
        key = (w.seq, index)
        if key not in self._free_in_heap:
            self._free_in_heap.add(key)
            heapq.heappush(self._free, (w.seq, index, w.worker_id))

    def _pop_free(self) -> SlotId:
        # Lowest worker first: packing onto old workers leaves new ones empty to drain.
        while True:
            seq, index, wid = heapq.heappop(self._free)
            self._free_in_heap.discard((seq, index))
            w = self._workers.get(wid)
            if w is not None and w.seq == seq and w.state is WorkerState.READY and index not in w.leases:
                self._free_ready -= 1
                return w.slot_ids[index]

    def _set_capacity(self, capacity: int) -> None:
        self._capacity = capacity
        self._floor = self._policy.pool.floor_slots(capacity)

    def _observe_hold(self, seconds: float) -> None:
        self._mean_hold = 0.9 * self._mean_hold + 0.1 * max(0.0, seconds)
        self._holds_seen = True

    def _position(self, req: Request) -> int:
        ahead = sum(self._waiting_cls[: req.cls])
        return ahead + self._positions[req.cls].prefix(req.seq)

    def _estimate(self, position: int) -> float | None:
        """Expected wait: the slots ahead, drained at capacity / mean hold per second; None before
        any lease has ended (no observed hold to base it on)."""
        if not self._holds_seen:
            return None
        return (position + 1) * self._mean_hold / max(1, self._capacity)

    def _refresh(self, t: TenantState) -> None:
        """Re-index a tenant after a change to what it holds: the floor, its queue, its victims.

        The floor accounting is updated at once (the slack is read mid-pass); heap entries are
        pushed once per tenant when the heaps are next read (their `flush`), so an event that touches
        a tenant twice pays for one re-index."""
        contrib = t.preemptible()
        self._preemptible += contrib - t.preemptible_contrib
        t.preemptible_contrib = contrib
        self._order.dirty[t] = None
        self._victims.dirty[t] = None

    def _refresh_queue(self, t: TenantState) -> None:
        self._order.dirty[t] = None

    def _refresh_victims(self, t: TenantState) -> None:
        self._victims.dirty[t] = None

    # ------------------------------------------------------------------ restore

    def _restore(self, r: CoreRecords) -> None:
        """Load `r` into this fresh core and rebuild every index from it (see `restore`)."""
        # The heaps' staleness checks close over these very dicts: refill them, never replace.
        tenants = self._tenants
        tenants.clear()
        in_policy = {spec.name: spec for spec in self._policy.tenants}
        for spec in r.tenants:
            if spec.name in tenants:
                raise ValueError(f"tenant {spec.name!r} appears twice")
            if spec.name not in r.retired:  # a retired tenant keeps the spec it had
                if spec.name not in in_policy:
                    raise ValueError(f"tenant {spec.name!r} is neither in the policy nor retired")
                spec = in_policy[spec.name]
            tenants[spec.name] = TenantState(spec)
        missing = [n for n in in_policy if n not in tenants or n in r.retired]
        if missing or not r.retired <= tenants.keys():
            raise ValueError(
                f"the core state does not match the policy (tenants {missing or sorted(r.retired)})"
            )
        self._retired = set(r.retired)

        for wr in r.workers:
            self._workers[wr.worker_id] = WorkerRec(wr.worker_id, wr.address, wr.slots, wr.seq, wr.state)
        self._worker_seq = r.worker_seq
        self._epochs = dict(r.epochs)

        for gseq, lr in enumerate(r.leases, start=1):  # tuple order is grant order
            self._restore_lease(lr, gseq)
        self._gseq = len(self._leases)
        self._orphans = dict.fromkeys(r.orphans)
        if any(lid not in self._leases for lid in self._orphans):
            raise ValueError("an orphaned yield names no live lease")

        for rr in r.requests:
            self._restore_request(rr)
        self._order.earmarked[:] = r.earmark_order
        heapq.heapify(self._order.earmarked)

        self._free = list(r.free_slots)
        heapq.heapify(self._free)
        self._free_in_heap = {(seq, index) for seq, index, _ in self._free}
        ready = [w for w in self._workers.values() if w.state is WorkerState.READY]
        self._free_ready = sum(w.slots - len(w.leases) for w in ready)
        self._set_capacity(sum(w.slots for w in ready))
        for t in tenants.values():
            t.preemptible_contrib = t.preemptible()
            self._preemptible += t.preemptible_contrib
            self._refresh(t)  # re-indexed in the heaps on their next read

        self._expiries = list(r.expiries)
        heapq.heapify(self._expiries)
        self._yield_deadlines = list(r.yield_deadlines)
        heapq.heapify(self._yield_deadlines)
        self._maturing = deque(r.maturing)
        self._seq = r.seq
        self._now = r.now
        self._mean_hold = r.mean_hold_s
        self._holds_seen = r.holds_seen

    def _restore_lease(self, lr: LeaseRecord, gseq: int) -> None:
        lease, state = lr.lease, lr.state
        lid, cls = lease.lease_id, CLASS_INDEX[lease.qos]
        t = self._tenants.get(lease.tenant)
        w = self._workers.get(lease.slot.worker)
        if t is None or w is None or not 0 <= lease.slot.index < w.slots:
            raise ValueError(f"lease {lid} names an unknown tenant, worker or slot")
        if state not in (LeaseState.ACTIVE, LeaseState.YIELDING):
            raise ValueError(f"lease {lid} is {state.value}: only live leases are state")
        rec = LeaseRec(
            lease, t, cls, state, lr.arrival, lr.seq, w, lr.for_session, lr.borrowing, gseq, lr.matured
        )
        yielding = state is LeaseState.YIELDING
        if yielding:
            if lr.yield_deadline is None:
                raise ValueError(f"yielding lease {lid} has no yield deadline")
            rec.yield_deadline = lr.yield_deadline
        if lease.slot.index in w.leases or lid in self._leases or lease.session in self._holders:
            raise ValueError(f"lease {lid} collides with another lease")
        w.leases[lease.slot.index] = lid
        self._leases[lid] = rec
        self._holders[lease.session] = rec
        t.held[cls] += 1
        t.yielding[cls] += int(yielding)
        if cls == G:
            self._held_g += 1
        if cls == B and lr.borrowing:
            t.b_borrowing += 1
            t.b_borrowing_yielding += int(yielding)
        if lr.candidate:
            t.candidates[cls][lid] = lease.granted_at
        if lr.mature:
            t.mature[cls][lid] = lease.granted_at
            self._mature_n += 1

    def _restore_request(self, rr: RequestRecord) -> None:
        t = self._tenants.get(rr.tenant)
        if t is None:
            raise ValueError(f"request of session {rr.session} names an unknown tenant {rr.tenant!r}")
        cls = CLASS_INDEX[rr.qos]
        req = Request(
            rr.session,
            t,
            cls,
            rr.arrival,
            rr.seq,
            rr.enqueued_at,
            rr.resume_from,
            rr.earmark,
            rr.earmark_tier,
        )
        if req.session in self._requests or req.session in self._holders:
            raise ValueError(f"session {req.session} is queued twice or queued and holding")
        self._requests[req.session] = req
        t.waiting[cls] += 1
        self._waiting_cls[cls] += 1
        self._positions[cls].add(req.seq, 1)
        if req.earmark is None:
            t.push_request(cls, (req.arrival, req.seq, req.session))
        else:
            t.earmarked[cls] += 1
            if req.earmark_tier == TIER_SHARED:
                t.earmarked_fair += 1
            elif req.earmark_tier == TIER_NOMINAL:
                self._inflight_nominal += 1
