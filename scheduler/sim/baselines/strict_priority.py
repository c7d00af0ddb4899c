"""Strict priority without preemption: Guaranteed before Burstable before BestEffort, FIFO within.

A free slot goes to the oldest request of the highest class waiting. A lease, once granted, runs
to its end: a Guaranteed request arriving at a full pool waits for some lease to end, however long
that takes (an agent session can hold a slot for many minutes). Tenants, quotas and weights are
ignored, so one tenant's flood of high-class work starves everyone's lower classes.
"""

from __future__ import annotations

from scheduler.core.model import Request
from scheduler.core.tenants import BE, B, G
from scheduler.core.types import Decision
from scheduler.policy.model import Policy
from scheduler.sim.baselines.common import Baseline, Lanes


class StrictPriority(Baseline):
    name = "strict-priority"

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.lanes: Lanes[int] = Lanes(self.waiting)

    def lane(self, req: Request) -> int:
        """One lane per class, served in class order (G, B, BE: lanes 0, 1, 2)."""
        return req.cls

    def _admit(self, req: Request, now: float, out: list[Decision]) -> None:
        self.wait(req)
        self.lanes.push(self.lane(req), (req.arrival,), req)

    def next_request(self) -> Request | None:
        for lane in (G, B, BE):
            req = self.lanes.head(lane)
            if req is not None:
                return req
        return None

    def _pass(self, now: float, out: list[Decision]) -> None:
        while self.free_slots > 0:
            req = self.next_request()
            if req is None:
                return
            self.grant(req, now, out)
