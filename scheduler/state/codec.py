"""The journal's record format: one JSON object per applied event, stable and versioned.

A record is what `SchedulerLoop` applied to the core and when, plus the server-side facts the
core does not hold but a recovered server needs (a session's wait_timeout, a worker's labels).
Replaying records in order through `Core.handle(event, at)` rebuilds the same core.

A journal entry holds the records of one group commit, one per line (`pack`; a lone record is
its own entry). A record, format (version 1), compact JSON, keys sorted, no whitespace:

    {"v": 1, "at": <float seconds>, "t": <type>, ...fields}

| t | fields |
| --- | --- |
| `worker_added` | `worker`, `slots`, `address`; optional `labels` (object), `static` (bool) |
| `worker_draining` | `worker`, `yield_within_s` (float or null) |
| `worker_removed` | `worker` |
| `acquire` | `session`, `tenant`, `qos`, `resume_from` (snapshot or null); optional `wait_timeout_s` |
| `release` | `session`, `lease_id` (string or null: withdraw the queued request), `epoch` |
| `renew_until` | `session`, `lease_id`, `epoch`; `until`: the expiry the renewal set (absent if refused) |
| `renew` | `session`, `lease_id`, `epoch`: read only (written before expiry steps; replayed: now + TTL) |
| `yield` | `session`, `lease_id`, `epoch`, `snapshot` (snapshot or null) |
| `tick` | (none) |
| `resumed` | `since`: the last `now` before an outage a new leader bridged (see `Resumed`) |
| `policy` | `yaml`: the SchedulingPolicy document applied (Admin.ApplyPolicy) |

`qos` is guaranteed, burstable or besteffort. A snapshot ref is `{"uri", "size_bytes", "sha256",
"created"}`. A reader refuses a record with an unknown `v` or `t` (`CodecError`) rather than
guess: a newer writer's journal must not be half-understood (hence `renew_until`: a build that
knew only `renew` would replay it as now + TTL, short of the expiry its leader set).

A renewal that changed nothing (`Renewed.quiet`: the expiry already past now + TTL) is not
journaled at all: replayed, it would change nothing either.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from scheduler.core.types import Event
from scheduler.dispatch import BY_NAME, BY_TYPE
from scheduler.policy.errors import PolicyError
from scheduler.ports import NO_EXTRAS, Extras, PolicyApplied

FORMAT_VERSION = 1


class CodecError(ValueError):
    """A journal record this build cannot read."""


# An ApplyPolicy, as journaled (it is not a core Event): the loop's own record of it.
PolicyRecord = PolicyApplied

Record = Event | PolicyRecord

__all__ = [
    "FORMAT_VERSION",
    "CodecError",
    "Extras",
    "PolicyRecord",
    "Record",
    "decode",
    "decode_entry",
    "encode",
    "pack",
]


def encode(record: Record, at: float, extras: Extras | None = None) -> bytes:
    """One record as compact JSON bytes (its fields written by scheduler/dispatch.py's table)."""
    spec = BY_TYPE.get(type(record))
    if spec is None:  # pragma: no cover - the Event union is closed
        raise CodecError(f"cannot encode {type(record).__name__}")
    if not math.isfinite(at):  # orjson would write null, which no reader takes for a time
        raise CodecError(f"cannot encode a record at time {at!r}")
    doc: dict[str, Any] = {"v": FORMAT_VERSION, "at": at, "t": spec.name}
    spec.encode(record, doc, extras or NO_EXTRAS)
    # orjson: ~1 us against json's ~8 (every Acquire and Release waits for its record); the
    # same compact, key-sorted JSON that json.loads reads (floats shortest round-trip).
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def pack(records: list[bytes]) -> bytes:
    """One journal entry holding a batch's records, in order: one line each (compact JSON holds
    no raw newline). One entry per group commit, not one per record: the leader's script adds one
    stream entry and a follower reads and parses one reply element per batch (`decode_entry`). A
    single record is its own entry, as before batches were packed."""
    return records[0] if len(records) == 1 else b"\n".join(records)


def decode_entry(raw: bytes) -> list[tuple[Record, float, Extras]]:
    """Every record of one journal entry (`pack`), in order. Raises CodecError."""
    if b"\n" not in raw:
        return [decode(raw)]
    return [decode(line) for line in raw.split(b"\n")]


def decode(raw: bytes | str) -> tuple[Record, float, Extras]:
    """The record, the `now` it was applied at, and its extras. Raises CodecError."""
    try:
        doc = orjson.loads(raw)  # the same documents json.loads reads, in a third of the time
        if type(doc) is not dict:  # orjson builds dicts, never a subclass
            raise CodecError("a journal record must be a JSON object")
        if doc.get("v") != FORMAT_VERSION:
            raise CodecError(f"journal record format v={doc.get('v')!r}; this build reads v={FORMAT_VERSION}")
        # The record's type and fields (inline, not a helper: a follower decodes every record).
        at = float(doc["at"])
        t = doc.get("t")
        spec = BY_NAME.get(t) if type(t) is str else None
        if spec is None:
            raise CodecError(f"unknown journal record type {t!r}")
        rec, x = spec.decode(doc)
        return rec, at, x
    except CodecError:
        raise
    except (ValueError, KeyError, TypeError, PolicyError) as e:
        raise CodecError(f"malformed journal record {raw[:200]!r}: {e}") from e
