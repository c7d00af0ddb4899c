"""State snapshots: a dump of the scheduler's state as a versioned JSON document, readable across
deploys. Named apart on purpose: "snapshot" alone means an actor checkpoint in this project
(`snapshots/`, `SnapshotRef`, `snapshots.errors.StateSnapshotError`); a dump of the scheduler's state
is a *state snapshot* (`StateSnapshotError`).

A snapshot holds what the state *is*, not how this build indexes it, so a build with a changed
core, policy or server still reads it (the journal is trimmed at every snapshot: an unreadable
snapshot would lose every lease):

    {"format": 3,                       # SNAPSHOT_FORMAT
     "last_now": <float or null>,       # the latest `now` applied (null: none yet)
     "policy": <SchedulingPolicy YAML>, # the policy the core runs under (policy_to_yaml)
     "core": <Core.export_state()>,     # workers, epochs, leases, queue, timers (own "format", 2:
                                        #   leases and requests as rows, see core/state_io.py)
     "loop": {"addresses": {worker: address},
              "yields": [{"lease": <lease>, "deadline", "cause", "for_session"}],
              "waited": {session: s}, "qos": {session: qos}, "wait_timeouts": {session: s},
              "ended": [[session, reason, qos, last_snapshot, at]]},  # oldest first
     "workers": [{"worker_id", "address", "slots", "registered_at", "labels", "last_heartbeat",
                  "draining", "static"}]}

A lease is `{"lease_id", "session", "tenant", "qos", "worker", "slot", "epoch", "granted_at",
"expires_at", "resume_from"}`, a snapshot ref `{"uri", "size_bytes", "sha256", "created"}`.
Format 2 was the same with the core's format 1 (an object per lease and request) and `ended`
as objects `{"session", "reason", "qos", "last_snapshot", "at"}`; it is still read.

Cost at scale (10,000 leases + 100,000 queued sessions: ~12 MB). Writing is split so the
event loop pays little: `capture` (on the loop, between events: dict copies and one tuple per
lease, ~10-30 ms) and `encode` (anywhere, e.g. `asyncio.to_thread`: records, rows, orjson, in
chunks of `_CHUNK` entries so no single call holds the GIL for long). Reading (`loads`) is
orjson plus a row-by-row build of the records and a bulk rebuild of the core's indexes.

Compatibility is an explicit number, not a hash of the sources: `loads` reads every format it
knows (`_READERS`) and refuses a newer one with `SnapshotMismatch` (recovery then replays the
whole journal if it was never trimmed, or stops and says so: run the newer build). A change to
what a snapshot must hold bumps SNAPSHOT_FORMAT and keeps a reader for the previous format.
Format 1 was a pickle of the core, tied to the exact build that wrote it: it is not readable.
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import orjson

from scheduler.core.engine import Core
from scheduler.core.restore import Capture, records_of
from scheduler.core.state_io import (
    lease_from_doc,
    lease_to_doc,
    ref_from_doc,
    ref_to_doc,
    time_from_doc,
    time_to_doc,
    to_doc,
)
from scheduler.core.types import (
    EndReason,
    LeaseId,
    QoS,
    SessionId,
    WorkerId,
    YieldCause,
    YieldRequested,
)
from scheduler.policy.errors import PolicyError
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import parse_policy, policy_to_yaml
from scheduler.ports import EndedSession, LoopState, WorkerEntry

SNAPSHOT_FORMAT = 3
_LABEL = "slotsched-snapshot"
_CHUNK = 5000  # entries per orjson call when encoding: a few ms of GIL each

Doc = dict[str, Any]


class StateSnapshotError(Exception):
    """The state cannot be snapshotted or restored."""


class SnapshotMismatch(StateSnapshotError):
    """A snapshot in a format this build does not read (a newer one, or the old pickle)."""


@dataclass
class State:
    """Everything a snapshot holds."""

    loop: LoopState
    workers: dict[WorkerId, WorkerEntry]
    last_now: float  # the latest `now` applied: recovery carries leases from here


@dataclass(frozen=True)
class Captured:
    """A consistent copy of a `State` (`capture`), never written after: `encode` it anywhere."""

    core: Capture
    policy: Policy
    addresses: dict[WorkerId, str]
    yields: tuple[YieldRequested, ...]
    waited: dict[SessionId, float]
    qos: dict[SessionId, QoS]
    wait_timeouts: dict[SessionId, float]
    ended: tuple[tuple[SessionId, EndedSession], ...]
    workers: tuple[WorkerEntry, ...]
    last_now: float

    @property
    def size(self) -> int:
        """Live leases + queued requests."""
        return self.core.size


def current_fingerprint() -> str:
    """What the store records beside the data (informational: `loads` reads the format inside)."""
    return f"{_LABEL}/{SNAPSHOT_FORMAT}"


# ------------------------------------------------------------------ write


def capture(state: State) -> Captured:
    """A consistent copy of `state`, cheap enough for the event loop (between events)."""
    loop = state.loop
    workers = tuple(
        WorkerEntry(
            w.worker_id,
            w.address,
            w.slots,
            w.registered_at,
            dict(w.labels),
            w.last_heartbeat,
            w.draining,
            w.static,
        )
        for w in state.workers.values()
    )
    return Captured(
        loop.core.capture(),
        loop.core.policy,
        dict(loop.addresses),
        tuple(loop.yields.values()),
        dict(loop.waited),
        dict(loop.qos),
        dict(loop.wait_timeouts),
        tuple(loop.ended.items()),
        workers,
        state.last_now,
    )


@contextmanager
def _gc_paused(freeze: bool = False) -> Iterator[None]:
    """No cyclic GC while building or reading 100,000s of objects: each collection would walk
    them all (seconds, in all), and none of them is garbage meanwhile. With `freeze`, what exists
    afterwards (the state just read) is moved out of the collector's sight (`gc.freeze`): left
    young, it would be walked again by the next collections of every generation, during the
    journal replay that follows. Objects already frozen (a state read before, since replaced)
    are handed back to the collector first (`gc.unfreeze`), so a cycle among them is not kept
    forever. A frozen object that is released is still freed (reference counting)."""
    was = gc.isenabled()
    gc.disable()
    try:
        if freeze:
            gc.unfreeze()
        yield
    finally:
        if freeze:
            gc.freeze()
        if was:
            gc.enable()


def encode(c: Captured) -> bytes:
    """The snapshot of a capture. Pure: safe in a thread while the loop goes on."""
    with _gc_paused():
        return _encode(c)


def _encode(c: Captured) -> bytes:
    try:
        doc: Doc = {
            "format": SNAPSHOT_FORMAT,
            "last_now": time_to_doc(c.last_now),
            "policy": policy_to_yaml(c.policy),
            "core": to_doc(records_of(c.core)),
            "loop": {
                "addresses": c.addresses,
                "yields": [
                    {
                        "lease": lease_to_doc(y.lease),
                        "deadline": y.deadline,
                        "cause": y.cause.value,
                        "for_session": y.for_session,
                    }
                    for y in c.yields
                ],
                "waited": c.waited,
                "qos": {s: q.value for s, q in c.qos.items()},
                "wait_timeouts": c.wait_timeouts,
                "ended": [
                    [s, e.reason.value, e.qos.value, ref_to_doc(e.last_snapshot), e.at] for s, e in c.ended
                ],
            },
            "workers": [
                {
                    "worker_id": w.worker_id,
                    "address": w.address,
                    "slots": w.slots,
                    "registered_at": w.registered_at,
                    "labels": w.labels,
                    "last_heartbeat": w.last_heartbeat,
                    "draining": w.draining,
                    "static": w.static,
                }
                for w in c.workers
            ],
        }
        data = _dump(doc)
        for rows in (doc["core"]["leases"], doc["core"]["requests"]):
            while rows:  # freed a chunk at a time, not in one GIL-holding cascade at return
                del rows[-_CHUNK:]
        return data
    except (TypeError, ValueError, AttributeError) as e:
        raise StateSnapshotError(f"cannot snapshot the scheduler state: {e}") from e


def dumps(state: State) -> bytes:
    """`encode(capture(state))`: the snapshot of `state`, all at once."""
    return encode(capture(state))


def _dump(v: Any) -> bytes:
    """orjson, a big list or map `_CHUNK` entries at a time (each call holds the GIL throughout)."""
    if isinstance(v, list) and len(v) > _CHUNK:
        return (
            b"[" + b",".join(orjson.dumps(v[i : i + _CHUNK])[1:-1] for i in range(0, len(v), _CHUNK)) + b"]"
        )
    if isinstance(v, dict):
        if len(v) > _CHUNK:
            items = list(v.items())
            parts = (orjson.dumps(dict(items[i : i + _CHUNK]))[1:-1] for i in range(0, len(items), _CHUNK))
            return b"{" + b",".join(parts) + b"}"
        if any(isinstance(x, (list, dict)) for x in v.values()):
            return b"{" + b",".join(orjson.dumps(k) + b":" + _dump(x) for k, x in v.items()) + b"}"
    # Non-finite floats would become null: the times that may be -inf went through time_to_doc.
    return orjson.dumps(v)


# ------------------------------------------------------------------ read


def loads(data: bytes, written_by: str | None = None) -> State:
    """Read a snapshot of any format this build knows. `written_by` (the label the store kept
    beside it) only sharpens the message for a snapshot that is not JSON (the old pickle)."""
    with _gc_paused(freeze=True):
        return _loads(data, written_by)


def _loads(data: bytes, written_by: str | None) -> State:
    try:
        doc = orjson.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        if written_by is not None and not written_by.startswith(_LABEL):
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
    core = Core.from_state(policy, doc["core"])
    ld = doc["loop"]
    yields: dict[LeaseId, YieldRequested] = {}
    for y in ld["yields"]:
        lease = lease_from_doc(y["lease"])
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
    return State(loop, workers, time_from_doc(doc["last_now"]))


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
