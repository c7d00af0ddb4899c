"""State snapshots of a leading replica, and the journal trimmed behind them: when one is due,
how it is cut and stored. A mixin of `Replica` (replica.py, which sets every attribute below);
apart only to keep each file to one job.

At the moment a batch is cut (so the state is exactly the journal up to that batch's
last entry), if a snapshot is due, the state is captured on the event loop (a consistent copy
at C speed: dict copies and one tuple per lease, ~15-30 ms for 10,000 leases + 100,000 queued
sessions); once the batch is in, the capture is encoded in a thread (versioned JSON, see
state_write.py) and stored with that batch's journal position in the background, fenced by the
term's token, and the journal trimmed up to it. The journal's next batches do not wait for it,
and one snapshot is in flight at a time.

When one is due (`snapshot_due`, a pure function of the tail, the live sessions, the time since
the last cut and what the last snapshot cost): the journal tail since the last cut holds
`tail_bound(live)` = max(`snapshot_every`, `snapshot_ratio` x live sessions) entries (live:
leases + queued requests at the last cut; like Raft's log compaction, the tail a cold recovery
replays stays a fixed fraction of the snapshot it reads), or `snapshot_interval_s` passed with
at least one entry; AND the time since the last cut is at least `snapshot_duty` x what the last
snapshot took to capture, encode and store (wall time). The second rule bounds what snapshots
cost: at most about 1 / `snapshot_duty` of the leader's time, whatever the rate of entries. The
tail rule alone does not: renewals arrive at live / 10 a second at the default TTL (about half
journaled), so a snapshot of the whole state would be due every second or so whatever the
number of sessions, its cost growing with the sessions squared (decision 0022). What it costs
recovery: a tail of at most max(tail_bound, the entries of `snapshot_duty` x one snapshot's
time) + the entries that arrive while one is encoded and stored. Replaying an entry costs a
follower less than deciding it cost the leader, so replaying the duty's part of the tail takes
less than `snapshot_duty` x one snapshot's time, and in practice a fraction of it (a renewal's
replay is a few µs against the leader's 30-45). At the default ratio 0.05 and a slow journal
that is 5,500 entries for 10k leases + 100k queued, ~0.1-0.3 s of replay (bench/recovery.py).
Any build that knows the snapshot's format reads it, so an ordinary deploy keeps the state; a
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

#: A snapshot is due once the journal tail holds this many entries per live lease or queued
#: session (and at least `snapshot_every`) ...
SNAPSHOT_RATIO = 0.05
#: ... and the time since the last one is at least this many times what the last one took to
#: capture, encode and store: snapshots take at most about 1/20 of the leader's time.
SNAPSHOT_DUTY = 20.0


def tail_bound(live: int, every: int, ratio: float) -> int:
    """Journal entries after which a snapshot is due, for a state of `live` leases + queued
    sessions: replaying the tail then costs a bounded fraction of reading the snapshot."""
    return max(every, int(ratio * live))


def snapshot_due(
    tail: int,
    live: int,
    since_s: float,
    last_cost_s: float,
    *,
    every: int,
    ratio: float,
    interval_s: float,
    duty: float,
) -> bool:
    """Whether a snapshot is due (module docstring): `tail` journal entries since the last cut,
    `live` sessions at it, `since_s` seconds since it, and the last snapshot's capture + encode +
    store time `last_cost_s` (0 before the first). Due when the tail reached its bound or the
    interval passed with an entry, and snapshots would take at most 1 / `duty` of the time."""
    if tail == 0 or since_s < duty * last_cost_s:
        return False
    return tail >= tail_bound(live, every, ratio) or since_s >= interval_s


class Compaction:
    """The snapshot half of a `Replica`."""

    store: StateStore
    loop: ReplicaHost
    registry: WorkerBook
    role: Role
    snapshot_every: int
    snapshot_ratio: float
    snapshot_interval_s: float
    snapshot_duty: float
    _aloop: asyncio.AbstractEventLoop
    _last_now: float
    _since_snapshot: int
    _last_snapshot: float
    _snapshots_ok: bool
    _snapshot_task: asyncio.Task[None] | None
    _snapshot_size: int
    _snapshot_events: int
    _snapshot_cost: float  # the last snapshot's capture + encode + store, seconds (wall)
    _capture_s: float  # the capture of the snapshot in flight

    def tail_bound(self, live: int) -> int:
        """Journal entries after which a snapshot is due, for a state of `live` sessions."""
        return tail_bound(live, self.snapshot_every, self.snapshot_ratio)

    def _snapshot_due(self) -> bool:
        if not self._snapshots_ok or self._since_snapshot == 0 or not DUTIES[self.role].serves:
            return False
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return False  # one at a time: the tail grows meanwhile (bounded by its duration)
        return snapshot_due(
            self._since_snapshot,
            self._snapshot_size,
            time.monotonic() - self._last_snapshot,
            self._snapshot_cost,
            every=self.snapshot_every,
            ratio=self.snapshot_ratio,
            interval_s=self.snapshot_interval_s,
            duty=self.snapshot_duty,
        )

    def _cut_snapshot(self) -> Captured | None:
        """At a batch cut: a consistent copy of the state if a snapshot is due (see the module
        docstring, Snapshots). Only the copy runs on the event loop; `_save_snapshot` encodes."""
        if not self._snapshot_due():
            return None
        t0 = time.perf_counter()
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
        self._capture_s = time.perf_counter() - t0
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
        except (StoreUnavailable, StaleTerm) as e:
            # Not fatal: the journal still holds everything after the previous snapshot; the
            # events this one covered count towards the next. What it took is not counted: a
            # store that failed (a timeout) says nothing of what the next will cost.
            self._since_snapshot += self._snapshot_events
            log.warning("snapshot not stored (%s)", e)
            return
        took = time.perf_counter() - t0
        # The next is not due before `snapshot_duty` x this (capture + encode + store).
        self._snapshot_cost = self._capture_s + took
        log.info(
            "snapshot at journal id %s (%d sessions, %d bytes, %.0f ms + %.0f ms to capture); "
            "journal trimmed",
            last_id,
            snap.size,
            len(data),
            took * 1e3,
            self._capture_s * 1e3,
        )
