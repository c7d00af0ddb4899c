"""State snapshots of a leading replica, and the journal trimmed behind them: when one is due,
how it is cut and stored. A mixin of `Replica` (replica.py, which sets every attribute below);
apart only to keep each file to one job.

At the moment a batch is cut (so the state is exactly the journal up to that batch's
last entry), if a snapshot is due, the state is captured on the event loop (a consistent copy
at C speed: dict copies and one tuple per lease, ~15-30 ms for 10,000 leases + 100,000 queued
sessions); once the batch is in, the capture is encoded in a thread (versioned JSON, see
state_write.py) and stored with that batch's journal position in the background, fenced by the
term's token, and the journal trimmed up to it. The journal's next batches do not wait for it,
and one snapshot is in flight at a time. A snapshot is due when the journal tail since the last
cut holds `tail_bound(live)` = max(`snapshot_every`, `snapshot_ratio` x live sessions) entries
(live: leases + queued requests at the last cut; like Raft's log compaction, the tail a cold
recovery replays stays a fixed fraction of the snapshot it reads), or `snapshot_interval_s`
passed with at least one entry. Worst-case tail = tail_bound + the entries that arrive while
one snapshot is encoded and stored (<1 s at 110k sessions); at the default ratio 0.05 that is
5,500 entries for 10k leases + 100k queued, ~0.1-0.3 s of replay (bench/recovery.py). Any
build that knows the snapshot's format reads it, so an ordinary deploy keeps the state; a
snapshot of a newer format is refused (the whole journal is replayed if it was never trimmed,
else this replica stops and says so).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from scheduler.state import state_write
from scheduler.state.roles import DUTIES, Role
from scheduler.state.state_write import Captured, State, StateSnapshotError
from scheduler.state.store import Position, StaleTerm, StateStore, StoreUnavailable

if TYPE_CHECKING:
    from scheduler.ports import ReplicaHost, WorkerBook

log = logging.getLogger("slotsched.state")


class Compaction:
    """The snapshot half of a `Replica`."""

    store: StateStore
    loop: ReplicaHost
    registry: WorkerBook
    role: Role
    snapshot_every: int
    snapshot_ratio: float
    snapshot_interval_s: float
    _aloop: asyncio.AbstractEventLoop
    _last_now: float
    _since_snapshot: int
    _last_snapshot: float
    _snapshots_ok: bool
    _snapshot_task: asyncio.Task[None] | None
    _snapshot_size: int
    _snapshot_events: int

    def tail_bound(self, live: int) -> int:
        """Journal entries after which a snapshot is due, for a state of `live` leases + queued
        sessions: replaying the tail then costs a bounded fraction of reading the snapshot."""
        return max(self.snapshot_every, int(self.snapshot_ratio * live))

    def _snapshot_due(self) -> bool:
        if not self._snapshots_ok or self._since_snapshot == 0 or not DUTIES[self.role].serves:
            return False
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return False  # one at a time: the tail grows meanwhile (bounded by its duration)
        due = self._since_snapshot >= self.tail_bound(self._snapshot_size)
        return due or time.monotonic() - self._last_snapshot >= self.snapshot_interval_s

    def _cut_snapshot(self) -> Captured | None:
        """At a batch cut: a consistent copy of the state if a snapshot is due (see the module
        docstring, Snapshots). Only the copy runs on the event loop; `_save_snapshot` encodes."""
        if not self._snapshot_due():
            return None
        try:
            state = State(self.loop.export_state(), self.registry.workers, self._last_now)
            snap = state_write.capture(state)
        except Exception as e:  # noqa: BLE001 - a capture must never stop the journal
            self._snapshots_ok = False  # the journal keeps everything; say so once
            log.error("snapshots disabled, the journal will not be compacted: %s", e)
            return None
        self._snapshot_events = self._since_snapshot
        self._since_snapshot = 0
        self._last_snapshot = time.monotonic()
        self._snapshot_size = snap.size
        return snap

    def _save_snapshot(self, snap: Captured, last_id: Position, token: str) -> None:
        """Encode (in a thread) and store the snapshot covering the journal up to `last_id`, in
        the background: the journal's next batches do not wait for it."""
        self._snapshot_task = self._aloop.create_task(self._store_snapshot(snap, last_id, token))

    async def _store_snapshot(self, snap: Captured, last_id: Position, token: str) -> None:
        t0 = time.perf_counter()
        try:
            data = await asyncio.to_thread(state_write.write_state, snap)
        except StateSnapshotError as e:
            self._snapshots_ok = False
            log.error("snapshots disabled, the journal will not be compacted: %s", e)
            return
        try:
            await self.store.save_snapshot(
                data, state_write.current_fingerprint(), last_id, snap.last_now, token
            )
            log.info(
                "snapshot at journal id %s (%d sessions, %d bytes, %.0f ms); journal trimmed",
                last_id,
                snap.size,
                len(data),
                (time.perf_counter() - t0) * 1e3,
            )
        except (StoreUnavailable, StaleTerm) as e:
            # Not fatal: the journal still holds everything after the previous snapshot; the
            # events this one covered count towards the next.
            self._since_snapshot += self._snapshot_events
            log.warning("snapshot not stored (%s)", e)
