"""The core's state and its bookkeeping: every change to who holds, who waits and who yields,
with the counters and indexes kept in step (the floor's slack, the tenants' counts, the order
of service, the victim heaps, the free-slot heap, the timers), the tenants' usage over time
(`_sample_usage`) and the promotion of leases lent from the floor (`_promote_lent`).

`Ledger` decides nothing: `Core` (engine.py) is the ledger plus the decisions, and calls these
methods from the steps of an event. export/restore of the state is restore.py's.
"""

from __future__ import annotations

import dataclasses
import heapq

from scheduler.core.indexes import PositionCounts
from scheduler.core.lifecycle import LeaseState, WorkerState, check_lease
from scheduler.core.model import LeaseRec, Request, WorkerRec
from scheduler.core.order import TIER_NOMINAL, TIER_SHARED, ServiceOrder
from scheduler.core.tenants import BE, CLASS_INDEX, CLASSES, B, G, TenantState
from scheduler.core.timers import Timers
from scheduler.core.types import (
    BlockedReason,
    Decision,
    Granted,
    LateSnapshot,
    Lease,
    LeaseId,
    QoS,
    Queued,
    Revoked,
    RevokeReason,
    SessionId,
    SlotId,
    SnapshotRef,
    TenantName,
    WorkerId,
    Yield,
    YieldCancelled,
    YieldCause,
    YieldRequested,
)
from scheduler.core.victims import VictimIndex, add_candidate
from scheduler.policy.model import Policy

_DEFAULT_MEAN_HOLD_S = 60.0
# Read on every grant, end and queued request: an enum member read off its class is a slow
# attribute lookup in CPython 3.11 (about 60 ns, ten times a global's).
_ACTIVE, _YIELDING, _READY = LeaseState.ACTIVE, LeaseState.YIELDING, WorkerState.READY
_LIMIT, _PENDING = BlockedReason.TENANT_LIMIT, BlockedReason.YIELD_PENDING
_QUOTA, _EXHAUSTED = BlockedReason.TENANT_QUOTA, BlockedReason.POOL_EXHAUSTED


class Ledger:
    """The core's state (one loop owns it: not thread-safe by design)."""

    def __init__(self, policy: Policy) -> None:
        # Every field of the core's state; `Core` (engine.py) decides, this class keeps accounts.
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

    def _take_policy(self, policy: Policy) -> None:
        """`policy`, and what every event reads of it kept at hand: with many pools each core's
        policy is an object of its own, one more to fetch per event."""
        self._policy = policy
        self._ttl = policy.timing.lease_ttl_s
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
            self._pool_name,
        )
        w = self._workers[slot.worker]
        # A Burstable lease within nominal is unpreemptible, so it is one only if the floor still
        # holds with this slot taken (slack >= 0 now); otherwise the slot is lent as borrowing.
        borrowing = req.cls == BE or (
            req.cls == B and not (t.b_nominal_held() < t.spec.burstable_nominal and self._slack() >= 0)
        )
        self._gseq += 1
        rec = LeaseRec(lease, t, req.cls, _ACTIVE, req.arrival, req.seq, w, None, borrowing, self._gseq)
        rec.preempted = req.preempted
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
            else:
                self._held_be += 1
            # The newest grant: last in grant order; its pick entry waits for a read (first_pick).
            t.candidates[req.cls][lid] = now
            self._timers.push_maturing(now + self._min_runtime, lid, epoch)
        self._timers.push_expiry(lease.expires_at, lid, epoch)
        self._refresh(t)
        out.append(Granted(lease, now - req.enqueued_at))

    def _end_lease(self, rec: LeaseRec, state: LeaseState) -> None:
        was_yielding = rec.state is _YIELDING
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
        elif cls == BE:
            self._held_be -= 1
        del self._leases[lid]
        del self._holders[rec.lease.session]
        self._cancelled.pop(lid, None)  # it ends: its own decision says so
        self._orphans.pop(lid, None)
        w = rec.worker
        del w.leases[rec.lease.slot.index]
        if w.state is _READY:
            self._push_free(w, rec.lease.slot.index)
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
        if cls == B and not rec.borrowing:
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
