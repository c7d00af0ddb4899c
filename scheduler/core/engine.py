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
kept by the same class, below the decisions ("the state and its bookkeeping"): one concept, one
class, so the rule of 600 lines names this file (tests/test_architecture.py). The weighted
share is `TenantState.share` (tenants.py); the views adapters read are views.py's; the state as
records (`export_records` /
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

import dataclasses
import heapq
import math
from collections.abc import Iterator

from scheduler.core import restore
from scheduler.core.indexes import PositionCounts
from scheduler.core.lifecycle import LeaseState, WorkerState, check_lease, check_worker
from scheduler.core.model import LeaseRec, Request, WorkerRec
from scheduler.core.order import TIER_BEST_EFFORT, TIER_GUARANTEED, TIER_NOMINAL, TIER_SHARED, ServiceOrder
from scheduler.core.records import CoreRecords
from scheduler.core.tenants import BE, CLASS_INDEX, CLASSES, B, G, TenantState
from scheduler.core.timers import Timers
from scheduler.core.types import (
    Acquire,
    BlockedReason,
    Decision,
    Ended,
    EndReason,
    ErrorCode,
    Event,
    Expired,
    Granted,
    LateSnapshot,
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
from scheduler.core.victims import VictimIndex, add_candidate, may_take
from scheduler.core.views import PoolView, SessionView, TenantView, WorkerView
from scheduler.policy.model import Policy

_DEFAULT_MEAN_HOLD_S = 60.0
# A renewal that moves a lease's expiry moves it to now + TTL + this many TTLs (`Core._renew`).
RENEW_STEP_TTLS = 0.5
# Read on every grant, end and queued request: an enum member read off its class is a slow
# attribute lookup in CPython 3.11 (about 60 ns, ten times a global's).
_ACTIVE, _YIELDING, _READY = LeaseState.ACTIVE, LeaseState.YIELDING, WorkerState.READY
_LIMIT, _PENDING = BlockedReason.TENANT_LIMIT, BlockedReason.YIELD_PENDING
_QUOTA, _EXHAUSTED = BlockedReason.TENANT_QUOTA, BlockedReason.POOL_EXHAUSTED
_RELEASED, _BY_RELEASE = LeaseState.RELEASED, EndReason.RELEASED
_new_tuple = tuple.__new__  # builds a NamedTuple decision of every churn from all its fields (`_grant`)

__all__ = ["Core", "PoolView", "SessionView", "TenantView", "WorkerView"]  # views: old import path

_RETRY_UNKNOWN_S = 5.0  # retry-after for a refusal before any hold has been observed
_CAUSES = {
    TIER_GUARANTEED: YieldCause.GUARANTEED,
    TIER_NOMINAL: YieldCause.NOMINAL,
    TIER_SHARED: YieldCause.FAIR_SHARE,
    TIER_BEST_EFFORT: YieldCause.FAIR_SHARE,
}


class Core:
    """The scheduler's state machine: its state, the bookkeeping of every change to it, and the
    decisions (one loop owns it: not thread-safe by design)."""

    def __init__(self, policy: Policy) -> None:
        # Every field of the core's state (restore.py reads and fills them).
        self._pool_name = policy.pool.name  # stamped on its leases and Queued
        self._take_policy(policy)
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
        self._positions = (PositionCounts(), PositionCounts(), PositionCounts())
        self._seq = 0
        self._now = float("-inf")
        self._mean_hold = _DEFAULT_MEAN_HOLD_S  # a prior for the autoscaler's drain time
        self._holds_seen = False  # until then, waits are not estimated (the prior is no evidence)
        self._to_report: list[Request] = []
        self._pass_owed = False  # a change outside an event (a new policy): the next Tick's pass
        self._mature_n = 0  # mature candidates: none means no fairness preemption is possible
        self._held_be = 0  # BestEffort leases held (against its minimum share of the borrowed)
        self._preempt_seq = 0  # counts preemptions: victim ties go to the least recently preempted
        # Tenants holding a Burstable lease lent from the floor while below nominal: promoted as
        # soon as the floor can spare it (`Core._promote_lent`).
        self._lent: dict[TenantState, None] = {}
        self._usage_on = policy.fairness.usage_half_life_s > 0
        self._usage_next = float("-inf")  # the next usage sample (spec.fairness)
        self._usage_last = float("-inf")  # the last one

        self._order = ServiceOrder(self._tenants, self._requests, policy.fairness.share_window_s)
        self._victims = VictimIndex(self._tenants, self._leases)
        self._victims.margin = 1.0 if self._usage_on else 0.0
        self._timers = Timers(self._leases)
        for spec in policy.tenants:
            self._tenants[spec.name] = TenantState(spec)

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
        if now < self._now:
            now = self._now
        # Dispatch on the exact type (events are final classes): a chain of isinstance tests,
        # and a union's, cost more than the step itself on a follower's grant/release churn.
        kind = type(event)
        if kind is Renew and event.until is None:  # type: ignore[union-attr]
            quiet = self._quiet_renew(event, now)  # type: ignore[arg-type]
            if quiet is not None:
                return quiet
        self._now = now
        out: list[Decision] = []
        if kind is Resumed:
            since: float = event.since  # type: ignore[union-attr]
            self._timers.resume(since, now, self._ttl)  # before the timers: the outage must not fire them
        if self._orphans:
            self._adopt_orphans()  # before the timers: no deadline may revoke them now
        # The state is quiescent after every event (the pass ran to completion), so a pass is
        # needed only when timers fired or the event can open a slot or a right to one: not for
        # a Tick at which nothing fired (a stale timer's, as a cancelled yield's deadline).
        sampled = now >= self._usage_next and self._sample_usage(now)
        fired = self._timers.earliest <= now and self._advance(now, out)  # mostly nothing due
        need_pass = fired or bool(self._cancelled) or sampled
        if kind is Acquire:
            need_pass = self._acquire(event, now, out) or need_pass  # type: ignore[arg-type]
        elif kind is Release:
            self._release(event, now, out)  # type: ignore[arg-type]
            need_pass = True
        elif kind is Renew:
            self._renew(event, now, out)  # type: ignore[arg-type]
        elif kind is Yield:
            self._yield(event, now, out)  # type: ignore[arg-type]
        elif kind is Tick:
            need_pass = need_pass or self._pass_owed
            self._pass_owed = False
        elif kind is WorkerAdded:
            self._worker_added(event, out)  # type: ignore[arg-type]
        elif kind is WorkerDraining:
            self._worker_draining(event, now, out)  # type: ignore[arg-type]
        elif kind is WorkerRemoved:
            self._worker_removed(event, now, out)  # type: ignore[arg-type]
        if need_pass or not (kind is Acquire or kind is Renew or kind is Tick):
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
        limit = t.quota(cls)
        if limit is not None and limit <= 0:  # `t.class_allowed(cls)`, without a second quota()
            msg = f"tenant {t.name!r} has no {ev.qos.value} quota in pool {self._pool_name!r}"
            out.append(Refused(s, RefuseReason.NO_QUOTA, msg, pool=self._pool_name))
            return False
        # Granted in this event iff a slot is free and the tenant is below its limit for the
        # class: between events no waiter could take a free slot (the pass ran), so none is
        # ahead of it. Any other request waits, for whatever reason, and meets the caps.
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
        self._end_lease(rec, _RELEASED)
        out.append(_new_tuple(Ended, (ev.session, _BY_RELEASE, rec.lease)))  # as a Lease in `_grant`

    def _renew(self, ev: Renew, now: float, out: list[Decision]) -> None:
        """The expiry moves in steps: a renewal that finds it already at or past now + TTL leaves
        it; one that must move it moves it to now + TTL + a step (`_renew_step`). So most
        renewals change nothing and are not journaled (`Renewed.quiet`), and a session that stops
        renewing keeps its slot up to a step past its TTL (docs/design.md, "Leases")."""
        rec = self._check_call(ev.session, ev.lease_id, ev.epoch, out)
        if rec is None:
            return
        lease = rec.lease
        if ev.until is not None:  # replayed: the expiry its leader set (0.0: before steps, exact)
            expires = max(now + self._ttl, ev.until)
        elif now + self._ttl <= lease.expires_at:
            expires = lease.expires_at
        else:
            expires = now + self._ttl + self._renew_step
        if expires != lease.expires_at:
            rec.lease = lease = lease._replace(expires_at=expires)
        out.append(Renewed(lease))

    def _quiet_renew(self, ev: Renew, now: float) -> list[Decision] | None:
        """`handle` for a renewal that changes nothing: held, its expiry already at or past now +
        TTL, and nothing due by `now` (no timer, no usage sample, no orphan, no cancelled yield),
        so the event is only read. None: take the whole path. What the path would do for it, in
        a few comparisons: most renewals at scale are these (`Renewed.quiet`: not journaled)."""
        if self._timers.earliest <= now or now >= self._usage_next or self._orphans or self._cancelled:
            return None
        rec = self._holders.get(ev.session)
        if rec is None:
            return None
        lease = rec.lease
        if lease.lease_id != ev.lease_id or lease.epoch != ev.epoch or now + self._ttl > lease.expires_at:
            return None
        self._now = now
        return [Renewed(lease, True)]

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

    # ------------------------------------------------------------------ the state and its bookkeeping
    # The core's state and its bookkeeping: every change to who holds, who waits and who yields,
    # with the counters and indexes kept in step (the floor's slack, the tenants' counts, the order
    # of service, the victim heaps, the free-slot heap, the timers), the tenants' usage over time
    # (`_sample_usage`) and the promotion of leases lent from the floor (`_promote_lent`).

    def _take_policy(self, policy: Policy) -> None:
        """`policy`, and what every event reads of it kept at hand: with many pools each core's
        policy is an object of its own, one more to fetch per event."""
        self._policy = policy
        self._ttl = policy.timing.lease_ttl_s
        # How far a renewal that moves the expiry moves it past now + TTL (`_renew`): half a TTL,
        # so of renewals every third of a TTL (the SDK's) every other one changes nothing.
        self._renew_step = self._ttl * RENEW_STEP_TTLS
        self._min_runtime = policy.timing.min_runtime_s
        self._queue = policy.queue
        self._be_min_share = policy.fairness.best_effort_min_share

    def _raise_epochs(self, worker: WorkerId, seen: tuple[tuple[int, int], ...]) -> None:
        """Each slot's epoch counter to at least what the worker reports having seen on it.

        Why: epochs are fencing tokens, and the worker refuses any older than one it accepted; a
        core that lost its state (a restart in memory) would count from 1 again. Never lowered:
        the counter may be ahead already (restored state, or kept across a removal)."""
        for index, epoch in seen:
            slot = SlotId(worker, index)
            if epoch > self._epochs.get(slot, 0):
                self._epochs[slot] = epoch

    # ------------------------------------------------------------------ what pools.py asks

    def stamp_pool(self) -> None:
        """Every lease names this core's pool (records hold no pool: the document's part does)."""
        for rec in self._leases.values():
            if rec.lease.pool != self._pool_name:
                rec.lease = rec.lease._replace(pool=self._pool_name)

    def has_session(self, session: SessionId) -> bool:
        return session in self._requests or session in self._holders

    def session_ids(self) -> list[SessionId]:
        return [*self._requests, *self._holders]

    def has_worker(self, worker: WorkerId) -> bool:
        return worker in self._workers

    def worker_ids(self) -> list[WorkerId]:
        return list(self._workers)

    def room_for(self, tenant: str, qos: QoS) -> bool:
        """Whether a request of `tenant` in class `qos` would find a slot free for it here now:
        a ready slot free and the tenant below its limit for the class."""
        t = self._tenants.get(tenant)
        if self._free_ready == 0 or t is None or tenant in self._retired:
            return False
        cls = CLASS_INDEX[qos]
        limit = t.quota(cls)
        return limit is None or t.held[cls] + t.waiting[cls] < limit

    # ------------------------------------------------------------------ leases and the queue

    def _grant(
        self, req: Request, slot: SlotId, now: float, out: list[Decision], queued: bool = True
    ) -> None:
        t = req.tenant
        if queued:
            self._dequeue(req, refresh=False)
        epoch = self._epochs.get(slot, 0) + 1
        self._epochs[slot] = epoch
        # No NewType calls here: LeaseId and TenantName are str at run time (a call each per grant).
        lid: LeaseId = f"{slot.worker}/{slot.index}#{epoch}"  # type: ignore[assignment]
        cls = req.cls
        # Every field, in order, built as the tuple it is: a NamedTuple's own __new__ is a Python
        # frame, about half of what building it costs.
        lease: Lease = _new_tuple(
            Lease,
            (
                lid,
                req.session,
                t.name,
                CLASSES[cls],
                slot,
                epoch,
                now,
                now + self._ttl,
                req.resume_from,
                self._pool_name,
            ),
        )
        w = self._workers[slot.worker]
        # A Burstable lease within nominal is unpreemptible, so it is one only if the floor still
        # holds with this slot taken (slack >= 0 now); otherwise the slot is lent as borrowing.
        borrowing = cls == BE or (
            cls == B and not (t.held[B] - t.b_borrowing < t.spec.burstable_nominal and self._slack() >= 0)
        )
        self._gseq += 1
        rec = LeaseRec(
            lease,
            t,
            cls,
            _ACTIVE,
            req.arrival,
            req.seq,
            w,
            None,
            borrowing,
            self._gseq,
            False,
            None,
            req.preempted,
        )
        w.leases[slot.index] = lid
        self._leases[lid] = rec
        self._holders[req.session] = rec
        t.held[cls] += 1
        if cls == G:
            self._held_g += 1
        elif cls == B and not borrowing:
            pass
        else:
            if cls == B:
                t.b_borrowing += 1
            else:
                self._held_be += 1
            # The newest grant: last in grant order; its pick entry waits for a read (first_pick).
            t.candidates[cls][lid] = now
            self._timers.push_maturing(now + self._min_runtime, lid, epoch)
        self._timers.push_expiry(lease.expires_at, lid, epoch)
        self._refresh(t)
        out.append(_new_tuple(Granted, (lease, now - req.enqueued_at)))

    def _end_lease(self, rec: LeaseRec, state: LeaseState) -> None:
        was_yielding = rec.state is _YIELDING
        rec.state = check_lease(rec.state, state)
        lease = rec.lease
        t, cls, lid = rec.tenant, rec.cls, lease.lease_id
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
        elif cls == BE:
            self._held_be -= 1
        del self._leases[lid]
        del self._holders[lease.session]
        if self._cancelled:
            self._cancelled.pop(lid, None)  # it ends: its own decision says so
        if self._orphans:
            self._orphans.pop(lid, None)
        w = rec.worker
        index = lease.slot.index
        del w.leases[index]
        if w.state is _READY:
            self._push_free(w, index)
        if rec.for_session is not None:
            waiter = self._requests.get(rec.for_session)
            if waiter is not None and waiter.earmark == lid:
                if w.state is _READY:
                    # The slot it waited for is free now: the waiter keeps its earmark through
                    # the pass, so it goes ahead of its own tier and the tiers after it (back in
                    # line, an older session of its tier, the holder re-queued among them,
                    # would take the slot back). If a higher tier takes it, the pass puts the
                    # waiter back in line (`_schedule`).
                    self._landed.append(waiter)
                else:
                    self._unearmark(waiter)  # the slot goes with its worker
                    self._refresh_queue(waiter.tenant)
        if cls == B and not rec.borrowing and t.candidates[B]:  # `_promote`'s first test, inline
            self._promote(t)
        self._refresh(t)

    def _promote(self, t: TenantState, reserve: int = 0) -> bool:
        """The tenant's oldest borrowing Burstable lease becomes nominal, if the tenant is below
        its nominal and the floor can spare it (keeping `reserve` slots of slack): it stops being
        preemptible. True if one was."""
        cands = t.candidates[B]
        if not cands or t.b_nominal_held() >= t.spec.burstable_nominal or self._slack() - reserve < 1:
            return False
        lid = next(iter(cands))
        del cands[lid]
        if t.mature[B].pop(lid, None) is not None:
            self._mature_n -= 1
        self._leases[lid].borrowing = False
        t.b_borrowing -= 1
        self._refresh(t)
        return True

    def _set_usage_policy(self, now: float) -> None:
        """Usage over time under a new policy: off, it is dropped (the share is what is held
        now); turned on, it counts from now; a new min runtime rescales it into slots."""
        on = self._policy.fairness.usage_half_life_s > 0
        if not on:
            self._usage_next = float("inf")
        elif not self._usage_on:
            self._usage_next = self._usage_last = now
            for t in self._tenants.values():
                t.usage_acc, t.usage_at = 0.0, now
        self._usage_on = on
        self._victims.margin = 1.0 if on else 0.0  # no ping-pong (`less_than_or_equal_to_final_share`)
        horizon = max(1.0, self._min_runtime)  # the share counts usage in slots of min runtime
        for t in self._tenants.values():
            if not on:
                t.usage = t.usage_acc = 0.0
            t.usage_slots = t.usage / horizon

    def _sample_usage(self, now: float) -> bool:
        """Decay every tenant's usage by the time since the last sample and add the borrowed
        slot-seconds it held since (spec.fairness, as Kueue samples admission usage); True if the
        shares changed. Between samples the usage stands still, so the heaps' keys stay true."""
        f = self._policy.fairness
        if f.usage_half_life_s <= 0:
            self._usage_next = float("inf")
            return False
        horizon = max(1.0, self._min_runtime)  # usage is counted in slots of one min runtime
        decay = (
            0.5 ** ((now - self._usage_last) / f.usage_half_life_s)
            if self._usage_last > float("-inf")
            else 0.0
        )
        changed = False
        for t in self._tenants.values():
            if t.preemptible_contrib:
                t.usage_acc += t.preemptible_contrib * (now - t.usage_at)
            t.usage_at = now
            if t.usage or t.usage_acc:
                u = t.usage * decay + t.usage_acc
                t.usage = u if u > 1e-9 else 0.0
                t.usage_acc = 0.0
                t.usage_slots = t.usage / horizon
                self._refresh_queue(t)
                self._refresh_victims(t)
                changed = True
        self._usage_last = now
        self._usage_next = now + f.usage_sampling_s
        return changed

    def _promote_lent(self) -> None:
        """Burstable leases lent from the floor to tenants below nominal become nominal as soon
        as the floor can spare them (slack beyond the nominal yields in flight), not only when a
        nominal lease of the tenant ends: a lent lease left preemptible would be asked to yield
        for a waiter that its own promotion had room for."""
        for t in list(self._lent):
            while self._promote(t, reserve=self._inflight_nominal):
                pass
            if self._slack() - self._inflight_nominal < 1:
                return

    def _revoke(self, rec: LeaseRec, reason: RevokeReason, now: float, out: list[Decision]) -> None:
        self._end_lease(rec, LeaseState.REVOKED)
        slot = rec.lease.slot
        self._epochs[slot] = self._epochs.get(slot, 0) + 1  # fence: the old epoch is dead now
        out.append(Revoked(rec.lease, reason, now - rec.lease.granted_at))
        self._requeue(rec, rec.lease.resume_from, now, out)
        req = self._requests.get(rec.lease.session)
        if req is not None:  # set in the event that made it (a state capture comes between events)
            req.revoked = (rec.lease.lease_id, rec.lease.epoch)

    def _requeue(self, rec: LeaseRec, snap: SnapshotRef | None, now: float, out: list[Decision]) -> None:
        req = Request(rec.lease.session, rec.tenant, rec.cls, rec.arrival, rec.seq, now, snap)
        req.preempted = rec.preempted
        self._enqueue(req)
        self._to_report.append(req)

    def _late_yield(self, ev: Yield, out: list[Decision]) -> bool:
        """Whether `ev` yields the lease whose revocation queued its session (then handled here)."""
        req = self._requests.get(ev.session)
        if req is None or req.revoked != (ev.lease_id, ev.epoch):
            return False
        self._late_snapshot(req, ev, out)
        return True

    def _late_snapshot(self, req: Request, ev: Yield, out: list[Decision]) -> None:
        """A Yield of the lease whose revocation queued `req` (docs/design.md, "Checkpoint-and-yield
        preemption", step 4): its snapshot, if it brings one, is the one the session resumes from.
        The request is replaced, not changed (a state capture may share it); it keeps its place."""
        if ev.snapshot is not None:
            late = dataclasses.replace(req, resume_from=ev.snapshot)
            self._requests[req.session] = late
            out.append(LateSnapshot(req.session, ev.lease_id, ev.epoch, ev.snapshot))
            req = late
        self._to_report.append(req)  # the caller is told its place in the queue

    def _report_queued(self, req: Request, out: list[Decision]) -> None:
        if self._requests.get(req.session) is req:
            out.append(self._queued_of(req))

    def queued(self, session: SessionId) -> Queued | None:
        """What a waiter is told now (None: not waiting here). The one answer to "where and why
        do I wait": the Queued decisions, the session view (GetSession, ListQueue) and every
        Queued the server sends later (a refresh, a re-attach) are all `_queued_of`'s."""
        req = self._requests.get(session)
        return None if req is None else self._queued_of(req)

    def _queued_of(self, req: Request) -> Queued:
        pos = self._position(req)
        return Queued(req.session, pos, self._estimate(pos), self._pool_name, self._blocked(req))

    def _blocked(self, req: Request) -> BlockedReason:
        """Why `req` waits (docs/design.md, "Why a session waits"), first that applies: the one
        reason function (`_queued_of`)."""
        t, cls = req.tenant, req.cls
        spec = t.spec  # `t.quota(cls)` and `t.b_nominal_held()` inline: one Queued an arrival
        limit = spec.best_effort_limit if cls == BE else spec.burstable_limit if cls == B else spec.guaranteed
        if limit is not None and t.held[cls] >= limit:
            return _LIMIT
        if req.earmark is not None:
            return _PENDING
        if cls == BE or (cls == B and t.held[B] - t.b_borrowing >= spec.burstable_nominal):
            return _QUOTA
        return _EXHAUSTED

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

    # ------------------------------------------------------------------ yields and earmarks

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
        if cause is not YieldCause.DRAIN:  # a drain is no choice among victims
            self._preempt_seq += 1
            rec.preempted = t.last_preempted = self._preempt_seq
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
            self._timers.push_deadline(deadline, lid, rec.lease.epoch)
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
            add_candidate(rec, self._leases)
            if rec.matured:
                add_candidate(rec, self._leases, mature=True)
                self._mature_n += 1
        self._cancelled[lid] = None
        self._refresh(t)

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
        if tier >= TIER_SHARED:
            t.earmarked_fair += 1
        elif tier == TIER_NOMINAL:
            self._inflight_nominal += 1
        self._order.push_earmarked(req)
        self._refresh_queue(t)

    def _unearmark(self, req: Request) -> None:
        t = req.tenant
        t.earmarked[req.cls] -= 1
        if req.earmark_tier >= TIER_SHARED:
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

    # ------------------------------------------------------------------ slots, the floor and waits

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
            if w is not None and w.seq == seq and w.state is _READY and index not in w.leases:
                self._free_ready -= 1
                return w.slot_ids[index]

    def _set_capacity(self, capacity: int) -> None:
        self._capacity = capacity
        self._floor = self._policy.pool.floor_slots(capacity)

    def _slack(self) -> int:
        """How far the floor invariant holds above its bound (>= 0 whenever it holds)."""
        return self._free_ready + self._preemptible - max(0, self._floor - self._held_g)

    def _observe_hold(self, seconds: float) -> None:
        self._mean_hold = 0.9 * self._mean_hold + 0.1 * (seconds if seconds > 0.0 else 0.0)  # no max() call
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

    # ------------------------------------------------------------------ re-indexing

    def _refresh(self, t: TenantState) -> None:
        """Re-index a tenant after a change to what it holds: the floor, its queue, its victims.

        The floor accounting is updated at once (the slack is read mid-pass); heap entries are
        pushed once per tenant when the heaps are next read (their `flush`), so an event that touches
        a tenant twice pays for one re-index."""
        borrowing = t.b_borrowing
        contrib = borrowing + t.held[BE]  # t.preemptible(), inline: twice an event
        old = t.preemptible_contrib
        if old and self._usage_on:  # the borrowed slot-seconds since the last change
            t.usage_acc += old * (self._now - t.usage_at)
        t.usage_at = self._now
        if contrib != old:
            self._preemptible += contrib - old
            t.preemptible_contrib = contrib
        self._order.dirty[t] = None
        self._victims.dirty[t] = None
        # Lent: a borrowing Burstable lease below nominal (none without a nominal).
        if borrowing and t.held[B] - borrowing < t.spec.burstable_nominal:
            self._lent[t] = None
        elif self._lent and t in self._lent:
            del self._lent[t]

    def _refresh_queue(self, t: TenantState) -> None:
        self._order.dirty[t] = None

    def _refresh_victims(self, t: TenantState) -> None:
        self._victims.dirty[t] = None
