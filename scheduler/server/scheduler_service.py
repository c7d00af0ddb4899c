"""The Scheduler service: proto in, one core event, decisions and stream events out.

No scheduling here, and no list of commands: each unary rpc is built from the command table
(scheduler/api/commands.py: its rate-limit flow) and its operation in `session_ops.UNARY_OPS`
(validate, submit one event to the loop, translate what came back), which the multiplexed
`Channel` (session_channel.py) shares. The one piece of logic of its own is the Acquire stream:
it relays the session's `LeaseStream` and hands it the caller's gRPC deadline, which, like
`wait_timeout`, withdraws a request still queued when it passes (the stream keeps that timer:
stream.py). A stream that breaks otherwise changes nothing in the core: the caller re-attaches,
the lease TTL reclaims the dead.

Each call goes to the unit its router gives (pool_routes.py): with one loop that loop; under
per-pool leadership the pool unit its session is in (a new Acquire: its first candidate pool),
whose loop and operations serve it, and a pool led by another replica answers NOT_LEADER naming
the pool and its leader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from scheduler.api import commands
from scheduler.api.commands import Command
from scheduler.api.gen.slotsched.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler.grants import GrantKeyring
from scheduler.ports import StateUnavailable
from scheduler.server import convert, errors
from scheduler.server.auth import Authenticator
from scheduler.server.pool_routes import PoolUnit, Router
from scheduler.server.session_channel import ChannelService
from scheduler.server.session_ops import FOLLOW_OPS, UNARY_OPS, Outcome
from scheduler.server.stream import FINAL, StreamClosed

# A gRPC deadline within this much of now counts as passed when the call is cancelled.
_DEADLINE_SLACK_S = 0.05


class SchedulerService(scheduler_pb2_grpc.SchedulerServicer):
    """`keys` sign grants and tag lease ids (grants.py); None = a key generated for this server.
    The unary rpcs are set below the class, one per row of the command table."""

    def __init__(self, router: Router, auth: Authenticator, keys: GrantKeyring | None = None) -> None:
        self._auth = auth
        self._keys = keys if keys is not None else GrantKeyring.generate()
        self._router = router
        self._channels = ChannelService(auth, self._keys, router)

    def _tenant(self, context: Any, command: Command) -> str:
        self._router.check_open()
        return self._auth.tenant(context, command)  # charged to the command's flow (rate limits)

    # ------------------------------------------------------------------ Acquire

    async def Acquire(self, request: scheduler_pb2.AcquireRequest, context: Any) -> None:
        """Open or re-attach the session's stream, then relay its events until the last one.

        One flat loop on purpose, and `context.write` rather than an async generator: every event
        of every session passes through here, and the generator costs an extra hop per event.
        """
        auth = self._auth
        try:
            tenant = self._tenant(context, commands.ACQUIRE)
            held = auth.streams.open_stream(tenant, context)  # spec.limits.streamsPer*
        except errors.RpcFailure as f:
            await errors.abort(context, f)
            return
        try:
            await self._run_acquire(request, context, tenant)
        finally:
            auth.streams.close("stream", held)

    async def _run_acquire(self, request: scheduler_pb2.AcquireRequest, context: Any, tenant: str) -> None:
        try:
            await self._auth.gate.admit(tenant)  # fair admission in the tenant's flow
            unit = self._router.for_acquire(tenant, request)
            loop = unit.loop
            stream = unit.ops.open(tenant, request)
        except errors.RpcFailure as f:
            await errors.abort(context, f)
            return
        left = context.time_remaining()
        if left is not None:  # the caller's patience too, while queued (the stream's timer)
            stream.give_up_at(loop.now() + left, "the caller's deadline")
        items = stream.items
        write = context.write
        keys = self._keys
        lease_event, seal = convert.lease_event, convert.seal_event
        try:
            while True:
                kind, notice, _ = items.popleft() if items else await stream.get()
                if notice is None or stream.closed:
                    # CLOSE (a newer stream attached, shutdown, a step-down): what is still queued
                    # is stale, e.g. a grant of a term whose state a step-down threw away.
                    reason = stream.close_reason or StreamClosed.SHUTTING_DOWN
                    await errors.abort(context, _closed(unit, reason))
                    return
                # Built (and signed) while the journal append is in flight; written only after:
                # never tell what a crash could take back.
                message = seal(keys, lease_event(notice))
                await loop.durable()
                if stream.closed:
                    continue  # closed while we waited: the check above ends the stream
                await write(message)
                if kind == FINAL:
                    if stream.withdrawn:
                        await errors.abort(context, errors.withdrawn(stream.withdrawn))
                    return
        except StateUnavailable as e:  # the state store could not make it durable
            await errors.abort(context, unit.ended(errors.from_state(e)))
        except asyncio.CancelledError:
            # Client gone or its deadline passed. Only the deadline withdraws a queued request
            # (cancelled before the stream's own timer: the same withdrawal).
            if stream.queued_since is not None and not stream.withdrawn:
                left = context.time_remaining()
                if left is not None and left <= _DEADLINE_SLACK_S:
                    loop.withdraw_queued(stream.key)
            raise
        finally:
            loop.detach(stream)

    async def Channel(self, requests: Any, context: Any) -> None:
        """Many sessions on one bidirectional stream (session_channel.py)."""
        await self._channels.serve(context)


def _closed(unit: PoolUnit, reason: StreamClosed) -> errors.RpcFailure:
    """How a stream the loop closed ends; a pool unit stepping down (its pool moved, or lost
    its lease) sends the caller to the pool's leader."""
    if reason is StreamClosed.SHUTTING_DOWN:
        return unit.ended(errors.from_closed(reason))
    return errors.from_closed(reason)


# ---------------------------------------------------------------- unary rpcs, from the table


def _unary_rpc(command: Command) -> Callable[[SchedulerService, Any, Any], Awaitable[Any]]:
    """The servicer method of a unary command: charge its flow, run its operation, and tell the
    caller once the event is durable: the reply, or the failure it came to."""
    op = UNARY_OPS[command]
    follow = FOLLOW_OPS.get(command)
    by_budget = command.by_budget

    async def rpc(self: SchedulerService, request: Any, context: Any) -> Any:
        tenant = self._tenant(context, command)
        await self._auth.gate.admit(tenant)  # fair admission in the tenant's flow (fairness.py)
        router = self._router
        sid = request.session_id
        unit = router.for_permit(tenant, request) if by_budget else router.for_session(tenant, sid)
        outcome = op(unit.ops, tenant, request)
        if follow is not None:  # a waiting first answer: the call answers once the wait is over
            outcome = await _follow(follow, unit, tenant, outcome)
        await unit.loop.durable()
        if isinstance(outcome, errors.RpcFailure):
            raise outcome
        return outcome

    rpc.__name__ = rpc.__qualname__ = command.rpc
    return errors.unary(rpc)


async def _follow(follow: Any, unit: PoolUnit, tenant: str, first: Outcome) -> Outcome:
    """Wait for a following command's last answer; the caller gone (or its deadline) gives up."""
    done: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

    def tell(outcome: Outcome) -> None:
        if not done.done():
            done.set_result(outcome)

    give_up = follow(unit.ops, tenant, first, tell)
    if give_up is None:
        return first
    try:
        return await done
    finally:
        if not done.done():
            give_up()


for _command in commands.BY_RPC.values():
    if not _command.streaming:
        setattr(SchedulerService, _command.rpc, _unary_rpc(_command))
