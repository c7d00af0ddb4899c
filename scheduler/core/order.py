"""The order of service: who gets the next free slot, written once.

From docs/design.md, "Who gets the next free slot":

    The order of service, in three tiers:

    1. **Guaranteed** requests of tenants within quota (leases held plus victims already yielding
       for them below `guaranteed`), oldest first.
    2. **Burstable** requests of tenants below `nominal`, lowest `(nominal leases held + yields in
       flight for them) / nominal` first, then oldest.
    3. **Everything else that may run** (Burstable beyond nominal within `limit`, BestEffort within
       its limit): the tenant with the lowest weighted share first — `share = (borrowing leases not
       already yielding + fairness yields in flight for it) / weight` [...]. Within a tenant its
       oldest such request goes first; ties between tenants go to the oldest request.

    A waiter with a victim already yielding for it ("earmarked") takes the first slot that frees
    ahead of the waiters of its own tier and the tiers after it, so a yield is not wasted on
    someone else. Ages are the original arrival time: a session that yielded keeps its place in line.

Each tier is a heap holding, per tenant, the head of its eligible queue under the key of that
tier (`ServiceOrder.reindex`); earmarked waiters are a fourth heap, by (tier, arrival). A
tenant's entries are stamped with its version, so re-indexing it supersedes its old entries.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from scheduler.core.indexes import VersionedHeap
from scheduler.core.model import Request
from scheduler.core.records import EarmarkEntry
from scheduler.core.tenants import BE, B, G, QueueEntry, TenantState
from scheduler.core.types import SessionId

TIER_GUARANTEED, TIER_NOMINAL, TIER_SHARED = 1, 2, 3


class ServiceOrder:
    """The tiers' heaps and the earmarked waiters, over the core's requests (read, never owned)."""

    __slots__ = ("tiers", "earmarked", "dirty", "_requests", "_tenants")

    def __init__(self, tenants: dict[str, TenantState], requests: dict[SessionId, Request]) -> None:
        def current(name: str, version: int) -> bool:
            return tenants[name].version == version

        # Indexed by tier - 1.
        self.tiers = (VersionedHeap(current), VersionedHeap(current), VersionedHeap(current))
        self.earmarked: list[EarmarkEntry] = []
        # Tenants whose entries are out of date (insertion-ordered, so flushing is deterministic).
        self.dirty: dict[TenantState, None] = {}
        self._requests = requests
        self._tenants = tenants

    def flush(self) -> None:
        """Bring the heaps up to date (before reading them): each dirty tenant re-indexed once."""
        if self.dirty:
            for t in self.dirty:
                self.reindex(t)
            self.dirty.clear()

    def reindex(self, t: TenantState) -> None:
        """Push the tenant's heads under the keys of the three tiers (the rules quoted above)."""
        t.version += 1
        v = t.version
        name = t.spec.name
        n = len(self._tenants)
        spec = t.spec
        held, ear, waiting = t.held, t.earmarked, t.waiting
        g, nominal, shared_tier = self.tiers

        # 1. Guaranteed within quota (yields in flight count as held): oldest first.
        if waiting[G] > ear[G] and held[G] + ear[G] < spec.guaranteed:
            h = self._head(t, G)
            if h is not None:
                g.push((h[0], h[1], h[2], name, v), n)
        # 2. Burstable below nominal: lowest (nominal held + yields in flight) / nominal, then
        #    oldest. At or above nominal (within limit) it competes in tier 3.
        shared: QueueEntry | None = None
        if waiting[B] > ear[B] and held[B] + ear[B] < spec.burstable_limit:
            h = self._head(t, B)
            if h is not None:
                used = held[B] - t.b_borrowing + ear[B]
                if used < spec.burstable_nominal:
                    nominal.push((used / spec.burstable_nominal, h[0], h[1], h[2], name, v), n)
                else:
                    shared = h
        # 3. The rest that may run (BestEffort within its limit): lowest weighted share, counting
        #    fairness yields in flight for it; the tenant's oldest such request; ties by age.
        be_limit = spec.best_effort_limit
        if waiting[BE] > ear[BE] and (be_limit is None or held[BE] + ear[BE] < be_limit):
            h = self._head(t, BE)
            if h is not None and (shared is None or h < shared):
                shared = h
        if shared is not None:
            shared_tier.push((t.share(t.earmarked_fair), shared[0], shared[1], shared[2], name, v), n)

    def for_free_slot(self) -> Request | None:
        """The waiter the next free slot goes to: an earmarked waiter goes ahead of its own tier
        and the tiers after it; otherwise the head of the first tier with one."""
        self.flush()
        best = self._earmarked_head()
        best_key = (best.earmark_tier, 0) if best is not None else (9, 9)
        for tier, heap in enumerate(self.tiers, start=1):
            if (tier, 1) >= best_key:
                break
            top = heap.peek()
            if top is not None:
                return self._requests[top[-3]]
        return best

    def first_with_right(
        self, nominal_room: Callable[[], bool], fairness: bool
    ) -> tuple[int, Request] | None:
        """The first waiter with a right to a victim, and its tier: the head of tier 1; else of
        tier 2 if the floor has room for one more nominal lease (`nominal_room()`); else of tier 3
        if a fairness preemption is possible at all (`fairness`: a victim ran min_runtime)."""
        self.flush()
        g, nominal, shared = self.tiers
        top = g.peek()
        if top is not None:
            return TIER_GUARANTEED, self._requests[top[-3]]
        top = nominal.peek()
        if top is not None and nominal_room():
            return TIER_NOMINAL, self._requests[top[-3]]
        if not fairness:
            return None
        top = shared.peek()
        return (TIER_SHARED, self._requests[top[-3]]) if top is not None else None

    def push_earmarked(self, req: Request) -> None:
        heapq.heappush(self.earmarked, (req.earmark_tier, req.arrival, req.seq, req.session))

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


__all__ = ["TIER_GUARANTEED", "TIER_NOMINAL", "TIER_SHARED", "EarmarkEntry", "ServiceOrder"]
