"""Start an actor from a snapshot, verified, walking back to an older one that verifies when it is
refused (or failing with DATA_LOSS / NOT_FOUND without `fallback`), and count the work lost on the
way: a refused snapshot, a newer snapshot never used, an actor stopped before its checkpoint.

What a failed read becomes (the Start errors worker.proto lists): missing or corrupt → walk back
(NOT_FOUND / DATA_LOSS with `--strict-restore`); the store unreachable → UNAVAILABLE (retry); a
ref of another tenant → PERMISSION_DENIED; any other refusal of the store (S3 NoSuchBucket,
AccessDenied: configuration, not the snapshot) → NOT_FOUND naming the store's error, never a
fresh start that would silently drop the session's work.

Runs in a thread (store reads block); mixed into `ActorHost`, whose store, config and metrics it uses.
"""

from __future__ import annotations

import logging

from slots.worker.actor import TRAILER_SIZE, Actor, ActorConfig, StateCorrupt
from slots.worker.host_errors import DataLoss, InvalidArgument, NotFound, PermissionDenied, Unavailable
from slots.worker.metrics import (
    LOST_SNAPSHOT_REFUSED,
    RESUME_CORRUPT,
    RESUME_MISSING,
    RESUME_REFUSED,
    RESUME_UNAVAILABLE,
    WorkerMetrics,
)
from slots.worker.slot_records import ref_created, store_name
from snapshots.errors import (
    ChecksumMismatch,
    SnapshotError,
    SnapshotNotFound,
    SnapshotUnavailable,
    TenantMismatch,
)
from snapshots.ref import SnapshotRef
from snapshots.store import SnapshotStore

log = logging.getLogger("slotsched.worker")

#: Lost work from a superseded snapshot: also counted when the gap is unknown (logged as such).
LOST_SUPERSEDED = "snapshot_superseded"


class RestoreMixin:
    """Restore and lost-work accounting of `ActorHost` (set by its constructor)."""

    store: SnapshotStore
    config: ActorConfig
    metrics: WorkerMetrics
    fallback: bool

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
        except SnapshotError as e:  # e.g. NoSuchBucket, AccessDenied
            self.metrics.resume_failures.labels(RESUME_MISSING).inc()
            log.error("resume of session %s from %s failed: %s", session_id, ref.uri, e)
            raise NotFound(f"snapshot {ref.uri} cannot be read from the snapshot store: {e}") from e
        except ValueError as e:  # the store's own argument checks (e.g. a malformed sha256)
            raise InvalidArgument(f"resume_from: {e}") from e

        # Walk back through the session's snapshots to the newest older one that verifies.
        bad_created = ref_created(ref)
        try:
            listing = self.store.list(tenant, store_name(session_id))
        except SnapshotUnavailable as e:
            self.metrics.resume_failures.labels(RESUME_UNAVAILABLE).inc()
            raise Unavailable(
                f"cannot list session {session_id}'s snapshots after refusing {ref.uri}: {e}"
            ) from e
        except SnapshotError as e:
            self.metrics.resume_failures.labels(RESUME_MISSING).inc()
            raise NotFound(f"refused {ref.uri}, and the store refuses to list older snapshots: {e}") from e
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
            except SnapshotUnavailable as e:
                self.metrics.resume_failures.labels(RESUME_UNAVAILABLE).inc()
                raise Unavailable(f"snapshot store failed while reading {prev.uri}: {e}") from e
            except SnapshotError as e:
                self.metrics.resume_failures.labels(RESUME_MISSING).inc()
                raise NotFound(f"snapshot {prev.uri} cannot be read from the snapshot store: {e}") from e
        actor = fallback if fallback is not None else Actor(session_id, self.config.bytes_per_turn)
        newest = max([ref, *listing], key=lambda r: ref_created(r) or 0.0)
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
        used_created = ref_created(used) or 0.0
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
