"""What the host records about its slots and actors: results of Start, checkpoint records, the state
of each slot, the bookkeeping of a running actor, and the session's name in the snapshot store.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field

from slots.worker.actor import Actor
from snapshots.ref import SnapshotRef
from snapshots.store import name_created, validate_name


@dataclass(frozen=True)
class StartResult:
    turns: int
    state_sha256: str
    state_bytes: int
    #: The snapshot the actor was restored from (None: fresh, or no snapshot verified).
    restored_from: SnapshotRef | None = None
    #: Snapshots refused on the way, with why (the requested one first).
    refused: tuple[tuple[str, str], ...] = ()
    #: True when Start found the same session, lease and epoch running (an idempotent repeat).
    already_running: bool = False


@dataclass(frozen=True)
class CheckpointRecord:
    session_id: str
    tenant: str
    uri: str
    size_bytes: int
    seconds: float
    turns: int
    at: float  # unix time


@dataclass(frozen=True)
class SlotState:
    index: int
    session_id: str = ""
    tenant: str = ""
    lease_id: str = ""
    epoch: int = 0
    turns: int = 0
    state_bytes: int = 0
    state_sha256: str = ""


@dataclass(eq=False)
class Running:
    """One actor running in a slot, with what the host must remember about it."""

    session_id: str
    tenant: str
    slot: int
    lease_id: str
    epoch: int
    actor: Actor
    started: float  # monotonic: when this incarnation began on this worker
    saved: float  # monotonic: when the state its holder last received a snapshot of was captured
    saved_turns: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None
    next_turn_at: float = 0.0  # event-loop time
    abort_checkpoint: bool = False
    stopped: bool = False
    writing: bool = False  # a checkpoint is in flight (it may still save the work an end would lose)
    # An end's loss held until that checkpoint settles: (reason, slot-seconds, detail).
    lost_pending: tuple[str, float, str] | None = None


def store_name(session_id: str) -> str:
    """The session's name in the snapshot store: itself when the store accepts it as a path
    segment, else a stable digest (session ids may hold any character; store keys may not)."""
    try:
        return validate_name("session", session_id)
    except ValueError:
        return "sid-" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


def ref_created(ref: SnapshotRef) -> float | None:
    """When `ref` was written: its own field, else the time in its name (None if neither says)."""
    if ref.created:
        return ref.created
    return name_created(ref.uri.rsplit("/", 1)[-1])
