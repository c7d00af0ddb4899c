"""The core's state as records and back: `export_records` reads a core's state into the frozen
records of records.py; `load_records` fills a fresh core from them and rebuilds every index.

The engine's friend: it reads and fills the private fields `Ledger` (ledger.py) declares, so
that state_io and the shell never touch them (`Core.export_records` / `Core.restore`).
"""

from __future__ import annotations

import heapq

from scheduler.core.ledger import Ledger
from scheduler.core.lifecycle import LeaseState, WorkerState
from scheduler.core.model import LeaseRec, Request, WorkerRec
from scheduler.core.order import TIER_NOMINAL, TIER_SHARED
from scheduler.core.records import CoreRecords, LeaseRecord, RequestRecord, WorkerRecord
from scheduler.core.tenants import CLASS_INDEX, CLASSES, B, G, TenantState
from scheduler.core.types import TenantName


def export_records(core: Ledger) -> CoreRecords:
    """The logical state of `core` as records. Call between events only."""
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
        for lid, rec in core._leases.items()
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
        for r in core._requests.values()
    )
    # Earmark entries are kept only for a request that can come back with that seq.
    lineages = {(s, r.seq) for s, r in core._requests.items()}
    lineages.update((s, r.seq) for s, r in core._holders.items())
    earmark_order = tuple(sorted({e for e in core._order.earmarked if (e[3], e[2]) in lineages}))
    return CoreRecords(
        now=core._now,
        seq=core._seq,
        worker_seq=core._worker_seq,
        mean_hold_s=core._mean_hold,
        holds_seen=core._holds_seen,
        tenants=tuple(t.spec for t in core._tenants.values()),
        retired=frozenset(core._retired),
        workers=tuple(
            WorkerRecord(w.worker_id, w.address, w.slots, w.seq, w.state) for w in core._workers.values()
        ),
        epochs=tuple(core._epochs.items()),
        free_slots=tuple(core._free),
        leases=leases,
        orphans=tuple(core._orphans),
        requests=requests,
        earmark_order=earmark_order,
        expiries=tuple(core._timers.expiries),
        yield_deadlines=tuple(core._timers.deadlines),
        maturing=tuple(core._timers.maturing),
    )


def load_records(core: Ledger, r: CoreRecords) -> None:
    """Load `r` into the fresh `core` and rebuild every index from it (see `Core.restore`)."""
    # The heaps' staleness checks close over these very dicts: refill them, never replace.
    tenants = core._tenants
    tenants.clear()
    in_policy = {spec.name: spec for spec in core._policy.tenants}
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
        raise ValueError(f"the core state does not match the policy (tenants {missing or sorted(r.retired)})")
    core._retired = set(r.retired)

    for wr in r.workers:
        core._workers[wr.worker_id] = WorkerRec(wr.worker_id, wr.address, wr.slots, wr.seq, wr.state)
    core._worker_seq = r.worker_seq
    core._epochs = dict(r.epochs)

    for gseq, lr in enumerate(r.leases, start=1):  # tuple order is grant order
        _load_lease(core, lr, gseq)
    core._gseq = len(core._leases)
    core._orphans = dict.fromkeys(r.orphans)
    if any(lid not in core._leases for lid in core._orphans):
        raise ValueError("an orphaned yield names no live lease")

    for rr in r.requests:
        _load_request(core, rr)
    core._order.earmarked[:] = r.earmark_order
    heapq.heapify(core._order.earmarked)

    core._free = list(r.free_slots)
    heapq.heapify(core._free)
    core._free_in_heap = {(seq, index) for seq, index, _ in core._free}
    ready = [w for w in core._workers.values() if w.state is WorkerState.READY]
    core._free_ready = sum(w.slots - len(w.leases) for w in ready)
    core._set_capacity(sum(w.slots for w in ready))
    for t in tenants.values():
        t.preemptible_contrib = t.preemptible()
        core._preemptible += t.preemptible_contrib
        core._refresh(t)  # re-indexed in the heaps on their next read

    core._timers.load(r.maturing, r.yield_deadlines, r.expiries)
    core._seq = r.seq
    core._now = r.now
    core._mean_hold = r.mean_hold_s
    core._holds_seen = r.holds_seen


def _load_lease(core: Ledger, lr: LeaseRecord, gseq: int) -> None:
    lease, state = lr.lease, lr.state
    lid, cls = lease.lease_id, CLASS_INDEX[lease.qos]
    t = core._tenants.get(lease.tenant)
    w = core._workers.get(lease.slot.worker)
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
    if lease.slot.index in w.leases or lid in core._leases or lease.session in core._holders:
        raise ValueError(f"lease {lid} collides with another lease")
    w.leases[lease.slot.index] = lid
    core._leases[lid] = rec
    core._holders[lease.session] = rec
    t.held[cls] += 1
    t.yielding[cls] += int(yielding)
    if cls == G:
        core._held_g += 1
    if cls == B and lr.borrowing:
        t.b_borrowing += 1
        t.b_borrowing_yielding += int(yielding)
    if lr.candidate:
        t.candidates[cls][lid] = lease.granted_at
    if lr.mature:
        t.mature[cls][lid] = lease.granted_at
        core._mature_n += 1


def _load_request(core: Ledger, rr: RequestRecord) -> None:
    t = core._tenants.get(rr.tenant)
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
    if req.session in core._requests or req.session in core._holders:
        raise ValueError(f"session {req.session} is queued twice or queued and holding")
    core._requests[req.session] = req
    t.waiting[cls] += 1
    core._waiting_cls[cls] += 1
    core._positions[cls].add(req.seq, 1)
    if req.earmark is None:
        t.push_request(cls, (req.arrival, req.seq, req.session))
    else:
        t.earmarked[cls] += 1
        if req.earmark_tier == TIER_SHARED:
            t.earmarked_fair += 1
        elif req.earmark_tier == TIER_NOMINAL:
            core._inflight_nominal += 1


__all__ = ["export_records", "load_records"]
