"""Which lease yields for a waiter: the victim order, written once (`victim_order`), and the
fairness rule (`less_than_or_equal_to_final_share`). Modelled on Kueue's
pkg/scheduler/preemption/common/ordering.go: one ordering documented by its rule list.

The heaps here are built from `victim_order`: rule 1 is structural (one heap per class, BestEffort
read first), rules 2-4 are the key of a tenant's entry (`tenant_key`), and rule 5 is the order
of the tenant's pick heap (`session_key`).
"""

from __future__ import annotations

import heapq

from scheduler.core.indexes import Entry, VersionedHeap
from scheduler.core.model import LeaseRec
from scheduler.core.tenants import BE, B, TenantState, share_at_most
from scheduler.core.types import LeaseId

# A tenant's candidate in its pick heap: (never preempted 0 / preempted before 1, key, lease).
PickEntry = tuple[int, int, LeaseId]


def session_key(rec: LeaseRec) -> PickEntry:
    """Rule 5 of `victim_order`: among one tenant's candidates, a session never preempted before
    first, the newest grant of those (least work lost: a session granted after a yield resumes
    from the snapshot it yielded with, so its grant is its last checkpoint); then sessions
    preempted before, the least recently preempted first. So no session is checkpointed over
    and over while its tenant has others."""
    lid = rec.lease.lease_id
    return (0, -rec.gseq, lid) if rec.preempted == 0 else (1, rec.preempted, lid)


def victim_order(cls: int, tenant: TenantState, rec: LeaseRec) -> tuple[int, float, int, str, PickEntry]:
    """The sort key of a preemption candidate (a BestEffort or borrowing Burstable lease, active,
    on a ready worker); the smallest key is asked to yield first:

    1. BestEffort before borrowing Burstable (a Guaranteed or nominal lease is never a victim);
    2. then the tenant furthest above its share (highest weighted share, `TenantState.share`,
       which counts recent usage when spec.fairness has a half-life);
    3. ties in share: the tenant least recently preempted (never first), spreading yields over
       tenants;
    4. then by tenant name, so the order is total and deterministic;
    5. within the tenant, `session_key`.

    A victim is never a lease of the requester's own tenant (a yield for its own waiter is a
    checkpoint spent for nothing). A fairness preemption further takes only leases that ran
    min_runtime, never a Burstable lease of a tenant below its nominal
    (`fair_burstable_victims`), and only if `less_than_or_equal_to_final_share` holds.
    """
    return (0 if cls == BE else 1, -tenant.share(), tenant.last_preempted, tenant.name, session_key(rec))


def tenant_key(tenant: TenantState) -> tuple[float, int, str]:
    """Rules 2-4 of `victim_order`: the key of a tenant's entry in a class's victim heap."""
    return -tenant.share(), tenant.last_preempted, tenant.name


def less_than_or_equal_to_final_share(
    requester: TenantState, victims: TenantState, margin: float = 0.0
) -> bool:
    """May `requester` take a slot from a lease of `victims` for fairness (Kueue's
    LessThanOrEqualToFinalShare)? Only if its share after taking the slot (counting the fairness
    yields already in flight for it) is no larger than the victims' tenant's after losing it.
    With a usage half-life the shares count recent usage in slots (usage / min runtime), so a
    tenant below one slot of share still rotates: it may take the slot once the victims' tenant
    has used at least one min runtime of a slot more than it has, recently.

    `margin` (`VictimIndex.margin`: 1 with a usage half-life, else 0) is what the requester's
    usage grows by while it holds the slot for one min runtime: the requester's share must stay
    no larger than the victims' also then. Without it two tenants at their fair split take the
    slot back and forth, each as soon as the other's usage has grown past its own (a checkpoint
    and a restore each time, for nothing); with it a preemption leaves the requester below the
    victims' tenant by at least one min runtime of a slot, so the victims' tenant has no right
    to take it straight back. And with usage counted, the requester must hold (counting yields
    in flight for it) less than the victims' tenant now, by weight: recent usage decides which of
    two tenants a slot apart holds it (the rotation when tenants outnumber slots), but never
    lets a tenant that had little take more than the other holds, to pay back what the other
    used before (the other would take it back once its own usage fell behind: a checkpoint
    each way)."""
    r_held, r_weight = requester.borrowed_effective() + requester.earmarked_fair, requester.spec.weight
    v_held, v_weight = victims.borrowed_effective(), victims.spec.weight
    if margin > 0 and r_held * v_weight >= v_held * r_weight:
        return False
    return share_at_most(
        r_held + 1 + requester.usage_slots + margin, r_weight, v_held - 1 + victims.usage_slots, v_weight
    )


def fair_burstable_victims(t: TenantState) -> bool:
    """May a fairness preemption take one of `t`'s (borrowing) Burstable leases? Not while `t`
    holds fewer nominal leases than its nominal: such a lease is a borrowed floor lease, and its
    holder, re-queued, would be a tier-2 waiter (below nominal), served before any tier-3 waiter:
    it would take its slot straight back, a revoke for no one. Only Guaranteed and nominal rights
    reclaim it (tiers 1-2, which go ahead of it)."""
    return t.b_nominal_held() >= t.spec.burstable_nominal


def may_take(
    requester: TenantState, rec: LeaseRec, fairness: bool, burstable: bool = True, margin: float = 0.0
) -> bool:
    """The rules of `VictimIndex.any_victim` / `fair_victim` for one lease (`burstable`: the
    requester may take a borrowing Burstable lease, see `fair_victim`; `margin`: the index's)."""
    t, lid = rec.tenant, rec.lease.lease_id
    if t is requester or lid not in t.candidates[rec.cls]:
        return False
    if not fairness:
        return True
    return (
        lid in t.mature[rec.cls]
        and (rec.cls != B or (burstable and fair_burstable_victims(t)))
        and less_than_or_equal_to_final_share(requester, t, margin)
    )


def add_candidate(rec: LeaseRec, leases: dict[LeaseId, LeaseRec], mature: bool = False) -> None:
    """Make `rec` a candidate of its tenant (`mature`: a mature one), in both its dict (kept in
    grant order: `insert_in_grant_order`) and its pick heap. (A lease just granted is only put
    last in its dict, `Core._grant`: `first_pick` pushes it when the heap is next read.)"""
    t, cls = rec.tenant, rec.cls
    d = t.mature[cls] if mature else t.candidates[cls]
    heap = t.mpick[cls] if mature else t.pick[cls]
    insert_in_grant_order(d, rec, leases)
    heapq.heappush(heap, session_key(rec))
    if len(heap) > 2 * len(d) + 32:  # mostly entries of leases gone: rebuild from the dict
        heap[:] = [session_key(leases[lid]) for lid in d]
        heapq.heapify(heap)


def first_pick(
    d: dict[LeaseId, float],
    heap: list[PickEntry],
    leases: dict[LeaseId, LeaseRec],
    pushed: list[int] | None = None,
    cls: int = 0,
) -> LeaseId | None:
    """The tenant's first candidate in `session_key` order (entries whose lease left `d`, or
    whose key changed since, as when its session was asked to yield, are dropped as they
    surface).

    `pushed[cls]`: the grant seq up to which `d`'s leases have their entry in `heap`. Leases
    granted since are last in `d` (grant order) and pushed here first: a grant's entry would
    sift to the top of the heap (the newest grant goes first) on every grant, for a heap read
    only by a preemption. A lease's key does not change while it is in `d`."""
    if pushed is not None and d:
        newest = leases[next(reversed(d))].gseq
        if newest > pushed[cls]:
            for lid in reversed(d):
                rec = leases[lid]
                if rec.gseq <= pushed[cls]:
                    break
                heapq.heappush(heap, session_key(rec))
            pushed[cls] = newest
            if len(heap) > 2 * len(d) + 32:  # mostly entries of leases gone: rebuild
                heap[:] = [session_key(leases[lid]) for lid in d]
                heapq.heapify(heap)
    while heap:
        top = heap[0]
        lid = top[2]
        if lid in d and top == session_key(leases[lid]):
            return lid
        heapq.heappop(heap)
    return None


def insert_in_grant_order(d: dict[LeaseId, float], rec: LeaseRec, leases: dict[LeaseId, LeaseRec]) -> None:
    """Put `rec` among a tenant's candidates (`d`, kept in grant order: promotion takes the
    oldest, and a restored core rebuilds them in that order), as when its yield is cancelled."""
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

    __slots__ = ("any", "mature", "dirty", "margin", "_tenants", "_leases")

    def __init__(self, tenants: dict[str, TenantState], leases: dict[LeaseId, LeaseRec]) -> None:
        def current(name: str, version: int) -> bool:
            return tenants[name].vversion == version

        # (BestEffort, Burstable): rule 1 of `victim_order`.
        self.any = (VersionedHeap(current), VersionedHeap(current))
        self.mature = (VersionedHeap(current), VersionedHeap(current))
        # Tenants whose entries are out of date (insertion-ordered, so flushing is deterministic).
        self.dirty: dict[TenantState, None] = {}
        # The no-ping-pong margin of `less_than_or_equal_to_final_share`, in slots of one min
        # runtime: 1 while shares count recent usage (spec.fairness.usageHalfLifeSeconds > 0),
        # else 0 (an instantaneous share does not grow while the slot is held). The ledger sets it.
        self.margin = 0.0
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
            key = (*tenant_key(t), v)
            if t.candidates[BE]:
                self.any[0].push(key, n)
            if t.mature[BE]:
                self.mature[0].push(key, n)
        if t.borrowed_b_effective() > 0 and (t.candidates[B] or t.mature[B]):
            key = (*tenant_key(t), v)
            if t.candidates[B]:
                self.any[1].push(key, n)
            if t.mature[B] and fair_burstable_victims(t):
                self.mature[1].push(key, n)

    def any_victim(self, a: TenantState) -> LeaseRec | None:
        """The first candidate in `victim_order` of a tenant other than `a` (for a Guaranteed or
        nominal right)."""
        self.flush()
        for cls, heap in ((BE, self.any[0]), (B, self.any[1])):
            top = _top_other(heap, a)
            if top is not None:
                t = self._tenants[top[-2]]
                return self._pick(t, cls, mature=False)
        return None

    def fair_victim(self, a: TenantState, burstable: bool = True) -> LeaseRec | None:
        """The first mature candidate of another tenant in `victim_order`, if `a` may take it
        (`less_than_or_equal_to_final_share`); a borrowing Burstable one only if `burstable` (a
        BestEffort waiter takes Burstable work only while BestEffort is below its minimum share).
        Checking the top tenant of a class suffices: the others have lower shares."""
        self.flush()
        for cls, heap in ((BE, self.mature[0]), (B, self.mature[1])):
            if cls == B and not burstable:
                break
            top = _top_other(heap, a)
            if top is None:
                continue
            t = self._tenants[top[-2]]
            if less_than_or_equal_to_final_share(a, t, self.margin):
                return self._pick(t, cls, mature=True)
        return None

    def _pick(self, t: TenantState, cls: int, mature: bool) -> LeaseRec:
        if mature:
            lid = first_pick(t.mature[cls], t.mpick[cls], self._leases)
        else:
            lid = first_pick(t.candidates[cls], t.pick[cls], self._leases, t.pushed, cls)
        assert lid is not None  # the tenant has an entry in the heap only with candidates
        return self._leases[lid]


def _top_other(heap: VersionedHeap, a: TenantState) -> Entry | None:
    """The top entry of `heap` that is not `a`'s (never the requester's own lease: look one
    below)."""
    top = heap.peek()
    if top is not None and top[-2] == a.name:
        own = heap.pop_current()
        top = heap.peek()
        heap.push_back([own] if own is not None else [])
    return top


__all__ = [
    "PickEntry",
    "VictimIndex",
    "add_candidate",
    "first_pick",
    "session_key",
    "fair_burstable_victims",
    "insert_in_grant_order",
    "less_than_or_equal_to_final_share",
    "may_take",
    "tenant_key",
    "victim_order",
]
