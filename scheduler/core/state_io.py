"""The core's state as a plain, versioned document (`Core.export_state` / `Core.from_state`).

This module only converts: `to_doc` turns `CoreRecords` (records.py, from `Core.export_records`)
into the document, `from_doc` turns a document back into records (for `Core.restore`).

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

Format 2 (written) holds leases and requests, the entries there are many of, as rows (JSON
arrays) under a header naming their columns (`lease_fields`, `request_fields`): half the bytes
of a field-named object each, and read at C speed. A lease row also holds `matured` (format 1
derived it from the pending maturity timers, which is wrong for a lease that never had one).
Format 1 (objects per lease and request) is still read. `Core.from_state` refuses any other
`format` with a ValueError; a later format must keep a reader for these (or convert them) so
that a deploy never loses the state.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from scheduler.core.lifecycle import LeaseState, WorkerState
from scheduler.core.records import CoreRecords, LeaseRecord, RequestRecord, Timer, WorkerRecord
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
from scheduler.policy.model import TenantSpec

FORMAT = 2
READS = (1, 2)

LEASE_FIELDS = (
    "lease_id", "session", "tenant", "qos", "worker", "slot", "epoch", "granted_at", "expires_at",
    "resume_from", "state", "arrival", "seq", "borrowing", "for_session", "yield_deadline",
    "candidate", "mature", "matured",
)  # fmt: skip
REQUEST_FIELDS = (
    "session", "tenant", "qos", "arrival", "seq", "enqueued_at", "resume_from", "earmark", "earmark_tier",
)  # fmt: skip
_QOS = {q.value: q for q in QoS}
_LEASE_STATES = {s.value: s for s in LeaseState}

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


def _untimer(doc: Any) -> Timer:
    return (float(doc[0]), LeaseId(str(doc[1])), int(doc[2]))


# ------------------------------------------------------------------ records -> document


def lease_to_doc(lease: Lease) -> Doc:
    """A lease as JSON: the one form, shared by the core's export and the server's state snapshot."""
    return {
        "lease_id": lease.lease_id,
        "session": lease.session,
        "tenant": lease.tenant,
        "qos": lease.qos.value,
        "worker": lease.slot.worker,
        "slot": lease.slot.index,
        "epoch": lease.epoch,
        "granted_at": lease.granted_at,
        "expires_at": lease.expires_at,
        "resume_from": ref_to_doc(lease.resume_from),
    }


def lease_from_doc(d: Doc) -> Lease:
    return Lease(
        LeaseId(str(d["lease_id"])),
        SessionId(str(d["session"])),
        TenantName(str(d["tenant"])),
        QoS(d["qos"]),
        SlotId(WorkerId(str(d["worker"])), int(d["slot"])),
        int(d["epoch"]),
        float(d["granted_at"]),
        float(d["expires_at"]),
        ref_from_doc(d["resume_from"]),
    )


def _lease_row(lr: LeaseRecord) -> list[Any]:
    lease = lr.lease
    ref = lease.resume_from
    return [
        lease.lease_id, lease.session, lease.tenant, lease.qos.value, lease.slot.worker, lease.slot.index,
        lease.epoch, lease.granted_at, lease.expires_at, None if ref is None else ref_to_doc(ref),
        lr.state.value, lr.arrival, lr.seq, lr.borrowing, lr.for_session, lr.yield_deadline,
        lr.candidate, lr.mature, lr.matured,
    ]  # fmt: skip


def to_doc(r: CoreRecords) -> Doc:
    """The document of `r` (see the module docstring)."""
    return {
        "format": FORMAT,
        "now": time_to_doc(r.now),
        "seq": r.seq,
        "worker_seq": r.worker_seq,
        "mean_hold_s": r.mean_hold_s,
        "holds_seen": r.holds_seen,
        "tenants": [_spec(spec) for spec in r.tenants],
        "retired": sorted(r.retired),
        "workers": [
            {"id": w.worker_id, "address": w.address, "slots": w.slots, "seq": w.seq, "state": w.state.value}
            for w in r.workers
        ],
        "epochs": sorted([slot.worker, slot.index, epoch] for slot, epoch in r.epochs),
        "free_slots": sorted([seq, index, wid] for seq, index, wid in r.free_slots),
        "lease_fields": list(LEASE_FIELDS),
        "leases": [_lease_row(lr) for lr in r.leases],
        "orphans": list(r.orphans),
        "request_fields": list(REQUEST_FIELDS),
        "requests": [
            [
                rr.session,
                rr.tenant,
                rr.qos.value,
                rr.arrival,
                rr.seq,
                rr.enqueued_at,
                None if rr.resume_from is None else ref_to_doc(rr.resume_from),
                rr.earmark,
                rr.earmark_tier,
            ]  # fmt: skip
            for rr in r.requests
        ],
        "earmark_order": [list(e) for e in r.earmark_order],
        "timers": {
            "expiries": sorted(r.expiries),
            "yield_deadlines": sorted(r.yield_deadlines),
            "maturing": list(r.maturing),  # a FIFO: its order is kept as is
        },
    }


# ------------------------------------------------------------------ document -> records


def from_doc(doc: Any) -> CoreRecords:
    """The records of a document `to_doc` wrote (this format or an older document of it);
    ValueError naming what is wrong if it is of an unknown format or malformed."""
    if not isinstance(doc, dict):
        raise ValueError("core state: expected a JSON object")
    fmt = doc.get("format")
    if fmt not in READS:
        raise ValueError(f"core state format {fmt!r} is not one this build reads (it reads {list(READS)})")
    try:
        return _records_v2(doc) if fmt == 2 else _records(doc)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"core state is malformed: {type(e).__name__}: {e}") from e


def _common(doc: Doc) -> dict[str, Any]:
    """The fields every format of the core's document holds in the same shape."""
    return {
        "now": time_from_doc(doc["now"]),
        "seq": int(doc["seq"]),
        "worker_seq": int(doc["worker_seq"]),
        "mean_hold_s": float(doc["mean_hold_s"]),
        "holds_seen": bool(doc["holds_seen"]),
        "tenants": tuple(_unspec(td) for td in doc["tenants"]),
        "retired": frozenset(str(n) for n in doc["retired"]),
        "workers": tuple(
            WorkerRecord(
                WorkerId(str(wd["id"])),
                str(wd["address"]),
                int(wd["slots"]),
                int(wd["seq"]),
                WorkerState(wd["state"]),
            )
            for wd in doc["workers"]
        ),
        "orphans": tuple(LeaseId(str(lid)) for lid in doc["orphans"]),
        "earmark_order": tuple(
            (int(e[0]), float(e[1]), int(e[2]), SessionId(str(e[3]))) for e in doc["earmark_order"]
        ),
    }


def _records(doc: Doc) -> CoreRecords:
    timers = doc["timers"]
    maturing = tuple(_untimer(e) for e in timers["maturing"])
    yield_deadlines = tuple(_untimer(e) for e in timers["yield_deadlines"])
    pending_maturity = {(lid, epoch) for _, lid, epoch in maturing}
    # An older document lacks a lease's `yield_deadline`: the earliest yield-deadline timer.
    earliest_deadline: dict[tuple[str, int], float] = {}
    for d, lid, epoch in yield_deadlines:
        earliest_deadline[(lid, epoch)] = min(d, earliest_deadline.get((lid, epoch), math.inf))
    return CoreRecords(
        **_common(doc),
        epochs=tuple((SlotId(WorkerId(str(w)), int(i)), int(e)) for w, i, e in doc["epochs"]),
        free_slots=tuple((int(seq), int(index), WorkerId(str(wid))) for seq, index, wid in doc["free_slots"]),
        leases=tuple(_lease(ld, pending_maturity, earliest_deadline) for ld in doc["leases"]),
        requests=tuple(_request(rd) for rd in doc["requests"]),
        expiries=tuple(_untimer(e) for e in timers["expiries"]),
        yield_deadlines=yield_deadlines,
        maturing=maturing,
    )


def _records_v2(doc: Doc) -> CoreRecords:
    if tuple(doc["lease_fields"]) != LEASE_FIELDS or tuple(doc["request_fields"]) != REQUEST_FIELDS:
        raise ValueError("lease_fields or request_fields are not the columns of format 2")
    timers = doc["timers"]
    return CoreRecords(
        **_common(doc),
        epochs=tuple((SlotId(w, int(i)), int(e)) for w, i, e in doc["epochs"]),
        free_slots=tuple((int(seq), int(index), wid) for seq, index, wid in doc["free_slots"]),
        leases=_leases_v2(doc["leases"]),
        requests=_requests_v2(doc["requests"]),
        expiries=_timers(timers["expiries"]),
        yield_deadlines=_timers(timers["yield_deadlines"]),
        maturing=_timers(timers["maturing"]),
    )


# The many rows are read a column at a time (zip, map: C speed, no call per row in Python).


def _columns(rows: list[list[Any]], n: int, what: str) -> tuple[tuple[Any, ...], ...]:
    if not rows:
        return ((),) * n
    if set(map(len, rows)) != {n}:
        raise ValueError(f"every {what} row must have {n} columns")
    return tuple(zip(*rows, strict=True))


def _check_types(column: tuple[Any, ...], types: set[type], what: str) -> None:
    if not set(map(type, column)) <= types:
        raise TypeError(f"{what}: expected {' or '.join(sorted(t.__name__ for t in types))}")


def _timers(rows: list[list[Any]]) -> tuple[Timer, ...]:
    at, lid, epoch = _columns(rows, 3, "timer")
    _check_types(lid, {str}, "a timer's lease")
    return tuple(zip(map(float, at), lid, map(int, epoch), strict=True))


# NamedTuple construction without a Python-level __new__ per row (the fields are checked above).
_make_request = partial(tuple.__new__, RequestRecord)
_make_lease = partial(tuple.__new__, LeaseRecord)


def _refs(column: tuple[Any, ...]) -> tuple[Any, ...]:
    return column if column.count(None) == len(column) else tuple(map(ref_from_doc, column))


def _optional_floats(column: tuple[Any, ...]) -> tuple[Any, ...]:
    if column.count(None) == len(column):
        return column
    return tuple(None if x is None else float(x) for x in column)


def _leases_v2(rows: list[list[Any]]) -> tuple[LeaseRecord, ...]:
    lid, s, tenant, qos, worker, index, epoch, granted, expires, ref, *rest = _columns(rows, 19, "lease")
    state, arrival, seq, borrowing, for_session, yd, candidate, mature, matured = rest
    for column, what in ((lid, "id"), (s, "session"), (tenant, "tenant"), (worker, "worker")):
        _check_types(column, {str}, f"a lease's {what}")
    _check_types(for_session, {str, type(None)}, "a lease's for_session")
    leases = map(
        Lease,
        lid,
        s,
        tenant,
        map(_QOS.__getitem__, qos),
        map(SlotId, worker, map(int, index)),
        map(int, epoch),
        map(float, granted),
        map(float, expires),
        _refs(ref),
    )
    columns = (
        leases,
        map(_LEASE_STATES.__getitem__, state),
        map(float, arrival),
        map(int, seq),
        map(bool, borrowing),
        for_session,
        _optional_floats(yd),
        map(bool, candidate),
        map(bool, mature),
        map(bool, matured),
    )
    return tuple(map(_make_lease, zip(*columns, strict=True)))


def _requests_v2(rows: list[list[Any]]) -> tuple[RequestRecord, ...]:
    s, tenant, qos, arrival, seq, enqueued_at, ref, earmark, tier = _columns(rows, 9, "request")
    _check_types(s, {str}, "a request's session")
    _check_types(tenant, {str}, "a request's tenant")
    _check_types(earmark, {str, type(None)}, "a request's earmark")
    refs = _refs(ref)
    columns = (
        s,
        tenant,
        map(_QOS.__getitem__, qos),
        map(float, arrival),
        map(int, seq),
        map(float, enqueued_at),
        refs,
        earmark,
        map(int, tier),
    )
    return tuple(map(_make_request, zip(*columns, strict=True)))


def _lease(
    ld: Doc, pending_maturity: set[tuple[LeaseId, int]], earliest_deadline: dict[tuple[str, int], float]
) -> LeaseRecord:
    lease = lease_from_doc(ld)
    lid, epoch = lease.lease_id, lease.epoch
    for_session = ld["for_session"]
    yd = ld["yield_deadline"] if "yield_deadline" in ld else earliest_deadline.get((lid, epoch))
    return LeaseRecord(
        lease,
        LeaseState(ld["state"]),
        float(ld["arrival"]),
        int(ld["seq"]),
        bool(ld["borrowing"]),
        None if for_session is None else SessionId(str(for_session)),
        None if yd is None else float(yd),
        bool(ld["candidate"]),
        bool(ld["mature"]),
        (lid, epoch) not in pending_maturity,  # its maturity timer has fired
    )


def _request(rd: Doc) -> RequestRecord:
    earmark = rd["earmark"]
    return RequestRecord(
        SessionId(str(rd["session"])),
        TenantName(str(rd["tenant"])),
        QoS(rd["qos"]),
        float(rd["arrival"]),
        int(rd["seq"]),
        float(rd["enqueued_at"]),
        ref_from_doc(rd["resume_from"]),
        None if earmark is None else LeaseId(str(earmark)),
        int(rd["earmark_tier"]),
    )


__all__ = [
    "FORMAT",
    "LEASE_FIELDS",
    "READS",
    "REQUEST_FIELDS",
    "from_doc",
    "ref_from_doc",
    "ref_to_doc",
    "time_from_doc",
    "time_to_doc",
    "to_doc",
]
