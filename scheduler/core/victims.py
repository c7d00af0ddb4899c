"""Which lease yields for a waiter: the victim order, written once (`victim_order`), and the
fairness rule (`less_than_or_equal_to_final_share`). Modelled on Kueue's
pkg/scheduler/preemption/common/ordering.go: one ordering documented by its rule list.

The heaps here are built from `victim_order`: rule 1 is structural (one heap per class, BestEffort
read first), rules 2–3 are the key of a tenant's entry (`tenant_key`), and rule 4 is the order
of the tenant's candidates (kept in grant order, so the newest is the last).
"""

from __future__ import annotations

from scheduler.core.indexes import VersionedHeap
from scheduler.core.model import LeaseRec
from scheduler.core.tenants import BE, B, TenantState, share_at_most
from scheduler.core.types import LeaseId


def victim_order(cls: int, tenant: TenantState, grant_seq: int) -> tuple[int, float, str, int]:
    """The sort key of a preemption candidate (a BestEffort or borrowing Burstable lease, active,
    on a ready worker); the smallest key is asked to yield first:

    1. BestEffort before borrowing Burstable (a Guaranteed or nominal lease is never a victim);
    2. then the tenant furthest above its share (highest weighted share, `TenantState.share`);
    3. ties in share by tenant name, so the order is total and deterministic;
    4. then the lease that loses least work: the newest grant (a session granted after a yield
       resumes from the snapshot it yielded with, so its grant is its last checkpoint).

    A fairness preemption further takes only leases that ran min_runtime, never one of the
    requester's tenant, never a Burstable lease of a tenant below its nominal
    (`fair_burstable_victims`), and only if `less_than_or_equal_to_final_share` holds.
    """
    return (0 if cls == BE else 1, -tenant.share(), tenant.name, -grant_seq)


def tenant_key(cls: int, tenant: TenantState) -> tuple[float, str]:
    """Rules 2–3 of `victim_order`: the key of a tenant's entry in a class's victim heap."""
    _, neg_share, name, _ = victim_order(cls, tenant, 0)
    return neg_share, name


def less_than_or_equal_to_final_share(requester: TenantState, victims: TenantState) -> bool:
    """May `requester` take a slot from a lease of `victims` for fairness (Kueue's
    LessThanOrEqualToFinalShare)? Only if its share after taking the slot (counting the fairness
    yields already in flight for it) is no larger than the victims' tenant's after losing it."""
    return share_at_most(
        requester.borrowed_effective() + requester.earmarked_fair + 1,
        requester.spec.weight,
        victims.borrowed_effective() - 1,
        victims.spec.weight,
    )


def fair_burstable_victims(t: TenantState) -> bool:
    """May a fairness preemption take one of `t`'s (borrowing) Burstable leases? Not while `t`
    holds fewer nominal leases than its nominal: such a lease is a borrowed floor lease, and its
    holder, re-queued, would be a tier-2 waiter (below nominal), served before any tier-3 waiter:
    it would take its slot straight back, a revoke for no one. Only Guaranteed and nominal rights
    reclaim it (tiers 1-2, which go ahead of it)."""
    return t.b_nominal_held() >= t.spec.burstable_nominal


def may_take(requester: TenantState, rec: LeaseRec, fairness: bool) -> bool:
    """The rules of `VictimIndex.any_victim` / `fair_victim` for one lease."""
    t, lid = rec.tenant, rec.lease.lease_id
    if lid not in t.candidates[rec.cls]:
        return False
    if not fairness:
        return True
    return (
        t is not requester
        and lid in t.mature[rec.cls]
        and (rec.cls != B or fair_burstable_victims(t))
        and less_than_or_equal_to_final_share(requester, t)
    )


def insert_in_grant_order(d: dict[LeaseId, float], rec: LeaseRec, leases: dict[LeaseId, LeaseRec]) -> None:
    """Put `rec` back among a tenant's candidates (`d`, kept in grant order: rule 4 of
    `victim_order` reads the newest last), as when its yield is cancelled."""
    lid = rec.lease.lease_id
    if d:
        last = next(reversed(d))
        if leases[last].gseq > rec.gseq:
            # The tenant was granted leases of this class since: rebuild the dict in grant
            # order (linear in them, and only when a yield is cancelled).
            items = list(d.items())
            i = len(items)
            while i > 0 and leases[items[i - 1][0]].gseq > rec.gseq:
                i -= 1
            items.insert(i, (lid, rec.lease.granted_at))
            d.clear()
            d.update(items)
            return
    d[lid] = rec.lease.granted_at


class VictimIndex:
    """Tenants as sources of victims, per class: any candidate, and mature ones (fairness)."""

    __slots__ = ("any", "mature", "dirty", "_tenants", "_leases")

    def __init__(self, tenants: dict[str, TenantState], leases: dict[LeaseId, LeaseRec]) -> None:
        def current(name: str, version: int) -> bool:
            return tenants[name].vversion == version

        # (BestEffort, Burstable): rule 1 of `victim_order`.
        self.any = (VersionedHeap(current), VersionedHeap(current))
        self.mature = (VersionedHeap(current), VersionedHeap(current))
        # Tenants whose entries are out of date (insertion-ordered, so flushing is deterministic).
        self.dirty: dict[TenantState, None] = {}
        self._tenants = tenants
        self._leases = leases

    def flush(self) -> None:
        """Bring the heaps up to date; only a preemption reads them, and most passes end before
        one is possible, so this is done on demand."""
        if self.dirty:
            for t in self.dirty:
                self._reindex(t)
            self.dirty.clear()

    def _reindex(self, t: TenantState) -> None:
        t.vversion += 1
        v = t.vversion
        n = len(self._tenants)
        if t.candidates[BE] or t.mature[BE]:
            key = (*tenant_key(BE, t), v)
            if t.candidates[BE]:
                self.any[0].push(key, n)
            if t.mature[BE]:
                self.mature[0].push(key, n)
        if t.borrowed_b_effective() > 0 and (t.candidates[B] or t.mature[B]):
            key = (*tenant_key(B, t), v)
            if t.candidates[B]:
                self.any[1].push(key, n)
            if t.mature[B] and fair_burstable_victims(t):
                self.mature[1].push(key, n)

    def any_victim(self) -> LeaseRec | None:
        """The first candidate in `victim_order` (for a Guaranteed or nominal right)."""
        self.flush()
        for cls, heap in ((BE, self.any[0]), (B, self.any[1])):
            top = heap.peek()
            if top is not None:
                t = self._tenants[top[-2]]
                return self._leases[next(reversed(t.candidates[cls]))]
        return None

    def fair_victim(self, a: TenantState) -> LeaseRec | None:
        """The first mature candidate of another tenant in `victim_order`, if `a` may take it
        (`less_than_or_equal_to_final_share`). Checking the top tenant of a class suffices: the
        others have lower shares."""
        self.flush()
        for cls, heap in ((BE, self.mature[0]), (B, self.mature[1])):
            top = heap.peek()
            if top is not None and top[-2] == a.name:
                own = heap.pop_current()  # never the requester's own lease: look one below
                top = heap.peek()
                heap.push_back([own] if own is not None else [])
            if top is None:
                continue
            t = self._tenants[top[-2]]
            if less_than_or_equal_to_final_share(a, t):
                return self._leases[next(reversed(t.mature[cls]))]
        return None


__all__ = [
    "VictimIndex",
    "fair_burstable_victims",
    "insert_in_grant_order",
    "less_than_or_equal_to_final_share",
    "may_take",
    "tenant_key",
    "victim_order",
]
