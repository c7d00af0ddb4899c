"""The policy core: one deterministic state machine that decides who holds, waits and yields.

`Core.handle(event, now)` applies one event at time `now` and returns the decisions it caused,
in these steps (the methods below follow this order):
  1. timers due by `now` fire in time order, the slots freed at each instant handed out before
     the next (as a tick then would have): lease expiries, maturity for fairness preemption,
     yield deadlines (`_advance`; the heaps are timers.py's, and after an outage
     `Timers.resume` first moves them out);
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
Both pass steps read heads of indexed heaps: a decision costs O(log queued + log tenants). The
state, and every change to it with its accounting (grant, end, yield, earmark, free slots), is
`Ledger`'s (ledger.py): this module only decides. The weighted share is `TenantState.share`
(tenants.py); the views adapters read are views.py's; the state as records (`export_records` /
`from_records`) is records.py's, read and loaded by restore.py; the core knows no document (a
state snapshot is scheduler/state/state_write.py's and state_read.py's).

A yield exists for a waiter. When the waiter leaves (withdrawn, granted another slot, its right
gone with a policy change), its victim is made ACTIVE again at once and the pass runs: a waiter
with a right to that very lease takes the yield over (it stays under way, same deadline, and the
holder hears nothing); otherwise the event ends with `YieldCancelled` for it. So no lease is
revoked, and no yield frees a slot, for a waiter that is not there. When the victim's slot frees,
its waiter keeps its earmark through the pass, so the slot goes to it, not back to the victim's
holder re-queued in the same tier (`_landed`)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from scheduler.core import restore
from scheduler.core.ledger import Ledger
from scheduler.core.lifecycle import LeaseState, WorkerState, check_worker
from scheduler.core.model import LeaseRec, Request, WorkerRec
from scheduler.core.order import TIER_BEST_EFFORT, TIER_GUARANTEED, TIER_NOMINAL, TIER_SHARED
from scheduler.core.records import CoreRecords
from scheduler.core.tenants import BE, CLASS_INDEX, CLASSES, B, G, TenantState
from scheduler.core.types import (
    Acquire,
    Decision,
    Ended,
    EndReason,
    ErrorCode,
    Event,
    Expired,
    Lease,
    LeaseId,
    Refused,
    RefuseReason,
    Rejected,
    Release,
    Renew,
    Renewed,
    Resumed,
    RevokeReason,
    SessionId,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerDraining,
    WorkerRemoved,
    Yield,
    YieldCause,
)
from scheduler.core.victims import add_candidate, may_take
from scheduler.core.views import PoolView, SessionView, TenantView, WorkerView
from scheduler.policy.model import Policy

__all__ = ["Core", "PoolView", "SessionView", "TenantView", "WorkerView"]  # views: old import path

_RETRY_UNKNOWN_S = 5.0  # retry-after for a refusal before any hold has been observed
_CAUSES = {
    TIER_GUARANTEED: YieldCause.GUARANTEED,
    TIER_NOMINAL: YieldCause.NOMINAL,
    TIER_SHARED: YieldCause.FAIR_SHARE,
    TIER_BEST_EFFORT: YieldCause.FAIR_SHARE,
}


class Core(Ledger):
    """The scheduler's state machine: the ledger's state (ledger.py) and the decisions."""

    # ------------------------------------------------------------------ public API

    @property
    def policy(self) -> Policy:
        return self._policy

    def export_records(self) -> CoreRecords:
        """The logical state (records.py), for `from_records`. Call between events only."""
        return restore.export_records(self)

    def capture(self) -> restore.Capture:
        """`export_records` in two steps: this cheap consistent copy between events, then
        `restore.records_of(capture)` in any thread (a state snapshot off the event loop)."""
        return restore.capture(self)

    @classmethod
    def from_records(cls, policy: Policy, records: CoreRecords) -> Core:
        """A core whose future behaviour is that of the core `records` were exported from, under
        the policy it ran under; ValueError if they do not fit the policy or each other."""
        core = cls(policy)
        restore.load_records(core, records)
        return core

    def handle(self, event: Event, now: float) -> list[Decision]:
        """Apply one event at time `now`; return every decision it caused, in order."""
        now = max(now, self._now)
        self._now = now
        out: list[Decision] = []
        if isinstance(event, Resumed):
            self._timers.resume(
                event.since, now, self._ttl
            )  # before the timers: the outage must not fire them
        if self._orphans:
            self._adopt_orphans()  # before the timers: no deadline may revoke them now
        # The state is quiescent after every event (the pass ran to completion), so a pass is
        # needed only when timers fired or the event can open a slot or a right to one: not for
        # a Tick at which nothing fired (a stale timer's, as a cancelled yield's deadline).
        sampled = now >= self._usage_next and self._sample_usage(now)
        need_pass = self._advance(now, out) or bool(self._cancelled) or sampled
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
            need_pass = need_pass or self._pass_owed
            self._pass_owed = False
        elif isinstance(event, WorkerAdded):
            self._worker_added(event, out)
        elif isinstance(event, WorkerDraining):
            self._worker_draining(event, now, out)
        elif isinstance(event, WorkerRemoved):
            self._worker_removed(event, now, out)
        if need_pass or not isinstance(event, Acquire | Renew | Tick):
            self._schedule(now, out)
            if self._lent:
                self._promote_lent()
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
        self._take_policy(policy)
        self._set_usage_policy(now)
        self._order.window = policy.fairness.share_window_s  # every tenant is re-indexed below
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
        self._pass_owed = True  # the quotas changed: the state is not quiescent under them
        return self.handle(Tick(), now)

    def next_deadline(self) -> float | None:
        """The earliest time at which a Tick would change something (timers, and the next usage
        sample while a fairness waiter could gain from it), if any."""
        return self._timers.next_deadline(self._order.fairness_waiter, self._usage_next)

    def deadline_bound(self) -> float | None:
        """No later than `next_deadline` (None only if that is None), and cheaper: no flush."""
        at = self._timers.earliest  # after every event of every pool (pools.py): no calls
        if self._usage_next < at:
            at = self._usage_next
        return None if at == math.inf else at

    # ------------------------------------------------------------------ views

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
                self._pool_name,
            )
        req = self._requests.get(session)
        if req is None:
            return None
        q = self._queued_of(req)  # the stream's Queued and this view: one answer
        return SessionView(
            session,
            TenantName(req.tenant.name),
            CLASSES[req.cls].value,
            "queued",
            None,
            q.position,
            q.estimated_wait_s,
            req.resume_from,
            req.enqueued_at,
            q.pool,
            q.reason.value,
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

    def describe(self, now: float | None = None) -> PoolView:
        """The pool now (`now`: a later time than its last event, for ages and waits)."""
        now = self._now if now is None else max(self._now, now)
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
        tenants = tuple(t.view() for t in self._tenants.values())
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
            self._pool_name,
        )

    # ------------------------------------------------------------------ step 1: timers

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
        timers = self._timers
        fired = False
        while (at := timers.next_due(now)) is not None:
            freed = False
            for rec in timers.expired(at):
                self._end_lease(rec, LeaseState.EXPIRED)
                out.append(Expired(rec.lease, now - rec.lease.granted_at))
                freed = True
            matured = False
            for rec in timers.matured(at):
                rec.matured = True  # kept while it yields, for when the yield is cancelled
                t = rec.tenant
                if rec.lease.lease_id in t.candidates[rec.cls]:
                    add_candidate(rec, self._leases, mature=True)
                    self._mature_n += 1
                    self._refresh_victims(t)
                    matured = True
            if freed and timers.deadline_due(at):
                self._schedule(now, out, preempt=False)
            revoked = False
            for rec in timers.overdue(at):
                self._revoke(rec, RevokeReason.YIELD_DEADLINE, now, out)
                revoked = True
            if freed or revoked:
                # Served before the event and later timers: the event may take the slot away
                # (its worker removed), as it would have after a tick at `at`.
                self._schedule(now, out, preempt=False)
            fired = fired or freed or matured or revoked
        return fired

    # ------------------------------------------------------------------ step 2: the event

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
            msg = f"tenant {t.name!r} has no {ev.qos.value} quota in pool {self._pool_name!r}"
            out.append(Refused(s, RefuseReason.NO_QUOTA, msg, pool=self._pool_name))
            return False
        # Granted in this event iff a slot is free and the tenant is below its limit for the
        # class: between events no waiter could take a free slot (the pass ran), so none is
        # ahead of it. Any other request waits, for whatever reason, and meets the caps.
        limit = t.quota(cls)
        at_once = self._free_ready > 0 and (limit is None or t.held[cls] + t.earmarked[cls] < limit)
        if not at_once:
            refusal = self._cap_refusal(s, t, cls)
            if refusal is not None:
                out.append(refusal)
                return False
        self._seq += 1
        req = Request(s, t, cls, now, self._seq, now, ev.resume_from)
        if at_once and not self._requests:  # nobody waits: no pass needed to find it first
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
        q = self._queue
        frac = q.best_effort_fraction if cls == BE else 1.0
        pending = sum(self._waiting_cls)
        if pending >= q.max_pending * frac:
            reason = RefuseReason.QUEUE_FULL
            msg = f"pool queue holds {pending} of {q.max_pending} (pool {self._pool_name!r})"
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
        return Refused(s, reason, msg, retry_after_s=retry, estimated_wait_s=est, pool=self._pool_name)

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

    def _yield(self, ev: Yield, now: float, out: list[Decision]) -> None:
        if self._late_yield(ev, out):  # revoked at its deadline: the snapshot still counts
            return
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
        bad = [i for i, _ in ev.epochs if not 0 <= i < ev.slots]
        if bad:
            out.append(Rejected(None, ErrorCode.INVALID, f"worker {ev.worker} has no slot {bad[0]}"))
            return
        self._raise_epochs(ev.worker, ev.epochs)
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

    # ------------------------------------------------------------------ step 3: the pass

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
            if not self._landed or not self._back_in_line():
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

    def _be_first(self) -> bool:
        """BestEffort waits and holds less than its minimum share of the borrowed slots: its
        fairness rights may take Burstable victims, so Burstable never starves it."""
        return bool(self._waiting_cls[BE]) and (self._held_be < self._be_min_share * self._preemptible)

    def _preempt_once(self, now: float, out: list[Decision]) -> bool:
        """Ask one victim to yield for the first waiter with a right to a slot; False if none."""
        if self._lent:
            self._promote_lent()  # a lent lease the floor can spare is not a victim: promoted
        fairness = self._mature_n > 0
        be_first = fairness and self._be_first()  # a BestEffort right takes Burstable only then
        rights = self._order.with_right(lambda: self._slack() - self._inflight_nominal >= 1, fairness)
        return bool(rights) and any(self._preempt_for(req, tier, be_first, now, out) for tier, req in rights)

    def _preempt_for(self, req: Request, tier: int, be_first: bool, now: float, out: list[Decision]) -> bool:
        fairness = tier >= TIER_SHARED
        burstable = tier != TIER_BEST_EFFORT or be_first  # BestEffort takes Burstable only then
        victim = self._under_way_for(req, fairness, burstable) if self._cancelled else None
        if victim is None:
            victim = (
                self._victims.fair_victim(req.tenant, burstable)
                if fairness
                else self._victims.any_victim(req.tenant)
            )
        if victim is None:
            return False
        self._earmark(req, victim, tier)
        deadline = now + self._policy.timing.yield_grace_s
        self._ask_to_yield(victim, deadline, _CAUSES[tier], req.session, out)
        return True

    def _under_way_for(self, req: Request, fairness: bool, burstable: bool) -> LeaseRec | None:
        """A lease whose yield was cancelled in this event and that `req` has a right to
        (`victims.may_take`): taking it over keeps the yield under way instead of starting
        another. Only this event's cancellations are looked at."""
        for lid in self._cancelled:
            rec = self._leases.get(lid)
            if (
                rec is not None
                and rec.state is LeaseState.ACTIVE
                and may_take(req.tenant, rec, fairness, burstable, self._victims.margin)
            ):
                return rec
        return None
