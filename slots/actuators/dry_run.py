"""An actuator that only says what it would do: for trying a policy's autoscaler on a live
scheduler before it is allowed to touch anything.

It runs no worker, so `list()` is empty and a scale-up is asked for again each tick while the
decision stands; it logs a request at INFO when it changes and at DEBUG when it repeats. It is a
`WouldOnly` actuator: the loop drains no worker for it, it only tells it which it would drain.
Every call is also kept in `calls`, so a test or a status page can show the would-be actions.
"""

from __future__ import annotations

import builtins
import logging

from slots.actuators.base import ScaleNote, WorkerInfo

log = logging.getLogger("slotsched.actuators.dry_run")


class DryRunActuator:
    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or log
        self.calls: builtins.list[tuple[str, object]] = []
        self._last_scale: int | None = None
        self._last_would: dict[str, tuple[str, ...]] = {}

    def scale_to(self, n: int) -> None:
        level = logging.DEBUG if n == self._last_scale else logging.INFO
        self.log.log(level, "dry run: would scale the pool to %d workers", n)
        self._last_scale = n
        self.calls.append(("scale_to", n))

    def remove(self, worker_ids: builtins.list[str]) -> None:
        self.log.info("dry run: would remove drained workers %s", ", ".join(worker_ids))
        self.calls.append(("remove", tuple(worker_ids)))

    def would(self, action: str, worker_ids: tuple[str, ...]) -> None:
        level = logging.DEBUG if self._last_would.get(action) == worker_ids else logging.INFO
        self.log.log(level, "dry run: would %s workers %s", action, ", ".join(worker_ids))
        self._last_would[action] = worker_ids
        self.calls.append((action, worker_ids))

    def list(self) -> builtins.list[WorkerInfo]:
        return []

    def poll_errors(self) -> builtins.list[str]:
        return []

    def record(self, note: ScaleNote) -> None:
        self.log.info("dry run: decision %s", note.message())
        self.calls.append(("record", note))

    def close(self) -> None:
        pass
