"""What each event of a session's stream does to its state, one handler per kind (`HANDLERS`).

A grant starts the renewals and queues `on_grant`; YieldRequested starts the yield path and
YieldCancelled calls it off (`yielder.py`); Revoked and Ended{YIELDED} queue the session again;
Ended{session_over} ends it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.client.callbacks import CallbackQueue, invoke
from scheduler.client.channel import ClientLink
from scheduler.client.errors import GrantFailed, SessionEnded
from scheduler.client.phases import SessionEvent
from scheduler.client.renewer import Renewer
from scheduler.client.state import SessionState, log
from scheduler.client.types import (
    ClientSnapshotRef,
    LeaseInfo,
    QueueInfo,
    end_reason_name,
    lease_key,
    timestamp,
)
from scheduler.client.yielder import Yielder

_OURS = (scheduler_pb2.END_REASON_RELEASED, scheduler_pb2.END_REASON_WITHDRAWN)


def _event_time(ev: scheduler_pb2.LeaseEvent) -> datetime | None:
    return timestamp(ev.at) if ev.HasField("at") else None


class EventApplier:
    """Applies one session's stream events to its state."""

    def __init__(
        self,
        state: SessionState,
        client: ClientLink,
        renewer: Renewer,
        yielder: Yielder,
        queue: CallbackQueue,
        give_back: Callable[[], Callable[[], Awaitable[None]] | None],
    ) -> None:
        self._state = state
        self._client = client
        self._renewer = renewer
        self._yielder = yielder
        self._queue = queue
        self._give_back_lease = give_back  # the session's aclose, by a weak reference (no cycle)
        self._renew_interval_s: float | None = None
        self._give_back_task: asyncio.Task[None] | None = None

    def apply(self, ev: scheduler_pb2.LeaseEvent) -> None:
        if ev.HasField("at"):  # server clock minus ours (plus the one-way delay): for deadlines
            at = ev.at
            self._state.skew_s = at.seconds + at.nanos * 1e-9 - time.time()
        handler = HANDLERS.get(ev.WhichOneof("event") or "")
        if handler is not None:
            handler(self, ev)
        self._state.notify()

    def _queued(self, ev: scheduler_pb2.LeaseEvent) -> None:
        state = self._state
        if state.lease is not None:
            # Queued while we thought we held: the server no longer knows our lease. After our own
            # Yield of it (sent; its answer and Ended{YIELDED} lost to a failover, the re-attach
            # replays only "queued") that is our yield, not a lease taken from us.
            state.drop_lease(involuntary=self._yielder.sent != state.lease.key)
        state.queue = QueueInfo.from_proto(ev.queued)
        state.move(SessionEvent.QUEUED)

    def _yield_requested(self, ev: scheduler_pb2.LeaseEvent) -> None:
        state, yr = self._state, ev.yield_requested
        if not state.is_current(yr.lease_id, yr.epoch):
            return
        state.move(SessionEvent.YIELD_ASKED)
        lease = state.require_lease()
        if yr.HasField("deadline"):  # on_yield sees how long it has to checkpoint
            lease = replace(lease, yield_deadline=state.local(yr.deadline))
            state.lease = lease
        self._yielder.start(lease)

    def _yield_cancelled(self, ev: scheduler_pb2.LeaseEvent) -> None:
        self._yielder.called_off(ev.yield_cancelled.lease_id, ev.yield_cancelled.epoch)

    def _revoked(self, ev: scheduler_pb2.LeaseEvent) -> None:
        state, rv = self._state, ev.revoked
        key = lease_key(rv.lease_id, rv.epoch)
        self._yielder.revoked(key)
        if state.is_current(rv.lease_id, rv.epoch):
            state.drop_lease(involuntary=True)
        # A Yield of it answered OK after all (it raced the deadline): its snapshot is kept.
        kept = self._yielder.kept_snapshot(key)
        state.resume_from = kept or ClientSnapshotRef.from_optional(rv, "resume_from")
        if rv.reason != scheduler_pb2.REVOKE_REASON_EXPIRED:
            state.move(SessionEvent.REVOKED)  # (an expiry: the session's Ended follows)

    def _granted(self, ev: scheduler_pb2.LeaseEvent) -> None:
        state = self._state
        lease = LeaseInfo.from_proto(ev.granted.lease, ev.granted.grant)
        replay = state.is_current(lease.lease_id, lease.epoch)
        state.lease = lease
        state.queue = None
        state.move(SessionEvent.GRANTED)
        state.lost_lease.clear()
        if replay and lease.yield_deadline is None and self._yielder.started == lease.key:
            # Re-attached to an ACTIVE lease we were yielding: we missed its YieldCancelled.
            self._yielder.called_off(lease.lease_id, lease.epoch)
        # A lease we are giving back is not renewed: a Renew sent behind our Release would be
        # refused NOT_FOUND and read as a lease taken from us (a re-attach after a failover
        # replays the grant while the release is under way).
        renew = not state.release_requested
        if replay:
            # Re-attached: renew at once (renewals may have failed while detached), then on schedule.
            if renew:
                interval = self._renew_interval_s or self._ttl_interval(lease, ev)
                self._renewer.start(lease, interval, immediate=True)
            return
        state.grants += 1
        state.resume_from = lease.resume_from
        self._renew_interval_s = self._ttl_interval(lease, ev)
        if renew:
            self._renewer.start(lease, self._renew_interval_s, immediate=False)
        on_grant = state.spec.on_grant
        if on_grant is None:
            return
        regrant = state.grants > 1

        async def grant_action() -> None:
            try:
                if state.is_current(lease.lease_id, lease.epoch):
                    await invoke(on_grant, lease)
            except Exception as e:
                state.grant_error = e
                if regrant and state.is_current(lease.lease_id, lease.epoch):
                    self._give_back(lease, e)
                raise
            finally:
                state.grant_done = lease.key
                state.notify()

        self._queue.put(grant_action)

    def _give_back(self, lease: LeaseInfo, cause: Exception) -> None:
        """A re-grant whose actor did not start: release it and end the session with GrantFailed.
        (The first grant's failure is raised from `__aenter__` instead.) Holding on would pin a
        slot that runs nothing until the runtime noticed; the snapshot stays in `.resume_from`."""
        state = self._state
        err = GrantFailed(
            f"on_grant failed for session {state.session_id!r} on lease {lease.lease_id} "
            f"(epoch {lease.epoch}): {cause!r}; the lease was released"
        )
        err.__cause__ = cause
        if state.error is None:
            state.error = err
        state.lost_lease.set()
        self._give_back_task = asyncio.create_task(
            self._close_quietly(), name=f"slotsched-give-back-{state.session_id}"
        )

    async def _close_quietly(self) -> None:
        try:
            aclose = self._give_back_lease()
            if aclose is not None:  # (else the session is gone, and nothing holds its lease)
                await aclose()
        except Exception as e:  # e.g. the client was closed first: nothing left to release with
            log.warning("slotsched: giving back the lease of %s failed: %r", self._state.session_id, e)

    def _ttl_interval(self, lease: LeaseInfo, ev: scheduler_pb2.LeaseEvent) -> float:
        """A third of the lease TTL, read from the server's own clock (no client skew)."""
        if self._client.renew_interval_s is not None:
            return self._client.renew_interval_s
        if lease.expires_at is None:
            return 10.0
        # Both times are the server's. For a fresh grant expires_at - granted_at is the TTL; for a
        # replay expires_at was renewed since the grant, so time it from the later event time
        # instead (an underestimate, never an overestimate).
        starts = [t for t in (lease.granted_at, _event_time(ev)) if t is not None]
        start = max(starts) if starts else datetime.now(UTC)
        ttl = (lease.expires_at - start).total_seconds()
        return max(0.05, ttl / 3.0)

    def _ended(self, ev: scheduler_pb2.LeaseEvent) -> None:
        state, ended = self._state, ev.ended
        ours = state.release_requested and ended.reason in _OURS
        key = lease_key(ended.lease_id, ended.epoch)
        if ended.lease_id and state.is_current(ended.lease_id, ended.epoch):
            state.drop_lease(involuntary=not ours and ended.reason != scheduler_pb2.END_REASON_YIELDED)
        if ended.reason == scheduler_pb2.END_REASON_YIELDED and not ended.session_over:
            self._yielder.count(key)
            snapshot = self._yielder.snapshot_of(key)
            if snapshot is not None:
                state.resume_from = snapshot  # before the Yield response, maybe
            state.move(SessionEvent.YIELDED)
            return
        if not ended.session_over:
            return
        reason = end_reason_name(int(ended.reason))
        if not state.release_requested and state.error is None:
            state.error = SessionEnded(f"session {state.session_id!r} ended: {reason}", reason)
        state.end_reason = reason
        # `ended` is set when the stream closes: its status may name the end better (a
        # DEADLINE_EXCEEDED after Ended{WITHDRAWN} is a wait_timeout).
        state.end(reason, final_status_pending=True)


HANDLERS: dict[str, Callable[[EventApplier, scheduler_pb2.LeaseEvent], None]] = {
    "queued": EventApplier._queued,
    "granted": EventApplier._granted,
    "yield_requested": EventApplier._yield_requested,
    "yield_cancelled": EventApplier._yield_cancelled,
    "revoked": EventApplier._revoked,
    "ended": EventApplier._ended,
}
