"""The one seam between the autoscaler loop and whatever runs workers.

Why so small: the loop decides *how many* workers and *which* ones leave; an actuator only starts
workers and stops the ones it is told to. `scale_to(n)` raises the number of workers wanted to `n`
and never lowers it — workers leave only through `remove(ids)`, after the loop has drained them,
so no actuator (nor a ReplicaSet behind it) ever picks which worker dies.

Errors: a call that fails raises (`ActuatorError` when the actuator knows why); the loop turns it
into data for its next tick. What fails later, on its own (a worker process that exits, a pod that
crash-loops), is reported by `poll_errors`, each failure once.

A worker's id is the id it registers with the scheduler (`--worker-id`; a pod's name on
Kubernetes), so the loop can match what the actuator runs with what the core knows.
"""

from __future__ import annotations

import builtins
import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class WorkerPhase(enum.StrEnum):
    STARTING = "starting"  # asked for; not known to be up yet (a pending pod)
    RUNNING = "running"  # up; it registers with the scheduler on its own
    STOPPING = "stopping"  # removed; on its way out (terminating pod, process given SIGTERM)


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    phase: WorkerPhase
    detail: str = ""  # pid, pod phase: for logs and status, never parsed


class ActuatorError(RuntimeError):
    """A call to the outside world failed; `retry` says whether trying again can help."""

    def __init__(self, message: str, *, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True)
class ScaleNote:
    """The numbers behind one scale decision, for an actuator that records decisions."""

    direction: str  # "up" | "down"
    desired: int  # ready workers wanted
    current: int  # ready workers when decided
    weighted_demand_slots: float
    reason: str  # slots.autoscaler.decision.Reason value
    at_ceiling: bool
    estimated_drain_s: float
    workers: tuple[str, ...] = ()  # the workers drained (down), none for up

    def message(self) -> str:
        text = (
            f"scale {self.direction}: desired={self.desired} current={self.current} "
            f"weighted_demand_slots={self.weighted_demand_slots:g} reason={self.reason} "
            f"at_ceiling={str(self.at_ceiling).lower()} estimated_drain_s={self.estimated_drain_s:.1f}"
        )
        if self.workers:
            text += f" drain={','.join(self.workers)}"
        return text


class Actuator(Protocol):
    def scale_to(self, n: int) -> None:
        """Want at least `n` workers in all (starting, running, draining); never stops one."""
        ...

    def remove(self, worker_ids: list[str]) -> None:
        """Stop exactly these workers; the number wanted goes down by as many. An id this
        actuator does not run is skipped. Idempotent: removing a worker twice is harmless."""
        ...

    def list(self) -> list[WorkerInfo]:
        """The workers this actuator runs, stopping ones included."""
        ...

    def poll_errors(self) -> builtins.list[str]:
        """Failures since the last poll (each once), oldest first."""
        ...


@runtime_checkable
class DecisionRecorder(Protocol):
    """An actuator that also records why the pool changed (Kubernetes Events, logs)."""

    def record(self, note: ScaleNote) -> None: ...


@runtime_checkable
class WouldOnly(Protocol):
    """A dry run: an actuator that only says what it would do. A dry run changes nothing
    anywhere, so the loop then drains and deregisters no worker either (a drain is a change to the
    scheduler, not only to the actuator): it tells this actuator what it would do instead."""

    def would(self, action: str, worker_ids: tuple[str, ...]) -> None: ...
