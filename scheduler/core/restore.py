"""The core's state as records and back: `export_records` reads a core's state into the frozen
records of records.py; `load_records` fills a fresh core from them and rebuilds every index.

The engine's friend: it reads and fills the private fields `Core` (engine.py) declares, so
that the shell never touches them (`Core.export_records` / `Core.from_records`); the state
as a document is scheduler/state/state_write.py's and state_read.py's.

Export in two steps, so that a state snapshot of a big core costs its event loop little:
`capture` takes a consistent copy between two events at C speed (dict and list copies, one
tuple per live lease: ~10 ms for 10,000 leases + 100,000 queued sessions), and
`records_of(capture)` turns it into records anywhere, later, in another thread: nothing it reads
changes after the capture. A queued `Request` changes after its creation only in its earmark
(`_earmark` / `_unearmark`), so the capture copies the request map (not the requests) and the
earmarks of the requests that can have one: every earmarked request has an entry in the
earmarked heap (entries are dropped only once stale), which the capture reads.

`load_records` builds the indexes in bulk (each tenant queue heapified once, the position counts
built in linear time) and checks what a snapshot could get wrong (unknown tenant, worker or
slot, two leases on a slot, a session queued twice or queued and holding) with set sizes.
"""

from __future__ import annotations

import heapq
import operator
from collections import Counter
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from scheduler.core.lifecycle import LeaseState, WorkerState
from scheduler.core.model import LeaseRec, Request, WorkerRec
from scheduler.core.order import TIER_NOMINAL, TIER_SHARED
from scheduler.core.records import (
    CoreRecords,
    EarmarkEntry,
    FreeSlot,
    LeaseRecord,
    RequestRecord,
    TenantUsage,
    Timer,
    WorkerRecord,
)
from scheduler.core.tenants import BE, CLASS_INDEX, CLASSES, B, G, TenantState
from scheduler.core.types import LeaseId, SessionId, SlotId, TenantName
from scheduler.core.victims import session_key
from scheduler.policy.model import TenantSpec

if TYPE_CHECKING:  # the engine calls this module: its type, for annotations only
    from scheduler.core.engine import Core

# One live lease as captured: everything of a LeaseRec that can change, read in C.
_LEASE_ROW = attrgetter(
    "lease", "state", "arrival", "seq", "borrowing", "for_session", "yield_deadline", "matured"
)
_NO_EARMARK: tuple[LeaseId | None, int] = (None, 0)


@dataclass(frozen=True)
class Capture:
    """A consistent copy of a core's state taken between events (`capture`); read-only after."""

    now: float
    seq: int
    worker_seq: int
    mean_hold_s: float
    holds_seen: bool
    tenants: tuple[TenantSpec, ...]
    retired: frozenset[str]
    workers: tuple[WorkerRecord, ...]
    epochs: dict[SlotId, int]
    free_slots: list[FreeSlot]
    leases: list[tuple[Any, ...]]  # _LEASE_ROW of every live lease, in grant order
    candidates: frozenset[LeaseId]
    mature: frozenset[LeaseId]
    orphans: tuple[LeaseId, ...]
    requests: dict[SessionId, Request]  # a copy of the map: see the module docstring
    earmarks: dict[SessionId, tuple[LeaseId | None, int]]
    earmarked: list[EarmarkEntry]
    expiries: list[Timer]
    yield_deadlines: list[Timer]
    maturing: tuple[Timer, ...]
    preempt_seq: int
    preempted: tuple[tuple[SessionId, int], ...]
    usage_last: float
    usage: tuple[TenantUsage, ...]

    @property
    def size(self) -> int:
        """Live leases + queued requests: what a snapshot of it holds, roughly."""
        return len(self.leases) + len(self.requests)


def capture(core: Core) -> Capture:
    """A consistent copy of `core`'s state, cheap enough for the event loop. Between events only."""
    tenants = core._tenants.values()
    cands: set[LeaseId] = set()
    mature: set[LeaseId] = set()
    for t in tenants:
        for d in t.candidates:
            cands.update(d)
        for d in t.mature:
            mature.update(d)
    requests = core._requests
    earmarks: dict[SessionId, tuple[LeaseId | None, int]] = {}
    for *_, s in core._order.earmarked:
        r = requests.get(s)
        if r is not None and r.earmark is not None:
            earmarks[s] = (r.earmark, r.earmark_tier)
    return Capture(
        now=core._now,
        seq=core._seq,
        worker_seq=core._worker_seq,
        mean_hold_s=core._mean_hold,
        holds_seen=core._holds_seen,
        tenants=tuple(t.spec for t in tenants),
        retired=frozenset(core._retired),
        workers=tuple(
            WorkerRecord(w.worker_id, w.address, w.slots, w.seq, w.state) for w in core._workers.values()
        ),
        epochs=dict(core._epochs),
        free_slots=list(core._free),
        leases=list(map(_LEASE_ROW, core._leases.values())),
        candidates=frozenset(cands),
        mature=frozenset(mature),
        orphans=tuple(core._orphans),
        requests=dict(requests),
        earmarks=earmarks,
        earmarked=list(core._order.earmarked),
        expiries=list(core._timers.expiries),
        yield_deadlines=list(core._timers.deadlines),
        maturing=tuple(core._timers.maturing),
        preempt_seq=core._preempt_seq,
        preempted=tuple(
            (s, p)
            for s, p in (
                *((r.session, r.preempted) for r in requests.values()),
                *((h.lease.session, h.preempted) for h in core._leases.values()),
            )
            if p
        ),
        usage_last=core._usage_last,
        usage=tuple(
            TenantUsage(t.name, t.usage, t.usage_acc, t.usage_at, t.last_preempted)
            for t in tenants
            if t.usage or t.usage_acc or t.last_preempted or t.preemptible_contrib
        ),
    )


def records_of(c: Capture) -> CoreRecords:
    """The records of a capture; pure, safe in any thread (the capture is never written)."""
    cands, mature = c.candidates, c.mature
    leases = tuple(
        LeaseRecord(
            lease,
            state,
            arrival,
            seq,
            borrowing,
            for_session,
            yd,
            lease.lease_id in cands,
            lease.lease_id in mature,
            matured,
        )
        for lease, state, arrival, seq, borrowing, for_session, yd, matured in c.leases
    )
    earmarks = c.earmarks
    no = _NO_EARMARK
    requests = tuple(
        RequestRecord(
            r.session,
            TenantName(r.tenant.name),
            CLASSES[r.cls],
            r.arrival,
            r.seq,
            r.enqueued_at,
            r.resume_from,
            *earmarks.get(s, no),
            r.revoked,
        )
        for s, r in c.requests.items()
    )
    # Earmark entries are kept only for a request that can come back with that seq.
    lineages = {(s, r.seq) for s, r in c.requests.items()}
    lineages.update((lr.lease.session, lr.seq) for lr in leases)
    earmark_order = tuple(sorted({e for e in c.earmarked if (e[3], e[2]) in lineages}))
    return CoreRecords(
        now=c.now,
        seq=c.seq,
        worker_seq=c.worker_seq,
        mean_hold_s=c.mean_hold_s,
        holds_seen=c.holds_seen,
        tenants=c.tenants,
        retired=c.retired,
        workers=c.workers,
        epochs=tuple(c.epochs.items()),
        free_slots=tuple(c.free_slots),
        leases=leases,
        orphans=c.orphans,
        requests=requests,
        earmark_order=earmark_order,
        expiries=tuple(c.expiries),
        yield_deadlines=tuple(c.yield_deadlines),
        maturing=c.maturing,
        preempt_seq=c.preempt_seq,
        preempted=c.preempted,
        usage_last=c.usage_last,
        usage=c.usage,
    )


def export_records(core: Core) -> CoreRecords:
    """The logical state of `core` as records. Call between events only."""
    return records_of(capture(core))


def load_records(core: Core, r: CoreRecords) -> None:
    """Load `r` into the fresh `core` and rebuild every index from it (see `Core.from_records`)."""
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

    _load_requests(core, r.requests)
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

    _load_fairness(core, r)
    core._timers.load(r.maturing, r.yield_deadlines, r.expiries)
    core._seq = r.seq
    core._now = r.now
    core._mean_hold = r.mean_hold_s
    core._holds_seen = r.holds_seen


def _load_lease(core: Core, lr: LeaseRecord, gseq: int) -> None:
    lease, state = lr.lease, lr.state
    lid, cls = lease.lease_id, CLASS_INDEX[lease.qos]
    t = core._tenants.get(lease.tenant)
    w = core._workers.get(lease.slot.worker)
    if t is None or w is None or not 0 <= lease.slot.index < w.slots:
        raise ValueError(f"lease {lid} names an unknown tenant, worker or slot")
    if state is not LeaseState.ACTIVE and state is not LeaseState.YIELDING:
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
    if cls == BE:
        core._held_be += 1
    if lr.candidate:
        t.candidates[cls][lid] = lease.granted_at
    if lr.mature:
        t.mature[cls][lid] = lease.granted_at
        core._mature_n += 1


def _load_fairness(core: Core, r: CoreRecords) -> None:
    """Usage over time, who was preempted, and the tenants' pick heaps (built from the leases)."""
    core._preempt_seq = r.preempt_seq
    core._usage_last = r.usage_last
    f = core._policy.fairness
    core._usage_on = f.usage_half_life_s > 0
    core._victims.margin = 1.0 if core._usage_on else 0.0
    if f.usage_half_life_s <= 0:
        core._usage_next = float("inf")
    elif r.usage_last > float("-inf"):
        core._usage_next = r.usage_last + f.usage_sampling_s
    elif r.now > float("-inf"):  # an older build's state: usage counts from now
        core._usage_last, core._usage_next = r.now, r.now + f.usage_sampling_s
    horizon = max(1.0, core._policy.timing.min_runtime_s)
    at = r.now if r.now > float("-inf") else 0.0
    for t in core._tenants.values():  # an older state has none: usage starts at zero, now
        t.usage = t.usage_acc = t.usage_slots = 0.0
        t.usage_at = at
    for u in r.usage:
        ut = core._tenants.get(u.tenant)
        if ut is None:
            raise ValueError(f"usage names tenant {u.tenant!r}, not in the state")
        ut.usage, ut.usage_acc, ut.usage_at, ut.last_preempted = u.usage, u.acc, u.at, u.last_preempted
        ut.usage_slots = ut.usage / horizon if f.usage_half_life_s > 0 else 0.0
    preempted = dict(r.preempted)
    if preempted:
        for req in core._requests.values():
            req.preempted = preempted.get(req.session, 0)
    for rec in core._leases.values():
        rec.preempted = preempted.get(rec.lease.session, 0)
    for t in core._tenants.values():
        for cls in range(3):
            t.pick[cls] = [session_key(core._leases[lid]) for lid in t.candidates[cls]]
            heapq.heapify(t.pick[cls])
            t.pushed[cls] = core._gseq  # every candidate's entry is in the heap
            t.mpick[cls] = [session_key(core._leases[lid]) for lid in t.mature[cls]]
            heapq.heapify(t.mpick[cls])


def _load_requests(core: Core, records: tuple[RequestRecord, ...]) -> None:
    """The queue, in bulk and a column at a time: the requests (queue order), the tenants' counts
    and queue heaps (each heapified once), the counts of queue positions (built in linear time)."""
    if not records:
        return
    tenants, requests = core._tenants, core._requests
    s, tenant, qos, arrival, seq, enqueued_at, ref, earmark, tier, revoked = zip(*records, strict=True)
    try:
        owners = list(map(tenants.__getitem__, tenant))
        classes = list(map(CLASS_INDEX.__getitem__, qos))
    except KeyError as e:
        raise ValueError(f"a queued request names an unknown tenant or class {e}") from e
    reqs = map(Request, s, owners, classes, arrival, seq, enqueued_at, ref, earmark, tier, revoked)
    requests.update(zip(s, reqs, strict=True))
    if len(requests) != len(records) or not requests.keys().isdisjoint(core._holders):
        raise ValueError("a session is queued twice or queued and holding")
    for (t, cls), n in Counter(zip(owners, classes, strict=True)).items():
        t.waiting[cls] += n
    for req in compress(requests.values(), earmark):  # earmarked: a lease id, never empty
        t = req.tenant
        t.earmarked[req.cls] += 1
        if req.earmark_tier >= TIER_SHARED:
            t.earmarked_fair += 1
        elif req.earmark_tier == TIER_NOMINAL:
            core._inflight_nominal += 1
    waiting = list(map(operator.not_, earmark))
    for t, cls, entry in compress(
        zip(owners, classes, zip(arrival, seq, s, strict=True), strict=True), waiting
    ):
        t.queues[cls].append(entry)
    for t in tenants.values():
        for q in t.queues:
            heapq.heapify(q)
    for cls in range(3):
        positions = list(compress(seq, map(operator.eq, classes, repeat(cls))))
        core._waiting_cls[cls] = len(positions)
        if positions:
            core._positions[cls].load(positions)


__all__ = ["Capture", "capture", "export_records", "load_records", "records_of"]
