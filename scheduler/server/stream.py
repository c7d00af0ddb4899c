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

It also decides what a waiter is told, and when (`offer`): every Queued it may send is the
core's answer for the waiter (`Pools.queued`: position, estimate, pool, reason), offered on the
core's decision, on the loop's refresh after events, on a re-attach and on its own countdown
timer. A new position, pool or reason, or a core estimate a quarter away from the one this
place began with, is told at once (and the countdown starts again from it); otherwise the
estimate counts down with time since this place began, and is told again once it has fallen by
`ESTIMATE_CHANGE` of what was last told (at least `ESTIMATE_MIN_STEP_S`), down to zero.
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

# A shown estimate is told again when it has moved by this share of what was told: a display of
# "about N s" needs relative precision, and a countdown then costs a few Queued per place
# (0.75^k of it), not one every few seconds for the whole wait.
ESTIMATE_CHANGE = 0.25
# ... but never by less than this (a short estimate's quarter would be a flurry of Queued).
ESTIMATE_MIN_STEP_S = 1.0

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

    def queued_now(self, key: SessionId) -> Queued | None:
        """What the core tells the waiter now (`Pools.queued`); None if it does not wait."""
        ...


def countdown(base: float | None, elapsed: float) -> float | None:
    """The estimate `elapsed` seconds after a place was told with `base` (None: no estimate)."""
    return None if base is None else max(0.0, base - elapsed)


def _near(estimate: float | None, base: float | None) -> bool:
    """Whether the core's estimate for a place is still the one its countdown began with."""
    if estimate is None or base is None:
        return estimate is base
    return abs(estimate - base) < ESTIMATE_CHANGE * base or estimate == base


def _step(told: float) -> float:
    """How far a told estimate must fall to be told again (to zero, if that is nearer)."""
    return min(told, max(ESTIMATE_CHANGE * told, ESTIMATE_MIN_STEP_S))


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
        "told",
        "told_base",
        "_tick",
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
        self.told: Queued | None = None  # the last Queued sent in this wait (its shown estimate)
        # (the core's estimate when this place was first told, when): the countdown's start
        self.told_base: tuple[float | None, float] = (None, 0.0)
        self._tick: asyncio.TimerHandle | None = None  # the countdown's next re-tell

    def put(self, kind: int, notice: Notice, at: float) -> None:
        if kind == QUEUED:
            self.position = notice.decision.position  # type: ignore[union-attr]
            if self.queued_since is None:  # a position refresh keeps the wait's start
                self.queued_since = at
                self._arm()
        elif kind != OTHER:
            self.position = -1
            self.queued_since = None
            self.told = None
            self.disarm()
        self._push((kind, notice, at))

    def offer(self, q: Queued, now: float, since: float) -> bool:
        """Tell the waiter `q` (the core's answer now) if it differs materially from what it was
        told (module doc); `since`: when its wait began. True if a Queued was sent."""
        told, (base, base_at) = self.told, self.told_base
        est = q.estimated_wait_s
        if (
            told is None
            or q.position != told.position
            or q.reason != told.reason
            or q.pool != told.pool
            or not _near(est, base)
        ):
            base, base_at = est, now  # a new place, or a new estimate for it: told as it is
            self.told_base = (base, base_at)
        else:
            est = countdown(base, now - base_at)
            last = told.estimated_wait_s
            if est is None or last is None or last <= 0.0 or last - est < _step(last):
                return False  # nothing told has moved: the countdown armed for it stands
            q = q._replace(estimated_wait_s=est)
        self.told = q
        self.put(QUEUED, Notice(q, now), since)
        self._tick_at(base, base_at)
        return True

    def _tick_at(self, base: float | None, base_at: float) -> None:
        """Arm the countdown at the time the shown estimate will have fallen by a step."""
        p, told = self.patience, self.told
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        last = None if told is None else told.estimated_wait_s
        if p is None or base is None or last is None or last <= 0.0 or self.closed:
            return
        due = base_at + base - (last - _step(last))  # countdown(base, due - base_at) == last - step
        delay = max(0.0, due - p.now()) + 0.001  # +1 ms: at or after `due`, despite rounding
        self._tick = asyncio.get_running_loop().call_later(delay, self._retell)

    def _retell(self) -> None:
        self._tick = None
        p = self.patience
        if self.closed or p is None or self.queued_since is None:
            return
        q = p.queued_now(self.key)
        if q is not None and not self.offer(q, p.now(), self.queued_since):
            self._tick_at(*self.told_base)  # not due yet by the loop's clock: again, later

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
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, until[0] - p.now())
        self._timer = asyncio.get_running_loop().call_later(delay, self._over, until[1])

    def disarm(self) -> None:
        """Stop both timers: the wait's end and the countdown."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

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
