"""One attached session's stream, in domain terms: what the loop tells a session, why a stream
closes, and how long a queued session waits. No protobuf and no status codes here: the Acquire
handler (scheduler_service.py) and the Channel (session_channel.py) turn a `Notice` into a
LeaseEvent (convert.lease_event) and a `StreamClosed` or a withdrawal into a status (errors.py),
once per event, as the loop used to.

`LeaseStream` (named apart from the SDK's session stream: the client's side of a session) is also
the one owner of the caller's patience: while its session is queued it keeps a timer at the
session's `wait_timeout` (counted from when the wait began, the `at` of its first QUEUED item)
or at a deadline its handler gives (`give_up_at`: a per-session Acquire's gRPC deadline), and
when that passes withdraws the request through its `Patience` (the loop) and says why
(`withdrawn`): both wire shapes then end it DEADLINE_EXCEEDED after `Ended{WITHDRAWN}`. Only an
attached stream waits so: a session nobody listens to stays queued (it re-attaches).
"""

from __future__ import annotations

import asyncio
from collections import deque
from enum import Enum
from typing import NamedTuple, Protocol

from scheduler.core.types import (
    Ended,
    Expired,
    Granted,
    Queued,
    Revoked,
    SessionId,
    YieldCancelled,
    YieldRequested,
)

# Kinds of stream items: the handler needs to know queued/granted (for wait_timeout), the last
# event of a session, and a close order from the loop (re-attach, shutdown).
QUEUED, GRANTED, OTHER, FINAL, CLOSE = range(5)


class Notice(NamedTuple):
    """One event for a session's stream: the core's decision, stamped with the time the wire
    shows, plus what the wire quotes that the decision does not carry."""

    decision: Granted | Queued | Ended | YieldRequested | YieldCancelled | Revoked | Expired
    at: float
    address: str = ""  # Granted: the worker's address
    yielding: YieldRequested | None = None  # Granted replayed on re-attach: the pending yield


# (kind, notice or None for CLOSE, time the handler measures from: a queued session's wait began)
Item = tuple[int, Notice | None, float]


class StreamClosed(Enum):
    """Why the loop closed a stream (errors.from_closed says what the caller sees)."""

    SUPERSEDED = "superseded"  # a newer Acquire stream attached to the same session
    SHUTTING_DOWN = "shutting_down"  # shutdown or a step-down: re-attach to another replica


class Patience(Protocol):
    """What a stream needs of the loop to withdraw its session when the wait is over."""

    def now(self) -> float: ...

    def wait_timeout(self, key: SessionId) -> float | None: ...

    def withdraw_queued(self, key: SessionId) -> bool:
        """Withdraw the session's request if it is still queued; False if not (a grant won)."""
        ...


class LeaseStream:
    """One attached session stream: the loop puts events in, the handler takes them out.

    A deque and at most one waiting future rather than an asyncio.Queue: every event of every
    session passes through here, and the Queue's getter bookkeeping was measurable per grant.
    """

    __slots__ = (
        "key",
        "items",
        "_waiter",
        "close_reason",
        "position",
        "closed",
        "patience",
        "queued_since",
        "deadline",
        "_timer",
        "withdrawn",
    )

    def __init__(self, key: SessionId) -> None:
        self.key = key
        self.items: deque[Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.close_reason: StreamClosed | None = None
        self.position = -1  # last queue position sent; -1 while not queued
        self.closed = False  # once closed, items still queued are stale: never written
        self.patience: Patience | None = None  # set by the loop when it attaches the stream
        self.queued_since: float | None = None  # when the current wait began; None if not queued
        self.deadline: tuple[float, str] | None = None  # give_up_at's (time, why)
        self._timer: asyncio.TimerHandle | None = None
        self.withdrawn = ""  # why the wait was over, once the request was withdrawn for it

    def put(self, kind: int, notice: Notice, at: float) -> None:
        if kind == QUEUED:
            self.position = notice.decision.position  # type: ignore[union-attr]
            if self.queued_since is None:  # a position refresh keeps the wait's start
                self.queued_since = at
                self._arm()
        elif kind != OTHER:
            self.position = -1
            self.queued_since = None
            self.disarm()
        self._push((kind, notice, at))

    def close(self, reason: StreamClosed) -> None:
        self.close_reason = reason
        self.closed = True
        self.disarm()
        self._push((CLOSE, None, 0.0))

    # ------------------------------------------------------------------ patience

    def give_up_at(self, at: float, why: str) -> None:
        """Also stop waiting at loop time `at` (`why`, e.g. "the caller's deadline")."""
        self.deadline = (at, why)
        if self.queued_since is not None:
            self._arm()

    def _arm(self) -> None:
        """The timer at the earlier of `wait_timeout` (from the wait's start) and the deadline."""
        p = self.patience
        if p is None or self.queued_since is None or self.withdrawn:
            return
        wait = p.wait_timeout(self.key)
        until = None if wait is None else (self.queued_since + wait, f"wait_timeout {wait:g}s")
        if self.deadline is not None and (until is None or self.deadline[0] < until[0]):
            until = self.deadline
        if until is None:
            return
        self.disarm()
        delay = max(0.0, until[0] - p.now())
        self._timer = asyncio.get_running_loop().call_later(delay, self._over, until[1])

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _over(self, why: str) -> None:
        self._timer = None
        p = self.patience
        if self.closed or p is None:
            return
        if p.withdraw_queued(self.key):  # Ended{WITHDRAWN} is in `items` now
            self.withdrawn = why

    def _push(self, item: Item) -> None:
        self.items.append(item)
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():  # a cancelled getter leaves a done future behind
                w.set_result(None)

    async def get(self) -> Item:
        """The next item, waiting for one if none is there. Safe to cancel: nothing is lost."""
        items = self.items
        while not items:
            w = self._waiter = asyncio.get_running_loop().create_future()
            await w
        return items.popleft()
