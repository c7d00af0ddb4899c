"""Write a running actor's state to the snapshot store: under the actor's lock (no turn tears it),
with its known sha256 (no staging copy), aborted at the next chunk if its caller gave up, and
deleted if it completed after that (nobody holds its ref).

Mixed into `ActorHost`, whose store, config, metrics and checkpoint records it uses.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Iterator

from slots.worker.actor import ActorConfig
from slots.worker.host_errors import NotFound, Unavailable
from slots.worker.metrics import WorkerMetrics
from slots.worker.slot_records import CheckpointRecord, Running, store_name
from snapshots.errors import SnapshotError, SnapshotUnavailable
from snapshots.ref import SnapshotRef
from snapshots.store import Chunk, SnapshotStore

log = logging.getLogger("slotsched.worker")


class _CheckpointAborted(Exception):
    """Raised into the store's chunk iterator when the checkpoint's caller has gone away."""


class CheckpointMixin:
    """The store side of `ActorHost.checkpoint` (set by the host's constructor)."""

    store: SnapshotStore
    config: ActorConfig
    metrics: WorkerMetrics
    checkpoints: deque[CheckpointRecord]

    async def _write(self, run: Running) -> tuple[SnapshotRef, float, int]:
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

    def _discard(self, task: asyncio.Task[tuple[SnapshotRef, float, int]], run: Running) -> None:
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
