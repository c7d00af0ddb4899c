"""Hosts reference actors in a worker's slots: start, turns, stop, fencing, and the slot bookkeeping.

The store side lives beside it: restoring a snapshot with its fallback and lost-work accounting
in `restore.py`, writing one in `checkpoint.py`; refusals in `host_errors.py`, records in
`slot_records.py`. The guarantees below are the host's as a whole.

Why the logic lives here and not in the gRPC servicer: what a worker must guarantee is about
state, not about the wire, and it is easiest to test without one:

* Actors are keyed by (tenant, session_id): session ids are tenant-local, so two tenants may
  run sessions of the same name here. Checkpoint and Stop that name the tenant, lease and epoch
  reach only the actor started under them (a stale epoch is FAILED_PRECONDITION, another lease
  PERMISSION_DENIED); whether a Start's lease was granted at all is checked before the host, in
  the servicer (leases.py).
* Fencing by epoch. Each slot remembers the highest lease epoch it has seen (from Start and from
  the leases a heartbeat lists). An older epoch is refused; a newer one on a busy slot means the
  old lease is gone (revoked, expired), so its actor is stopped. A heartbeat stops every actor
  whose lease the scheduler no longer lists.
* An ended lease starts nothing. Each slot also remembers the highest epoch whose actor ended
  there (its holder's Stop, fencing, a move of the session): a Start at that epoch or below is
  refused FAILED_PRECONDITION. Why here and not only in the heartbeat check: a lease stopped and
  then released or yielded is still listed until the next heartbeat, and its grant still
  verifies; without this, a Start with it would run an actor nobody holds until then.
* Consistent checkpoints. A checkpoint holds the actor's lock while the store reads its state,
  so no turn tears the snapshot; the next turn is then due a full interval later, so a holder
  that checkpoints and stops (the yield path) loses no turn in between. A checkpoint whose caller
  gave up (its deadline passed) is aborted at the next chunk, or deleted if it completed anyway:
  nobody holds its ref, and a snapshot nobody can resume from would only confuse the accounting.
* Verified resumes with a fallback. A snapshot whose bytes do not match its sha256, that is
  inconsistent, or that is missing, is refused with an error naming it; the host then walks back
  through the session's snapshots (`store.list`) to the newest one that verifies (or starts fresh
  if none does) — never silently.
* Lost work is counted, once. Work is lost (a) when an actor is stopped by fencing or by the
  worker's exit: the slot-seconds since its last checkpoint that reached its caller (or since
  its start/restore); and (b) when a resume starts from an older snapshot than the newest one the
  session's holder received (a refused snapshot, or a checkpoint that came too late to be used):
  the turns between them, at the actor's pace. An explicit Stop (end of session, or after the
  yield checkpoint) counts nothing: the holder chose it. An actor stopped while a checkpoint of
  it is in flight (a revocation at the yield deadline) loses nothing if that checkpoint
  completes: the loss waits for it (`_settle`). Every loss goes to
  `slotsched_worker_work_lost_slot_seconds_total` and to a warning naming the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable

from slots.worker.actor import Actor, ActorConfig
from slots.worker.checkpoint import CheckpointMixin
from slots.worker.host_errors import (
    DataLoss,
    FailedPrecondition,
    HostError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from slots.worker.metrics import LOST_FENCED, LOST_WORKER_EXIT, WorkerMetrics
from slots.worker.restore import LOST_SUPERSEDED, RestoreMixin
from slots.worker.slot_records import CheckpointRecord, Running, SlotState, StartResult, store_name
from snapshots.ref import SnapshotRef
from snapshots.store import SnapshotStore, validate_name

# What importers of the host (the servicer, the agent, tests) took from it before the split.
__all__ = [
    "BIG_TURN_BYTES",
    "LOST_SUPERSEDED",
    "ActorHost",
    "CheckpointRecord",
    "DataLoss",
    "FailedPrecondition",
    "HostError",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "SlotState",
    "StartResult",
    "Unavailable",
    "store_name",
]

log = logging.getLogger("slotsched.worker")

#: Turns appending at least this many bytes compute their chunk off the event loop.
BIG_TURN_BYTES = 1 << 20


class ActorHost(RestoreMixin, CheckpointMixin):
    """Runs actors in `slots` slots of worker `worker_id`, checkpointing to `store`.

    Use from one event loop. `fallback=False` makes a refused snapshot fail Start with DATA_LOSS /
    NOT_FOUND instead of walking back to an older one.
    """

    def __init__(
        self,
        worker_id: str,
        slots: int,
        store: SnapshotStore,
        config: ActorConfig | None = None,
        metrics: WorkerMetrics | None = None,
        *,
        fallback: bool = True,
        keep_records: int = 1000,
    ) -> None:
        if slots < 1:
            raise ValueError(f"a worker needs at least one slot, got {slots}")
        self.worker_id = worker_id
        self.slots = slots
        self.store = store
        self.config = config or ActorConfig()
        self.metrics = metrics or WorkerMetrics()
        self.metrics.slots.set(slots)
        self.fallback = fallback
        #: False once draining or shutting down: Start is refused with UNAVAILABLE.
        self.accepting = True
        self.highest_epoch = [0] * slots
        #: Per slot, the highest epoch whose actor ended here: no Start at or below it.
        self.ended_epoch = [0] * slots
        self.checkpoints: deque[CheckpointRecord] = deque(maxlen=keep_records)
        self._slots: list[Running | None] = [None] * slots
        self._by_session: dict[tuple[str, str], Running] = {}  # (tenant, session_id)
        self._slot_locks = [asyncio.Lock() for _ in range(slots)]
        self._emptied = asyncio.Event()
        self._emptied.set()

    # ------------------------------------------------------------------ queries

    @property
    def empty(self) -> bool:
        return not self._by_session

    async def wait_empty(self) -> None:
        await self._emptied.wait()

    def running(self, session_id: str, tenant: str | None = None) -> Actor | None:
        run = self._find(session_id, tenant)
        return run.actor if run is not None else None

    def _find(self, session_id: str, tenant: str | None) -> Running | None:
        """The actor of `session_id` (of `tenant`; of any tenant if None and only one has it)."""
        if tenant is not None:
            return self._by_session.get((tenant, session_id))
        runs = [r for (_t, sid), r in self._by_session.items() if sid == session_id]
        if len(runs) > 1:
            raise FailedPrecondition(
                f"sessions named {session_id!r} of {len(runs)} tenants run on {self.worker_id}: "
                "name the tenant"
            )
        return runs[0] if runs else None

    def _check_owner(self, run: Running, lease_id: str, epoch: int) -> None:
        """Refuse a caller that names another lease or epoch than the one `run` was started under."""
        if (not lease_id or lease_id == run.lease_id) and (not epoch or epoch == run.epoch):
            return
        if epoch and epoch < run.epoch:
            raise FailedPrecondition(
                f"epoch {epoch} is stale: session {run.session_id!r} runs under lease {run.lease_id!r} "
                f"epoch {run.epoch}"
            )
        raise PermissionDenied(
            f"lease {lease_id!r} epoch {epoch} did not start session {run.session_id!r} "
            f"(it runs under lease {run.lease_id!r} epoch {run.epoch})"
        )

    def status(self) -> list[SlotState]:
        out = []
        for i, run in enumerate(self._slots):
            if run is None:
                out.append(SlotState(i, epoch=self.highest_epoch[i]))
            else:
                a = run.actor
                sha = a.state_sha256()
                out.append(
                    SlotState(
                        i, run.session_id, run.tenant, run.lease_id, run.epoch, a.turns, a.state_size, sha
                    )
                )
        return out

    # ------------------------------------------------------------------ start

    def validate_start(
        self, session_id: str, tenant: str, slot: int, lease_id: str, worker_id: str | None = None
    ) -> None:
        """The checks of `start` that need no lease: arguments, slot, draining (raises HostError)."""
        if not session_id:
            raise InvalidArgument("session_id: required")
        if not lease_id:
            raise InvalidArgument("lease_id: required")
        try:
            validate_name("tenant", tenant)
        except ValueError as e:
            raise InvalidArgument(f"tenant: {e}") from None
        if worker_id is not None and worker_id != self.worker_id:
            raise FailedPrecondition(f"slot {worker_id}/{slot} is not on this worker ({self.worker_id})")
        if not 0 <= slot < self.slots:
            raise FailedPrecondition(f"slot {self.worker_id}/{slot} is out of range (0..{self.slots - 1})")
        if not self.accepting:
            raise Unavailable(f"worker {self.worker_id} is draining: it starts no new actors")

    async def start(
        self,
        session_id: str,
        tenant: str,
        slot: int,
        lease_id: str,
        epoch: int,
        resume_from: SnapshotRef | None = None,
        worker_id: str | None = None,
    ) -> StartResult:
        self.validate_start(session_id, tenant, slot, lease_id, worker_id)
        async with self._slot_locks[slot]:
            if epoch <= self.ended_epoch[slot]:
                raise FailedPrecondition(
                    f"lease {lease_id!r} epoch {epoch} has ended on slot {self.worker_id}/{slot} (its actor "
                    f"was stopped at epoch {self.ended_epoch[slot]}): an ended lease starts no actor; "
                    "acquire again for a new grant"
                )
            if epoch < self.highest_epoch[slot]:
                raise FailedPrecondition(
                    f"epoch {epoch} is older than slot {self.worker_id}/{slot}'s {self.highest_epoch[slot]}"
                )
            cur = self._slots[slot]
            if cur is not None:
                if (cur.tenant, cur.session_id, cur.lease_id, cur.epoch) == (
                    tenant,
                    session_id,
                    lease_id,
                    epoch,
                ):
                    a = cur.actor
                    return StartResult(a.turns, a.state_sha256(), a.state_size, already_running=True)
                if epoch <= cur.epoch:
                    raise FailedPrecondition(
                        f"slot {self.worker_id}/{slot} runs session {cur.session_id!r} at epoch {cur.epoch}"
                    )
            self.highest_epoch[slot] = epoch
            if cur is not None:
                self._end(cur, LOST_FENCED, f"slot {slot} was granted again (epoch {epoch})")
            other = self._by_session.get((tenant, session_id))
            if other is not None:
                self._end(other, LOST_FENCED, f"the session was granted slot {slot} (epoch {epoch})")
            if resume_from is None:
                actor = Actor(session_id, self.config.bytes_per_turn)
                restored: SnapshotRef | None = None
                refused: tuple[tuple[str, str], ...] = ()
            else:
                actor, restored, refused = await asyncio.to_thread(
                    self._load, session_id, tenant, resume_from
                )
            now = time.monotonic()
            run = Running(
                session_id,
                tenant,
                slot,
                lease_id,
                epoch,
                actor,
                started=now,
                saved=now,
                saved_turns=actor.turns,
            )
            self._slots[slot] = run
            self._by_session[(tenant, session_id)] = run
            self._emptied.clear()
            self.metrics.actors.set(len(self._by_session))
            run.task = asyncio.create_task(self._turns(run), name=f"actor-{session_id}")
            log.info(
                "started session %s (tenant %s) on %s/%d epoch %d: %d turns, %d bytes%s",
                session_id, tenant, self.worker_id, slot, epoch, actor.turns, actor.state_size,
                f", restored from {restored.uri}" if restored else "",
            )  # fmt: skip
            return StartResult(actor.turns, actor.state_sha256(), actor.state_size, restored, refused)

    # ------------------------------------------------------------------ turns

    async def _turns(self, run: Running) -> None:
        loop = asyncio.get_running_loop()
        interval = self.config.turn_interval_s
        max_turns = self.config.max_turns
        run.next_turn_at = loop.time() + interval
        while max_turns is None or run.actor.turns < max_turns:
            delay = run.next_turn_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            async with run.lock:
                if run.stopped:
                    return
                if loop.time() < run.next_turn_at:
                    continue  # a checkpoint pushed the turn back
                actor = run.actor
                if actor.bytes_per_turn >= BIG_TURN_BYTES:
                    actor.take_turn(await asyncio.to_thread(actor.next_chunk))
                else:
                    actor.take_turn()
                run.next_turn_at = max(run.next_turn_at + interval, loop.time())

    # ------------------------------------------------------------------ checkpoint

    async def checkpoint(
        self, session_id: str, tenant: str | None = None, lease_id: str = "", epoch: int = 0
    ) -> SnapshotRef:
        """Write the actor's state to the store; the ref counts as received once this returns.

        `tenant`, `lease_id`, `epoch` (when given) must be those the actor was started under."""
        if not session_id:
            raise InvalidArgument("session_id: required")
        run = self._find(session_id, tenant)
        if run is None:
            raise NotFound(f"no actor of session {session_id!r} on worker {self.worker_id}")
        self._check_owner(run, lease_id, epoch)
        task = asyncio.create_task(self._write(run), name=f"checkpoint-{session_id}")
        run.writing = True
        try:
            ref, captured, turns = await asyncio.shield(task)
        except asyncio.CancelledError:
            # The caller gave up: stop the write at its next chunk; if it completes anyway,
            # delete it (no one holds the ref, so no one can resume from it).
            run.abort_checkpoint = True
            task.add_done_callback(lambda t: self._discard(t, run))
            self._settle(run, saved=False)
            raise
        except BaseException:
            self._settle(run, saved=False)
            raise
        if run.saved < captured:
            run.saved, run.saved_turns = captured, turns
        self._settle(run, saved=True)
        return ref

    def _settle(self, run: Running, saved: bool) -> None:
        """The checkpoint in flight is over: an end it outlived (fencing, a new lease on the slot:
        a revocation at the yield deadline) lost nothing if it saved, and what it held back if
        not. The checkpoint holds the actor's lock, so no turn ran between its capture and the
        end: a snapshot that reaches its caller late still holds all the work."""
        run.writing = False
        pending, run.lost_pending = run.lost_pending, None
        if pending is None:
            return
        reason, seconds, detail = pending
        if saved:
            log.info(
                "session %s: no work lost (%s): the checkpoint in flight saved it", run.session_id, detail
            )
        else:
            self._count_lost(reason, run.session_id, seconds, detail)

    # ------------------------------------------------------------------ stop and fencing

    async def stop(
        self, session_id: str, tenant: str | None = None, lease_id: str = "", epoch: int = 0
    ) -> bool:
        """Stop the session's actor at its holder's request (no loss counted). False if none ran.

        `tenant`, `lease_id`, `epoch` (when given) must be those the actor was started under."""
        if not session_id:
            raise InvalidArgument("session_id: required")
        run = self._find(session_id, tenant)
        if run is None:
            return False
        self._check_owner(run, lease_id, epoch)
        self._end(run, None, "stopped by its holder")
        return True

    def fence(self, live: Iterable[tuple[int, str, int]], since: float) -> list[str]:
        """Apply a heartbeat: `live` lists (slot, lease_id, epoch) of the leases the scheduler holds
        on this worker, as of a request sent at monotonic time `since`. Actors started before then
        whose lease is not listed are stopped (their unsaved work counted as lost)."""
        live_set = set(live)
        for slot, _lease, epoch in live_set:
            if 0 <= slot < self.slots and epoch > self.highest_epoch[slot]:
                self.highest_epoch[slot] = epoch
        stopped = []
        for run in list(self._by_session.values()):
            if run.started < since and (run.slot, run.lease_id, run.epoch) not in live_set:
                self._end(run, LOST_FENCED, f"lease {run.lease_id} epoch {run.epoch} is no longer live")
                stopped.append(run.session_id)
        return stopped

    def close(self) -> None:
        """Stop accepting and stop every actor (their unsaved work counted as lost)."""
        self.accepting = False
        for run in list(self._by_session.values()):
            self._end(run, LOST_WORKER_EXIT, f"worker {self.worker_id} is shutting down")

    def _end(self, run: Running, lost_reason: str | None, why: str) -> None:
        if run.stopped:
            return
        run.stopped = True
        # However it ended, its lease's actor is done here: that lease must not start another.
        self.ended_epoch[run.slot] = max(self.ended_epoch[run.slot], run.epoch)
        if run.task is not None:
            run.task.cancel()
        if self._slots[run.slot] is run:
            self._slots[run.slot] = None
        if self._by_session.get((run.tenant, run.session_id)) is run:
            del self._by_session[(run.tenant, run.session_id)]
        self.metrics.actors.set(len(self._by_session))
        if not self._by_session:
            self._emptied.set()
        unsaved_turns = run.actor.turns - run.saved_turns
        unsaved_s = max(0.0, time.monotonic() - run.saved)
        if lost_reason is None:
            log.info(
                "stopped session %s on %s/%d (%s); %d turns since its last checkpoint",
                run.session_id, self.worker_id, run.slot, why, unsaved_turns,
            )  # fmt: skip
            return
        detail = (
            f"actor on {self.worker_id}/{run.slot} stopped ({why}) {unsaved_turns} turns after its last "
            "checkpoint"
        )
        if run.writing:  # a checkpoint in flight may still save it: counted when it settles
            run.lost_pending = (lost_reason, unsaved_s, detail)
            return
        self._count_lost(lost_reason, run.session_id, unsaved_s, detail)

    async def aclose(self) -> None:
        """`close`, then wait for the actors' tasks to finish."""
        tasks = [r.task for r in self._by_session.values() if r.task is not None]
        self.close()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
