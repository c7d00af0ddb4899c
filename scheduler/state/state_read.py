"""The one module that reads a state snapshot (the document state_write.py writes, whose
docstring is the format) back into the scheduler's state: the core (its records, loaded by
`Core.from_records`), the loop's bookkeeping and the registered workers.

Every format this build knows is read (`_READERS`, and `CORE_READS` for the core's part); a
newer one is refused with `SnapshotMismatch` (recovery then replays the whole journal if it was
never trimmed, or stops and says so: run the newer build). Reading is orjson plus a row-by-row
build of the records (the many rows a column at a time: zip and map, C speed) and a bulk
rebuild of the core's indexes (core/restore.py).

Older formats still read: state snapshot format 2 was format 3 with the core's format 1 and
`ended` as objects `{"session", "reason", "qos", "last_snapshot", "at"}`. The core's format 1
held an object per lease and request; a lease's `matured` was derived from the pending maturity
timers (wrong for a lease that never had one: format 2 stores it), and its `yield_deadline`,
when missing, is the lease's earliest yield-deadline timer. Format 1 of the state snapshot was
a pickle of the core, tied to the exact build that wrote it: it is not readable.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import partial
from typing import Any, cast

import orjson

from scheduler.core.lifecycle import LeaseState, WorkerState
from scheduler.core.pools import Pools, PoolsRecords
from scheduler.core.records import CoreRecords, LeaseRecord, RequestRecord, TenantUsage, Timer, WorkerRecord
from scheduler.core.types import (
    EndReason,
    Lease,
    LeaseId,
    QoS,
    SessionId,
    SlotId,
    TenantName,
    WorkerId,
    YieldCause,
    YieldRequested,
)
from scheduler.dispatch import ref_from_doc
from scheduler.policy.errors import PolicyError
from scheduler.policy.model import DEFAULT_POOL, TenantSpec
from scheduler.policy.yaml_io import parse_policy
from scheduler.ports import EndedSession, LoopState, WorkerEntry
from scheduler.state.state_write import (
    LABEL,
    LEASE_FIELDS,
    REQUEST_FIELDS,
    SNAPSHOT_FORMAT,
    State,
    StateSnapshotError,
    gc_paused,
)

CORE_READS = (1, 2)  # the core part's formats this build reads
_QOS = {q.value: q for q in QoS}
_LEASE_STATES = {s.value: s for s in LeaseState}

Doc = dict[str, Any]


class SnapshotMismatch(StateSnapshotError):
    """A snapshot in a format this build does not read (a newer one, or the old pickle)."""


# ------------------------------------------------------------------ the state


def read_state(data: bytes, written_by: str | None = None) -> State:
    """Read a snapshot of any format this build knows. `written_by` (the label the store kept
    beside it) only sharpens the message for a snapshot that is not JSON (the old pickle)."""
    with gc_paused(freeze=True):
        return _read(data, written_by)


def _read(data: bytes, written_by: str | None) -> State:
    try:
        doc = orjson.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        if written_by is not None and not written_by.startswith(LABEL):
            raise SnapshotMismatch(
                f"snapshot written by {written_by!r} is a pickle of an earlier build (format 1); "
                f"this build reads formats {sorted(_READERS)}"
            ) from e
        raise StateSnapshotError(f"cannot read the snapshot: not JSON ({e})") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("format"), int):
        raise StateSnapshotError("the snapshot does not hold a slotsched state (no format number)")
    fmt = doc["format"]
    reader = _READERS.get(fmt)
    if reader is None:
        newer = "a newer build" if fmt > SNAPSHOT_FORMAT else "an unknown build"
        raise SnapshotMismatch(
            f"snapshot format {fmt} was written by {newer}; this build reads formats {sorted(_READERS)} "
            f"(up to {SNAPSHOT_FORMAT}): run a build that knows format {fmt}"
        )
    try:
        return reader(doc)
    except StateSnapshotError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, PolicyError) as e:
        raise StateSnapshotError(f"cannot read the snapshot (format {fmt}): {type(e).__name__}: {e}") from e


def _read_v2(doc: Doc) -> State:
    policy, _ = parse_policy(str(doc["policy"]))
    first = str(doc.get("core_pool") or policy.pool_names()[0])
    parts = [(first, core_records(doc["core"]))]
    parts += [(str(name), core_records(part)) for name, part in (doc.get("pools") or {}).items()]
    core = Pools.from_records(policy, PoolsRecords(tuple(parts)))
    ld = doc["loop"]
    yields: dict[LeaseId, YieldRequested] = {}
    for y in ld["yields"]:
        lease = lease_of(y["lease"])
        fs = y["for_session"]
        yields[lease.lease_id] = YieldRequested(
            lease, float(y["deadline"]), YieldCause(y["cause"]), None if fs is None else SessionId(str(fs))
        )
    ended: OrderedDict[SessionId, EndedSession] = OrderedDict()
    for e in ld["ended"]:
        ended[SessionId(str(e["session"]))] = EndedSession(
            EndReason(e["reason"]), QoS(e["qos"]), ref_from_doc(e["last_snapshot"]), float(e["at"])
        )
    loop = LoopState(
        core,
        {WorkerId(str(w)): str(a) for w, a in ld["addresses"].items()},
        yields,
        _seconds(ld["waited"]),
        _qos_map(ld["qos"]),
        _seconds(ld["wait_timeouts"]),
        ended,
    )
    workers: dict[WorkerId, WorkerEntry] = {}
    for w in doc["workers"]:
        wid = WorkerId(str(w["worker_id"]))
        hb = w["last_heartbeat"]
        workers[wid] = WorkerEntry(
            wid,
            str(w["address"]),
            int(w["slots"]),
            float(w["registered_at"]),
            {str(k): str(v) for k, v in w["labels"].items()},
            None if hb is None else float(hb),
            bool(w["draining"]),
            bool(w["static"]),
        )
    return State(loop, workers, time_of(doc["last_now"]))


def _seconds(d: dict[str, Any]) -> dict[SessionId, float]:
    """{session: seconds}, one per live session at most, converted at C speed."""
    return cast(dict[SessionId, float], dict(zip(d.keys(), map(float, d.values()), strict=True)))


def _qos_map(d: dict[str, Any]) -> dict[SessionId, QoS]:
    """The sessions' classes (one per live session: 110,000 in a big state), by table look-up."""
    qos = {q.value: q for q in QoS}
    # JSON keys are strings: C-speed map, no per-entry call.
    return cast(dict[SessionId, QoS], dict(zip(d.keys(), map(qos.__getitem__, d.values()), strict=True)))


def _read_v3(doc: Doc) -> State:
    state = _read_v2({**doc, "loop": {**doc["loop"], "ended": []}})
    ended = state.loop.ended
    reasons = {r.value: r for r in EndReason}
    qos = {q.value: q for q in QoS}
    for s, reason, q, ref, at in doc["loop"]["ended"]:
        ended[SessionId(str(s))] = EndedSession(reasons[reason], qos[q], ref_from_doc(ref), float(at))
    return state


# Every format this build reads. Format 1 (a pickle tied to its build) has no reader.
_READERS = {2: _read_v2, 3: _read_v3}


# ------------------------------------------------------------------ the core's part


def time_of(x: Any) -> float:
    """A time that may be None in the document (-inf: no event seen yet)."""
    return float("-inf") if x is None else float(x)


def lease_of(d: Doc) -> Lease:
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
        str(d.get("pool", DEFAULT_POOL)),
    )


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


def core_records(doc: Any) -> CoreRecords:
    """The records of the core's part of a document (`state_write.core_doc`, or an older format
    of it), for `Core.from_records`; ValueError naming what is wrong if unknown or malformed."""
    if not isinstance(doc, dict):
        raise ValueError("core state: expected a JSON object")
    fmt = doc.get("format")
    if fmt not in CORE_READS:
        reads = list(CORE_READS)
        raise ValueError(f"core state format {fmt!r} is not one this build reads (it reads {reads})")
    try:
        return _records_v2(doc) if fmt == 2 else _records(doc)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"core state is malformed: {type(e).__name__}: {e}") from e


def _common(doc: Doc) -> dict[str, Any]:
    """The fields every format of the core's document holds in the same shape."""
    return {
        "now": time_of(doc["now"]),
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
        **_fairness(doc.get("fairness")),
    }


def _fairness(doc: Any) -> dict[str, Any]:
    """Fair share over time (absent from an older build's document: usage starts at zero)."""
    if doc is None:
        return {}
    return {
        "preempt_seq": int(doc["preempt_seq"]),
        "preempted": tuple((SessionId(str(s)), int(p)) for s, p in doc["preempted"]),
        "usage_last": time_of(doc["usage_last"]),
        "usage": tuple(
            TenantUsage(str(t), float(u), float(acc), float(at), int(lp))
            for t, u, acc, at, lp in doc["usage"]
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
    columns = tuple(doc["lease_fields"]), tuple(doc["request_fields"])
    if columns[0] != LEASE_FIELDS or columns[1] not in (REQUEST_FIELDS, _REQUEST_FIELDS_0):
        raise ValueError("lease_fields or request_fields are not the columns of format 2")
    timers = doc["timers"]
    return CoreRecords(
        **_common(doc),
        epochs=tuple((SlotId(w, int(i)), int(e)) for w, i, e in doc["epochs"]),
        free_slots=tuple((int(seq), int(index), wid) for seq, index, wid in doc["free_slots"]),
        leases=_leases_v2(doc["leases"]),
        requests=_requests_v2(doc["requests"], columns[1]),
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


# The request columns of an older build (no `revoked`: read as none).
_REQUEST_FIELDS_0 = REQUEST_FIELDS[:-1]


def _requests_v2(rows: list[list[Any]], fields: tuple[str, ...]) -> tuple[RequestRecord, ...]:
    # The document's own columns say which build wrote it (not a row's length: a row short of
    # one column is malformed, not an older build's).
    read = _columns(rows, len(fields), "request")
    if fields == _REQUEST_FIELDS_0:
        read = (*read, (None,) * len(read[0]))
    s, tenant, qos, arrival, seq, enqueued_at, ref, earmark, tier, revoked = read
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
        map(_revoked, revoked),
    )
    return tuple(map(_make_request, zip(*columns, strict=True)))


def _revoked(value: Any) -> tuple[LeaseId, int] | None:
    if value is None:
        return None
    lease_id, epoch = value
    return LeaseId(str(lease_id)), int(epoch)


def _lease(
    ld: Doc, pending_maturity: set[tuple[LeaseId, int]], earliest_deadline: dict[tuple[str, int], float]
) -> LeaseRecord:
    lease = lease_of(ld)
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
        _revoked(rd.get("revoked")),
    )


__all__ = ["CORE_READS", "SnapshotMismatch", "core_records", "lease_of", "read_state", "time_of"]
