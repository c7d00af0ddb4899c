"""Hosts reference actors in a worker's slots: start/restore, turns, checkpoint, stop, fencing.

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
  yield checkpoint) counts nothing: the holder chose it. Every loss goes to
  `slotsched_worker_work_lost_slot_seconds_total` and to a warning naming the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from scheduler.core.types import SnapshotRef
from slots.worker.actor import TRAILER_SIZE, Actor, ActorConfig, StateCorrupt
from slots.worker.metrics import (
    LOST_FENCED,
    LOST_SNAPSHOT_REFUSED,
    LOST_WORKER_EXIT,
    RESUME_CORRUPT,
    RESUME_MISSING,
    RESUME_REFUSED,
    RESUME_UNAVAILABLE,
    WorkerMetrics,
)
from snapshots.errors import (
    ChecksumMismatch,
    SnapshotError,
    SnapshotNotFound,
    SnapshotUnavailable,
    TenantMismatch,
)
from snapshots.store import Chunk, SnapshotStore, name_created, validate_name

log = logging.getLogger("slotsched.worker")

#: Turns appending at least this many bytes compute their chunk off the event loop.
BIG_TURN_BYTES = 1 << 20
#: Lost work from a superseded snapshot: also counted when the gap is unknown (logged as such).
LOST_SUPERSEDED = "snapshot_superseded"


# ---------------------------------------------------------------------------------------- errors


class HostError(Exception):
    """A request the host refuses; `code` names the gRPC status the servicer returns."""

    code = "unknown"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(HostError):
    code = "invalid_argument"


class NotFound(HostError):
    code = "not_found"


class FailedPrecondition(HostError):
    code = "failed_precondition"


class DataLoss(HostError):
    code = "data_loss"


class Unavailable(HostError):
    code = "unavailable"


class PermissionDenied(HostError):
    code = "permission_denied"


class _CheckpointAborted(Exception):
    """Raised into the store's chunk iterator when the checkpoint's caller has gone away."""


# ---------------------------------------------------------------------------------------- values


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
class _Running:
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


def store_name(session_id: str) -> str:
    """The session's name in the snapshot store: itself when the store accepts it as a path
    segment, else a stable digest (session ids may hold any character; store keys may not)."""
    try:
        return validate_name("session", session_id)
    except ValueError:
        return "sid-" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


def _ref_created(ref: SnapshotRef) -> float | None:
    if ref.created:
        return ref.created
    return name_created(ref.uri.rsplit("/", 1)[-1])


# ---------------------------------------------------------------------------------------- host


class ActorHost:
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
        self.checkpoints: deque[CheckpointRecord] = deque(maxlen=keep_records)
        self._slots: list[_Running | None] = [None] * slots
        self._by_session: dict[tuple[str, str], _Running] = {}  # (tenant, session_id)
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

    def _find(self, session_id: str, tenant: str | None) -> _Running | None:
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

    def _check_owner(self, run: _Running, lease_id: str, epoch: int) -> None:
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
            run = _Running(
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

    # ------------------------------------------------------------------ restore (in a thread)

    def _restore_one(self, session_id: str, tenant: str, ref: SnapshotRef) -> Actor:
        data = self.store.get(ref, tenant)
        actor = Actor.restore(data, session_id, ref.uri, ref.sha256)
        self.metrics.resumes_verified.inc()
        return actor

    def _load(
        self, session_id: str, tenant: str, ref: SnapshotRef
    ) -> tuple[Actor, SnapshotRef | None, tuple[tuple[str, str], ...]]:
        """Restore from `ref`, else from the newest older snapshot that verifies, else fresh."""
        refused: list[tuple[str, str]] = []
        try:
            actor = self._restore_one(session_id, tenant, ref)
            self._count_superseded(session_id, tenant, ref, actor)
            return actor, ref, ()
        except (ChecksumMismatch, StateCorrupt, SnapshotNotFound) as e:
            self._refused(session_id, ref, e)
            if not self.fallback:
                if isinstance(e, SnapshotNotFound):
                    raise NotFound(str(e)) from e
                raise DataLoss(str(e)) from e
            refused.append((ref.uri, str(e)))
        except SnapshotUnavailable as e:
            self.metrics.resume_failures.labels(RESUME_UNAVAILABLE).inc()
            log.error(
                "resume of session %s from %s failed: snapshot store unavailable: %s", session_id, ref.uri, e
            )
            raise Unavailable(f"snapshot store unavailable while reading {ref.uri}: {e}") from e
        except TenantMismatch as e:
            self.metrics.resume_failures.labels(RESUME_REFUSED).inc()
            log.error("resume of session %s refused: %s", session_id, e)
            raise PermissionDenied(str(e)) from e

        # Walk back through the session's snapshots to the newest older one that verifies.
        bad_created = _ref_created(ref)
        try:
            listing = self.store.list(tenant, store_name(session_id))
        except SnapshotError as e:
            self.metrics.resume_failures.labels(RESUME_UNAVAILABLE).inc()
            raise Unavailable(
                f"cannot list session {session_id}'s snapshots after refusing {ref.uri}: {e}"
            ) from e
        older = [r for r in listing if r.uri != ref.uri and (bad_created is None or r.created < bad_created)]
        used: SnapshotRef | None = None
        fallback: Actor | None = None
        for prev in reversed(older):
            try:
                fallback = self._restore_one(session_id, tenant, prev)
                used = prev
                break
            except (ChecksumMismatch, StateCorrupt, SnapshotNotFound) as e:
                self._refused(session_id, prev, e)
                refused.append((prev.uri, str(e)))
            except SnapshotError as e:
                self.metrics.resume_failures.labels(RESUME_UNAVAILABLE).inc()
                raise Unavailable(f"snapshot store failed while reading {prev.uri}: {e}") from e
        actor = fallback if fallback is not None else Actor(session_id, self.config.bytes_per_turn)
        newest = max([ref, *listing], key=lambda r: _ref_created(r) or 0.0)
        lost = self._estimate_lost(newest, actor)
        self._count_lost(
            LOST_SNAPSHOT_REFUSED,
            session_id,
            lost,
            f"resumed from {used.uri if used else 'nothing (fresh start)'} at turn {actor.turns} instead of "
            f"{ref.uri}",
        )
        return actor, used, tuple(refused)

    def _refused(self, session_id: str, ref: SnapshotRef, e: Exception) -> None:
        reason = RESUME_MISSING if isinstance(e, SnapshotNotFound) else RESUME_CORRUPT
        self.metrics.resume_failures.labels(reason).inc()
        log.error("resume of session %s refused snapshot %s: %s", session_id, ref.uri, e)

    def _count_superseded(self, session_id: str, tenant: str, used: SnapshotRef, actor: Actor) -> None:
        """Count the work of snapshots newer than the one resumed from (written, never used)."""
        try:
            listing = self.store.list(tenant, store_name(session_id))
        except SnapshotError as e:
            log.warning("session %s: could not list snapshots to check for lost work: %s", session_id, e)
            return
        used_created = _ref_created(used) or 0.0
        newer = [r for r in listing if r.uri != used.uri and r.created > used_created]
        if not newer:
            return
        newest = newer[-1]
        lost = self._estimate_lost(newest, actor)
        self._count_lost(
            LOST_SUPERSEDED,
            session_id,
            lost,
            f"resumed from {used.uri} (turn {actor.turns}) although {newest.uri} is newer: "
            "that checkpoint was never accepted (late or failed yield)",
        )

    def _estimate_lost(self, newest: SnapshotRef, actor: Actor) -> float | None:
        """Slot-seconds between `actor`'s state and `newest`, from sizes at the actor's pace."""
        if newest.size_bytes <= TRAILER_SIZE:
            return None
        newest_turns = (newest.size_bytes - TRAILER_SIZE) // actor.bytes_per_turn
        lost_turns = max(0, newest_turns - actor.turns)
        per_turn = actor.run_seconds / actor.turns if actor.turns else self.config.turn_interval_s
        return lost_turns * per_turn

    def _count_lost(self, reason: str, session_id: str, seconds: float | None, detail: str) -> None:
        if seconds is None:
            log.warning("work lost: session %s: an unknown number of slot-seconds (%s)", session_id, detail)
            return
        if seconds <= 0.0:
            log.info("session %s: no work lost (%s)", session_id, detail)
            return
        self.metrics.work_lost.labels(reason).inc(seconds)
        log.warning("work lost: session %s: %.3f slot-seconds (%s): %s", session_id, seconds, reason, detail)

    # ------------------------------------------------------------------ turns

    async def _turns(self, run: _Running) -> None:
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
        try:
            ref, captured, turns = await asyncio.shield(task)
        except asyncio.CancelledError:
            # The caller gave up: stop the write at its next chunk; if it completes anyway,
            # delete it (no one holds the ref, so no one can resume from it).
            run.abort_checkpoint = True
            task.add_done_callback(lambda t: self._discard(t, run))
            raise
        if run.saved < captured:
            run.saved, run.saved_turns = captured, turns
        return ref

    async def _write(self, run: _Running) -> tuple[SnapshotRef, float, int]:
        loop = asyncio.get_running_loop()
        async with run.lock:
            if run.stopped:
                raise NotFound(f"the actor of session {run.session_id!r} was stopped")
            run.abort_checkpoint = False
            captured = time.monotonic()
            actor = run.actor
            turns = actor.turns
            chunks = actor.state_chunks()

            def guarded() -> Iterator[Chunk]:
                for c in chunks:
                    if run.abort_checkpoint:
                        raise _CheckpointAborted(f"checkpoint of {run.session_id} abandoned by its caller")
                    yield c

            # The actor knows its state's hash (running hash): the store can skip a staging copy.
            put = functools.partial(
                self.store.put, run.tenant, store_name(run.session_id), guarded(), sha256=actor.state_sha256()
            )
            t0 = time.perf_counter()
            try:
                ref = await asyncio.to_thread(put)
            except SnapshotUnavailable as e:
                self.metrics.checkpoints.labels("failed").inc()
                log.error(
                    "checkpoint of session %s failed: snapshot store unavailable: %s", run.session_id, e
                )
                raise Unavailable(f"snapshot store unavailable: {e}") from e
            except (SnapshotError, _CheckpointAborted, OSError) as e:
                self.metrics.checkpoints.labels("failed").inc()
                log.error("checkpoint of session %s failed: %s", run.session_id, e)
                raise Unavailable(f"checkpoint failed: {e}") from e
            finally:
                chunks.close()  # release the views of the history before the next turn grows it
            seconds = time.perf_counter() - t0
            run.next_turn_at = loop.time() + self.config.turn_interval_s
        self.metrics.checkpoints.labels("ok").inc()
        self.metrics.checkpoint_seconds.observe(seconds)
        self.metrics.checkpoint_bytes.observe(ref.size_bytes)
        self.checkpoints.append(
            CheckpointRecord(run.session_id, run.tenant, ref.uri, ref.size_bytes, seconds, turns, time.time())
        )
        log.info(
            "checkpointed session %s: %d turns, %d bytes in %.3fs -> %s",
            run.session_id, turns, ref.size_bytes, seconds, ref.uri,
        )  # fmt: skip
        return ref, captured, turns

    def _discard(self, task: asyncio.Task[tuple[SnapshotRef, float, int]], run: _Running) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        ref = task.result()[0]
        log.warning(
            "session %s: checkpoint %s completed after its caller gave up; deleting it",
            run.session_id,
            ref.uri,
        )

        def delete() -> None:
            try:
                self.store.delete(ref, run.tenant)
            except SnapshotError as e:
                log.warning("could not delete unused checkpoint %s: %s", ref.uri, e)

        asyncio.get_running_loop().run_in_executor(None, delete)

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

    def _end(self, run: _Running, lost_reason: str | None, why: str) -> None:
        if run.stopped:
            return
        run.stopped = True
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
        self._count_lost(
            lost_reason,
            run.session_id,
            unsaved_s,
            f"actor on {self.worker_id}/{run.slot} stopped ({why}) {unsaved_turns} turns after its last "
            "checkpoint",
        )

    async def aclose(self) -> None:
        """`close`, then wait for the actors' tasks to finish."""
        tasks = [r.task for r in self._by_session.values() if r.task is not None]
        self.close()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
