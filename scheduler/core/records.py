"""The core's logical state as public frozen records (`Core.export_records` /
`Core.from_records`).

What the core *knows*, not how it indexes it: tenants, workers, slot epochs, live leases, queued
requests, counters and pending timers. The indexes (per-tenant accounting, queues, heaps, position
counts, holder map, capacity, floor, free-slot count, preemptible total) are rebuilt from these.
scheduler/state/state_write.py turns them into a JSON document, state_read.py back; nothing
in the core knows JSON.

Order is part of the state and is kept by tuple order: tenants (as the core met them), workers
(registration), leases (grant order: also the order of each tenant's candidates and mature
candidates, and of each worker's leases), requests (queue order), maturing timers (a FIFO).
Leases and requests, the records there are many of (110,000 in a big state), are named tuples:
built and read at C speed on a snapshot's and a recovery's path; the rest are frozen dataclasses.
The lazily cleaned structures (`free_slots`, `earmark_order`, the timers) are kept entry by entry,
stale entries included, because those still change what the core does next (see state_write.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from scheduler.core.lifecycle import LeaseState, WorkerState
from scheduler.core.types import Lease, LeaseId, QoS, SessionId, SlotId, SnapshotRef, TenantName, WorkerId
from scheduler.policy.model import TenantSpec

# A timer entry: (when, lease, epoch). Entries of leases since renewed or ended may remain.
Timer = tuple[float, LeaseId, int]
# A free-slot heap entry: (worker registration seq, slot index, worker).
FreeSlot = tuple[int, int, WorkerId]
# An earmarked waiter's entry: (tier of its right, original arrival, seq, session).
EarmarkEntry = tuple[int, float, int, SessionId]


@dataclass(frozen=True)
class WorkerRecord:
    worker_id: WorkerId
    address: str
    slots: int
    seq: int  # registration order: a worker added again under the same id is a new worker
    state: WorkerState


class LeaseRecord(NamedTuple):
    lease: Lease
    state: LeaseState  # ACTIVE or YIELDING: only live leases are state
    arrival: float  # the session's original arrival (kept across yields)
    seq: int
    borrowing: bool  # preemptible: BestEffort, or Burstable held as borrowing
    for_session: SessionId | None  # the waiter it yields for
    yield_deadline: float | None  # of the yield under way
    candidate: bool  # a preemption candidate (active, preemptible, on a ready worker)
    mature: bool  # a candidate that ran min_runtime (a fairness victim)
    matured: bool  # its min_runtime timer fired (kept while it yields)


class RequestRecord(NamedTuple):
    session: SessionId
    tenant: TenantName
    qos: QoS
    arrival: float
    seq: int
    enqueued_at: float
    resume_from: SnapshotRef | None
    earmark: LeaseId | None  # the victim yielding for it
    earmark_tier: int
    revoked: tuple[LeaseId, int] | None = None  # the lease whose revocation queued it (a late Yield's)


@dataclass(frozen=True)
class CoreRecords:
    now: float  # -inf before the first event
    seq: int
    worker_seq: int
    mean_hold_s: float
    holds_seen: bool
    tenants: tuple[TenantSpec, ...]  # specs as the core holds them (a retired tenant keeps its own)
    retired: frozenset[str]
    workers: tuple[WorkerRecord, ...]
    epochs: tuple[tuple[SlotId, int], ...]
    free_slots: tuple[FreeSlot, ...]
    leases: tuple[LeaseRecord, ...]
    orphans: tuple[LeaseId, ...]  # yields an older build left running for no one
    requests: tuple[RequestRecord, ...]
    earmark_order: tuple[EarmarkEntry, ...]
    expiries: tuple[Timer, ...]
    yield_deadlines: tuple[Timer, ...]
    maturing: tuple[Timer, ...]
    # Fair share over time (spec.fairness), absent from a state an older build wrote: usage then
    # starts at zero and no session counts as preempted before.
    preempt_seq: int = 0
    preempted: tuple[tuple[SessionId, int], ...] = ()  # sessions (holding or queued) preempted before
    usage_last: float = float("-inf")  # the last usage sample
    usage: tuple[TenantUsage, ...] = ()


class TenantUsage(NamedTuple):
    tenant: str
    usage: float  # borrowed slot-seconds, decayed, at the last sample
    acc: float  # borrowed slot-seconds since the last sample, up to `at`
    at: float
    last_preempted: int


__all__ = [
    "CoreRecords",
    "EarmarkEntry",
    "FreeSlot",
    "LeaseRecord",
    "RequestRecord",
    "TenantUsage",
    "Timer",
    "WorkerRecord",
]
