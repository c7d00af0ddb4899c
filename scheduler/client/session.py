"""`AsyncSession`: hold a slot for a session through its whole life with one `async with`.

Why a session object and a background task rather than thin RPC wrappers: the Scheduler contract
puts a session's whole life on one server stream (Queued -> Granted -> YieldRequested -> Ended
{YIELDED} -> Queued -> Granted(resume_from) ...), and a holder must meanwhile renew its lease
every third of the TTL, answer YieldRequested before a deadline and survive broken streams by
re-attaching. Each runtime re-implementing that loop would get the corner cases wrong in a
different way (double yields, renewing a fenced epoch, re-attaching after a release), so the SDK
does it once:

* a stream task consumes `Acquire`, keeps `.lease` / `.queue` / `.resume_from` current and, when
  the stream breaks (UNAVAILABLE, RST, server restart), calls `Acquire` again with the same
  session id with exponential backoff (0.1 s doubling to 2 s by default, giving up after
  `reattach_timeout_s`). The server replays the session's current state, so the lease is kept.
  The first sign that the server answers again (another session's event, a renewal, a new
  channel's first response) ends the backoff sleep of every session of the client (`wake.py`):
  after a restart they re-attach together, not each at the end of its own sleep.
  A session that never reached the server (no event yet: a wrong or dead address, a server not
  up yet) retries the same way, logging a WARNING each time, but only for `connect_timeout_s`
  (default 10 s); then it fails with `Unavailable` saying it could not connect, and to where.
  (If the server lost its state, e.g. an in-memory restart, the re-attach becomes a new request
  carrying the session's last snapshot, and `on_grant` sees the new lease.)
* a renew task renews at TTL/3 on a fixed, jitter-free schedule counted from the grant
  (`renew_interval_s` overrides it); a renew answered YIELDING starts the yield path even if the
  YieldRequested event was missed.
* an action task runs the runtime's callbacks in order, so the stream is never blocked by them:
  `on_grant(lease)` after every new grant (first grant, re-grant after a yield or a revocation;
  not for the replay of the same lease on re-attach), and on YieldRequested `on_yield(lease)`
  to checkpoint the actor, followed by `Yield(lease_id, epoch, ref)` (retried across a failover;
  a retry refused as stale because the old leader applied the first attempt counts as done, see
  `duties.py`). Callbacks may be plain functions (run with `asyncio.to_thread`, so blocking I/O
  is fine) or coroutine functions.
  - `on_yield` returns the `SnapshotRef` it wrote, or None to yield without one (the server then
    keeps the session's previous snapshot). `lease.yield_deadline` says by when: past it the
    server revokes the lease, so a checkpoint should be bounded by it.
  - Without `on_yield` the session yields at once with its last `resume_from` (None if it never
    had one): suitable for actors whose state lives elsewhere.
  - If `on_yield` raises, the session does NOT yield: the error is recorded in
    `callback_errors`, the server revokes the lease at the yield deadline and the session is
    re-queued from its last good snapshot. Yielding with a snapshot that was not written would
    be worse than losing the work since the last one.
  - A yield exists for a waiter: if the waiter leaves first, the server sends YieldCancelled
    and the session keeps its lease and goes back to HOLDING. A queued yield does not run; an
    `on_yield` in progress finishes, but no Yield follows (the actor should keep running). The
    optional `on_yield_cancelled(lease)` is called at once, on the SDK's loop (it must not
    block: set a flag that `on_yield` reads before it does anything it cannot undo, e.g.
    stopping the actor). If it returns False, it is too late to keep the lease (the actor was
    stopped): the yield in progress goes on and the server accepts it as a voluntary yield.
  - If `on_grant` raises for a re-grant, the actor did not start on its new slot: the session
    releases the lease and ends with `GrantFailed` in `.error` (`.lost_lease` is set), rather
    than pin a slot that runs nothing. `.resume_from` keeps the snapshot to start over from.
* leaving the `async with` releases the lease (or withdraws the queued request) and stops the
  tasks. Refusals (queue full, no quota, bad argument, timeout in the queue) are raised from
  `__aenter__` as typed errors (see `errors.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Self

import grpc
import grpc.aio

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.client.channel import TRANSIENT_CODES
from scheduler.client.errors import SlotschedError, from_rpc_error
from scheduler.client.session_state import log
from scheduler.client.stream import SessionStream
from scheduler.client.types import LeaseInfo, Phase, SessionInfo


class AsyncSession(SessionStream):
    """One session's hold on a slot, from the first wait to the release.

    Use `async with client.session(...) as lease:`; `__aenter__` returns this object once a slot
    is granted and `on_grant` has run for it, and its attributes stay current through yields
    and re-grants:

    * `.lease` — the current `LeaseInfo` (None while queued or after the end); `.lease_id`,
      `.epoch`, `.worker_address`, `.slot` are shortcuts to it, None whenever it is None.
    * `.queue` — the latest `QueueInfo` while queued (None otherwise).
    * `.resume_from` — the snapshot the current (or next) grant resumes from.
    * `.phase`, `.yields`, `.yields_cancelled`, `.grants`, `.reattaches`, `.callback_errors`;
      once over,
      `.end_reason` ("released", "withdrawn", "expired", "revoked"; "failed" when the stream
      failed, "abandoned" when a release could not reach the server) and `.error` (None after
      our own release).
    * `.lost_lease` — an `asyncio.Event` set when a held lease was taken away without this
      client yielding or releasing it (revoked, expired, re-attach gave up); cleared on re-grant.
    * `.ended` — an `asyncio.Event` set when the session is over.

    To watch the queue before the grant, call `start()` and then `await wait_granted()` (or
    `wait_until`) instead of `async with`, and `release()` at the end.
    """

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the Acquire stream in the background (idempotent; needs a running loop)."""
        if self._stream_task is not None:
            return
        self._client._sessions.add(self)
        self._stream_task = asyncio.create_task(
            self._run_stream(), name=f"slotsched-stream-{self.session_id}"
        )
        self._action_task = asyncio.create_task(
            self._run_actions(), name=f"slotsched-actions-{self.session_id}"
        )

    async def wait_until(
        self, predicate: Callable[[AsyncSession], bool], timeout: float | None = None
    ) -> None:
        """Wait until `predicate(self)` holds (checked after every state change).

        Raises TimeoutError after `timeout` seconds.
        """

        async def _wait() -> None:
            while not predicate(self):
                await self._changed.wait()

        await asyncio.wait_for(_wait(), timeout)

    async def wait_granted(self, timeout: float | None = None) -> LeaseInfo:
        """Wait until the session holds a lease and return it (at once if it holds one now).

        With `on_grant`, it returns once `on_grant` has run for that lease (an error it raised
        is in `callback_errors`; `__aenter__` re-raises it for the first grant).

        Raises the session's error if it failed (e.g. `QueueFull`, `AcquireTimeout`), or
        `SessionEnded` if it ended without a lease; TimeoutError after `timeout` seconds.
        """
        self.start()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            await self.wait_until(lambda s: s._ready() or s.ended.is_set(), left)
            if self._lease is not None:
                return self._lease
            if self.ended.is_set():
                raise self._end_error()
            # Ready when checked, but the lease went before this task resumed (a yield right
            # after the grant, e.g. a floor slot reclaimed): the session is queued again, wait on.

    async def release(self) -> None:
        """End the session: Release the lease, or withdraw the queued request. Idempotent.

        Raises a typed error if the server refused the release for another reason than the
        session being gone already.
        """
        if self._stream_task is None or self._phase is Phase.ENDED:
            if self._stream_task is not None and not self.ended.is_set():
                with contextlib.suppress(TimeoutError):  # the closing status is on its way
                    await self.wait_until(lambda s: s.ended.is_set() or not s._attached, 1.0)
                self.ended.set()
            await self._shutdown()
            return
        self._release_requested = True
        self._stop_renew()
        if self._phase is Phase.STARTING and self._attached:
            # The Acquire is in flight: a withdrawal now could miss the request it creates.
            with contextlib.suppress(TimeoutError):
                await self.wait_until(lambda s: s._phase is not Phase.STARTING, self._client.rpc_timeout_s)
        if not self._attached:
            # No stream to report the end, and a pending re-attach would re-create the session.
            self._closing = True
            await self._cancel(self._stream_task)
        released = False
        try:
            await self._release_rpc()
            released = True
        finally:
            # The stream reports the end (Ended{RELEASED|WITHDRAWN}) and closes; wait for it so
            # the server has really let go when release() returns.
            with contextlib.suppress(TimeoutError):
                await self.wait_until(
                    lambda s: s.ended.is_set() or not s._attached, self._client.rpc_timeout_s
                )
            if not self.ended.is_set():
                # No final event seen (no stream, or it broke): end it on our side.
                self._set_ended("released" if released else "abandoned")
                self._notify()
            await self._shutdown()

    async def _release_rpc(self) -> None:
        stub = self._client.session_stub()
        for attempt in range(5):
            lease = self._lease
            req = scheduler_pb2.ReleaseRequest(session_id=self.session_id)
            if lease is not None:
                req.lease_id = lease.lease_id
                req.epoch = lease.epoch
            try:
                await stub.Release(req, metadata=self._client.metadata, timeout=self._client.rpc_timeout_s)
                return
            except grpc.aio.AioRpcError as e:
                code = e.code()
                if code is grpc.StatusCode.NOT_FOUND:
                    return  # over already (expired, withdrawn, or never queued)
                if code is grpc.StatusCode.FAILED_PRECONDITION and attempt < 4:
                    if self._attached:
                        # Raced a grant or a revocation: let the stream catch up, then quote it.
                        await self._wait_lease_change(lease, 0.5)
                    elif not await self._learn_lease():
                        return  # the session is over on the server
                    continue
                if code in TRANSIENT_CODES and attempt < 4:
                    await asyncio.sleep(self._client.backoff_initial_s * 2**attempt)
                    continue
                raise from_rpc_error(e) from e

    async def _learn_lease(self) -> bool:
        """Detached (no stream tells us), the server says our lease is not the session's: e.g. the
        leader applied our Yield and re-granted, then died before answering, and the stream has
        not re-attached. Read what the session holds now (GetSession) so the Release quotes it;
        False if the session is over. Giving up instead would leave its slot held until expiry."""
        try:
            msg = await self._client.stub().GetSession(
                scheduler_pb2.GetSessionRequest(session_id=self.session_id),
                metadata=self._client.metadata,
                timeout=self._client.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from e
        info = SessionInfo.from_proto(msg)
        if info.phase is Phase.ENDED:
            return False
        self._lease = info.lease  # None while queued: the Release withdraws the request
        return True

    async def _wait_lease_change(self, old: LeaseInfo | None, timeout: float) -> None:
        def changed(s: AsyncSession) -> bool:
            return s._lease != old

        with contextlib.suppress(TimeoutError):
            await self.wait_until(changed, timeout)

    async def aclose(self) -> None:
        """Release (best effort, never raises a server error) and stop the background tasks."""
        try:
            await self.release()
        except SlotschedError as e:
            self.release_error = e
            log.warning("slotsched: releasing session %s failed: %s", self.session_id, e)
            await self._shutdown()

    async def __aenter__(self) -> Self:
        if self._stream_task is not None and self._phase is Phase.ENDED:
            raise RuntimeError("this session has ended; create a new one with client.session()")
        self.start()
        try:
            await self.wait_granted()
            if self._grant_error is not None:
                raise self._grant_error  # the actor did not start: do not run the body
        except BaseException:
            await asyncio.shield(self.aclose())
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _shutdown(self) -> None:
        self._closing = True
        self._stop_renew()
        current = asyncio.current_task()
        for task in (self._stream_task, self._action_task):
            if task is not None and task is not current:
                await self._cancel(task)
        self._client._sessions.discard(self)
