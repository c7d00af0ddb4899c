"""The core's state as a plain, versioned document (`Core.export_state` / `Core.from_state`).

A snapshot must survive a deploy, so it holds what the core *knows*, not how it indexes it:
workers, slot epochs, live leases, queued requests, counters and pending timers, as JSON types
only (str, int, float, bool, None, list, dict). Everything else is rebuilt on import from that:
per-tenant accounting (held, yielding, borrowing, waiting, earmarked counts), the tenant queues,
the order-of-service and victim heaps (every tenant is re-indexed on the first read), the
Fenwick trees of queue positions, the holder map, capacity, floor, free-slot count and the
preemptible total. The policy is not in the document: the caller stores it and passes it back.

Order is part of the state and is kept by list order: tenants (as the core met them), workers
(registration), leases (grant order: it is also the order of each tenant's preemption
candidates and mature candidates, and of each worker's leases), and requests (queue order).
`orphans` is always empty now (a yield whose waiter left is taken over or cancelled within the
event); an older build's document may list yields left running for no one, and the next event
cancels them (or gives them a waiter). A lease's `yield_deadline` is that of the yield under
way (older documents lack it: it is then the lease's earliest yield-deadline timer).

Three lazily cleaned structures are stored entry by entry, because their leftover entries still
change what the core does next, and a rebuilt core must do exactly the same:
  * `timers` (lease expiries, yield deadlines, maturity for fairness preemption): an entry of a
    lease since renewed or ended still wakes the core at its time (`next_deadline`);
  * `free_slots` (seq, index, worker): the free-slot heap keeps one entry per slot it has seen
    free, stamped with the worker's registration seq at the time; a worker removed and added
    again reuses its old entries (and their place in the packing order);
  * `earmark_order` (tier, arrival, seq, session): a request earmarked more than once keeps its
    earlier entries, and the lowest tier among them decides its rank. Entries of requests that
    can never come back (no request or lease with that session and seq) are dropped.

Format 1. `Core.from_state` refuses any other `format` with a ValueError; a later format must
keep a reader for this one (or convert it) so that a deploy never loses the state.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import TYPE_CHECKING, Any

from scheduler.core.lifecycle import LeaseState, WorkerState
from scheduler.core.tenants import CLASS_INDEX, CLASSES, B, G, TenantState
from scheduler.core.types import (
    Lease,
    LeaseId,
    QoS,
    SessionId,
    SlotId,
    SnapshotRef,
    TenantName,
    WorkerId,
)
from scheduler.policy import Policy, TenantSpec

if TYPE_CHECKING:
    from scheduler.core.engine import Core

FORMAT = 1

Doc = dict[str, Any]


# ------------------------------------------------------------------ small codecs


def ref_to_doc(ref: SnapshotRef | None) -> Doc | None:
    """A snapshot ref as JSON (None stays None); shared by the journal codec and snapshots."""
    if ref is None:
        return None
    return {"uri": ref.uri, "size_bytes": ref.size_bytes, "sha256": ref.sha256, "created": ref.created}


def ref_from_doc(doc: Any) -> SnapshotRef | None:
    if doc is None:
        return None
    return SnapshotRef(str(doc["uri"]), int(doc["size_bytes"]), str(doc["sha256"]), float(doc["created"]))


def time_to_doc(x: float) -> float | None:
    """A time that may be -inf (no event seen yet): JSON has no infinities, so None."""
    return x if math.isfinite(x) else None


def time_from_doc(x: Any) -> float:
    return float("-inf") if x is None else float(x)


def _spec(spec: TenantSpec) -> Doc:
    return {
        "name": spec.name,
        "weight": spec.weight,
        "guaranteed": spec.guaranteed,
        "burstable_nominal": spec.burstable_nominal,
        "burstable_limit": spec.burstable_limit,
        "best_effort_limit": spec.best_effort_limit,
        "tokens": list(spec.tokens),
    }


def _unspec(doc: Doc) -> TenantSpec:
    be = doc["best_effort_limit"]
    return TenantSpec(
        str(doc["name"]),
        float(doc["weight"]),
        int(doc["guaranteed"]),
        int(doc["burstable_nominal"]),
        int(doc["burstable_limit"]),
        None if be is None else int(be),
        tuple(str(t) for t in doc["tokens"]),
    )


def _timer(entry: tuple[float, LeaseId, int]) -> list[Any]:
    return [entry[0], entry[1], entry[2]]


def _untimer(doc: Any) -> tuple[float, LeaseId, int]:
    return (float(doc[0]), LeaseId(str(doc[1])), int(doc[2]))


# ------------------------------------------------------------------ export


def export_state(core: Core) -> Doc:
    """The logical state of `core` (see the module docstring). Call between events only."""
    tenants = core._tenants
    leases: list[Doc] = []
    for lid, rec in core._leases.items():
        lease = rec.lease
        t = rec.tenant
        leases.append(
            {
                "lease_id": lid,
                "session": lease.session,
                "tenant": lease.tenant,
                "qos": lease.qos.value,
                "worker": lease.slot.worker,
                "slot": lease.slot.index,
                "epoch": lease.epoch,
                "granted_at": lease.granted_at,
                "expires_at": lease.expires_at,
                "resume_from": ref_to_doc(lease.resume_from),
                "state": rec.state.value,
                "arrival": rec.arrival,
                "seq": rec.seq,
                "borrowing": rec.borrowing,
                "for_session": rec.for_session,
                "yield_deadline": rec.yield_deadline,
                # Preemption candidate (active, preemptible, on a ready worker), and whether it
                # has run min_runtime (only then a fairness victim).
                "candidate": lid in t.candidates[rec.cls],
                "mature": lid in t.mature[rec.cls],
            }
        )
    requests: list[Doc] = [
        {
            "session": req.session,
            "tenant": req.tenant.name,
            "qos": CLASSES[req.cls].value,
            "arrival": req.arrival,
            "seq": req.seq,
            "enqueued_at": req.enqueued_at,
            "resume_from": ref_to_doc(req.resume_from),
            "earmark": req.earmark,
            "earmark_tier": req.earmark_tier,
        }
        for req in core._requests.values()
    ]
    lineages = {(s, r.seq) for s, r in core._requests.items()}
    lineages.update((s, r.seq) for s, r in core._holders.items())
    earmark_order = sorted(
        {
            (tier, arrival, seq, s)
            for tier, arrival, seq, s in core._order.earmarked
            if (s, seq) in lineages  # a request that can come back with this seq
        }
    )
    return {
        "format": FORMAT,
        "now": time_to_doc(core._now),
        "seq": core._seq,
        "worker_seq": core._worker_seq,
        "mean_hold_s": core._mean_hold,
        "holds_seen": core._holds_seen,
        "tenants": [_spec(t.spec) for t in tenants.values()],
        "retired": sorted(core._retired),
        "workers": [
            {"id": w.worker_id, "address": w.address, "slots": w.slots, "seq": w.seq, "state": w.state.value}
            for w in core._workers.values()
        ],
        "epochs": sorted([slot.worker, slot.index, epoch] for slot, epoch in core._epochs.items()),
        "free_slots": sorted([seq, index, wid] for seq, index, wid in core._free),
        "leases": leases,
        "orphans": list(core._orphans),
        "requests": requests,
        "earmark_order": [list(e) for e in earmark_order],
        "timers": {
            "expiries": sorted(_timer(e) for e in core._expiries),
            "yield_deadlines": sorted(_timer(e) for e in core._yield_deadlines),
            "maturing": [_timer(e) for e in core._maturing],  # a FIFO: its order is kept as is
        },
    }


# ------------------------------------------------------------------ import


def from_state(policy: Policy, doc: Doc) -> Core:
    """A core whose future behaviour is that of the core `doc` was exported from."""
    if not isinstance(doc, dict):
        raise ValueError("core state: expected a JSON object")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise ValueError(f"core state format {fmt!r} is not one this build reads (it reads {FORMAT})")
    try:
        return _build(policy, doc)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"core state is malformed: {type(e).__name__}: {e}") from e


def _build(policy: Policy, doc: Doc) -> Core:
    from scheduler.core.engine import Core
    from scheduler.core.model import LeaseRec, Request, WorkerRec
    from scheduler.core.order import TIER_NOMINAL, TIER_SHARED

    core = Core(policy)
    # The heaps' staleness checks close over this very dict: refill it, never replace it.
    tenants = core._tenants
    tenants.clear()
    retired = {str(n) for n in doc["retired"]}
    in_policy = {spec.name: spec for spec in policy.tenants}
    for td in doc["tenants"]:
        name = str(td["name"])
        if name in tenants:
            raise ValueError(f"tenant {name!r} appears twice")
        if name in retired:
            spec = _unspec(td)  # no longer in the policy: it keeps the spec it had
        elif name in in_policy:
            spec = in_policy[name]
        else:
            raise ValueError(f"tenant {name!r} is neither in the policy nor retired")
        tenants[name] = TenantState(spec)
    missing = [n for n in in_policy if n not in tenants or n in retired]
    if missing or not retired <= tenants.keys():
        raise ValueError(f"the core state does not match the policy (tenants {missing or sorted(retired)})")
    core._retired = retired

    workers = core._workers
    for wd in doc["workers"]:
        wid = WorkerId(str(wd["id"]))
        workers[wid] = WorkerRec(
            wid, str(wd["address"]), int(wd["slots"]), int(wd["seq"]), WorkerState(wd["state"])
        )
    core._worker_seq = int(doc["worker_seq"])
    core._epochs = {SlotId(WorkerId(str(w)), int(i)): int(e) for w, i, e in doc["epochs"]}

    timers = doc["timers"]
    pending_maturity = {(str(e[1]), int(e[2])) for e in timers["maturing"]}
    earliest_deadline: dict[tuple[str, int], float] = {}
    for e in timers["yield_deadlines"]:
        k = (str(e[1]), int(e[2]))
        earliest_deadline[k] = min(float(e[0]), earliest_deadline.get(k, math.inf))

    held_g = mature_n = 0
    for gseq, ld in enumerate(doc["leases"], start=1):
        lid = LeaseId(str(ld["lease_id"]))
        qos = QoS(ld["qos"])
        cls = CLASS_INDEX[qos]
        t = tenants[str(ld["tenant"])]
        w = workers[WorkerId(str(ld["worker"]))]
        slot = w.slot_ids[int(ld["slot"])]
        lease = Lease(
            lid,
            SessionId(str(ld["session"])),
            TenantName(t.name),
            qos,
            slot,
            int(ld["epoch"]),
            float(ld["granted_at"]),
            float(ld["expires_at"]),
            ref_from_doc(ld["resume_from"]),
        )
        state = LeaseState(ld["state"])
        if state not in (LeaseState.ACTIVE, LeaseState.YIELDING):
            raise ValueError(f"lease {lid} is {state.value}: only live leases are state")
        for_session = ld["for_session"]
        borrowing = bool(ld["borrowing"])
        rec = LeaseRec(
            lease,
            t,
            cls,
            state,
            float(ld["arrival"]),
            int(ld["seq"]),
            w,
            None if for_session is None else SessionId(str(for_session)),
            borrowing,
            gseq,  # list order is grant order
            # Its maturity timer has fired (the timers hold the ones still pending).
            (lid, lease.epoch) not in pending_maturity,
        )
        if state is LeaseState.YIELDING:
            yd = ld["yield_deadline"] if "yield_deadline" in ld else earliest_deadline.get((lid, lease.epoch))
            if yd is None:
                raise ValueError(f"yielding lease {lid} has no yield deadline")
            rec.yield_deadline = float(yd)
        if slot.index in w.leases or lid in core._leases or lease.session in core._holders:
            raise ValueError(f"lease {lid} collides with another lease")
        w.leases[slot.index] = lid
        core._leases[lid] = rec
        core._holders[lease.session] = rec
        yielding = state is LeaseState.YIELDING
        t.held[cls] += 1
        t.yielding[cls] += int(yielding)
        if cls == G:
            held_g += 1
        if cls == B and borrowing:
            t.b_borrowing += 1
            t.b_borrowing_yielding += int(yielding)
        if ld["candidate"]:
            t.candidates[cls][lid] = lease.granted_at
        if ld["mature"]:
            t.mature[cls][lid] = lease.granted_at
            mature_n += 1
    core._held_g = held_g
    core._gseq = len(core._leases)
    core._mature_n = mature_n
    core._orphans = {LeaseId(str(lid)): None for lid in doc["orphans"]}
    if any(lid not in core._leases for lid in core._orphans):
        raise ValueError("an orphaned yield names no live lease")

    inflight_nominal = 0
    for rd in doc["requests"]:
        t = tenants[str(rd["tenant"])]
        cls = CLASS_INDEX[QoS(rd["qos"])]
        earmark = rd["earmark"]
        req = Request(
            SessionId(str(rd["session"])),
            t,
            cls,
            float(rd["arrival"]),
            int(rd["seq"]),
            float(rd["enqueued_at"]),
            ref_from_doc(rd["resume_from"]),
            None if earmark is None else LeaseId(str(earmark)),
            int(rd["earmark_tier"]),
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
                inflight_nominal += 1
    core._inflight_nominal = inflight_nominal
    core._order.earmarked = [
        (int(e[0]), float(e[1]), int(e[2]), SessionId(str(e[3]))) for e in doc["earmark_order"]
    ]
    heapq.heapify(core._order.earmarked)

    core._free = [(int(seq), int(index), WorkerId(str(wid))) for seq, index, wid in doc["free_slots"]]
    heapq.heapify(core._free)
    core._free_in_heap = {(seq, index) for seq, index, _ in core._free}
    ready = [w for w in workers.values() if w.state is WorkerState.READY]
    core._free_ready = sum(w.slots - len(w.leases) for w in ready)
    core._set_capacity(sum(w.slots for w in ready))

    preemptible = 0
    for t in tenants.values():
        t.preemptible_contrib = t.preemptible()
        preemptible += t.preemptible_contrib
        # Re-indexed in the order-of-service and victim heaps on their next read.
        core._order.dirty[t] = None
        core._victims.dirty[t] = None
    core._preemptible = preemptible

    core._expiries = [_untimer(e) for e in timers["expiries"]]
    heapq.heapify(core._expiries)
    core._yield_deadlines = [_untimer(e) for e in timers["yield_deadlines"]]
    heapq.heapify(core._yield_deadlines)
    core._maturing = deque(_untimer(e) for e in timers["maturing"])

    core._seq = int(doc["seq"])
    core._now = time_from_doc(doc["now"])
    core._mean_hold = float(doc["mean_hold_s"])
    core._holds_seen = bool(doc["holds_seen"])
    return core


__all__ = ["FORMAT", "export_state", "from_state"]
