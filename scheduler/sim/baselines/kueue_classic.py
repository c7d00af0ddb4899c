"""Kueue-style classic preemption: quota-aware admission, evictions without checkpoint.

Modelled on Kueue's ClusterQueue/cohort semantics with the usual classic-preemption settings
(`withinClusterQueue: LowerPriority`, `reclaimWithinCohort: Any`, `BestEffortFIFO`):

- Each tenant is a ClusterQueue in one cohort spanning the pool. Its nominal quota is its
  Guaranteed quota plus its Burstable nominal from the policy; beyond that it borrows idle slots.
  Class is a WorkloadPriorityClass: Guaranteed 2 > Burstable 1 > BestEffort 0.
- Each queue's head is its highest-priority, oldest request. Heads that fit in their queue's
  nominal quota go first, then by priority, then by arrival.
- With no free slot, a head may evict one victim: a lower-priority workload of its own queue, or —
  if the head fits in its nominal quota — any workload of another queue that is borrowing.
  Victims are ordered as Kueue orders candidates (`preemption/common/ordering.go`): other queues
  before one's own, lowest priority, most recently admitted, then id.
- Eviction is a kill: no checkpoint, the work since admission is lost, the victim is requeued at
  its original place. Unlike slotsched, a Guaranteed workload of a borrowing tenant can be a
  victim: Kueue's priority is a label inside a queue, not a contract across queues.
"""

from __future__ import annotations

from scheduler.core.model import LeaseRec, Request
from scheduler.core.tenants import TenantState
from scheduler.core.types import Decision, YieldCause
from scheduler.policy.model import Policy
from scheduler.sim.baselines.common import Baseline, Lanes


def nominal(t: TenantState) -> int:
    """A ClusterQueue's nominal quota: the tenant's Guaranteed quota plus its Burstable nominal."""
    return t.spec.guaranteed + t.spec.burstable_nominal


class KueueClassic(Baseline):
    name = "kueue-classic"

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.lanes: Lanes[TenantState] = Lanes(self.waiting)

    def _admit(self, req: Request, now: float, out: list[Decision]) -> None:
        self.wait(req)
        self.lanes.push(req.tenant, (req.cls, req.arrival), req)  # the class index: G first

    def fits_nominal(self, t: TenantState) -> bool:
        return sum(t.held) + 1 <= nominal(t)

    def _heads(self) -> list[Request]:
        heads = [req for _, req in self.lanes.heads()]
        return sorted(heads, key=lambda r: (not self.fits_nominal(r.tenant), r.cls, r.arrival, r.seq))

    def _victim(self, req: Request) -> LeaseRec | None:
        own = req.tenant
        reclaim = self.fits_nominal(own)
        best: LeaseRec | None = None
        best_key: tuple[bool, int, float, str] | None = None
        for rec in self.active_leases():
            t = rec.tenant
            # Within its own queue a lower priority; another queue's only if borrowing, to reclaim.
            if (rec.cls > req.cls) if t is own else (reclaim and sum(t.held) > nominal(t)):
                key = (t is own, -rec.cls, -rec.lease.granted_at, rec.lease.lease_id)
                if best_key is None or key < best_key:
                    best, best_key = rec, key
        return best

    def _pass(self, now: float, out: list[Decision]) -> None:
        while self.waiting:
            heads = self._heads()
            if not heads:
                return
            if self.free_slots > 0:
                self.grant(heads[0], now, out)
                continue
            for req in heads:
                victim = self._victim(req)
                if victim is not None:
                    cause = YieldCause.NOMINAL if self.fits_nominal(req.tenant) else YieldCause.FAIR_SHARE
                    self.kill(victim, cause, req.session, now, out)
                    self.grant(req, now, out)
                    break
            else:
                return
