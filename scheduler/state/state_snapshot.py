"""State snapshots: a dump of the scheduler's state as a versioned JSON document, readable across
deploys. Named apart on purpose: "snapshot" alone means an actor checkpoint in this project
(`snapshots/`, `SnapshotRef`, `snapshots.errors.StateSnapshotError`); a dump of the scheduler's state
is a *state snapshot* (`StateSnapshotError`).

A snapshot holds what the state *is*, not how this build indexes it, so a build with a changed
core, policy or server still reads it (the journal is trimmed at every snapshot: an unreadable
snapshot would lose every lease):

    {"format": 2,                       # SNAPSHOT_FORMAT
     "last_now": <float or null>,       # the latest `now` applied (null: none yet)
     "policy": <SchedulingPolicy YAML>, # the policy the core runs under (policy_to_yaml)
     "core": <Core.export_state()>,     # workers, epochs, leases, queue, timers (own "format")
     "loop": {"addresses": {worker: address},
              "yields": [{"lease": <lease>, "deadline", "cause", "for_session"}],
              "waited": {session: s}, "qos": {session: qos}, "wait_timeouts": {session: s},
              "ended": [{"session", "reason", "qos", "last_snapshot", "at"}]},  # oldest first
     "workers": [{"worker_id", "address", "slots", "registered_at", "labels", "last_heartbeat",
                  "draining", "static"}]}

A lease is `{"lease_id", "session", "tenant", "qos", "worker", "slot", "epoch", "granted_at",
"expires_at", "resume_from"}`, a snapshot ref `{"uri", "size_bytes", "sha256", "created"}`.

Compatibility is an explicit number, not a hash of the sources: `loads` reads every format it
knows (`_READERS`) and refuses a newer one with `SnapshotMismatch` (recovery then replays the
whole journal if it was never trimmed, or stops and says so: run the newer build). A change to
what a snapshot must hold bumps SNAPSHOT_FORMAT and keeps a reader for the previous format.
Format 1 was a pickle of the core, tied to the exact build that wrote it: it is not readable.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from scheduler.core.engine import Core
from scheduler.core.state_io import (
    lease_from_doc,
    lease_to_doc,
    ref_from_doc,
    ref_to_doc,
    time_from_doc,
    time_to_doc,
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
from scheduler.policy.yaml_io import parse_policy, policy_to_yaml
from scheduler.ports import EndedSession, LoopState, WorkerEntry

SNAPSHOT_FORMAT = 2
_LABEL = "slotsched-snapshot"

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


def current_fingerprint() -> str:
    """What the store records beside the data (informational: `loads` reads the format inside)."""
    return f"{_LABEL}/{SNAPSHOT_FORMAT}"


# ------------------------------------------------------------------ write


def dumps(state: State) -> bytes:
    loop = state.loop
    try:
        doc: Doc = {
            "format": SNAPSHOT_FORMAT,
            "last_now": time_to_doc(state.last_now),
            "policy": policy_to_yaml(loop.core.policy),
            "core": loop.core.export_state(),
            "loop": {
                "addresses": dict(loop.addresses),
                "yields": [
                    {
                        "lease": lease_to_doc(y.lease),
                        "deadline": y.deadline,
                        "cause": y.cause.value,
                        "for_session": y.for_session,
                    }
                    for y in loop.yields.values()
                ],
                "waited": dict(loop.waited),
                "qos": {s: q.value for s, q in loop.qos.items()},
                "wait_timeouts": dict(loop.wait_timeouts),
                "ended": [
                    {
                        "session": s,
                        "reason": e.reason.value,
                        "qos": e.qos.value,
                        "last_snapshot": ref_to_doc(e.last_snapshot),
                        "at": e.at,
                    }
                    for s, e in loop.ended.items()
                ],
            },
            "workers": [
                {
                    "worker_id": w.worker_id,
                    "address": w.address,
                    "slots": w.slots,
                    "registered_at": w.registered_at,
                    "labels": dict(w.labels),
                    "last_heartbeat": w.last_heartbeat,
                    "draining": w.draining,
                    "static": w.static,
                }
                for w in state.workers.values()
            ],
        }
        return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError, AttributeError) as e:
        raise StateSnapshotError(f"cannot snapshot the scheduler state: {e}") from e


# ------------------------------------------------------------------ read


def loads(data: bytes, written_by: str | None = None) -> State:
    """Read a snapshot of any format this build knows. `written_by` (the label the store kept
    beside it) only sharpens the message for a snapshot that is not JSON (the old pickle)."""
    try:
        doc = json.loads(data)
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
        {SessionId(str(s)): float(v) for s, v in ld["waited"].items()},
        {SessionId(str(s)): QoS(q) for s, q in ld["qos"].items()},
        {SessionId(str(s)): float(v) for s, v in ld["wait_timeouts"].items()},
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


# Every format this build reads. Format 1 (a pickle tied to its build) has no reader.
_READERS = {2: _read_v2}
