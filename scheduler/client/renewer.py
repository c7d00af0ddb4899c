"""A held lease's renewals: one Renew per tick of a fixed, jitter-free schedule counted from the
grant (a third of the TTL, or `renew_interval_s`), sent through `calls.py` (the one layer that
sends a Renew again). A Renew answered YIELDING starts the yield path, even if the
YieldRequested event was missed; one refused NOT_FOUND or FAILED_PRECONDITION (as
`reactions.py` says: LEASE_LOST) drops the lease, unless our own release got there first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import grpc.aio

from scheduler.api import commands
from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.client.calls import Abandoned, SessionCalls, column
from scheduler.client.channel import ClientLink
from scheduler.client.phases import Phase, SessionEvent
from scheduler.client.reactions import Reaction, from_rpc_error, react
from scheduler.client.state import SessionState
from scheduler.client.ticks import Tick, ticks
from scheduler.client.types import LeaseInfo, timestamp


class Renewer:
    """The renewals of one session (at most one schedule at a time, for the lease held).

    Between two ticks a held lease costs an entry in the loop's deadlines (`ticks.py`), not a
    sleeping task: a task is made at each tick for the Renew it sends."""

    def __init__(
        self,
        state: SessionState,
        client: ClientLink,
        calls: SessionCalls,
        yield_asked: Callable[[LeaseInfo], None],
    ) -> None:
        self._state = state
        self._client = client
        self._calls = calls
        self._yield_asked = yield_asked
        #: The Renew being sent now (None between ticks).
        self.task: asyncio.Task[None] | None = None
        self._timer: Tick | None = None
        self._schedule = 0  # bumped by `stop`: a tick of an older schedule does nothing

    def start(self, lease: LeaseInfo, interval: float, immediate: bool) -> None:
        self.stop()
        start = asyncio.get_running_loop().time()
        self._at(self._schedule, lease, interval, start, 0 if immediate else 1)

    def stop(self) -> None:
        self._schedule += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
        self.task = None

    def _at(self, schedule: int, lease: LeaseInfo, interval: float, start: float, tick: int) -> None:
        """Tick `tick` of the schedule counted from `start`: now if it is due (a late Renew makes
        the next one go at once), else at its time."""
        if schedule != self._schedule:
            return  # stopped (maybe from within the Renew that just ended)
        when = start + tick * interval
        if when > asyncio.get_running_loop().time():
            self._timer = ticks().call_at(when, self._tick, schedule, lease, interval, start, tick)
        else:
            self._tick(schedule, lease, interval, start, tick)

    def _tick(self, schedule: int, lease: LeaseInfo, interval: float, start: float, tick: int) -> None:
        self._timer = None
        self.task = asyncio.create_task(
            self._renew(schedule, lease, interval, start, tick),
            name=f"slotsched-renew-{self._state.session_id}",
        )

    async def _renew(self, schedule: int, lease: LeaseInfo, interval: float, start: float, tick: int) -> None:
        state = self._state

        def wanted() -> bool:
            return state.is_current(lease.lease_id, lease.epoch) and not state.release_requested

        def request() -> scheduler_pb2.RenewRequest:
            return scheduler_pb2.RenewRequest(
                # the id as last reported (its tag changes when the scheduler's key does)
                session_id=state.session_id,
                lease_id=(state.lease or lease).lease_id,
                epoch=lease.epoch,
            )

        if not wanted():
            return
        timeout = min(self._client.rpc_timeout_s, max(interval, 0.5))
        try:
            resp = await self._calls.send(commands.RENEW, request, timeout=timeout, wanted=wanted)
        except Abandoned:
            return
        except grpc.aio.AioRpcError as e:
            if self._refused(lease, e):
                return
            # SKIP: the next tick renews, two chances before expiry
        else:
            if self._answered(lease, resp):
                return
        if self.task is asyncio.current_task():
            self.task = None
        self._at(schedule, lease, interval, start, tick + 1)

    def _refused(self, lease: LeaseInfo, e: grpc.aio.AioRpcError) -> bool:
        """Note a refused Renew; True when the lease is gone and the renewals stop."""
        state = self._state
        err = from_rpc_error(e)
        err.__cause__ = e
        state.renew_error = err
        if react(column(commands.RENEW), e) is not Reaction.LEASE_LOST:
            return False
        # The lease is gone (expired or fenced); the stream, if attached, says why. Gone after
        # our own Release (a Renew in flight behind it) is not a loss.
        if state.is_current(lease.lease_id, lease.epoch) and not state.release_requested:
            state.drop_lease(involuntary=True)
            state.move(SessionEvent.LEASE_LOST)
            state.notify()
        return True

    def _answered(self, lease: LeaseInfo, resp: scheduler_pb2.RenewResponse) -> bool:
        """Take a Renew's answer in; True when the lease renewed is not ours any more."""
        state = self._state
        if state.renew_error is not None:
            state.renew_error = None
            # Answered after failing: sessions asleep in re-attach backoff try again now.
            self._client.wake.heard()
        current = state.lease
        if current is None or current.key != lease.key:
            return True
        # One copy of the lease, not one a field. The grant: what Checkpoint and Stop show the
        # worker, valid past the new expiry.
        expires = timestamp(resp.expires_at) if resp.HasField("expires_at") else current.expires_at
        current = replace(current, expires_at=expires, grant=resp.grant or current.grant)
        state.lease = current
        if resp.state == common_pb2.LEASE_STATE_YIELDING and state.phase is Phase.HOLDING:
            # We missed YieldRequested (e.g. while re-attaching): yield now.
            state.move(SessionEvent.YIELD_ASKED)
            if resp.HasField("yield_deadline"):
                current = replace(current, yield_deadline=state.local(resp.yield_deadline))
                state.lease = current
            self._yield_asked(current)
        state.notify()
        return False
