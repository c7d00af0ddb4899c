"""The core's timers: lease expiries, yield deadlines and min-runtime maturity, as heaps of
`(time, lease id, epoch)` entries over the core's leases (read, never owned).

Entries are never removed early: an entry whose lease has ended, moved to another epoch, been
renewed or had its yield cancelled is stale, and is dropped (or, renewed, pushed again at its new
expiry) when it comes due. What a due timer does is the engine's (`Core._advance`): here it is
only found, in time order.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator

from scheduler.core.lifecycle import LeaseState
from scheduler.core.model import LeaseRec
from scheduler.core.types import LeaseId

TimerEntry = tuple[float, LeaseId, int]


class Timers:
    __slots__ = ("maturing", "deadlines", "expiries", "earliest", "_leases")

    def __init__(self, leases: dict[LeaseId, LeaseRec]) -> None:
        # Every lease matures min_runtime after its grant, so grant order is time order: a deque.
        self.maturing: deque[TimerEntry] = deque()
        self.deadlines: list[TimerEntry] = []
        self.expiries: list[TimerEntry] = []
        # The earliest entry of the three (inf: none), lowered by every push and found again
        # after entries are popped: `next_due` runs on every event and mostly finds nothing due,
        # so it is one comparison. Between events it is exact; it is never later than a head.
        self.earliest = math.inf
        self._leases = leases

    def load(
        self,
        maturing: tuple[TimerEntry, ...],
        deadlines: tuple[TimerEntry, ...],
        expiries: tuple[TimerEntry, ...],
    ) -> None:
        """Refill from exported entries (restore)."""
        self.maturing = deque(maturing)
        self.deadlines = list(deadlines)
        heapq.heapify(self.deadlines)
        self.expiries = list(expiries)
        heapq.heapify(self.expiries)
        self._refind()

    def push_expiry(self, at: float, lease_id: LeaseId, epoch: int) -> None:
        heapq.heappush(self.expiries, (at, lease_id, epoch))
        if at < self.earliest:
            self.earliest = at

    def push_deadline(self, at: float, lease_id: LeaseId, epoch: int) -> None:
        heapq.heappush(self.deadlines, (at, lease_id, epoch))
        if at < self.earliest:
            self.earliest = at

    def push_maturing(self, at: float, lease_id: LeaseId, epoch: int) -> None:
        """`at` is never before the last one pushed (grant time + the same min runtime)."""
        self.maturing.append((at, lease_id, epoch))
        if at < self.earliest:
            self.earliest = at

    def _refind(self) -> float:
        at = math.inf
        if self.maturing:
            at = self.maturing[0][0]
        if self.deadlines and self.deadlines[0][0] < at:
            at = self.deadlines[0][0]
        if self.expiries and self.expiries[0][0] < at:
            at = self.expiries[0][0]
        self.earliest = at
        return at

    def next_due(self, now: float) -> float | None:
        """The earliest instant <= `now` at which a timer is due, if any."""
        if self.earliest > now:
            return None
        at = self._refind()  # entries may have been popped since it was last found
        return at if at <= now else None

    def next_deadline(self, fairness_waiter: Callable[[], bool], sample: float = math.inf) -> float | None:
        """The earliest time at which a timer would change something; maturity and the next
        usage `sample` count only if `fairness_waiter()` (a waiter that a mature victim could
        serve), which is asked only when one of them is the earliest: after every event of every
        pool (pools.py), so comparisons, not lists."""
        at = math.inf
        if self.deadlines:
            at = self.deadlines[0][0]
        if self.expiries and self.expiries[0][0] < at:
            at = self.expiries[0][0]
        lower = self.maturing[0][0] if self.maturing else math.inf
        if sample < lower:
            lower = sample
        if lower < at and fairness_waiter():
            at = lower
        return None if at == math.inf else at

    def deadline_due(self, at: float) -> bool:
        return bool(self.deadlines) and self.deadlines[0][0] <= at

    # The three below pop lazily: an entry is checked only when reached, after the engine acted
    # on the ones before it (a lease may have two entries; the second then finds it gone).

    def expired(self, at: float) -> Iterator[LeaseRec]:
        """The leases whose expiry is due by `at` (renewed ones are pushed again)."""
        expiries = self.expiries
        while expiries and expiries[0][0] <= at:
            _, lid, epoch = heapq.heappop(expiries)
            rec = self._leases.get(lid)
            if rec is None or rec.lease.epoch != epoch:
                continue
            if rec.lease.expires_at > at:
                self.push_expiry(rec.lease.expires_at, lid, epoch)  # renewed meanwhile
                continue
            yield rec

    def matured(self, at: float) -> Iterator[LeaseRec]:
        """The live leases that ran min_runtime by `at`."""
        maturing = self.maturing
        while maturing and maturing[0][0] <= at:
            _, lid, epoch = maturing.popleft()
            rec = self._leases.get(lid)
            if rec is not None and rec.lease.epoch == epoch:
                yield rec

    def overdue(self, at: float) -> Iterator[LeaseRec]:
        """The yielding leases whose yield deadline is due by `at`."""
        deadlines = self.deadlines
        while deadlines and deadlines[0][0] <= at:
            deadline, lid, epoch = heapq.heappop(deadlines)
            rec = self._leases.get(lid)
            if (
                rec is not None
                and rec.lease.epoch == epoch
                and rec.state is LeaseState.YIELDING
                and rec.yield_deadline == deadline  # not the entry of an earlier, cancelled yield
            ):
                yield rec

    def resume(self, since: float, now: float, ttl: float) -> None:
        """See `Resumed`: every expiry and yield deadline moves by the outage (expiries to at
        least a full TTL from `now`). Stale expiry entries re-queue themselves in `expired`."""
        gap = max(0.0, now - since)
        at_least = now + ttl
        for rec in self._leases.values():
            expires = max(rec.lease.expires_at + gap, at_least)
            if expires != rec.lease.expires_at:
                rec.lease = rec.lease._replace(expires_at=expires)
            if gap and rec.yield_deadline is not None:
                rec.yield_deadline += gap  # as its heap entry below: they must stay equal
        if gap and self.deadlines:
            # The same shift for every entry keeps the heap order: no re-heapify needed.
            self.deadlines = [(d + gap, lid, epoch) for d, lid, epoch in self.deadlines]
            self._refind()  # later now: `earliest` stays exact


__all__ = ["TimerEntry", "Timers"]
