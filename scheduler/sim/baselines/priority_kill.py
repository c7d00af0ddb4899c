"""Strict priority with kill preemption: a higher class takes a slot from a lower one at once.

Order of service as in `strict_priority`. When no slot is free, the oldest request of the highest
waiting class kills one lease of a strictly lower class — the lowest class, then the most recently
granted (least work lost) — and takes its slot. The victim has no time to checkpoint: its work
since its grant is lost (`Revoked.lost_slot_seconds`), and it is requeued at its original place
to redo that work. One victim per waiting request; equal classes never preempt each other.
"""

from __future__ import annotations

from scheduler.core.model import LeaseRec
from scheduler.core.tenants import G
from scheduler.core.types import Decision, YieldCause
from scheduler.sim.baselines.strict_priority import StrictPriority


def victim_order(rec: LeaseRec) -> tuple[int, float, str]:
    """Lowest class first (the highest class index), then the newest grant, then the lease id
    (determinism)."""
    return (-rec.cls, -rec.lease.granted_at, rec.lease.lease_id)


class PriorityKill(StrictPriority):
    name = "priority-kill"

    def _pass(self, now: float, out: list[Decision]) -> None:
        super()._pass(now, out)
        while self.free_slots == 0:
            req = self.next_request()
            if req is None:
                return
            lower = [r for r in self.active_leases() if r.cls > req.cls]
            if not lower:
                return
            cause = YieldCause.GUARANTEED if req.cls == G else YieldCause.NOMINAL
            self.kill(min(lower, key=victim_order), cause, req.session, now, out)
            self.grant(req, now, out)
