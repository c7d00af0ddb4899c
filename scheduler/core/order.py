"""The order of service: who gets the next free slot, written once.

From docs/design.md, "Who gets the next free slot":

    The order of service, in three tiers:

    1. **Guaranteed** requests of tenants within quota (leases held plus victims already yielding
       for them below `guaranteed`), oldest first.
    2. **Burstable** requests of tenants below `nominal`, lowest `(nominal leases held + yields in
       flight for them) / nominal` first, then oldest.
    3. **Everything else that may run** (Burstable beyond nominal within `limit`, BestEffort within
       its limit): the tenant with the lowest weighted share first — `share = (borrowing leases not
       already yielding + fairness yields in flight for it + recent usage) / weight`. A tenant's
       head is its oldest Burstable request beyond nominal, else its oldest BestEffort request (a
       tenant's Burstable goes before its own BestEffort); ties between tenants go to the oldest.

    With `spec.fairness.shareWindowSeconds` W > 0 the share is bounded by age: a request goes
    ahead of an older one by a lower share only if it arrived less than W seconds after it
    (`fair_key`).

    A waiter with a victim already yielding for it ("earmarked") takes the first slot that frees
    ahead of the waiters of its own tier and the tiers after it, so a yield is not wasted on
    someone else. Ages are the original arrival time: a session that yielded keeps its place in line.

Each tier is a heap holding, per tenant, the head of its eligible queue under the key of that
tier (`ServiceOrder.reindex`); earmarked waiters are a fourth heap, by (tier, arrival). A
tenant's entries are stamped with its version, so re-indexing it supersedes its old entries.
(`TIER_BEST_EFFORT` names the fairness right of a BestEffort head of tier 3, which takes a
Burstable victim only while BestEffort is below its minimum share; an earmark of that tier ranks
as tier 3.)
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from scheduler.core.indexes import VersionedHeap
from scheduler.core.model import Request
from scheduler.core.records import EarmarkEntry
from scheduler.core.tenants import BE, B, G, QueueEntry, TenantState
from scheduler.core.types import SessionId

TIER_GUARANTEED, TIER_NOMINAL, TIER_SHARED, TIER_BEST_EFFORT = 1, 2, 3, 4
_SERVED = (TIER_GUARANTEED, TIER_NOMINAL, TIER_SHARED)  # the tiers' heaps, in the order served


def fair_key(share: float, arrival: float, window: float) -> float:
    """The key of a tenant's head in tiers 3-4 (lowest first): its weighted share alone without a
    window; with a window W, `arrival + W * share / (share + 1)`, the arrival delayed by up to W
    as the share grows (half of W at one slot of share per weight). Time-invariant, as a virtual
    start time in weighted fair queueing: it orders waiters as `share' - age / W` would at every
    instant, so it stays true in the heaps. A request is passed only by one that arrived less
    than W * (its share term - the other's) < W seconds after it."""
    if window <= 0:
        return share
    return arrival + window * share / (share + 1.0)


class ServiceOrder:
    """The tiers' heaps and the earmarked waiters, over the core's requests (read, never owned)."""

    __slots__ = ("tiers", "earmarked", "dirty", "window", "_requests", "_tenants")

    def __init__(
        self, tenants: dict[str, TenantState], requests: dict[SessionId, Request], window: float = 0.0
    ) -> None:
        def current(name: str, version: int) -> bool:
            return tenants[name].version == version

        # Indexed by tier - 1.
        self.tiers = tuple(VersionedHeap(current) for _ in _SERVED)
        self.earmarked: list[EarmarkEntry] = []
        # Tenants whose entries are out of date (insertion-ordered, so flushing is deterministic).
        self.dirty: dict[TenantState, None] = {}
        # spec.fairness.shareWindowSeconds (`fair_key`); a change re-indexes every tenant.
        self.window = window
        self._requests = requests
        self._tenants = tenants

    def flush(self) -> None:
        """Bring the heaps up to date (before reading them): each dirty tenant re-indexed once."""
        if self.dirty:
            for t in self.dirty:
                self.reindex(t)
            self.dirty.clear()

    def reindex(self, t: TenantState) -> None:
        """Push the tenant's heads under the keys of the four tiers (the rules quoted above)."""
        t.version += 1
        held, ear, waiting = t.held, t.earmarked, t.waiting
        if waiting == ear:  # every waiter has a victim yielding for it, or none waits: no head
            return
        v = t.version
        spec = t.spec
        name = spec.name
        n = len(self._tenants)
        # 1. Guaranteed within quota (yields in flight count as held): oldest first.
        if waiting[G] > ear[G] and held[G] + ear[G] < spec.guaranteed:
            h = self._head(t, G)
            if h is not None:
                self.tiers[0].push((h[0], h[1], h[2], name, v), n)
        # 2. Burstable below nominal: lowest (nominal held + yields in flight) / nominal, then
        #    oldest. At or above nominal (within limit) it competes in tier 3.
        fair: QueueEntry | None = None
        if waiting[B] > ear[B] and held[B] + ear[B] < spec.burstable_limit:
            h = self._head(t, B)
            if h is not None:
                used = held[B] - t.b_borrowing + ear[B]
                if used < spec.burstable_nominal:
                    self.tiers[1].push((used / spec.burstable_nominal, h[0], h[1], h[2], name, v), n)
                else:
                    fair = h
        # 3. Burstable beyond nominal, else BestEffort (within its limit): lowest weighted share,
        #    counting fairness yields in flight for it, bounded by age (`fair_key`); the
        #    tenant's oldest; ties by age.
        if fair is None:
            be_limit = spec.best_effort_limit
            if waiting[BE] > ear[BE] and (be_limit is None or held[BE] + ear[BE] < be_limit):
                fair = self._head(t, BE)
            if fair is None:
                return
        # `fair_key(t.share(t.earmarked_fair), arrival, window)` inlined (the hot path), term for
        # term as `TenantState.share` adds them, so the floats are the same.
        share = (
            t.b_borrowing - t.b_borrowing_yielding + held[BE] - t.yielding[BE] + t.earmarked_fair
            + t.usage_slots
        ) / spec.weight  # fmt: skip
        window = self.window
        key = share if window <= 0 else fair[0] + window * share / (share + 1.0)
        self.tiers[2].push((key, fair[0], fair[1], fair[2], name, v), n)

    def for_free_slot(self) -> Request | None:
        """The waiter the next free slot goes to: an earmarked waiter goes ahead of its own tier
        and the tiers after it; otherwise the head of the first tier with one."""
        self.flush()
        best = self._earmarked_head()
        at = min(best.earmark_tier, TIER_SHARED) - 1 if best is not None else 3
        for heap in self.tiers[:at]:
            top = heap.peek()
            if top is not None:
                return self._requests[top[-3]]
        return best

    def with_right(self, nominal_room: Callable[[], bool], fairness: bool) -> tuple[tuple[int, Request], ...]:
        """The waiters with a right to a victim, with their tier: the head of tier 1 if there is
        one; else of tier 2 if the floor has room for one more nominal lease (`nominal_room()`);
        else, if a fairness preemption is possible at all (`fairness`: a victim ran min_runtime),
        the head of tier 3 (`TIER_BEST_EFFORT` for a BestEffort head: see the module docstring)."""
        self.flush()
        top = self.tiers[0].peek()
        if top is not None:
            return ((TIER_GUARANTEED, self._requests[top[-3]]),)
        top = self.tiers[1].peek()
        if top is not None and nominal_room():
            return ((TIER_NOMINAL, self._requests[top[-3]]),)
        if not fairness:
            return ()
        top = self.tiers[2].peek()
        if top is None:
            return ()
        req = self._requests[top[-3]]
        return ((TIER_BEST_EFFORT if req.cls == BE else TIER_SHARED, req),)

    def fairness_waiter(self) -> bool:
        """A waiter a fairness preemption could serve (tier 3)."""
        self.flush()
        return self.tiers[2].peek() is not None

    def push_earmarked(self, req: Request) -> None:
        tier = min(req.earmark_tier, TIER_SHARED)  # a BestEffort fairness right ranks as tier 3
        heapq.heappush(self.earmarked, (tier, req.arrival, req.seq, req.session))

    def _earmarked_head(self) -> Request | None:
        heap = self.earmarked
        while heap:
            _, _, seq, s = heap[0]
            req = self._requests.get(s)
            if req is not None and req.seq == seq and req.earmark is not None:
                return req
            heapq.heappop(heap)
        return None

    def _head(self, t: TenantState, cls: int) -> QueueEntry | None:
        """The oldest of the tenant's requests of a class still waiting without a victim."""
        q = t.queues[cls]
        requests = self._requests
        while q:
            arrival, seq, s = q[0]
            req = requests.get(s)
            if req is not None and req.seq == seq and req.earmark is None and req.cls == cls:
                return q[0]
            heapq.heappop(q)
        return None


__all__ = [
    "TIER_BEST_EFFORT",
    "TIER_GUARANTEED",
    "TIER_NOMINAL",
    "TIER_SHARED",
    "EarmarkEntry",
    "ServiceOrder",
    "fair_key",
]
