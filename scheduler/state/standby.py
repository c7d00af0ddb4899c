"""A replica's core while it does not lead: loaded from the state store once, then following the journal
as the leader appends it (hot standby), and the full recovery a take-over falls back to.

A mixin of `Replica` (scheduler/state/replica.py, whose docstring tells the whole story:
"Hot standby"); apart only to keep each file to one job. Everything here applies journal
entries through `loop.replay` and `registry.replay`, exactly as recovery always did: no fan-out,
no timers, nothing served (the loop stays `shutting_down` until the take-over resumes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.core.pools import Pools
from scheduler.core.types import Decision
from scheduler.dispatch import spec_of
from scheduler.policy.model import Policy
from scheduler.ports import LoopState, ReplicaHost, WorkerBook
from scheduler.state import codec
from scheduler.state.roles import DUTIES, Role
from scheduler.state.state_read import read_state
from scheduler.state.state_write import State, StateSnapshotError
from scheduler.state.store import START, Entry, Position, StateStore, StoreUnavailable

if TYPE_CHECKING:
    from scheduler.state.metrics import StateMetrics
    from scheduler.state.reach import StoreReach

log = logging.getLogger("slotsched.state")


# A read that brought records makes the standby wait `tail_pace_s` (this, or less with a short
# campaign interval) before the next: a read costs a follower more than replaying a few records
# (a round trip, a task's wake-up), and a replica following many pools, each with a trickle, read
# a record or two at a time (at 30 pools following cost 0.31 of leading; paced, 0.24:
# bench/follow_cost.py --pools 30). Its core stays that much more behind: a take-over reads the
# tail anyway, and a snapshot trims only what the one before it covered (the store's contract),
# so a standby that far behind reads on through it instead of reloading it.
FOLLOW_PACE_S = 0.05
# Journal entries read (and applied, between two awaits) at a time: an entry is a whole group
# commit (codec.pack), up to hundreds of records, so fewer than the store's default of records.
ENTRIES_PER_READ = 200


class StateError(RuntimeError):
    """The durable state cannot be recovered by this build: fail loudly, do not serve."""


@dataclass(frozen=True)
class TakeOver:
    """How the last take-over went: from a live core (`hot`) or a full recovery; how many
    journal entries it read; how long it took (seconds)."""

    hot: bool
    entries: int
    seconds: float


class Standby:
    """The loading and following half of a `Replica` (which sets every attribute below)."""

    store: StateStore
    loop: ReplicaHost
    registry: WorkerBook
    policy: Policy
    metrics: StateMetrics
    reach: StoreReach
    role: Role
    leader_ttl_s: float
    tail_block_ms: int
    tail_pace_s: float
    snapshot_loads: int
    _aloop: asyncio.AbstractEventLoop
    _pos: Position | None
    _fresh: bool
    _last_now: float
    _since_snapshot: int
    _follow_task: asyncio.Task[None] | None
    _follow_broken: bool
    _first_load: asyncio.Event
    may_follow: Callable[[], bool] | None
    _nudged: asyncio.Event

    async def _renew_if_due(self) -> None:
        raise NotImplementedError  # Replica's: keep the lease through a long recovery

    async def _catch_up(self) -> int | None:
        """The journal after this standby's position; None if it cannot be applied (trimmed
        past it, or undecodable): then the take-over recovers in full."""
        assert self._pos is not None
        if await self.store.trimmed_past(self._pos):
            log.info("the journal was trimmed past this standby's position: recovering in full")
            return None
        n = 0
        try:
            async for chunk in self.store.journal_after(self._pos, ENTRIES_PER_READ):
                n += self._apply(chunk)
                await self._renew_if_due()  # a standby that had just loaded may have a long tail
        except (codec.CodecError, StateError) as e:
            log.warning("cannot apply the journal's tail (%s): recovering in full", e)
            return None
        return n

    async def _recover(self) -> int:
        """Rebuild the loop and registry from the store (snapshot, then the whole journal after it);
        the number of journal entries replayed."""
        after = await self._load_state_snapshot()
        await self._renew_if_due()
        n = 0
        async for chunk in self.store.journal_after(after, ENTRIES_PER_READ):
            n += self._apply(chunk)
            await self._renew_if_due()
        self._since_snapshot = n  # a long tail makes the next batch snapshot
        log.info("recovered: snapshot %s, %d journal entries replayed", after, n)
        return n

    async def _load_state_snapshot(self) -> Position:
        """Load the stored snapshot into the loop and registry (an empty state without one);
        the journal position it covers (START: replay the whole journal)."""
        stored = await self.store.load_snapshot()
        self.snapshot_loads += 1
        state: State | None = None
        after = START
        if stored is not None:
            try:
                state = read_state(stored.data, stored.fingerprint)
                after = stored.covers
            except StateSnapshotError as e:
                if await self.store.trimmed():
                    raise StateError(
                        f"{e}; the journal was compacted up to that snapshot, so it cannot be replayed "
                        "instead. Run a build that reads its format, or delete the state keys to start empty."
                    ) from e
                log.warning("%s: replaying the whole journal instead", e)
        if state is None:
            empty = LoopState(Pools(self.policy), {}, {}, {}, {}, {}, OrderedDict())
            state = State(empty, {}, float("-inf"))
        self.loop.load_state(state.loop)
        self.registry.workers = state.workers
        self._last_now = state.last_now
        self._fresh = stored is None
        return after

    def _apply(self, rows: list[Entry]) -> int:
        """Replay journal entries into the core and bookkeeping, exactly as recovery does (no
        fan-out, timers or journal: see `SchedulerLoop.replay`); advances the position. The
        number of records applied (an entry holds a batch: codec.pack)."""
        n = 0
        replay = self.loop.replay
        for rid, raw in rows:
            try:
                records = codec.decode_entry(raw)
            except codec.CodecError as e:
                raise StateError(str(e)) from e
            for rec, at, x in records:
                decisions: list[Decision] = replay(rec, at, x)
                if spec_of(rec).membership:
                    self.registry.replay(rec, decisions, at, dict(x.labels), x.static)  # type: ignore[arg-type]
                if at > self._last_now:
                    self._last_now = at
            n += len(records)
            self._fresh = False
            if self._pos is not None:
                self._pos = rid
        return n

    # ------------------------------------------------------------------ hot standby

    async def _follow(self) -> None:
        """A standby's life: load the snapshot once, then apply the journal as the leader
        appends it (XREAD BLOCK), so taking over needs only the last few entries. A trim past
        this position reloads the snapshot; an entry it cannot apply stops the following (the
        take-over then recovers in full, and says why)."""
        me = asyncio.current_task()
        # Also ends once `_stop_following` let go of this task: a cancellation can be lost inside
        # the redis client (seen under load: the task went on following and a take-over awaiting
        # it hung), so the next iteration must not depend on it.
        while DUTIES[self.role].follows and self._follow_task is me:
            try:
                if self._pos is None:
                    self._pos = await self._load_state_snapshot()
                    if self._pos != START:
                        log.info(
                            "standby: loaded the state snapshot (journal up to %s); following the journal",
                            self._pos,
                        )
                    else:  # none stored yet (or unreadable: warned), or one taken before any entry
                        log.info("standby: no state snapshot covers the journal; following it from its start")
                    self._first_load.set()
                pos = self._pos
                tail = await self.store.tail(pos, self.tail_block_ms, ENTRIES_PER_READ)
                if tail.gap:  # entries after our position were trimmed before we read them
                    log.info("standby: the journal was trimmed past %s: reloading the snapshot", pos)
                    self._pos = None
                    continue
                if self.reach.ok is not True:
                    await self.reach.answered()
                if tail.entries:
                    n = self._apply(tail.entries)
                    self.metrics.standby_applied.inc(n)
                    await asyncio.sleep(self.tail_pace_s)  # let the next read carry several batches
            except asyncio.CancelledError:
                if self._pos is not None and not self._first_load.is_set():
                    self._pos = None  # cancelled inside a load: the core is half-restored
                raise
            except StoreUnavailable as e:
                self._pos = None if not self._first_load.is_set() else self._pos
                await self.reach.failed(e)  # logged when it stops answering, then every few seconds
                self._first_load.set()  # start() goes on as a standby; this loop keeps trying
                await asyncio.sleep(min(0.5, self.leader_ttl_s / 2))
            except (StateError, StateSnapshotError) as e:
                log.error("standby: cannot follow the journal (%s): a take-over recovers in full", e)
                self._pos = None
                self._follow_broken = True
                self._first_load.set()
                return
            except Exception:
                log.exception("standby: following the journal failed: reloading")
                self._pos = None
                self._first_load.set()  # start() goes on as a standby
                await asyncio.sleep(1.0)

    async def _stop_following(self) -> None:
        task, self._follow_task = self._follow_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def nudge(self) -> None:
        """The owners table or this replica's membership changed: look again at once whether to
        follow and whether to campaign (ownership.py)."""
        self._nudged.set()

    def hot(self) -> bool:
        """This core is the pool's as of its journal: leading, or following it loaded."""
        return DUTIES[self.role].serves or self._pos is not None

    async def _follow_or_drop(self) -> None:
        """Follow the pool while `may_follow` says so; else stop and hold nothing of it (an
        empty core: loaded again, cold, if this replica is ever to lead or follow it)."""
        if self.may_follow is None or self.may_follow():
            self._ensure_following()
            return
        if self._follow_task is None and self._pos is None:
            return
        await self._stop_following()
        self._pos = None
        empty = LoopState(Pools(self.policy), {}, {}, {}, {}, {}, OrderedDict())
        self.loop.load_state(empty)
        self.registry.workers = {}

    def _ensure_following(self) -> None:
        if not DUTIES[self.role].follows or self._follow_broken:
            return
        if self.may_follow is not None and not self.may_follow():
            return
        if self._follow_task is None or self._follow_task.done():
            self._follow_task = self._aloop.create_task(self._follow())
