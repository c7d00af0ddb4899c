"""The journal's record format: one JSON object per applied event, stable and versioned.

A record is what `SchedulerLoop` applied to the core and when, plus the server-side facts the
core does not hold but a recovered server needs (a session's wait_timeout, a worker's labels).
Replaying records in order through `Core.handle(event, at)` rebuilds the same core.

Format (version 1), compact JSON, keys sorted, no whitespace:

    {"v": 1, "at": <float seconds>, "t": <type>, ...fields}

| t | fields |
| --- | --- |
| `worker_added` | `worker`, `slots`, `address`; optional `labels` (object), `static` (bool) |
| `worker_draining` | `worker`, `yield_within_s` (float or null) |
| `worker_removed` | `worker` |
| `acquire` | `session`, `tenant`, `qos`, `resume_from` (snapshot or null); optional `wait_timeout_s` |
| `release` | `session`, `lease_id` (string or null: withdraw the queued request), `epoch` |
| `renew` | `session`, `lease_id`, `epoch` |
| `yield` | `session`, `lease_id`, `epoch`, `snapshot` (snapshot or null) |
| `tick` | (none) |
| `resumed` | `since`: the last `now` before an outage a new leader bridged (see `Resumed`) |
| `policy` | `yaml`: the SchedulingPolicy document applied (Admin.ApplyPolicy) |

`qos` is guaranteed, burstable or besteffort. A snapshot ref is `{"uri", "size_bytes", "sha256",
"created"}`. A reader refuses a record with an unknown `v` or `t` (`CodecError`) rather than
guess: a newer writer's journal must not be half-understood.
"""

from __future__ import annotations

import json
from typing import Any

from scheduler.core.state_io import ref_from_doc, ref_to_doc
from scheduler.core.types import (
    Acquire,
    Event,
    LeaseId,
    QoS,
    Release,
    Renew,
    Resumed,
    SessionId,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerDraining,
    WorkerId,
    WorkerRemoved,
    Yield,
)
from scheduler.policy_load import PolicyError, parse_policy, policy_to_yaml
from scheduler.ports import Extras, PolicyApplied

FORMAT_VERSION = 1


class CodecError(ValueError):
    """A journal record this build cannot read."""


# An ApplyPolicy, as journaled (it is not a core Event): the loop's own record of it.
PolicyRecord = PolicyApplied

Record = Event | PolicyRecord

__all__ = ["FORMAT_VERSION", "CodecError", "Extras", "PolicyRecord", "Record", "decode", "encode"]


def encode(record: Record, at: float, extras: Extras | None = None) -> bytes:
    """One record as compact JSON bytes."""
    doc: dict[str, Any] = {"v": FORMAT_VERSION, "at": at}
    x = extras or Extras()
    if isinstance(record, Acquire):
        doc.update(
            t="acquire",
            session=record.session,
            tenant=record.tenant,
            qos=record.qos.value,
            resume_from=ref_to_doc(record.resume_from),
        )
        if x.wait_timeout_s is not None:
            doc["wait_timeout_s"] = x.wait_timeout_s
    elif isinstance(record, Renew):
        doc.update(t="renew", session=record.session, lease_id=record.lease_id, epoch=record.epoch)
    elif isinstance(record, Release):
        doc.update(t="release", session=record.session, lease_id=record.lease_id, epoch=record.epoch)
    elif isinstance(record, Yield):
        doc.update(
            t="yield",
            session=record.session,
            lease_id=record.lease_id,
            epoch=record.epoch,
            snapshot=ref_to_doc(record.snapshot),
        )
    elif isinstance(record, Tick):
        doc["t"] = "tick"
    elif isinstance(record, Resumed):
        doc.update(t="resumed", since=record.since)
    elif isinstance(record, WorkerAdded):
        doc.update(t="worker_added", worker=record.worker, slots=record.slots, address=record.address)
        if x.labels:
            doc["labels"] = dict(x.labels)
        if x.static:
            doc["static"] = True
    elif isinstance(record, WorkerDraining):
        doc.update(t="worker_draining", worker=record.worker, yield_within_s=record.yield_within_s)
    elif isinstance(record, WorkerRemoved):
        doc.update(t="worker_removed", worker=record.worker)
    elif isinstance(record, PolicyRecord):
        doc.update(t="policy", yaml=policy_to_yaml(record.policy))
    else:  # pragma: no cover - the Event union is closed
        raise CodecError(f"cannot encode {type(record).__name__}")
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def decode(raw: bytes | str) -> tuple[Record, float, Extras]:
    """The record, the `now` it was applied at, and its extras. Raises CodecError."""
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise CodecError("a journal record must be a JSON object")
        if doc.get("v") != FORMAT_VERSION:
            raise CodecError(f"journal record format v={doc.get('v')!r}; this build reads v={FORMAT_VERSION}")
        return _decode(doc)
    except CodecError:
        raise
    except (ValueError, KeyError, TypeError, PolicyError) as e:
        raise CodecError(f"malformed journal record {raw[:200]!r}: {e}") from e


def _decode(doc: dict[str, Any]) -> tuple[Record, float, Extras]:
    at = float(doc["at"])
    t = doc.get("t")
    x = Extras()
    rec: Record
    if t == "acquire":
        rec = Acquire(
            SessionId(doc["session"]),
            TenantName(doc["tenant"]),
            QoS(doc["qos"]),
            ref_from_doc(doc.get("resume_from")),
        )
        wt = doc.get("wait_timeout_s")
        x = Extras(wait_timeout_s=None if wt is None else float(wt))
    elif t == "renew":
        rec = Renew(SessionId(doc["session"]), LeaseId(doc["lease_id"]), int(doc["epoch"]))
    elif t == "release":
        lid = doc.get("lease_id")
        rec = Release(SessionId(doc["session"]), None if lid is None else LeaseId(lid), int(doc["epoch"]))
    elif t == "yield":
        rec = Yield(
            SessionId(doc["session"]),
            LeaseId(doc["lease_id"]),
            int(doc["epoch"]),
            ref_from_doc(doc.get("snapshot")),
        )
    elif t == "tick":
        rec = Tick()
    elif t == "resumed":
        rec = Resumed(float(doc["since"]))
    elif t == "worker_added":
        rec = WorkerAdded(WorkerId(doc["worker"]), int(doc["slots"]), str(doc["address"]))
        labels = {str(k): str(v) for k, v in (doc.get("labels") or {}).items()}
        x = Extras(labels=labels, static=bool(doc.get("static", False)))
    elif t == "worker_draining":
        within = doc.get("yield_within_s")
        rec = WorkerDraining(WorkerId(doc["worker"]), None if within is None else float(within))
    elif t == "worker_removed":
        rec = WorkerRemoved(WorkerId(doc["worker"]))
    elif t == "policy":
        rec = PolicyRecord(parse_policy(doc["yaml"])[0])
    else:
        raise CodecError(f"unknown journal record type {t!r}")
    return rec, at, x
