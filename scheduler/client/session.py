"""`AsyncSession`: hold a slot for a session through its whole life with one `async with`.

Why a session object and a background task rather than thin RPC wrappers: the Scheduler contract
puts a session's whole life on one server stream (Queued -> Granted -> YieldRequested -> Ended
{YIELDED} -> Queued -> Granted(resume_from) ...), and a holder must meanwhile renew its lease
every third of the TTL, answer YieldRequested before a deadline and survive broken streams by
re-attaching. Each runtime re-implementing that loop would get the corner cases wrong in a
different way (double yields, renewing a fenced epoch, re-attaching after a release), so the SDK
does it once:

* the session's attachment (on a channel, fed by its reader; else, or once it broke, a stream
  task) consumes `Acquire`, keeps `.lease` / `.queue` / `.resume_from` current and, when
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
* renewals at TTL/3 on a fixed, jitter-free schedule counted from the grant
  (`renew_interval_s` overrides it; a deadline between ticks, a task for each Renew, `renewer.py`);
  a renew answered YIELDING starts the yield path even if the
  YieldRequested event was missed.
* an action task runs the runtime's callbacks in order, so the stream is never blocked by them:
  `on_grant(lease)` after every new grant (first grant, re-grant after a yield or a revocation;
  not for the replay of the same lease on re-attach), and on YieldRequested `on_yield(lease)`
  to checkpoint the actor, followed by `Yield(lease_id, epoch, ref)` (retried across a failover;
  a retry refused as stale because the old leader applied the first attempt counts as done, see
  `yielder.py`). Callbacks may be plain functions (run with `asyncio.to_thread`, so blocking I/O
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

The session is composed of parts over one shared `SessionState` (`state.py`; its phases move
only through the table of `phases.py`): `attach.StreamAttacher` (the stream and re-attach),
`events.EventApplier` (what each event does), `renewer.Renewer`, `yielder.Yielder`,
`release.Releaser`, `callbacks.CallbackQueue`; their calls go through `calls.SessionCalls`, the one
layer that sends a command again, and every failure is met as `reactions.py`'s table says.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from scheduler.client.attach import StreamAttacher
from scheduler.client.callbacks import CallbackQueue, OnGrant, OnYield, OnYieldCancelled
from scheduler.client.calls import SessionCalls
from scheduler.client.channel import ClientLink
from scheduler.client.errors import SlotschedError
from scheduler.client.events import EventApplier
from scheduler.client.forward import Forward
from scheduler.client.permit import OnPermitQueued, Permit, estimate_of
from scheduler.client.permit_routes import PermitLink
from scheduler.client.phases import Phase
from scheduler.client.release import Releaser
from scheduler.client.renewer import Renewer
from scheduler.client.state import SessionSpec, SessionState, nothing
from scheduler.client.types import LeaseInfo, QoS, QueueInfo, Slot, SnapshotRef
from scheduler.client.yielder import Yielder


class AsyncSession:
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

    def __init__(
        self,
        client: ClientLink,
        session_id: str,
        qos: QoS,
        *,
        on_yield: OnYield | None = None,
        on_grant: OnGrant | None = None,
        resume_from: SnapshotRef | None = None,
        wait_timeout_s: float | None = None,
        on_yield_cancelled: OnYieldCancelled | None = None,
        pool: str = "",
        selector: tuple[tuple[str, str], ...] = (),
        fallback: tuple[str, ...] = (),
    ) -> None:
        self.session_id = session_id
        self.qos = qos
        self._client = client
        spec = SessionSpec(
            session_id,
            qos,
            on_yield=on_yield,
            on_grant=on_grant,
            on_yield_cancelled=on_yield_cancelled,
            resume_from=resume_from,
            wait_timeout_s=wait_timeout_s,
            pool=pool,
            selector=selector,
            fallback=fallback,
        )
        # The parts, each with the shared state and only the peers it calls.
        state = self._state = SessionState(spec)
        calls = SessionCalls(client)
        # No part holds the session itself, and the state's hook to the renewer is cut at
        # shutdown (`SessionTasks.shutdown`): a session ended is freed when its last reference
        # goes, not by the cyclic garbage collector, whose passes over thousands of ended
        # sessions a second were a third of the SDK's CPU per acquire+release pair.
        self._queue = CallbackQueue(session_id, state.callback_failed)
        self._yielder = Yielder(state, client, calls, self._queue)
        self._renewer = Renewer(state, client, calls, self._yielder.start)
        state.stop_renewals = self._renewer.stop
        aclose = weakref.WeakMethod(self.aclose)
        self._events = EventApplier(state, client, self._renewer, self._yielder, self._queue, aclose)
        self._attacher = StreamAttacher(state, client, self._events)
        self._tasks = SessionTasks(self, state, client, self._attacher, self._queue, self._renewer)
        self._releaser = Releaser(state, client, calls, self._renewer, self._tasks)

    # ---------------------------------------------------------------------------- public view
    # Read-only, live views of the session's state (`state.py`).

    phase = Forward[Phase]("_state")
    lease = Forward[LeaseInfo | None]("_state")
    queue = Forward[QueueInfo | None]("_state")
    resume_from = Forward[SnapshotRef | None]("_state")
    #: How many times this session yielded its slot (Yield accepted by the server).
    yields = Forward[int]("_state")
    #: How many yield requests the server called off while this session held the lease.
    yields_cancelled = Forward[int]("_state")
    #: How many distinct leases this session was granted (replays on re-attach not counted).
    grants = Forward[int]("_state")
    reattaches = Forward[int]("_state")
    end_reason = Forward[str | None]("_state")
    error = Forward[SlotschedError | None]("_state")
    callback_errors = Forward[list[BaseException]]("_state")
    renew_error = Forward[SlotschedError | None]("_state")
    release_error = Forward[SlotschedError | None]("_state")
    lost_lease = Forward[asyncio.Event]("_state")
    ended = Forward[asyncio.Event]("_state")
    lease_id = Forward[str | None]("_state")  # these four: None while `.lease` is
    epoch = Forward[int | None]("_state")
    worker_address = Forward[str | None]("_state")
    slot = Forward[Slot | None]("_state")
    #: The pool of the lease, or of the queue it waits in (None before the server says).
    pool = Forward[str | None]("_state")

    @property
    def _attached(self) -> bool:
        return self._state.attached

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call `fn()` (in the loop, must not block) after every state change."""
        self._state.add_listener(fn)

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the Acquire stream in the background (idempotent; needs a running loop)."""
        self._tasks.start()

    async def wait_until(
        self, predicate: Callable[[AsyncSession], bool], timeout: float | None = None
    ) -> None:
        """Wait until `predicate(self)` holds (checked after every state change).

        Raises TimeoutError after `timeout` seconds.
        """
        await self._state.wait_until(lambda: predicate(self), timeout)

    async def wait_granted(self, timeout: float | None = None) -> LeaseInfo:
        """Wait until the session holds a lease and return it (at once if it holds one now).

        With `on_grant`, it returns once `on_grant` has run for that lease (an error it raised
        is in `callback_errors`; `__aenter__` re-raises it for the first grant).

        Raises the session's error if it failed (e.g. `QueueFull`, `AcquireTimeout`), or
        `SessionEnded` if it ended without a lease; TimeoutError after `timeout` seconds.
        """
        self.start()
        state = self._state
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            await state.wait_until(lambda: state.ready() or state.ended.is_set(), left)
            if state.lease is not None:
                return state.lease
            if state.ended.is_set():
                raise state.end_error()
            # Ready when checked, but the lease went before this task resumed (a yield right
            # after the grant, e.g. a floor slot reclaimed): the session is queued again, wait on.

    def permit(
        self,
        budget: str,
        estimate: Any,
        *,
        on_queued: OnPermitQueued | None = None,
        timeout_s: float | None = None,
    ) -> Permit:
        """A permit for one LLM call on `budget` (spec.budgets[]), in this session's class:
        `async with session.permit("anthropic-sonnet", estimate=(input_tokens, max_tokens)) as
        p:` around the call, then `await p.settle(response)` (client/permit.py). `estimate`: an
        `(input, max_output)` pair, a `TokenUsage`, or a usage object or dict. `on_queued(info)`
        on each update while it waits (`p.queue`); `timeout_s` gives up waiting (withdrawn)."""
        link = PermitLink(
            self._client, budget, self.qos.to_proto()
        )  # to its budget's home (permit_routes.py)
        return Permit(link, self.session_id, budget, estimate_of(estimate), on_queued, timeout_s)

    async def release(self) -> None:
        """End the session: Release the lease, or withdraw the queued request. Idempotent.

        Raises a typed error if the server refused the release for another reason than the
        session being gone already.
        """
        await self._releaser.release()

    async def aclose(self) -> None:
        """Release (best effort, never raises a server error) and stop the background tasks."""
        await self._releaser.aclose()

    async def __aenter__(self) -> Self:
        if self._tasks.started and self._state.phase is Phase.ENDED:
            raise RuntimeError("this session has ended; create a new one with client.session()")
        self.start()
        try:
            await self.wait_granted()
            if self._state.grant_error is not None:
                raise self._state.grant_error  # the actor did not start: do not run the body
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


class SessionTasks:
    """A session's background work (its attachment, its callbacks' task, its renewals): started
    together with the session, stopped together at its end."""

    def __init__(
        self,
        session: AsyncSession,
        state: SessionState,
        client: ClientLink,
        attacher: StreamAttacher,
        queue: CallbackQueue,
        renewer: Renewer,
    ) -> None:
        self._session: AsyncSession | None = session  # (None after shutdown: no cycle left)
        self._state = state
        self._client = client
        self._attacher = attacher
        self._queue = queue
        self._renewer = renewer
        self.started = False

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        assert self._session is not None
        self._client.sessions.add(self._session)
        self._attacher.begin()  # (its stream task, if it needs one: `attach.py`)
        self._queue.start()

    async def stop_stream(self) -> None:
        self._attacher.stop()
        await _cancel(self._attacher.task)

    async def shutdown(self) -> None:
        self._state.closing = True
        self._renewer.stop()
        self._queue.stop()
        self._attacher.stop()
        current = asyncio.current_task()
        for task in (self._attacher.task, self._queue.task):
            if task is not None and task is not current:
                await _cancel(task)
        if self._session is not None:
            self._client.sessions.discard(self._session)
            self._session = None
        self._state.stop_renewals = nothing  # the renewer's bound method: the state's cycle


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
