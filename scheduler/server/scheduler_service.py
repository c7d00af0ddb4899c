"""The Scheduler service: proto in, one core event, decisions and stream events out.

No scheduling here. Each rpc authenticates and hands the request to `SessionOps`
(session_ops.py: validate, submit one event to the loop, translate what came back), which the
multiplexed `Channel` (session_channel.py) shares. The one piece of logic of its own is
the Acquire stream: it waits on the session's queue and enforces the caller's patience — a
`wait_timeout` or gRPC deadline passing while still queued withdraws the request. A stream that
breaks otherwise changes nothing in the core: the caller re-attaches, the lease TTL reclaims the
dead.
"""

from __future__ import annotations

import asyncio
from typing import Any

from scheduler.api.gen.slotsched.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler.core.types import QoS
from scheduler.grants import GrantKeyring
from scheduler.ports import StateUnavailable
from scheduler.server import convert, errors
from scheduler.server.auth import Authenticator
from scheduler.server.loop import SchedulerLoop
from scheduler.server.session_channel import ChannelService
from scheduler.server.session_ops import Outcome, SessionOps, check_session_id
from scheduler.server.stream import FINAL, GRANTED, QUEUED, Item, SessionStream, StreamClosed

# A gRPC deadline within this much of now counts as passed when the call is cancelled.
_DEADLINE_SLACK_S = 0.05

_PHASES = {
    "queued": scheduler_pb2.SESSION_PHASE_QUEUED,
    "active": scheduler_pb2.SESSION_PHASE_HOLDING,
    "yielding": scheduler_pb2.SESSION_PHASE_YIELDING,
}


class SchedulerService(scheduler_pb2_grpc.SchedulerServicer):
    """`keys` sign grants and tag lease ids (grants.py); None = a key generated for this server."""

    def __init__(self, loop: SchedulerLoop, auth: Authenticator, keys: GrantKeyring | None = None) -> None:
        self._loop = loop
        self._auth = auth
        self._keys = keys if keys is not None else GrantKeyring.generate()
        self._ops = SessionOps(loop, self._keys)
        self._channels = ChannelService(loop, auth, self._ops)

    def _tenant(self, context: Any, rpc: str) -> str:
        if self._loop.shutting_down:
            raise errors.unavailable()
        return self._auth.tenant(context, rpc)  # charged to the tenant's flow (rate limits)

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
                # Built (and signed) while the journal append is in flight; written only after:
                # never tell what a crash could take back.
                message = seal(keys, lease_event(notice))
                await self._loop.durable()
                if stream.closed:
                    continue  # closed while we waited: the check above ends the stream
                await write(message)
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
                    self._ops.withdraw_now(key)
            raise
        finally:
            self._loop.detach(stream)

    def _open(self, request: scheduler_pb2.AcquireRequest, context: Any) -> SessionStream:
        """Authenticate, validate, then re-attach to a live session or queue a new one."""
        return self._ops.open(self._tenant(context, "Acquire"), request)

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
            if self._ops.withdraw_now(stream.key):
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

    # ------------------------------------------------------------------ unary rpcs

    async def _answer(self, outcome: Outcome) -> Any:
        """Tell the caller once the event is durable: the reply, or the failure it came to."""
        await self._loop.durable()
        if isinstance(outcome, errors.RpcFailure):
            raise outcome
        return outcome

    @errors.unary
    async def Release(
        self, request: scheduler_pb2.ReleaseRequest, context: Any
    ) -> scheduler_pb2.ReleaseResponse:
        tenant = self._tenant(context, "Release")
        out: scheduler_pb2.ReleaseResponse = await self._answer(self._ops.release(tenant, request))
        return out

    @errors.unary
    async def Renew(self, request: scheduler_pb2.RenewRequest, context: Any) -> scheduler_pb2.RenewResponse:
        tenant = self._tenant(context, "Renew")
        out: scheduler_pb2.RenewResponse = await self._answer(self._ops.renew(tenant, request))
        return out

    @errors.unary
    async def Yield(self, request: scheduler_pb2.YieldRequest, context: Any) -> scheduler_pb2.YieldResponse:
        tenant = self._tenant(context, "Yield")
        out: scheduler_pb2.YieldResponse = await self._answer(self._ops.yield_(tenant, request))
        return out

    async def Channel(self, requests: Any, context: Any) -> None:
        """Many sessions on one bidirectional stream (session_channel.py)."""
        await self._channels.serve(context)

    @errors.unary
    async def GetSession(
        self, request: scheduler_pb2.GetSessionRequest, context: Any
    ) -> scheduler_pb2.SessionState:
        tenant = self._tenant(context, "GetSession")
        check_session_id(request.session_id)
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
