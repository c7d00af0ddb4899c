"""The end of a session on our side: Release the lease (or withdraw the queued request), wait for
the stream to report the end, stop the session's tasks.

A Release goes through `calls.py` (sent again after a lost connection or a timeout). Refused
NOT_FOUND it is SETTLED (the session is over already: expired, withdrawn, never queued); refused
FAILED_PRECONDITION it is RECHECKed: attached, the stream is given a moment to report the grant or
revocation it raced, and the Release quotes what it says; detached, the session is read with
GetSession (the leader may have applied our Yield and re-granted, then died before answering),
so the Release quotes the lease the session holds now; giving up instead would leave its slot
held until it expires.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import grpc
import grpc.aio

from scheduler.api import commands
from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.client.calls import SessionCalls, Verdict
from scheduler.client.channel import ClientLink
from scheduler.client.errors import SlotschedError
from scheduler.client.phases import Phase
from scheduler.client.reactions import from_rpc_error
from scheduler.client.renewer import Renewer
from scheduler.client.state import SessionState, log
from scheduler.client.types import LeaseInfo, SessionInfo


class Tasks(Protocol):
    """The session's background tasks, as the release stops them."""

    @property
    def started(self) -> bool: ...

    async def stop_stream(self) -> None: ...

    async def shutdown(self) -> None: ...


class Releaser:
    """Release and shutdown of one session."""

    def __init__(
        self, state: SessionState, client: ClientLink, calls: SessionCalls, renewer: Renewer, tasks: Tasks
    ) -> None:
        self._state = state
        self._client = client
        self._calls = calls
        self._renewer = renewer
        self._tasks = tasks

    async def release(self) -> None:
        """End the session (`AsyncSession.release`)."""
        state, tasks = self._state, self._tasks
        if not tasks.started or state.phase is Phase.ENDED:
            if tasks.started and not state.ended.is_set():
                with contextlib.suppress(TimeoutError):  # the closing status is on its way
                    await state.wait_until(lambda: state.ended.is_set() or not state.attached, 1.0)
                state.ended.set()
            await tasks.shutdown()
            return
        state.release_requested = True
        self._renewer.stop()
        if state.phase is Phase.STARTING and state.attached:
            # The Acquire is in flight: a withdrawal now could miss the request it creates.
            with contextlib.suppress(TimeoutError):
                await state.wait_until(lambda: state.phase is not Phase.STARTING, self._client.rpc_timeout_s)
        if not state.attached:
            # No stream to report the end, and a pending re-attach would re-create the session.
            state.closing = True
            await tasks.stop_stream()
        released = False
        try:
            await self._send()
            released = True
        finally:
            # The stream reports the end (Ended{RELEASED|WITHDRAWN}) and closes; wait for it so
            # the server has really let go when release() returns.
            with contextlib.suppress(TimeoutError):
                await state.wait_until(
                    lambda: state.ended.is_set() or not state.attached, self._client.rpc_timeout_s
                )
            if not state.ended.is_set():
                # No final event seen (no stream, or it broke): end it on our side.
                state.end("released" if released else "abandoned")
                state.notify()
            await tasks.shutdown()

    async def _send(self) -> None:
        state = self._state

        def request() -> scheduler_pb2.ReleaseRequest:
            req = scheduler_pb2.ReleaseRequest(session_id=state.session_id)
            if state.lease is not None:
                req.lease_id = state.lease.lease_id
                req.epoch = state.lease.epoch
            return req

        quoted: list[LeaseInfo | None] = []

        def build() -> scheduler_pb2.ReleaseRequest:
            quoted.append(state.lease)
            return request()

        async def recheck(err: grpc.aio.AioRpcError, more: bool) -> Verdict:
            if not more:
                return Verdict.FAIL
            if state.attached:
                # Raced a grant or a revocation: let the stream catch up, then quote it.
                await self._lease_change(quoted[-1], 0.5)
                return Verdict.AGAIN
            return Verdict.AGAIN if await self._learn_lease() else Verdict.DONE

        try:
            await self._calls.send(
                commands.RELEASE, build, timeout=self._client.rpc_timeout_s, recheck=recheck
            )
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from e

    async def _learn_lease(self) -> bool:
        """Read what the session holds now (GetSession) so the Release quotes it; False if the
        session is over on the server."""
        state = self._state
        try:
            msg = await self._client.stub().GetSession(
                scheduler_pb2.GetSessionRequest(session_id=state.session_id),
                metadata=self._client.metadata,
                timeout=self._client.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from e
        info = SessionInfo.from_proto(msg)
        if info.phase is Phase.ENDED:
            return False
        state.lease = info.lease  # None while queued: the Release withdraws the request
        return True

    async def _lease_change(self, old: LeaseInfo | None, timeout: float) -> None:
        state = self._state
        with contextlib.suppress(TimeoutError):
            await state.wait_until(lambda: state.lease != old, timeout)

    async def aclose(self) -> None:
        """Release (best effort, never raises a server error) and stop the background tasks."""
        try:
            await self.release()
        except SlotschedError as e:
            self._state.release_error = e
            log.warning("slotsched: releasing session %s failed: %s", self._state.session_id, e)
            await self._tasks.shutdown()
