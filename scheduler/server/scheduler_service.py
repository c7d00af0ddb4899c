"""The Scheduler service: proto in, one core event, decisions and stream events out.

No scheduling here. Each rpc authenticates, validates (INVALID_ARGUMENT naming the field),
submits one event to the loop and translates what came back. The one piece of logic of its own is
the Acquire stream: it waits on the session's queue and enforces the caller's patience — a
`wait_timeout` or gRPC deadline passing while still queued withdraws the request. A stream that
breaks otherwise changes nothing in the core: the caller re-attaches, the lease TTL reclaims the
dead.
"""

from __future__ import annotations

import asyncio
from typing import Any

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.core.types import LeaseId, QoS, Queued, Release, Renew, Renewed, SessionId, SnapshotRef, Yield
from scheduler.grants import GrantKeyring
from scheduler.ports import StateUnavailable
from scheduler.server import convert, errors
from scheduler.server.auth import Authenticator
from scheduler.server.loop import SchedulerLoop
from scheduler.server.stream import FINAL, GRANTED, QUEUED, Item, SessionStream, StreamClosed

MAX_SESSION_ID_BYTES = 256
# A gRPC deadline within this much of now counts as passed when the call is cancelled.
_DEADLINE_SLACK_S = 0.05

_PHASES = {
    "queued": scheduler_pb2.SESSION_PHASE_QUEUED,
    "active": scheduler_pb2.SESSION_PHASE_HOLDING,
    "yielding": scheduler_pb2.SESSION_PHASE_YIELDING,
}


def _require(value: str, field: str) -> None:
    if not value:
        raise errors.invalid_argument(field, "required")


def _session_id(value: str) -> None:
    _require(value, "session_id")
    if len(value.encode()) > MAX_SESSION_ID_BYTES:
        raise errors.invalid_argument("session_id", f"longer than {MAX_SESSION_ID_BYTES} bytes")


def _snapshot(msg: Any, field: str) -> SnapshotRef | None:
    if not msg.HasField(field):
        return None
    ref = getattr(msg, field)
    if not ref.uri:
        raise errors.invalid_argument(f"{field}.uri", "required when a snapshot is given")
    return convert.snapshot_from_pb(ref)


class SchedulerService(scheduler_pb2_grpc.SchedulerServicer):
    """`keys` sign grants and tag lease ids (grants.py); None = a key generated for this server."""

    def __init__(self, loop: SchedulerLoop, auth: Authenticator, keys: GrantKeyring | None = None) -> None:
        self._loop = loop
        self._auth = auth
        self._keys = keys if keys is not None else GrantKeyring.generate()

    def _tenant(self, context: Any, rpc: str) -> str:
        if self._loop.shutting_down:
            raise errors.unavailable()
        return self._auth.tenant(context, rpc)  # charged to the tenant's flow (rate limits)

    def _lease_id(self, wire_id: str, tenant: str) -> LeaseId:
        """The core id of a lease id as quoted (tag verified), checked to be the caller's."""
        _require(wire_id, "lease_id")
        core = self._keys.core_of(wire_id)
        if core is None:
            # An untagged, mistagged or guessed id names no lease this caller was given.
            raise errors.not_found(f"no lease {wire_id[:80]!r}: quote lease_id as granted (with its tag)")
        lease = self._loop.core.lease(LeaseId(core))
        if lease is not None and lease.tenant != tenant:
            raise errors.failed_precondition(f"lease {wire_id} belongs to another tenant")
        return LeaseId(core)

    # ------------------------------------------------------------------ Acquire

    async def Acquire(self, request: scheduler_pb2.AcquireRequest, context: Any) -> None:
        """Open or re-attach the session's stream, then relay its events until the last one.

        One flat loop on purpose, and `context.write` rather than an async generator: every event
        of every session passes through here, and the generator costs an extra hop per event.
        """
        try:
            stream = self._open(request, context)
        except errors.RpcFailure as f:
            await errors.abort(context, f)
            return
        key = stream.key
        items = stream.items
        write = context.write
        keys = self._keys
        lease_event, seal = convert.lease_event, convert.seal_event
        wait_timeout = self._loop.wait_timeout(key)
        queued_since: float | None = None
        withdrawn = ""  # why the caller's patience ran out, once the request is withdrawn
        try:
            while True:
                if items:
                    kind, notice, at = items.popleft()
                elif queued_since is None or withdrawn:
                    kind, notice, at = await stream.get()
                else:
                    item, why = await self._next_while_queued(stream, queued_since, wait_timeout, context)
                    if item is None:
                        withdrawn = why  # Ended{WITHDRAWN} is in the queue now (or a grant was first)
                        continue
                    kind, notice, at = item
                if notice is None or stream.closed:
                    # CLOSE (a newer stream attached, shutdown, a step-down): what is still queued
                    # is stale, e.g. a grant of a term whose state a step-down threw away.
                    reason = stream.close_reason or StreamClosed.SHUTTING_DOWN
                    await errors.abort(context, errors.from_closed(reason))
                    return
                if kind == QUEUED:
                    if queued_since is None:
                        queued_since = at
                elif kind == GRANTED:
                    queued_since = None
                await self._loop.durable()  # never tell what a crash could take back
                if stream.closed:
                    continue  # closed while we waited: the check above ends the stream
                await write(seal(keys, lease_event(notice)))
                if kind == FINAL:
                    if withdrawn:
                        msg = f"still queued when {withdrawn} passed: the request was withdrawn"
                        await errors.abort(context, errors.deadline_exceeded(msg))
                    return
        except StateUnavailable as e:  # the state store could not make it durable
            await errors.abort(context, errors.from_state(e))
        except asyncio.CancelledError:
            # Client gone or its deadline passed. Only the deadline withdraws a queued request.
            if queued_since is not None:
                left = context.time_remaining()
                if left is not None and left <= _DEADLINE_SLACK_S:
                    self._withdraw_now(key)
            raise
        finally:
            self._loop.detach(stream)

    def _open(self, request: scheduler_pb2.AcquireRequest, context: Any) -> SessionStream:
        """Validate, then re-attach to a live session or ask the core for a new one."""
        tenant = self._tenant(context, "Acquire")
        _session_id(request.session_id)
        qos = convert.PB_TO_QOS.get(request.qos)
        if qos is None:
            raise errors.invalid_argument("qos", "must be GUARANTEED, BURSTABLE or BEST_EFFORT")
        resume = _snapshot(request, "resume_from")
        wait_timeout = None
        if request.HasField("wait_timeout"):
            wait_timeout = convert.from_dur(request.wait_timeout)
            if wait_timeout < 0:
                raise errors.invalid_argument("wait_timeout", "must not be negative")
        key = convert.session_key(tenant, request.session_id)
        stream = self._loop.reattach(key)
        if stream is not None:
            return stream
        stream, refusal = self._loop.acquire(key, tenant, qos, resume, wait_timeout)
        if refusal is not None or stream is None:
            raise errors.from_refused(refusal, tenant) if refusal else errors.unavailable()
        return stream

    async def _next_while_queued(
        self, stream: SessionStream, queued_since: float, wait_timeout: float | None, context: Any
    ) -> tuple[Item | None, str]:
        """The next item, or (None, why) once the caller's patience ran out and the request was
        withdrawn. If a grant beat the timer, nothing is withdrawn and waiting goes on."""
        timeout, why = self._patience(queued_since, wait_timeout, context)
        if timeout is None:
            return await stream.get(), ""
        try:
            return await asyncio.wait_for(stream.get(), max(0.0, timeout)), ""
        except TimeoutError:
            if self._withdraw_now(stream.key):
                return None, why
            return await stream.get(), ""  # not queued any more: the grant is coming

    def _patience(
        self, queued_since: float, wait_timeout: float | None, context: Any
    ) -> tuple[float | None, str]:
        """Seconds until the caller stops waiting (wait_timeout or gRPC deadline), and which."""
        timeout, why = None, ""
        if wait_timeout is not None:
            timeout, why = queued_since + wait_timeout - self._loop.now(), f"wait_timeout {wait_timeout:g}s"
        left = context.time_remaining()
        if left is not None and (timeout is None or left < timeout):
            timeout, why = left, "the caller's deadline"
        return timeout, why

    def _withdraw_now(self, key: SessionId) -> bool:
        view = self._loop.session(key)
        if view is None or view.lease is not None:
            return False
        self._loop.submit(Release(key, None))
        return True

    # ------------------------------------------------------------------ unary rpcs

    @errors.unary
    async def Release(
        self, request: scheduler_pb2.ReleaseRequest, context: Any
    ) -> scheduler_pb2.ReleaseResponse:
        tenant = self._tenant(context, "Release")
        _session_id(request.session_id)
        key = convert.session_key(tenant, request.session_id)
        if request.lease_id:
            lease_id = self._lease_id(request.lease_id, tenant)
            decisions = self._loop.submit(Release(key, lease_id, request.epoch))
            await self._loop.durable()
            errors.raise_for(decisions)
            return scheduler_pb2.ReleaseResponse(reason=scheduler_pb2.END_REASON_RELEASED)
        view = self._loop.session(key)
        if view is not None and view.lease is not None:
            raise errors.failed_precondition(
                f"session {request.session_id} holds lease {self._keys.wire_lease_id(view.lease.lease_id)}: "
                "quote lease_id and epoch"
            )
        decisions = self._loop.submit(Release(key, None))
        await self._loop.durable()
        errors.raise_for(decisions)
        return scheduler_pb2.ReleaseResponse(reason=scheduler_pb2.END_REASON_WITHDRAWN)

    @errors.unary
    async def Renew(self, request: scheduler_pb2.RenewRequest, context: Any) -> scheduler_pb2.RenewResponse:
        tenant = self._tenant(context, "Renew")
        _session_id(request.session_id)
        lease_id = self._lease_id(request.lease_id, tenant)
        key = convert.session_key(tenant, request.session_id)
        decisions = self._loop.submit(Renew(key, lease_id, request.epoch))
        # The reply is built now, from this event's state, and sent once that state is durable
        # (reading after the wait could report later events that are not).
        resp: scheduler_pb2.RenewResponse | None = None
        for d in decisions:
            if isinstance(d, Renewed) and d.lease.session == key:
                resp = scheduler_pb2.RenewResponse(
                    expires_at=convert.ts(d.lease.expires_at),
                    state=common_pb2.LEASE_STATE_ACTIVE,
                    grant=convert.grant_for_lease(self._keys, d.lease),
                )
                y = self._loop.yielding(d.lease.lease_id)
                if y is not None:
                    resp.state = common_pb2.LEASE_STATE_YIELDING
                    resp.yield_deadline.CopyFrom(convert.ts(y.deadline))
        await self._loop.durable()
        errors.raise_for(decisions)
        if resp is None:
            raise errors.not_found(f"lease {request.lease_id} expired")  # expired by this very tick
        return resp

    @errors.unary
    async def Yield(self, request: scheduler_pb2.YieldRequest, context: Any) -> scheduler_pb2.YieldResponse:
        tenant = self._tenant(context, "Yield")
        _session_id(request.session_id)
        _require(request.lease_id, "lease_id")
        snap = _snapshot(request, "snapshot")
        lease_id = self._lease_id(request.lease_id, tenant)
        key = convert.session_key(tenant, request.session_id)
        decisions = self._loop.submit(Yield(key, lease_id, request.epoch, snap))
        await self._loop.durable()
        errors.raise_for(decisions)
        position = 0  # re-granted at once if no Queued follows
        for d in decisions:
            if isinstance(d, Queued) and d.session == key:
                position = d.position
        return scheduler_pb2.YieldResponse(position=position)

    @errors.unary
    async def GetSession(
        self, request: scheduler_pb2.GetSessionRequest, context: Any
    ) -> scheduler_pb2.SessionState:
        tenant = self._tenant(context, "GetSession")
        _session_id(request.session_id)
        # Read now, answer once what was read is durable (a read may see events still in flight).
        try:
            out = self._session_state(request.session_id, tenant)
        finally:
            await self._loop.durable()
        return out

    def _session_state(self, session_id: str, tenant: str) -> scheduler_pb2.SessionState:
        request = scheduler_pb2.GetSessionRequest(session_id=session_id)
        key = convert.session_key(tenant, request.session_id)
        out = scheduler_pb2.SessionState(session_id=request.session_id, tenant=tenant)
        view = self._loop.session(key)
        if view is not None:
            out.state = _PHASES[view.phase]
            out.qos = convert.QOS_TO_PB[QoS(view.qos)]
            if view.resume_from is not None:
                out.last_snapshot.CopyFrom(convert.snapshot_to_pb(view.resume_from))
            if view.lease is not None:
                lease, y = view.lease, self._loop.yielding(view.lease.lease_id)
                out.lease.CopyFrom(convert.lease_to_pb(lease, self._loop.address(lease.slot.worker), y))
                out.grant = convert.grant_for(self._keys, out.lease)
                convert.tag_lease(self._keys, out.lease)
            else:
                out.position = view.position
                if view.estimated_wait_s is not None:
                    out.estimated_wait.CopyFrom(convert.dur(view.estimated_wait_s))
                out.queued_since.CopyFrom(convert.ts(view.waiting_since))
            return out
        ended = self._loop.ended(key)
        if ended is None:
            raise errors.not_found(f"no session {request.session_id}")
        out.state = scheduler_pb2.SESSION_PHASE_ENDED
        out.qos = convert.QOS_TO_PB[ended.qos]
        out.end_reason = convert.END_TO_PB[ended.reason]
        if ended.last_snapshot is not None:
            out.last_snapshot.CopyFrom(convert.snapshot_to_pb(ended.last_snapshot))
        return out
