"""The asyncio SDK: hold a slot for a session through its whole life with one `async with`.

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
  to checkpoint the actor, followed by `Yield(lease_id, epoch, ref)`. Callbacks may be plain
  functions (run with `asyncio.to_thread`, so blocking I/O is fine) or coroutine functions.
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
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Self, TypeAlias, cast

import grpc
import grpc.aio

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.client.errors import GrantFailed, SessionEnded, SlotschedError, Unavailable, from_rpc_error
from scheduler.client.types import (
    LeaseInfo,
    Phase,
    QoS,
    QueueInfo,
    SessionInfo,
    Slot,
    SnapshotRef,
    end_reason_name,
)

log = logging.getLogger(__name__)

#: `on_yield(lease)`: checkpoint the actor and return where the snapshot is (or None).
OnYield: TypeAlias = Callable[[LeaseInfo], SnapshotRef | None | Awaitable[SnapshotRef | None]]
#: `on_grant(lease)`: start (or restore from `lease.resume_from`) the actor on the new slot.
OnGrant: TypeAlias = Callable[[LeaseInfo], None | Awaitable[None]]
#: `on_yield_cancelled(lease)`: the yield asked of `lease` is called off (see the module
#: docstring); called at once on the SDK's loop, so it must not block. False = too late, yield.
OnYieldCancelled: TypeAlias = Callable[[LeaseInfo], bool | None | Awaitable[None]]

#: Stream failures after which the session re-attaches (the server keeps the session meanwhile).
_REATTACH_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)
#: How long a session that never reached the server keeps trying before it fails (seconds).
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: Unary-call failures worth retrying within a deadline (Yield, Release).
_TRANSIENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

#: Reconnect quickly after a server restart; gRPC's defaults (1 s growing to 120 s) would make a
#: re-attach wait far longer than a lease TTL.
DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


class _NoAnswer(Exception):
    """The first Acquire of a session got no answer within the connect deadline."""


def _event_time(ev: scheduler_pb2.LeaseEvent) -> datetime | None:
    return ev.at.ToDatetime(tzinfo=UTC) if ev.HasField("at") else None


async def _invoke(fn: Callable[[LeaseInfo], Any], lease: LeaseInfo) -> Any:
    """Call a user callback: coroutine functions are awaited, plain functions run in a thread."""
    if inspect.iscoroutinefunction(fn):
        return await fn(lease)
    result = await asyncio.to_thread(fn, lease)
    if inspect.isawaitable(result):
        result = await result
    return result


class AsyncClient:
    """A connection to the slotsched Scheduler service for asyncio code.

    `token` is sent as `authorization: Bearer <token>`; `tenant` as `x-slotsched-tenant` (the
    server's insecure dev mode only). `channel_options` are merged over `DEFAULT_CHANNEL_OPTIONS`;
    pass `credentials` for TLS. The channel is opened on first use, in the running loop.
    `connect_timeout_s` bounds how long a session tries to reach the server at all (its first
    Acquire); `reattach_timeout_s` how long an attached session tries to re-attach.
    """

    def __init__(
        self,
        target: str,
        token: str | None = None,
        tenant: str | None = None,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        rpc_timeout_s: float = 10.0,
        reattach_timeout_s: float = 30.0,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 2.0,
        renew_interval_s: float | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> None:
        if connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be > 0, not {connect_timeout_s!r}")
        self.target = target
        self.rpc_timeout_s = rpc_timeout_s
        self.reattach_timeout_s = reattach_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.renew_interval_s = renew_interval_s
        options = dict(DEFAULT_CHANNEL_OPTIONS)
        options.update(dict(channel_options or ()))
        self._options = list(options.items())
        self._credentials = credentials
        md: list[tuple[str, str]] = []
        if token is not None:
            md.append(("authorization", f"Bearer {token}"))
        if tenant is not None:
            md.append(("x-slotsched-tenant", tenant))
        self.metadata: tuple[tuple[str, str], ...] = tuple(md)
        self._channel: grpc.aio.Channel | None = None
        self._stub: scheduler_pb2_grpc.SchedulerStub | None = None
        self._sessions: set[AsyncSession] = set()
        self._closed = False

    def stub(self) -> scheduler_pb2_grpc.SchedulerStub:
        """The Scheduler stub, opening the channel on first use (must run inside the loop)."""
        if self._closed:
            raise RuntimeError("AsyncClient is closed")
        if self._stub is None:
            if self._credentials is not None:
                self._channel = grpc.aio.secure_channel(self.target, self._credentials, options=self._options)
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
            stub_cls: Any = scheduler_pb2_grpc.SchedulerStub  # generated code is untyped
            self._stub = stub_cls(self._channel)
        return self._stub

    def session(
        self,
        session_id: str,
        qos: QoS | str = QoS.BURSTABLE,
        on_yield: OnYield | None = None,
        on_grant: OnGrant | None = None,
        resume_from: SnapshotRef | None = None,
        wait_timeout_s: float | None = None,
        on_yield_cancelled: OnYieldCancelled | None = None,
    ) -> AsyncSession:
        """A session handle; `async with` it to acquire (see `AsyncSession`)."""
        return AsyncSession(
            self,
            session_id,
            QoS.parse(qos),
            on_yield=on_yield,
            on_grant=on_grant,
            resume_from=resume_from,
            wait_timeout_s=wait_timeout_s,
            on_yield_cancelled=on_yield_cancelled,
        )

    async def get_session(self, session_id: str) -> SessionInfo:
        """Read a session's state without attaching to it (GetSession)."""
        try:
            msg = await self.stub().GetSession(
                scheduler_pb2.GetSessionRequest(session_id=session_id),
                metadata=self.metadata,
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from e
        return SessionInfo.from_proto(msg)

    async def close(self) -> None:
        """Release every live session of this client (best effort), then close the channel."""
        if self._closed:
            return
        for s in list(self._sessions):
            await s.aclose()
        self._closed = True
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncSession:
    """One session's hold on a slot, from the first wait to the release.

    Use `async with client.session(...) as lease:`; `__aenter__` returns this object once a slot
    is granted and `on_grant` has run for it, and its attributes stay current through yields
    and re-grants:

    * `.lease` — the current `LeaseInfo` (None while queued or after the end); `.lease_id`,
      `.epoch`, `.worker_address`, `.slot` are shortcuts to it.
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

    def __init__(
        self,
        client: AsyncClient,
        session_id: str,
        qos: QoS,
        *,
        on_yield: OnYield | None = None,
        on_grant: OnGrant | None = None,
        resume_from: SnapshotRef | None = None,
        wait_timeout_s: float | None = None,
        on_yield_cancelled: OnYieldCancelled | None = None,
    ) -> None:
        self._client = client
        self.session_id = session_id
        self.qos = qos
        self._on_yield = on_yield
        self._on_grant = on_grant
        self._on_yield_cancelled = on_yield_cancelled
        self._initial_resume_from = resume_from
        self._wait_timeout_s = wait_timeout_s

        self._phase = Phase.STARTING
        self._lease: LeaseInfo | None = None
        self._queue: QueueInfo | None = None
        self._resume_from = resume_from
        self._yields = 0
        self._yields_cancelled = 0
        self._grants = 0
        self.reattaches = 0
        self.end_reason: str | None = None
        #: The error that ended the session (refusal, queue timeout, re-attach gave up, ...).
        self.error: SlotschedError | None = None
        #: Errors raised by on_grant/on_yield, or by the Yield call that followed on_yield.
        self.callback_errors: list[BaseException] = []
        #: The last error of a background Renew (None after a successful renew).
        self.renew_error: SlotschedError | None = None
        #: Why the last release at exit failed, if it did (exit never raises).
        self.release_error: SlotschedError | None = None

        self.lost_lease = asyncio.Event()
        self.ended = asyncio.Event()
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []

        self._stream_task: asyncio.Task[None] | None = None
        self._renew_task: asyncio.Task[None] | None = None
        self._action_task: asyncio.Task[None] | None = None
        self._actions: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._attached = False
        self._reached = False  # an event came from the server: the session exists there
        self._closing = False
        self._release_requested = False
        self._yield_started: tuple[str, int] | None = None
        self._yield_gen = 0  # bumped by every yield started or cancelled: stale ones stop
        self._background: set[asyncio.Task[Any]] = set()
        self._yield_ref: tuple[tuple[str, int], SnapshotRef] | None = None
        self._grant_done: tuple[str, int] | None = None
        self._grant_error: BaseException | None = None
        self._yielded: tuple[str, int] | None = None
        self._renew_interval_s: float | None = None
        self._give_back_task: asyncio.Task[None] | None = None
        self._skew_s = 0.0  # server clock minus ours, from the latest stream event

    # ----------------------------------------------------------------------------- public view

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def lease(self) -> LeaseInfo | None:
        return self._lease

    @property
    def queue(self) -> QueueInfo | None:
        return self._queue

    @property
    def resume_from(self) -> SnapshotRef | None:
        return self._resume_from

    @property
    def yields(self) -> int:
        """How many times this session yielded its slot (Yield accepted by the server)."""
        return self._yields

    @property
    def yields_cancelled(self) -> int:
        """How many yield requests the server called off while this session held the lease."""
        return self._yields_cancelled

    @property
    def grants(self) -> int:
        """How many distinct leases this session was granted (replays on re-attach not counted)."""
        return self._grants

    def _require_lease(self) -> LeaseInfo:
        if self._lease is None:
            raise RuntimeError(f"session {self.session_id!r} holds no lease (phase {self._phase})")
        return self._lease

    @property
    def lease_id(self) -> str:
        return self._require_lease().lease_id

    @property
    def epoch(self) -> int:
        return self._require_lease().epoch

    @property
    def worker_address(self) -> str:
        return self._require_lease().worker_address

    @property
    def slot(self) -> Slot:
        return self._require_lease().slot

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call `fn()` (in the loop, must not block) after every state change."""
        self._listeners.append(fn)

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
        await self.wait_until(lambda s: s._ready() or s.ended.is_set(), timeout)
        if self._lease is not None:
            return self._lease
        raise self._end_error()

    def _ready(self) -> bool:
        """Holding a lease whose on_grant (if any) has run."""
        lease = self._lease
        return lease is not None and (
            self._on_grant is None or self._grant_done == (lease.lease_id, lease.epoch)
        )

    def _end_error(self) -> SlotschedError:
        if self.error is not None:
            return self.error
        return SessionEnded(f"session {self.session_id!r} ended ({self.end_reason})", self.end_reason or "")

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
        stub = self._client.stub()
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
                if code is grpc.StatusCode.FAILED_PRECONDITION and attempt < 4 and self._attached:
                    # Raced a grant or a revocation: let the stream catch up, then quote it.
                    await self._wait_lease_change(lease, 0.5)
                    continue
                if code in _TRANSIENT_CODES and attempt < 4:
                    await asyncio.sleep(self._client.backoff_initial_s * 2**attempt)
                    continue
                raise from_rpc_error(e) from e

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

    @staticmethod
    async def _cancel(task: asyncio.Task[None] | None) -> None:
        if task is None or task.done():
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled ourselves, not just the task we cancelled

    # ---------------------------------------------------------------------------- state changes

    def _notify(self) -> None:
        old, self._changed = self._changed, asyncio.Event()
        old.set()
        for fn in self._listeners:
            try:
                fn()
            except Exception:  # a listener must never break the stream
                log.exception("slotsched: session listener failed")

    def _set_ended(self, reason: str, final_status_pending: bool = False) -> None:
        self._stop_renew()
        self._lease = None
        self._queue = None
        self._phase = Phase.ENDED
        self.end_reason = self.end_reason or reason
        if not final_status_pending:
            self.ended.set()

    def _fail(self, err: SlotschedError) -> None:
        if self.error is None:
            self.error = err
        if self._lease is not None:
            self.lost_lease.set()
        self._set_ended(self.end_reason or "failed")
        self._notify()

    def _drop_lease(self, involuntary: bool) -> None:
        self._stop_renew()
        if self._lease is not None and involuntary:
            self.lost_lease.set()
        self._lease = None

    def _is_current(self, lease_id: str, epoch: int) -> bool:
        return self._lease is not None and (self._lease.lease_id, self._lease.epoch) == (lease_id, epoch)

    # --------------------------------------------------------------------------------- stream

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
        started = loop.time()
        while not self._closing:
            failure: SlotschedError
            try:
                call = client.stub().Acquire(self._acquire_request(), metadata=client.metadata)
                self._attached = True
                events = call.__aiter__()
                if not self._reached:
                    # A black-holed address must not hang the first attach: the server answers an
                    # Acquire at once (Queued or Granted), so wait for that within the deadline.
                    left = client.connect_timeout_s - (loop.time() - started)
                    try:
                        first = await asyncio.wait_for(anext(events, None), max(0.05, left))
                    except TimeoutError:
                        call.cancel()
                        raise _NoAnswer(f"no answer within {client.connect_timeout_s:g}s") from None
                    if first is not None:
                        self._reached = True
                        outage_since, backoff = None, client.backoff_initial_s
                        self._handle_event(first)
                async for ev in events:
                    self._reached = True
                    outage_since, backoff = None, client.backoff_initial_s
                    self._handle_event(ev)
                if self._phase is Phase.ENDED:
                    self.ended.set()  # after the status: waiters see the final error
                    return
                failure = Unavailable("Acquire stream closed before the session ended", None)
            except _NoAnswer as e:
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
                if code not in _REATTACH_CODES:
                    self._fail(err)
                    return
                failure = err
            finally:
                self._attached = False
                self._notify()
            if self._release_requested or self._closing:
                return
            now = loop.time()
            if not self._reached:
                if now - started + backoff > client.connect_timeout_s:
                    err = Unavailable(
                        f"could not connect to the slotsched scheduler at {client.target} for session "
                        f"{self.session_id!r} within {now - started:.1f}s (connect_timeout_s="
                        f"{client.connect_timeout_s:g}): {failure.message}",
                        grpc.StatusCode.UNAVAILABLE,
                    )
                    err.__cause__ = failure
                    self._fail(err)
                    return
                log.warning(
                    "slotsched: cannot reach the scheduler at %s for session %s (%s); retrying in %.2fs",
                    client.target,
                    self.session_id,
                    failure.message,
                    backoff,
                )
                await asyncio.sleep(backoff)
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
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, client.backoff_max_s)
            self.reattaches += 1

    def _handle_event(self, ev: scheduler_pb2.LeaseEvent) -> None:
        kind = ev.WhichOneof("event")
        if ev.HasField("at"):  # server clock minus ours (plus the one-way delay): for deadlines
            self._skew_s = (ev.at.ToDatetime(tzinfo=UTC) - datetime.now(UTC)).total_seconds()
        if kind == "queued":
            if self._lease is not None:
                # Queued while we thought we held: the server no longer knows our lease.
                self._drop_lease(involuntary=True)
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
        lease = LeaseInfo.from_proto(ev.granted.lease)
        replay = self._is_current(lease.lease_id, lease.epoch)
        self._lease = lease
        self._queue = None
        self._phase = Phase.HOLDING
        self.lost_lease.clear()
        if replay and lease.yield_deadline is None and self._yield_started == (lease.lease_id, lease.epoch):
            # Re-attached to an ACTIVE lease we were yielding: we missed its YieldCancelled.
            self._yield_called_off(lease.lease_id, lease.epoch)
        if replay:
            # Re-attached: renew at once (renewals may have failed while detached), then on schedule.
            self._start_renew(lease, self._renew_interval_s or self._ttl_interval(lease, ev), immediate=True)
            return
        self._grants += 1
        self._resume_from = lease.resume_from
        self._renew_interval_s = self._ttl_interval(lease, ev)
        self._start_renew(lease, self._renew_interval_s, immediate=False)
        if self._on_grant is not None:
            on_grant = self._on_grant

            regrant = self._grants > 1

            async def grant_action() -> None:
                try:
                    if self._is_current(lease.lease_id, lease.epoch):
                        await _invoke(on_grant, lease)
                except Exception as e:
                    self._grant_error = e
                    if regrant and self._is_current(lease.lease_id, lease.epoch):
                        self._give_back(lease, e)
                    raise
                finally:
                    self._grant_done = (lease.lease_id, lease.epoch)
                    self._notify()

            self._actions.put_nowait(grant_action)

    def _local(self, server_time: Any) -> datetime:
        """A server timestamp in this machine's clock, so a skewed clock does not move deadlines."""
        return cast(datetime, server_time.ToDatetime(tzinfo=UTC)) - timedelta(seconds=self._skew_s)

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
            self._count_yield((ended.lease_id, ended.epoch))
            if self._yield_ref is not None and self._yield_ref[0] == (ended.lease_id, ended.epoch):
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

    def _yield_called_off(self, lease_id: str, epoch: int) -> None:
        """YieldCancelled for our lease: keep holding it (see the module docstring)."""
        key = (lease_id, epoch)
        if not self._is_current(lease_id, epoch) or self._yield_started != key:
            return  # not yielding it (any more): nothing to call off
        held = replace(self._require_lease(), yield_deadline=None)
        keep = True
        if self._on_yield_cancelled is not None:
            try:
                result = self._on_yield_cancelled(held)
                if inspect.isawaitable(result):  # a coroutine function: run it, keep the lease
                    task = asyncio.ensure_future(result)
                    self._background.add(task)
                    task.add_done_callback(self._background_done)
                else:
                    keep = result is not False
            except Exception as e:
                log.warning("slotsched: on_yield_cancelled for %s failed: %r", self.session_id, e)
                self.callback_errors.append(e)
        if not keep:
            log.info("slotsched: yield of %s called off too late (actor stopped); yielding", self.session_id)
            return
        self._yield_started = None
        self._yield_gen += 1  # a checkpoint in progress finishes, and no Yield follows it
        self._yields_cancelled += 1
        self._lease = held
        self._phase = Phase.HOLDING
        log.info("slotsched: yield of %s (lease %s) called off; holding on", self.session_id, lease_id)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.callback_errors.append(task.exception())  # type: ignore[arg-type]
            self._notify()

    def _count_yield(self, key: tuple[str, int]) -> None:
        if self._yielded != key:
            self._yielded = key
            self._yields += 1

    # ---------------------------------------------------------------------------------- renew

    def _stop_renew(self) -> None:
        if self._renew_task is not None and self._renew_task is not asyncio.current_task():
            self._renew_task.cancel()
        self._renew_task = None

    def _start_renew(self, lease: LeaseInfo, interval: float, immediate: bool) -> None:
        self._stop_renew()
        self._renew_task = asyncio.create_task(
            self._renew_loop(lease, interval, immediate), name=f"slotsched-renew-{self.session_id}"
        )

    async def _renew_loop(self, lease: LeaseInfo, interval: float, immediate: bool) -> None:
        loop = asyncio.get_running_loop()
        stub = self._client.stub()
        start = loop.time()
        tick = 0 if immediate else 1
        while True:
            delay = start + tick * interval - loop.time()
            tick += 1
            if delay > 0:
                await asyncio.sleep(delay)
            if not self._is_current(lease.lease_id, lease.epoch):
                return
            try:
                resp = await stub.Renew(
                    scheduler_pb2.RenewRequest(
                        session_id=self.session_id, lease_id=lease.lease_id, epoch=lease.epoch
                    ),
                    metadata=self._client.metadata,
                    timeout=min(self._client.rpc_timeout_s, max(interval, 0.5)),
                )
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e)
                err.__cause__ = e
                self.renew_error = err
                if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                    # The lease is gone (expired or fenced); the stream, if attached, says why.
                    if self._is_current(lease.lease_id, lease.epoch):
                        # Until the stream tells where the session stands, it is unknown.
                        self._drop_lease(involuntary=True)
                        self._phase = Phase.STARTING
                        self._notify()
                    return
                continue  # transient: the next tick retries, two chances before expiry
            self.renew_error = None
            current = self._lease
            if current is None or (current.lease_id, current.epoch) != (lease.lease_id, lease.epoch):
                return
            if resp.HasField("expires_at"):
                current = replace(current, expires_at=resp.expires_at.ToDatetime(tzinfo=UTC))
                self._lease = current
            if resp.state == common_pb2.LEASE_STATE_YIELDING and self._phase is Phase.HOLDING:
                # We missed YieldRequested (e.g. while re-attaching): yield now.
                self._phase = Phase.YIELDING
                if resp.HasField("yield_deadline"):
                    current = replace(current, yield_deadline=self._local(resp.yield_deadline))
                    self._lease = current
                self._start_yield(current)
            self._notify()

    # ---------------------------------------------------------------------------------- yield

    def _start_yield(self, lease: LeaseInfo) -> None:
        key = (lease.lease_id, lease.epoch)
        if self._yield_started == key or self._release_requested:
            return
        self._yield_started = key
        self._yield_gen += 1
        gen = self._yield_gen
        self._actions.put_nowait(lambda: self._do_yield(lease, gen))

    async def _do_yield(self, lease: LeaseInfo, gen: int) -> None:
        if not self._is_current(lease.lease_id, lease.epoch) or self._release_requested:
            return
        if gen != self._yield_gen:
            return  # called off before it began
        ref: SnapshotRef | None
        if self._on_yield is None:
            ref = self._resume_from
        else:
            try:
                result = await _invoke(self._on_yield, lease)
            except Exception as e:  # do not yield without a snapshot we believe in
                log.warning("slotsched: on_yield for %s failed, not yielding: %r", self.session_id, e)
                self.callback_errors.append(e)
                self._notify()
                return
            if result is not None and not isinstance(result, SnapshotRef):
                bad = TypeError(f"on_yield must return a SnapshotRef or None, not {type(result).__name__}")
                self.callback_errors.append(bad)
                self._notify()
                return
            ref = result
        if gen != self._yield_gen:
            # Called off while on_yield ran: keep the lease; the checkpoint stays unused.
            log.info("slotsched: %s checkpointed for a yield since called off; holding on", self.session_id)
            return
        req = scheduler_pb2.YieldRequest(
            session_id=self.session_id, lease_id=lease.lease_id, epoch=lease.epoch
        )
        if ref is not None:
            req.snapshot.CopyFrom(ref.to_proto())
            self._yield_ref = ((lease.lease_id, lease.epoch), ref)
        stub = self._client.stub()
        for attempt in range(5):
            if not self._is_current(lease.lease_id, lease.epoch) or self._release_requested:
                return
            if gen != self._yield_gen:
                return  # called off between attempts: the lease is still ours
            try:
                await stub.Yield(req, metadata=self._client.metadata, timeout=self._client.rpc_timeout_s)
                break
            except grpc.aio.AioRpcError as e:
                if e.code() in _TRANSIENT_CODES and attempt < 4:
                    await asyncio.sleep(self._client.backoff_initial_s * 2**attempt)
                    continue
                err = from_rpc_error(e)
                err.__cause__ = e
                self.callback_errors.append(err)
                self._notify()
                return
        if ref is not None and (self._lease is None or self._is_current(lease.lease_id, lease.epoch)):
            self._resume_from = ref  # (a re-grant that raced ahead already carries it)
        self._count_yield((lease.lease_id, lease.epoch))
        if self._is_current(lease.lease_id, lease.epoch):
            self._drop_lease(involuntary=False)
            self._phase = Phase.QUEUED
        self._notify()

    async def _run_actions(self) -> None:
        while True:
            action = await self._actions.get()
            try:
                await action()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("slotsched: callback for %s failed: %r", self.session_id, e)
                self.callback_errors.append(e)
                self._notify()
