"""Pool membership as the wire sees it: who registered, with what address and labels, and when
each worker was last heard from.

The core knows workers only as slot counts; liveness is a server concern because it is about
wall-clock silence. A worker silent for `MISSED_HEARTBEATS` intervals is removed
(`WorkerRemoved`: its leases are revoked and their sessions re-queued). The static local pool
runs in-process and is exempt.
"""

from __future__ import annotations

import asyncio
import logging

from scheduler.core.placement import default_pool
from scheduler.core.types import Decision, Rejected, WorkerAdded, WorkerDraining, WorkerId, WorkerRemoved
from scheduler.ports import Extras, WorkerEntry
from scheduler.server import errors
from scheduler.server.loop import SchedulerLoop

__all__ = ["MISSED_HEARTBEATS", "WorkerEntry", "WorkerRegistry"]  # WorkerEntry lives in scheduler/ports.py

MISSED_HEARTBEATS = 3
log = logging.getLogger("slotsched.server")


class WorkerRegistry:
    def __init__(self, loop: SchedulerLoop, heartbeat_interval_s: float) -> None:
        self.loop = loop
        self.heartbeat_interval_s = heartbeat_interval_s
        self.workers: dict[WorkerId, WorkerEntry] = {}

    def register(
        self,
        worker_id: WorkerId,
        address: str,
        slots: int,
        labels: dict[str, str],
        static: bool = False,
        *,
        replace: bool = False,
        epochs: tuple[tuple[int, int], ...] = (),
        pool: str = "",
    ) -> None:
        """Add a worker, or re-register a live one: idempotent at the same address and slots;
        elsewhere (or with other slots) only with `replace` (the caller is the same identity:
        the worker restarted), which removes the old registration first, its leases revoked and
        their sessions re-queued as by Deregister. The in-process pool is never replaced.
        `epochs`: (slot, highest epoch the worker has seen) for the core to grant above."""
        now = self.loop.now()
        w = self.workers.get(worker_id)
        if w is not None:
            # Compared with the pool `pool` resolves to (unset: the only pool or `default`), not
            # the raw request: an unset pool must not keep a worker where it no longer asked.
            resolved = pool or default_pool(self.loop.core.policy)
            same_pool = resolved is None or self.loop.core.worker_pool(worker_id) in (resolved, None)
            if w.address == address and w.slots == slots and same_pool:
                w.labels = labels  # idempotent re-register (e.g. after a scheduler restart)
                w.last_heartbeat = now
                return
            if not replace or w.static:
                why = "it is the scheduler's in-process pool" if w.static else "Deregister first"
                raise errors.failed_precondition(
                    f"worker {worker_id} is registered with address {w.address!r} and {w.slots} slots: {why}"
                )
            log.warning(
                "worker %s re-registered by its own credential at %s (was %s): replacing it",
                worker_id,
                address,
                w.address,
            )
            self.deregister(worker_id)
        # The journal keeps labels and static beside the event: recovery rebuilds this entry.
        extras = Extras(labels=labels, static=static)
        decisions = self.loop.submit(WorkerAdded(worker_id, slots, address, epochs, pool), extras)
        errors.raise_for(decisions)
        self.workers[worker_id] = WorkerEntry(worker_id, address, slots, now, labels, static=static)

    def entry(self, worker_id: WorkerId) -> WorkerEntry:
        w = self.workers.get(worker_id)
        if w is None:
            raise errors.not_found(f"worker {worker_id} is not registered: register again")
        return w

    def heartbeat(self, worker_id: WorkerId, rss_bytes: int = 0, uptime_s: float = 0.0) -> WorkerEntry:
        w = self.entry(worker_id)
        w.last_heartbeat = now = self.loop.now()
        if rss_bytes:  # what it reports of itself, for recycling (spec.autoscaler.recycle)
            w.rss_bytes = rss_bytes
        if uptime_s > 0:
            w.started_at = now - uptime_s
        return w

    def drain(self, worker_id: WorkerId, yield_within_s: float | None) -> list[Decision]:
        w = self.entry(worker_id)
        decisions = self.loop.submit(WorkerDraining(worker_id, yield_within_s))
        errors.raise_for(decisions)
        w.draining = True
        return decisions

    def deregister(self, worker_id: WorkerId) -> list[Decision]:
        self.entry(worker_id)
        decisions = self.loop.submit(WorkerRemoved(worker_id))
        errors.raise_for(decisions)
        del self.workers[worker_id]
        return decisions

    def replay(
        self,
        event: WorkerAdded | WorkerDraining | WorkerRemoved,
        decisions: list[Decision],
        at: float,
        labels: dict[str, str],
        static: bool,
    ) -> None:
        """Mirror a journaled membership event the core accepted (recovery)."""
        if any(isinstance(d, Rejected) for d in decisions):
            return
        if isinstance(event, WorkerAdded):
            self.workers[event.worker] = WorkerEntry(
                event.worker, event.address, event.slots, at, labels, static=static
            )
        elif isinstance(event, WorkerDraining):
            w = self.workers.get(event.worker)
            if w is not None:
                w.draining = True
        else:
            self.workers.pop(event.worker, None)

    def refresh_all(self) -> None:
        """Recovered: no worker could heartbeat while no server was up, so count from now."""
        now = self.loop.now()
        for w in self.workers.values():
            w.last_heartbeat = now

    def reap(self) -> list[WorkerId]:
        """Remove every non-static worker silent for MISSED_HEARTBEATS intervals."""
        cutoff = self.loop.now() - MISSED_HEARTBEATS * self.heartbeat_interval_s
        gone = [
            w.worker_id
            for w in self.workers.values()
            if not w.static and (w.last_heartbeat or w.registered_at) < cutoff
        ]
        for wid in gone:
            log.warning("worker %s missed %d heartbeats: removing it", wid, MISSED_HEARTBEATS)
            self.loop.submit(WorkerRemoved(wid))
            del self.workers[wid]
        return gone

    async def run_reaper(self) -> None:
        while not self.loop.shutting_down:
            await asyncio.sleep(self.heartbeat_interval_s / 2)
            self.reap()
