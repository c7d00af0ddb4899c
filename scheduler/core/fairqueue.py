"""Fair queuing of work items across flows, pure: as Kubernetes API Priority and Fairness admits
requests into the API server, by flow, with a bounded number of seats.

A flow is whoever the work is charged to (a tenant, or one flow for each of the admin, worker and
KEDA roles). A work item asks for seats with a cost (a Channel message: its commands; an rpc: 1),
taking as many seats as its cost (`width`: at least 1, at most all of them). While its seats are
free and nothing waits, it is admitted at once; while others wait, it is admitted at once only if
it is ahead of them all in fair order (then over the seats by at most `overdraft`: it would be
the next admitted anyway, and need not wait a release for it; `overdraft`, 0 by default); else it
waits in its flow's queue,
bounded per flow (past the bound it is refused: on the flooding flow's side, never another's).
When a seat frees, the waiting item with the smallest virtual finish tag is admitted (weighted
fair queuing, start-time tags as in SFQ): an item's start is the later of the queue's virtual
time and its flow's last finish, its finish is start + cost / weight, and the virtual time moves
to the start of the item admitted. A flow that was idle starts at the virtual time (no credit
saved up), so a flow that floods is served at its weight's share while others wait, and a quiet
flow's item is served ahead of the flood's backlog.

Time is passed in (for the throughput estimate a refused item's retry-after is computed from);
no clock, no I/O, no asyncio here: the server's adapter is scheduler/server/fairness.py.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

T = TypeVar("T")

#: Bounds of a refused item's retry-after, in seconds.
MIN_RETRY_S = 0.05
MAX_RETRY_S = 30.0
_RATE_HALF_LIFE_S = 1.0  # how fast the admitted-cost rate estimate follows the load


class Offer(Enum):
    ADMITTED = "admitted"  # holds a seat now
    QUEUED = "queued"  # waits in its flow's queue for a seat
    REFUSED = "refused"  # its flow's queue is at its bound


@dataclass(slots=True)
class _Waiting(Generic[T]):
    item: T
    cost: float
    start: float
    finish: float


@dataclass(slots=True)
class _Flow(Generic[T]):
    name: str
    weight: float = 1.0
    last_finish: float = 0.0
    queue: deque[_Waiting[T]] = field(default_factory=deque)
    queued_cost: float = 0.0


class FairQueue(Generic[T]):
    """Seats, and one bounded queue per flow. `offer` an item; `release` a seat when an admitted
    item is done: it returns the items admitted into the seats freed (in order)."""

    def __init__(self, seats: int, queued_per_flow: int, overdraft: int = 0) -> None:
        if seats < 1 or queued_per_flow < 1 or overdraft < 0:
            raise ValueError(
                "need seats >= 1, queued_per_flow >= 1, overdraft >= 0; "
                f"got {seats}, {queued_per_flow}, {overdraft}"
            )
        self.seats = seats
        self.overdraft = overdraft  # seats past `seats` an item first in fair order may take
        self.queued_per_flow = queued_per_flow
        self.in_use = 0
        self.virtual = 0.0
        self._flows: dict[str, _Flow[T]] = {}
        self._heads: list[tuple[float, int, str]] = []  # (finish of a flow's head, seq, flow)
        self._seq = 0
        self._waiting = 0
        self._rate = 0.0  # admitted cost a second (exponential average)
        self._rate_at: float | None = None

    # ------------------------------------------------------------------ reads

    def queued(self, flow: str) -> int:
        f = self._flows.get(flow)
        return len(f.queue) if f is not None else 0

    @property
    def waiting(self) -> int:
        return self._waiting

    def flows(self) -> tuple[str, ...]:
        return tuple(self._flows)

    def retry_after(self, flow: str, now: float) -> float:
        """When a refused item of `flow` might find room: its flow's queued cost at the flow's
        share of the admitted rate (clamped to [MIN_RETRY_S, MAX_RETRY_S])."""
        f = self._flows.get(flow)
        backlog = f.queued_cost if f is not None else 0.0
        busy = sum(1 for g in self._flows.values() if g.queue) or 1
        rate = self._decayed_rate(now) / busy
        if rate <= 0:
            return 1.0
        return min(MAX_RETRY_S, max(MIN_RETRY_S, backlog / rate))

    # ------------------------------------------------------------------ moves

    def offer(
        self, flow: str, item: T, now: float, cost: float = 1.0, weight: float = 1.0, bounded: bool = True
    ) -> Offer:
        """Ask a seat for `item` of `flow`. ADMITTED: it holds one (call `release` when done);
        QUEUED: `release` will hand it out; REFUSED: nothing kept. An item not `bounded` is never
        refused (work already accepted, such as the answers to commands applied: its caller
        bounds how many such items a flow can have waiting)."""
        if self.admit_now(flow, now, cost, weight):
            return Offer.ADMITTED
        f = self._flows[flow]
        if bounded and len(f.queue) >= self.queued_per_flow:
            return Offer.REFUSED
        start = max(self.virtual, f.last_finish)
        w = _Waiting(item, cost, start, start + cost / f.weight)
        f.last_finish = w.finish
        f.queue.append(w)
        f.queued_cost += cost
        self._waiting += 1
        if len(f.queue) == 1:
            self._push_head(f)
        return Offer.QUEUED

    def admit_now(self, flow: str, now: float, cost: float = 1.0, weight: float = 1.0) -> bool:
        """`offer`'s first step: admit at once while a seat is free and nothing waits (True;
        nothing kept), else False (then `offer` the item, or give up)."""
        f = self._flows.get(flow)
        if f is None:
            f = self._flows[flow] = _Flow(flow, weight)
        f.weight = weight if weight > 0 else 1.0
        width = self.width(cost)
        start = max(self.virtual, f.last_finish)
        finish = start + cost / f.weight
        if self._waiting and self.in_use + width <= self.seats + self.overdraft:
            # Items wait (for seats, or for the next release): this one goes now only if it is
            # ahead of them all in fair order anyway (its flow has nothing waiting, its finish
            # tag is the smallest), so it would be the next admitted; over the seats by at most
            # `overdraft`. It then does not pay a release for another flow's backlog: the
            # server's gate releases once a turn of the loop, so a quiet tenant's item under a
            # flood starts in the turn it arrives in instead of two turns later.
            if f.queue or finish >= self._heads[0][0]:
                return False
        elif self._waiting or self.in_use + width > self.seats:
            return False
        f.last_finish = finish
        self.virtual = start
        self.in_use += width
        self._admitted(cost, now)
        return True

    def width(self, cost: float) -> int:
        """The seats an item of `cost` takes: its cost, between 1 and all the seats (a Channel
        message of 200 commands takes 200 seats, as a wide request does in APF)."""
        return max(1, min(self.seats, math.ceil(cost)))

    def release(self, now: float, seats: int = 1) -> list[tuple[str, T]]:
        """Free `seats` seats; the waiting items admitted into the free seats, smallest finish
        first."""
        self.in_use = max(0, self.in_use - seats)
        out: list[tuple[str, T]] = []
        while self._heads:
            name = self._heads[0][2]
            f = self._flows[name]
            width = self.width(f.queue[0].cost)
            if self.in_use + width > self.seats:
                break  # the next in order waits for room: nothing narrower overtakes it
            heapq.heappop(self._heads)
            w = f.queue.popleft()
            f.queued_cost -= w.cost
            self._waiting -= 1
            self.virtual = max(self.virtual, w.start)
            self.in_use += width
            self._admitted(w.cost, now)
            out.append((name, w.item))
            if f.queue:
                self._push_head(f)
        return out

    def cancel(self, flow: str, item: T) -> bool:
        """Take a waiting item out of its queue (its caller left); False if it is not waiting."""
        f = self._flows.get(flow)
        if f is None:
            return False
        for i, w in enumerate(f.queue):
            if w.item is item:
                del f.queue[i]
                f.queued_cost -= w.cost
                self._waiting -= 1
                self._heads = [h for h in self._heads if h[2] != flow]
                heapq.heapify(self._heads)
                if f.queue:
                    self._push_head(f)
                return True
        return False

    def forget_idle(self) -> None:
        """Drop the flows with nothing waiting (their tags are below the virtual time anyway,
        or will be: a returning flow starts at the virtual time)."""
        for name in [n for n, f in self._flows.items() if not f.queue and f.last_finish <= self.virtual]:
            del self._flows[name]

    # ------------------------------------------------------------------ inner

    def _push_head(self, f: _Flow[T]) -> None:
        self._seq += 1
        heapq.heappush(self._heads, (f.queue[0].finish, self._seq, f.name))

    def _decayed_rate(self, now: float) -> float:
        if self._rate_at is None:
            return 0.0
        dt = max(0.0, now - self._rate_at)
        return float(self._rate * 0.5 ** (dt / _RATE_HALF_LIFE_S))

    def _admitted(self, cost: float, now: float) -> None:
        # An exponential average of cost per second: decay what was, add this item's share.
        self._rate = self._decayed_rate(now) + cost * (0.693 / _RATE_HALF_LIFE_S)
        self._rate_at = now if self._rate_at is None else max(self._rate_at, now)
