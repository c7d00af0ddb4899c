"""One session's state, shared by the parts that move it (`attach`, `events`, `renewer`,
`yielder`, `release`), and the one-step changes they all make: move the phase (through the
table of `phases.py`: the only place a phase is assigned), drop the lease, end, fail, notify.

Why a plain shared object: the parts are small and each does one job, but they act on the same
facts (which lease is held, whether a release began); a state object they all hold keeps those
facts in one place, where a class chain spread them over four files.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from scheduler.client.callbacks import OnGrant, OnYield, OnYieldCancelled
from scheduler.client.errors import SessionEnded, SlotschedError
from scheduler.client.phases import Phase, SessionEvent, next_phase
from scheduler.client.types import ClientQoS, ClientSnapshotRef, LeaseInfo, QueueInfo, Slot, lease_key

#: One logger for the whole async SDK, under the name it always had (users filter on it).
log = logging.getLogger("scheduler.client.aio")


@dataclass(frozen=True)
class SessionSpec:
    """What the runtime asked for: fixed for the session's life."""

    session_id: str
    qos: ClientQoS
    on_yield: OnYield | None = None
    on_grant: OnGrant | None = None
    on_yield_cancelled: OnYieldCancelled | None = None
    resume_from: ClientSnapshotRef | None = None
    wait_timeout_s: float | None = None
    #: Where it may run (docs/design.md "Pools"): a pool by name, or a label selector (sorted
    #: pairs), and the pools to try after it, in order. All empty: the policy's only pool.
    pool: str = ""
    selector: tuple[tuple[str, str], ...] = ()
    fallback: tuple[str, ...] = ()


def nothing() -> None:
    """No renewals to stop (`SessionState.stop_renewals` before and after the session's life)."""


@dataclass(eq=False)
class SessionState:
    """What this client knows of one session (`AsyncSession` shows it)."""

    spec: SessionSpec
    lease: LeaseInfo | None = None
    queue: QueueInfo | None = None
    #: The snapshot the current (or next) grant resumes from.
    resume_from: ClientSnapshotRef | None = None
    yields: int = 0
    yields_cancelled: int = 0
    grants: int = 0
    reattaches: int = 0
    end_reason: str | None = None
    #: The error that ended the session (refusal, queue timeout, re-attach gave up, ...).
    error: SlotschedError | None = None
    #: Errors raised by on_grant/on_yield, or by the Yield call that followed on_yield.
    callback_errors: list[BaseException] = field(default_factory=list)
    #: The last error of a background Renew (None after a successful renew).
    renew_error: SlotschedError | None = None
    #: Why the last release at exit failed, if it did (exit never raises).
    release_error: SlotschedError | None = None
    attached: bool = False  # an Acquire stream (or a place on a channel) is open
    reached: bool = False  # an event came from the server: the session exists there
    closing: bool = False  # shutting down: nothing re-attaches
    release_requested: bool = False  # release() began: no renewal, no yield from now on
    grant_done: tuple[str, int] | None = None  # the lease whose on_grant has run
    grant_error: BaseException | None = None
    skew_s: float = 0.0  # server clock minus ours, from the latest stream event
    #: Set when a held lease was taken away without this client yielding or releasing it.
    lost_lease: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when the session is over.
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    #: Told when the lease the renewals are for is gone (the renewer's `stop`).
    stop_renewals: Callable[[], None] = nothing
    _phase: Phase = field(default=Phase.STARTING, init=False)
    #: Futures of `wait_until` callers, resolved by the next `notify`.
    _waiters: list[asyncio.Future[None]] = field(default_factory=list, init=False)
    _listeners: list[Callable[[], None]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.resume_from = self.spec.resume_from

    @property
    def session_id(self) -> str:
        return self.spec.session_id

    @property
    def phase(self) -> Phase:
        return self._phase

    def move(self, event: SessionEvent) -> None:
        """The one place a phase changes (`phases.TRANSITIONS`; a move it lacks raises)."""
        self._phase = next_phase(self._phase, event)

    # ---------------------------------------------------------------------------- listeners

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call `fn()` (in the loop, must not block) after every state change."""
        self._listeners.append(fn)

    def callback_failed(self, e: BaseException) -> None:
        """A runtime's callback raised (`callbacks.CallbackQueue`): logged and kept."""
        log.warning("slotsched: callback for %s failed: %r", self.session_id, e)
        self.callback_errors.append(e)
        self.notify()

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        for fn in self._listeners:
            try:
                fn()
            except Exception:  # a listener must never break the stream
                log.exception("slotsched: session listener failed")

    async def wait_until(self, predicate: Callable[[], bool], timeout: float | None = None) -> None:
        """Wait until `predicate()` holds (checked after every change); TimeoutError after `timeout`."""
        if predicate():
            return
        # A timeout scope, not `wait_for`: no task made per wait (every release waits here).
        if timeout is None:
            await self._until(predicate)
            return
        async with asyncio.timeout(timeout):
            await self._until(predicate)

    async def _until(self, predicate: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        while not predicate():
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            await fut

    # ------------------------------------------------------------------------------- reading

    # The shortcuts to `.lease` are None whenever it is (queued, yielding away, re-attaching
    # after a loss, ended), as `.lease` is: one rule, rather than raising where `.lease` is None.

    @property
    def lease_id(self) -> str | None:
        return None if self.lease is None else self.lease.lease_id

    @property
    def epoch(self) -> int | None:
        return None if self.lease is None else self.lease.epoch

    @property
    def worker_address(self) -> str | None:
        return None if self.lease is None else self.lease.worker_address

    @property
    def slot(self) -> Slot | None:
        return None if self.lease is None else self.lease.slot

    @property
    def pool(self) -> str | None:
        """The pool the session holds its lease in, or waits in (None before the server says)."""
        if self.lease is not None:
            return self.lease.pool
        return None if self.queue is None else self.queue.pool

    def is_current(self, lease_id: str, epoch: int) -> bool:
        return self.lease is not None and self.lease.key == lease_key(lease_id, epoch)

    def require_lease(self) -> LeaseInfo:
        if self.lease is None:
            raise RuntimeError(f"session {self.session_id!r} holds no lease (phase {self._phase})")
        return self.lease

    def ready(self) -> bool:
        """Holding a lease whose on_grant (if any) has run."""
        lease = self.lease
        return lease is not None and (self.spec.on_grant is None or self.grant_done == lease.key)

    def end_error(self) -> SlotschedError:
        if self.error is not None:
            return self.error
        return SessionEnded(f"session {self.session_id!r} ended ({self.end_reason})", self.end_reason or "")

    def local(self, server_time: Any) -> datetime:
        """A server timestamp in this machine's clock, so a skewed clock does not move deadlines."""
        return cast(datetime, server_time.ToDatetime(tzinfo=UTC)) - timedelta(seconds=self.skew_s)

    # ------------------------------------------------------------------------------ changing

    def drop_lease(self, involuntary: bool) -> None:
        self.stop_renewals()
        if self.lease is not None and involuntary:
            self.lost_lease.set()
        self.lease = None

    def end(self, reason: str, final_status_pending: bool = False) -> None:
        """Over: no lease, no queue. `ended` is set at once unless the stream's closing status
        is still to come (it may name the end better: a DEADLINE_EXCEEDED is a wait_timeout)."""
        self.stop_renewals()
        self.lease = None
        self.queue = None
        if self._phase is not Phase.ENDED:
            self.move(SessionEvent.ENDED)
        self.end_reason = self.end_reason or reason
        if not final_status_pending:
            self.ended.set()

    def fail(self, err: SlotschedError) -> None:
        if self.error is None:
            self.error = err
        if self.lease is not None:
            self.lost_lease.set()
        self.end(self.end_reason or "failed")
        self.notify()
