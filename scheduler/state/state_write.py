"""The one module that writes the scheduler's state document (a *state snapshot*); the one that
reads it is state_read.py. Named apart on purpose: "snapshot" alone means an actor checkpoint in
this project (`snapshots/`, `SnapshotRef`); a dump of the scheduler's state is a *state
snapshot* (`StateSnapshotError`).

The document holds what the state *is*, not how this build indexes it, so a build with a changed
core, policy or server still reads it (the journal is trimmed at every snapshot: an unreadable
snapshot would lose every lease). The core knows its state as records (core/records.py,
`Core.export_records` / `Core.capture`; `Core.from_records` loads them); everything about JSON is
here and in state_read.py, so the core stays free of documents:

    {"format": 3,                       # SNAPSHOT_FORMAT
     "last_now": <float or null>,       # the latest `now` applied (null: none yet)
     "policy": <SchedulingPolicy YAML>, # the policy the core runs under (policy_to_yaml)
     "core": <the core's part, below>,
     "loop": {"addresses": {worker: address},
              "yields": [{"lease": <lease>, "deadline", "cause", "for_session"}],
              "waited": {session: s}, "qos": {session: qos}, "wait_timeouts": {session: s},
              "ended": [[session, reason, qos, last_snapshot, at]]},  # oldest first
     "workers": [{"worker_id", "address", "slots", "registered_at", "labels", "last_heartbeat",
                  "draining", "static"}]}

A lease is `{"lease_id", "session", "tenant", "qos", "worker", "slot", "epoch", "granted_at",
"expires_at", "resume_from"}`, a snapshot ref `{"uri", "size_bytes", "sha256", "created"}`.

The core's part (its own `"format"`, CORE_FORMAT = 2): counters (`now`, `seq`, `worker_seq`,
`mean_hold_s`, `holds_seen`), `tenants` (specs as the core holds them, in the order it met
them), `retired`, `workers` (registration order), `epochs`, `free_slots`, `leases` and
`requests` as rows (JSON arrays) under a header naming their columns (`lease_fields`,
`request_fields`: half the bytes of an object each, and read at C speed; a request's `revoked`,
the [lease id, epoch] whose revocation queued it, is absent from an older build's columns and
read as none), `orphans`,
`earmark_order`, `timers` (`expiries`, `yield_deadlines`, `maturing`) and `fairness`
(`preempt_seq`, `preempted` sessions, `usage_last`, per-tenant `usage` rows: absent from an
older build's document, read as none, so usage starts at zero). Everything else
(per-tenant accounting, queues, heaps, position counts, holder map, capacity, floor, free-slot
count, preemptible total) is rebuilt from these when read. Order is part of the state and is
kept by list order: leases in grant order (also each tenant's candidates' and each worker's
leases' order), requests in queue order. Three lazily cleaned structures are kept entry by entry,
stale entries included, because those still change what the core does next: the timers (an
entry of a lease since renewed or ended still wakes the core), `free_slots` (seq, index,
worker: a worker removed and added again reuses its entries and their place in the packing
order) and `earmark_order` (tier, arrival, seq, session: the lowest tier of a request earmarked
more than once decides its rank). `orphans` is always empty now (an older build's document may
list yields left running for no one: the next event cancels them).

Cost at scale (10,000 leases + 100,000 queued sessions: ~12 MB). Writing is split so the event
loop pays little: `capture` (on the loop, between events: dict copies and one tuple per lease,
~10-30 ms) and `write_state` (anywhere, e.g. `asyncio.to_thread`: records, rows, orjson, in
chunks of `_CHUNK` entries so no single call holds the GIL for long).

Compatibility is an explicit number, not a hash of the sources: state_read.py reads every
format it knows and refuses a newer one. A change to what a snapshot must hold bumps
SNAPSHOT_FORMAT (or CORE_FORMAT) and keeps a reader for the previous format there.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson

from scheduler.core.pools import PoolsCapture
from scheduler.core.records import CoreRecords, LeaseRecord
from scheduler.core.restore import records_of
from scheduler.core.types import Lease, QoS, SessionId, WorkerId, YieldRequested
from scheduler.dispatch import ref_to_doc
from scheduler.policy.model import DEFAULT_POOL, Policy, TenantSpec
from scheduler.policy.yaml_io import policy_to_yaml
from scheduler.ports import EndedSession, LoopState, WorkerEntry

SNAPSHOT_FORMAT = 3
CORE_FORMAT = 2
LABEL = "slotsched-snapshot"
_CHUNK = 5000  # entries per orjson call when writing: a few ms of GIL each

LEASE_FIELDS = (
    "lease_id", "session", "tenant", "qos", "worker", "slot", "epoch", "granted_at", "expires_at",
    "resume_from", "state", "arrival", "seq", "borrowing", "for_session", "yield_deadline",
    "candidate", "mature", "matured",
)  # fmt: skip
REQUEST_FIELDS = (
    "session", "tenant", "qos", "arrival", "seq", "enqueued_at", "resume_from", "earmark", "earmark_tier",
    "revoked",
)  # fmt: skip

Doc = dict[str, Any]


class StateSnapshotError(Exception):
    """The state cannot be written to, or read from, a state snapshot."""


@dataclass
class State:
    """Everything a state snapshot holds."""

    loop: LoopState
    workers: dict[WorkerId, WorkerEntry]
    last_now: float  # the latest `now` applied: recovery carries leases from here


@dataclass(frozen=True)
class Captured:
    """A consistent copy of a `State` (`capture`), never written after: write it anywhere."""

    core: PoolsCapture
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
    """What the store records beside the data (informational: the reader reads the format inside)."""
    return f"{LABEL}/{SNAPSHOT_FORMAT}"


@contextmanager
def gc_paused(freeze: bool = False) -> Iterator[None]:
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


# ------------------------------------------------------------------ the state


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
    core = loop.core.capture()
    if not isinstance(core, PoolsCapture):  # a bare Core (tests, tools): its one pool
        core = PoolsCapture(((loop.core.policy.pool.name, core),))
    return Captured(
        core,
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


def write_state(c: Captured) -> bytes:
    """The state snapshot of a capture. Pure: safe in a thread while the loop goes on."""
    with gc_paused():
        return _write(c)


def state_bytes(state: State) -> bytes:
    """`write_state(capture(state))`: the state snapshot of `state`, all at once."""
    return write_state(capture(state))


def _write(c: Captured) -> bytes:
    try:
        doc: Doc = {
            "format": SNAPSHOT_FORMAT,
            "last_now": time_doc(c.last_now),
            "policy": policy_to_yaml(c.policy),
            "core": core_doc(records_of(c.core.pools[0][1])),
            "loop": {
                "addresses": c.addresses,
                "yields": [
                    {
                        "lease": lease_doc(y.lease),
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
        if len(c.core.pools) > 1:  # the first pool's part is "core" (a document of one pool is as before)
            doc["core_pool"] = c.core.pools[0][0]
            doc["pools"] = {name: core_doc(records_of(part)) for name, part in c.core.pools[1:]}
        data = _dump(doc)
        parts = [doc["core"], *doc.get("pools", {}).values()]
        for rows in [p[k] for p in parts for k in ("leases", "requests")]:
            while rows:  # freed a chunk at a time, not in one GIL-holding cascade at return
                del rows[-_CHUNK:]
        return data
    except (TypeError, ValueError, AttributeError) as e:
        raise StateSnapshotError(f"cannot snapshot the scheduler state: {e}") from e


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
    # Non-finite floats would become null: the times that may be -inf went through time_doc.
    return orjson.dumps(v)


# ------------------------------------------------------------------ the core's part


def time_doc(x: float) -> float | None:
    """A time that may be -inf (no event seen yet): JSON has no infinities, so None."""
    return x if math.isfinite(x) else None


def lease_doc(lease: Lease) -> Doc:
    """A lease as JSON: the one form, for the loop's pending yields (the core's are rows)."""
    doc: Doc = {
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
    if lease.pool != DEFAULT_POOL:
        doc["pool"] = lease.pool
    return doc


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


def _lease_row(lr: LeaseRecord) -> list[Any]:
    lease = lr.lease
    ref = lease.resume_from
    return [
        lease.lease_id, lease.session, lease.tenant, lease.qos.value, lease.slot.worker, lease.slot.index,
        lease.epoch, lease.granted_at, lease.expires_at, None if ref is None else ref_to_doc(ref),
        lr.state.value, lr.arrival, lr.seq, lr.borrowing, lr.for_session, lr.yield_deadline,
        lr.candidate, lr.mature, lr.matured,
    ]  # fmt: skip


def core_doc(r: CoreRecords) -> Doc:
    """The core's part of the document, of `r` (see the module docstring): JSON types only."""
    return {
        "format": CORE_FORMAT,
        "now": time_doc(r.now),
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
                None if rr.revoked is None else list(rr.revoked),
            ]  # fmt: skip
            for rr in r.requests
        ],
        "earmark_order": [list(e) for e in r.earmark_order],
        "timers": {
            "expiries": sorted(r.expiries),
            "yield_deadlines": sorted(r.yield_deadlines),
            "maturing": list(r.maturing),  # a FIFO: its order is kept as is
        },
        # Fair share over time; an older document lacks them (read as none: usage from zero).
        "fairness": {
            "preempt_seq": r.preempt_seq,
            "preempted": [[s, p] for s, p in r.preempted],
            "usage_last": time_doc(r.usage_last),
            "usage": [list(u) for u in r.usage],
        },
    }


__all__ = [
    "CORE_FORMAT",
    "LEASE_FIELDS",
    "REQUEST_FIELDS",
    "SNAPSHOT_FORMAT",
    "Captured",
    "State",
    "StateSnapshotError",
    "capture",
    "core_doc",
    "current_fingerprint",
    "lease_doc",
    "state_bytes",
    "write_state",
]
