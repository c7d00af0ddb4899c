"""A session's Acquire stream: consume its events into the session's state, and re-attach when it
breaks (backoff, `reattach_timeout_s`), or give up connecting after `connect_timeout_s` when the
server was never reached. The backoff sleeps are the client's `Wake`'s: the first event of an
attach (a new session's, or one after a sleep) ends the sleeps of the client's other sessions.

Grants start the renewals and queue `on_grant`; YieldRequested starts the yield path (`duties.py`).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from datetime import UTC, datetime

import grpc
import grpc.aio

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.client.callbacks import invoke
from scheduler.client.channel import REATTACH_CODES, NoAnswer
from scheduler.client.duties import SessionDuties
from scheduler.client.errors import (
    GrantFailed,
    ResourceExhausted,
    SessionEnded,
    SlotschedError,
    Unavailable,
    from_rpc_error,
)
from scheduler.client.session_state import log
from scheduler.client.types import LeaseInfo, Phase, QueueInfo, SnapshotRef, end_reason_name, lease_key


def _event_time(ev: scheduler_pb2.LeaseEvent) -> datetime | None:
    return ev.at.ToDatetime(tzinfo=UTC) if ev.HasField("at") else None


class SessionStream(SessionDuties):
    """The stream task of one session and the handling of each event."""

    def _acquire_request(self) -> scheduler_pb2.AcquireRequest:
        req = scheduler_pb2.AcquireRequest(session_id=self.session_id, qos=self.qos.to_proto())
        # On a re-attach the server ignores these; if it lost the session they start it afresh
        # from the latest snapshot we know of.
        if self._resume_from is not None:
            req.resume_from.CopyFrom(self._resume_from.to_proto())
        if self._wait_timeout_s is not None:
            req.wait_timeout.FromNanoseconds(round(self._wait_timeout_s * 1e9))
        return req

    async def _run_stream(self) -> None:
        loop = asyncio.get_running_loop()
        client = self._client
        backoff = client.backoff_initial_s
        outage_since: float | None = None
        # The next event shows the server answers: told to the client's sessions asleep in
        # backoff (`wake.py`). Set for a new session's first event and after each sleep, so it
        # is told once per attach, never per event.
        announce = True
        wakeable = True  # one early wake per run of failures: until an event, sleep in full
        started = loop.time()
        while not self._closing:
            failure: SlotschedError
            try:
                call = client.session_stub().Acquire(self._acquire_request(), metadata=client.metadata)
                self._attached = True
                events = call.__aiter__()
                if not self._reached:
                    # A black-holed address must not hang the first attach: the server answers an
                    # Acquire at once (Queued or Granted), so wait for that within the deadline.
                    left = max(0.05, client.connect_timeout_s - (loop.time() - started))
                    try:
                        first = await asyncio.wait_for(anext(events, None), left)
                    except TimeoutError:
                        call.cancel()
                        raise NoAnswer(f"no answer within {left:.1f}s") from None
                    if first is not None:
                        self._reached = True
                        announce, outage_since, backoff = False, None, client.backoff_initial_s
                        wakeable = True
                        client.wake.heard()
                        self._handle_event(first)
                async for ev in events:
                    if announce:
                        # The server answers (after an outage, or for the first time): the
                        # client's sessions asleep in backoff try again now, not at their wake-up.
                        announce, outage_since, backoff = False, None, client.backoff_initial_s
                        wakeable = True
                        client.wake.heard()
                    self._reached = True
                    self._handle_event(ev)
                if self._phase is Phase.ENDED:
                    self.ended.set()  # after the status: waiters see the final error
                    return
                failure = Unavailable("Acquire stream closed before the session ended", None)
            except NoAnswer as e:
                failure = Unavailable(str(e), grpc.StatusCode.UNAVAILABLE)
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e)
                err.__cause__ = e
                code = e.code()
                if self._phase is Phase.ENDED:
                    # Closing status after the final event: DEADLINE_EXCEEDED names the withdrawal.
                    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                        self.error = err
                    self.ended.set()
                    return
                if self._closing:
                    return
                # A re-attach refused by the rate limit (every session of a client re-attaches
                # at once after a restart, past the tenant's burst; or a full queue, for a
                # session the server lost) waits as told and tries again, within
                # reattach_timeout_s; a new session's refusal is its answer.
                limited = (
                    self._reached and isinstance(err, ResourceExhausted) and err.retry_after_s is not None
                )
                if code not in REATTACH_CODES and not limited:
                    self._fail(err)
                    return
                if limited:
                    assert isinstance(err, ResourceExhausted) and err.retry_after_s is not None
                    # Jitter: the sessions refused together must not come back together.
                    backoff = max(backoff, err.retry_after_s * random.uniform(1.0, 1.5))
                    wakeable = False  # the server said when: another session's answer does not change it
                failure = err
            finally:
                self._attached = False
                self._notify()
            if self._release_requested or self._closing:
                return
            now = loop.time()
            if not self._reached:
                # Tried until the deadline itself: the last sleep is cut to end there and one more
                # attempt follows, so a server coming up late in the window is still reached.
                waited = now - started
                left = client.connect_timeout_s - waited
                if left <= 0:
                    err = Unavailable(
                        f"could not connect to the slotsched scheduler at {client.target} for session "
                        f"{self.session_id!r}: tried for {waited:.1f}s (connect_timeout_s="
                        f"{client.connect_timeout_s:g}): {failure.message}",
                        grpc.StatusCode.UNAVAILABLE,
                    )
                    err.__cause__ = failure
                    self._fail(err)
                    return
                pause = min(backoff, left)
                log.warning(
                    "slotsched: cannot reach the scheduler at %s for session %s (%s); retrying in %.2fs",
                    client.target,
                    self.session_id,
                    failure.message,
                    pause,
                )
                announce = True
                wakeable = await self._backoff(pause, wakeable)
                backoff = min(backoff * 2, client.backoff_max_s)
                continue
            if outage_since is None:
                outage_since = now
            if now - outage_since + backoff > client.reattach_timeout_s:
                gave_up = Unavailable(
                    f"gave up re-attaching session {self.session_id!r} after "
                    f"{now - outage_since:.1f}s: {failure.message}",
                    grpc.StatusCode.UNAVAILABLE,
                )
                gave_up.__cause__ = failure
                self._fail(gave_up)
                return
            log.info(
                "slotsched: stream of %s broke (%s); re-attaching in %.2fs", self.session_id, failure, backoff
            )
            announce = True
            wakeable = await self._backoff(backoff, wakeable)
            backoff = min(backoff * 2, client.backoff_max_s)
            self.reattaches += 1

    async def _backoff(self, delay: float, wakeable: bool) -> bool:
        """Sleep before the next attach, cut short by the client hearing from the server again
        (wake.py) if `wakeable`; whether the next sleep may be cut short too (not after a wake:
        only an event makes it so again)."""
        if not wakeable:
            await asyncio.sleep(delay)
            return False
        return not await self._client.wake.sleep(delay, self._client.backoff_initial_s)

    def _handle_event(self, ev: scheduler_pb2.LeaseEvent) -> None:
        kind = ev.WhichOneof("event")
        if ev.HasField("at"):  # server clock minus ours (plus the one-way delay): for deadlines
            self._skew_s = (ev.at.ToDatetime(tzinfo=UTC) - datetime.now(UTC)).total_seconds()
        if kind == "queued":
            if self._lease is not None:
                # Queued while we thought we held: the server no longer knows our lease. After
                # our own Yield of it (sent; its answer and Ended{YIELDED} lost to a failover, the
                # re-attach replays only "queued") that is our yield, not a lease taken from us.
                self._drop_lease(involuntary=self._yield_sent != self._lease.key)
            self._queue = QueueInfo.from_proto(ev.queued)
            self._phase = Phase.QUEUED
        elif kind == "granted":
            self._on_granted(ev)
        elif kind == "yield_requested":
            yr = ev.yield_requested
            if self._is_current(yr.lease_id, yr.epoch):
                self._phase = Phase.YIELDING
                lease = self._require_lease()
                if yr.HasField("deadline"):  # on_yield sees how long it has to checkpoint
                    lease = replace(lease, yield_deadline=self._local(yr.deadline))
                    self._lease = lease
                self._start_yield(lease)
        elif kind == "yield_cancelled":
            yc = ev.yield_cancelled
            self._yield_called_off(yc.lease_id, yc.epoch)
        elif kind == "revoked":
            rv = ev.revoked
            if self._is_current(rv.lease_id, rv.epoch):
                self._drop_lease(involuntary=True)
            self._resume_from = SnapshotRef.from_optional(rv, "resume_from")
            if rv.reason != scheduler_pb2.REVOKE_REASON_EXPIRED:
                self._phase = Phase.QUEUED
        elif kind == "ended":
            self._on_ended(ev.ended)
        self._notify()

    def _on_granted(self, ev: scheduler_pb2.LeaseEvent) -> None:
        lease = LeaseInfo.from_proto(ev.granted.lease, ev.granted.grant)
        replay = self._is_current(lease.lease_id, lease.epoch)
        self._lease = lease
        self._queue = None
        self._phase = Phase.HOLDING
        self.lost_lease.clear()
        if replay and lease.yield_deadline is None and self._yield_started == lease.key:
            # Re-attached to an ACTIVE lease we were yielding: we missed its YieldCancelled.
            self._yield_called_off(lease.lease_id, lease.epoch)
        # A lease we are giving back is not renewed: a Renew sent behind our Release would be
        # refused NOT_FOUND and read as a lease taken from us (a re-attach after a failover
        # replays the grant while the release is under way).
        renew = not self._release_requested
        if replay:
            # Re-attached: renew at once (renewals may have failed while detached), then on schedule.
            if renew:
                interval = self._renew_interval_s or self._ttl_interval(lease, ev)
                self._start_renew(lease, interval, immediate=True)
            return
        self._grants += 1
        self._resume_from = lease.resume_from
        self._renew_interval_s = self._ttl_interval(lease, ev)
        if renew:
            self._start_renew(lease, self._renew_interval_s, immediate=False)
        if self._on_grant is not None:
            on_grant = self._on_grant

            regrant = self._grants > 1

            async def grant_action() -> None:
                try:
                    if self._is_current(lease.lease_id, lease.epoch):
                        await invoke(on_grant, lease)
                except Exception as e:
                    self._grant_error = e
                    if regrant and self._is_current(lease.lease_id, lease.epoch):
                        self._give_back(lease, e)
                    raise
                finally:
                    self._grant_done = lease.key
                    self._notify()

            self._actions.put_nowait(grant_action)

    def _give_back(self, lease: LeaseInfo, cause: Exception) -> None:
        """A re-grant whose actor did not start: release it and end the session with GrantFailed.
        (The first grant's failure is raised from `__aenter__` instead.) Holding on would pin a
        slot that runs nothing until the runtime noticed; the snapshot stays in `.resume_from`."""
        err = GrantFailed(
            f"on_grant failed for session {self.session_id!r} on lease {lease.lease_id} "
            f"(epoch {lease.epoch}): {cause!r}; the lease was released"
        )
        err.__cause__ = cause
        if self.error is None:
            self.error = err
        self.lost_lease.set()
        self._give_back_task = asyncio.create_task(
            self._close_quietly(), name=f"slotsched-give-back-{self.session_id}"
        )

    async def _close_quietly(self) -> None:
        try:
            await self.aclose()
        except Exception as e:  # e.g. the client was closed first: nothing left to release with
            log.warning("slotsched: giving back the lease of %s failed: %r", self.session_id, e)

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

    def _on_ended(self, ended: scheduler_pb2.Ended) -> None:
        ours = self._release_requested and ended.reason in (
            scheduler_pb2.END_REASON_RELEASED,
            scheduler_pb2.END_REASON_WITHDRAWN,
        )
        if ended.lease_id and self._is_current(ended.lease_id, ended.epoch):
            self._drop_lease(involuntary=not ours and ended.reason != scheduler_pb2.END_REASON_YIELDED)
        if ended.reason == scheduler_pb2.END_REASON_YIELDED and not ended.session_over:
            self._count_yield(lease_key(ended.lease_id, ended.epoch))
            if self._yield_ref is not None and self._yield_ref[0] == lease_key(ended.lease_id, ended.epoch):
                self._resume_from = self._yield_ref[1]  # before the Yield response, maybe
            self._phase = Phase.QUEUED
            return
        if not ended.session_over:
            return
        reason = end_reason_name(int(ended.reason))
        if not self._release_requested and self.error is None:
            self.error = SessionEnded(f"session {self.session_id!r} ended: {reason}", reason)
        self.end_reason = reason
        # `ended` is set when the stream closes: its status may name the end better (a
        # DEADLINE_EXCEEDED after Ended{WITHDRAWN} is a wait_timeout).
        self._set_ended(reason, final_status_pending=True)
