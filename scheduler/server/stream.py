"""One attached Acquire stream, in domain terms: what the loop tells a session, and why a stream
closes. No protobuf and no status codes here: the Acquire handler (scheduler_service.py) turns a
`Notice` into a LeaseEvent (convert.lease_event) and a `StreamClosed` into a status (errors.py),
once per event, as the loop used to.
"""

from __future__ import annotations

import asyncio
from collections import deque
from enum import Enum
from typing import NamedTuple

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


class SessionStream:
    """One attached Acquire stream: the loop puts events in, the handler takes them out.

    A deque and at most one waiting future rather than an asyncio.Queue: every event of every
    session passes through here, and the Queue's getter bookkeeping was measurable per grant.
    """

    __slots__ = ("key", "items", "_waiter", "close_reason", "position", "closed")

    def __init__(self, key: SessionId) -> None:
        self.key = key
        self.items: deque[Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.close_reason: StreamClosed | None = None
        self.position = -1  # last queue position sent; -1 while not queued
        self.closed = False  # once closed, items still queued are stale: never written

    def put(self, kind: int, notice: Notice, at: float) -> None:
        if kind == QUEUED:
            self.position = notice.decision.position  # type: ignore[union-attr]
        elif kind != OTHER:
            self.position = -1
        self._push((kind, notice, at))

    def close(self, reason: StreamClosed) -> None:
        self.close_reason = reason
        self.closed = True
        self._push((CLOSE, None, 0.0))

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
