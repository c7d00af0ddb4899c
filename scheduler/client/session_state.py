"""A session's state and its one-step transitions: what `AsyncSession` exposes (`.lease`, `.phase`,
`.queue`, counters, events) and the small helpers every part of the state machine shares (notify
listeners, drop the lease, end, fail).

The parts that move the state live beside it: `duties.py` (renewals and the yield path),
`stream.py` (the Acquire stream and re-attach), `session.py` (start, wait, release).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from scheduler.client.callbacks import OnGrant, OnYield, OnYieldCancelled
from scheduler.client.channel import ClientLink
from scheduler.client.errors import SessionEnded, SlotschedError
from scheduler.client.types import LeaseInfo, Phase, QoS, QueueInfo, Slot, SnapshotRef, lease_key

#: One logger for the whole async SDK, under the name it always had (users filter on it).
log = logging.getLogger("scheduler.client.aio")


class SessionState:
    """The state of one session (see `AsyncSession` for the public view of it)."""

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
        self._yield_sent: tuple[str, int] | None = None  # the lease whose Yield we sent
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

    # The shortcuts to `.lease` are None whenever it is (queued, yielding away, re-attaching
    # after a loss, ended), as `.lease` is: one rule, rather than raising where `.lease` is None.

    @property
    def lease_id(self) -> str | None:
        return None if self._lease is None else self._lease.lease_id

    @property
    def epoch(self) -> int | None:
        return None if self._lease is None else self._lease.epoch

    @property
    def worker_address(self) -> str | None:
        return None if self._lease is None else self._lease.worker_address

    @property
    def slot(self) -> Slot | None:
        return None if self._lease is None else self._lease.slot

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call `fn()` (in the loop, must not block) after every state change."""
        self._listeners.append(fn)

    def _ready(self) -> bool:
        """Holding a lease whose on_grant (if any) has run."""
        lease = self._lease
        return lease is not None and (self._on_grant is None or self._grant_done == lease.key)

    def _end_error(self) -> SlotschedError:
        if self.error is not None:
            return self.error
        return SessionEnded(f"session {self.session_id!r} ended ({self.end_reason})", self.end_reason or "")

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
        return self._lease is not None and self._lease.key == lease_key(lease_id, epoch)

    def _local(self, server_time: Any) -> datetime:
        """A server timestamp in this machine's clock, so a skewed clock does not move deadlines."""
        return cast(datetime, server_time.ToDatetime(tzinfo=UTC)) - timedelta(seconds=self._skew_s)

    def _count_yield(self, key: tuple[str, int]) -> None:
        if self._yielded != key:
            self._yielded = key
            self._yields += 1

    def _stop_renew(self) -> None:
        if self._renew_task is not None and self._renew_task is not asyncio.current_task():
            self._renew_task.cancel()
        self._renew_task = None

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

    async def aclose(self) -> None:
        """Release and stop the background tasks (`AsyncSession.aclose`)."""
        raise NotImplementedError
