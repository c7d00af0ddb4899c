"""The contract between the gRPC server (scheduler/server/) and the durable state store
(scheduler/state/): plain domain records and narrow protocols, so neither package imports the other.

The arrows:

    scheduler/app/      ──>  scheduler/server/   (the loop, registry, servicers, gRPC assembly)
            │                       │
            └──────────> scheduler/state/   (journal, snapshots, recovery, leader election)
                                    │
         both ──> scheduler/ports.py ──> scheduler/core, scheduler/policy

The server implements `ReplicaHost` (SchedulerLoop) and `WorkerBook` (WorkerRegistry)
structurally; the state store drives them through these protocols and implements `Journal`
(the loop's durability). `scheduler/app/` (the composition root) is the only package that knows both sides.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from scheduler.core.pools import Pools
from scheduler.core.types import (
    Decision,
    EndReason,
    Event,
    LeaseId,
    QoS,
    SessionId,
    SnapshotRef,
    WorkerAdded,
    WorkerDraining,
    WorkerId,
    WorkerRemoved,
    YieldRequested,
)
from scheduler.policy.model import Policy


@dataclass(frozen=True)
class PolicyApplied:
    """An ApplyPolicy as observers and the journal see it (it is not a core Event)."""

    policy: Policy


Applied = Event | PolicyApplied
Observer = Callable[[Applied, Sequence[Decision], float], None]


@dataclass(frozen=True)
class Extras:
    """Server-side facts carried beside an event into the journal (all optional)."""

    wait_timeout_s: float | None = None  # acquire
    labels: Mapping[str, str] = field(default_factory=dict)  # worker_added
    static: bool = False  # worker_added: the in-process local pool


NO_EXTRAS = Extras()


class EndedSession(NamedTuple):
    """A session recently ended (GetSession). A NamedTuple, not a frozen dataclass: one is built
    per session's end, on the leader and on its follower alike, and it builds in a third of the time."""

    reason: EndReason
    qos: QoS
    last_snapshot: SnapshotRef | None
    at: float


@dataclass
class LoopState:
    """The core and the server-side bookkeeping a recovered server needs (streams excluded)."""

    core: Pools
    addresses: dict[WorkerId, str]
    yields: dict[LeaseId, YieldRequested]
    waited: dict[SessionId, float]
    qos: dict[SessionId, QoS]
    wait_timeouts: dict[SessionId, float]
    ended: OrderedDict[SessionId, EndedSession]


@dataclass(slots=True)
class WorkerEntry:
    """One registered worker as the wire sees it (address, labels, liveness)."""

    worker_id: WorkerId
    address: str
    slots: int
    registered_at: float
    labels: dict[str, str] = field(default_factory=dict)
    last_heartbeat: float | None = None
    draining: bool = False
    static: bool = False
    rss_bytes: int = 0  # resident memory its last heartbeat reported (0: none)
    started_at: float | None = None  # now - uptime its last heartbeat reported (None: none)


NOT_LEADER = "not the leader: this replica is a standby; retry (the Service routes to the leader)"


class StateUnavailable(Exception):
    """The state store cannot make what was applied durable (not the leader, Redis unreachable,
    a step-down): the caller should retry after `retry_after_s`, likely against another replica.
    scheduler/server/errors.py maps it to UNAVAILABLE with `retry-after-ms`."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class Journal(Protocol):
    """What the loop needs of a durable state store."""

    def durable(self) -> Awaitable[None]:
        """Resolves once everything applied so far is durable; raises StateUnavailable if it
        cannot be made so."""
        ...

    def record(self, event: Applied, now: float, extras: Extras) -> None:
        """Journal one applied event (called by the loop after every event it applies)."""
        ...


class ReplicaHost(Protocol):
    """What the state store drives on the server's loop (SchedulerLoop implements it)."""

    journal: Journal | None

    def now(self) -> float: ...

    def durable(self) -> Awaitable[None]: ...

    def durable_done(self) -> Awaitable[None]: ...

    def submit(self, event: Event) -> list[Decision]: ...

    def replay(self, event: Applied, now: float, extras: Extras = NO_EXTRAS) -> list[Decision]: ...

    def export_state(self) -> LoopState: ...

    def load_state(self, state: LoopState) -> None: ...

    def resume(self) -> None: ...

    def begin_shutdown(self) -> None: ...

    def close(self) -> None: ...


Membership = WorkerAdded | WorkerDraining | WorkerRemoved


class WorkerBook(Protocol):
    """What the state store drives on the worker registry (WorkerRegistry implements it)."""

    workers: dict[WorkerId, WorkerEntry]

    def replay(
        self, event: Membership, decisions: list[Decision], at: float, labels: dict[str, str], static: bool
    ) -> None: ...

    def refresh_all(self) -> None: ...
