"""What adapters read of the core: read-only views of a session, a tenant, a worker and the pool.

Built by `Core.session`, `Core.queue` and `Core.describe`; the server, the metrics, the autoscaler
and the simulator read these without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.lifecycle import WorkerState
from scheduler.core.types import Lease, SessionId, SnapshotRef, TenantName, WorkerId


@dataclass(frozen=True)
class SessionView:
    session: SessionId
    tenant: TenantName
    qos: str
    phase: str  # queued | active | yielding
    lease: Lease | None
    position: int
    estimated_wait_s: float | None
    resume_from: SnapshotRef | None
    waiting_since: float
    pool: str = "default"
    reason: str = ""  # a queued session's BlockedReason


@dataclass(frozen=True)
class TenantView:
    name: str
    weight: float
    held: tuple[int, int, int]
    pending: tuple[int, int, int]
    borrowed: int
    share: float
    guaranteed: int
    burstable_nominal: int
    burstable_limit: int
    best_effort_limit: int | None


@dataclass(frozen=True)
class WorkerView:
    worker_id: WorkerId
    address: str
    slots: int
    busy: int
    state: WorkerState
    lease_seconds: float  # slot-seconds since the grant of each of its leases, summed


@dataclass(frozen=True)
class BudgetFeed:
    """A budget a pool's sessions draw on (spec.pools[].budgets), as the autoscaler's cap reads
    it: per dimension (requests, input, output, total tokens; 0 where it has no limit), its
    effective limit a minute and what one active session was charged a minute lately."""

    budget: str
    effective_per_minute: tuple[float, float, float, float]
    per_session_per_minute: tuple[float, float, float, float]


@dataclass(frozen=True)
class PoolView:
    capacity: int
    free: int
    floor: int
    held: tuple[int, int, int]
    pending: tuple[int, int, int]
    preemptible: int
    yielding: int
    workers: tuple[WorkerView, ...]
    tenants: tuple[TenantView, ...]
    oldest_wait_s: tuple[float, float, float]
    mean_hold_s: float
    name: str = "default"
    # Filled by the server, not the core (which knows nothing of budgets): the pool's budgets
    # with what an active session spends of them, for the autoscaler's cap.
    budgets: tuple[BudgetFeed, ...] = ()


__all__ = ["BudgetFeed", "PoolView", "SessionView", "TenantView", "WorkerView"]
