"""The core's mutable records: a queued request, a live lease, a registered worker.

Owned by `Core` (engine.py) and never handed out: adapters read the frozen views (views.py) and
the exported records (records.py) instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.lifecycle import LeaseState, WorkerState
from scheduler.core.tenants import TenantState
from scheduler.core.types import Lease, LeaseId, SessionId, SlotId, SnapshotRef, WorkerId


@dataclass(slots=True)
class Request:
    session: SessionId
    tenant: TenantState
    cls: int
    arrival: float  # original arrival: a yielded session keeps its place in line
    seq: int
    enqueued_at: float  # when this wait began (time-to-slot counts every wait)
    resume_from: SnapshotRef | None
    earmark: LeaseId | None = None  # the victim yielding for this request, if any
    earmark_tier: int = 0
    # The lease (id, epoch) whose revocation queued it again: a Yield quoting it still brings the
    # snapshot the session resumes from (a late snapshot). Set in the event that queues it, and
    # after that never changed, as no field but the earmark is (a state capture shares the
    # request objects): a late snapshot replaces the request instead.
    revoked: tuple[LeaseId, int] | None = None
    preempted: int = 0  # the preemption seq when this session was last asked to yield (0: never)


@dataclass(slots=True)
class LeaseRec:
    lease: Lease
    tenant: TenantState
    cls: int
    state: LeaseState
    arrival: float
    seq: int
    worker: WorkerRec
    for_session: SessionId | None = None
    borrowing: bool = False  # preemptible: BestEffort, or Burstable held as borrowing
    gseq: int = 0  # grant order: candidates are kept in it (a cancelled yield goes back in place)
    matured: bool = False  # its min_runtime timer fired (it can be a fairness victim when active)
    yield_deadline: float | None = None  # of the yield under way; older heap entries are stale
    preempted: int = 0  # the preemption seq when this session was last asked to yield (0: never)


@dataclass(slots=True)
class WorkerRec:
    worker_id: WorkerId
    address: str
    slots: int
    seq: int
    state: WorkerState = WorkerState.READY
    leases: dict[int, LeaseId] = field(default_factory=dict)
    slot_ids: list[SlotId] = field(default_factory=list)  # built once: grants reuse them

    def __post_init__(self) -> None:
        self.slot_ids = [SlotId(self.worker_id, i) for i in range(self.slots)]
