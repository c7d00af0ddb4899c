"""Strict priority without preemption: Guaranteed before Burstable before BestEffort, FIFO within.

A free slot goes to the oldest request of the highest class waiting. A lease, once granted, runs
to its end: a Guaranteed request arriving at a full pool waits for some lease to end, however long
that takes (an agent session can hold a slot for many minutes). Tenants, quotas and weights are
ignored, so one tenant's flood of high-class work starves everyone's lower classes.
"""

from __future__ import annotations

from scheduler.core.types import Decision
from scheduler.policy.model import Policy
from scheduler.sim.baselines.common import Baseline, Lanes, Request


class StrictPriority(Baseline):
    name = "strict-priority"

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.lanes: Lanes[int] = Lanes(self.waiting)

    def _admit(self, req: Request, now: float, out: list[Decision]) -> None:
        self.wait(req)
        self.lanes.push(-req.priority, (req.arrival,), req)

    def next_request(self) -> Request | None:
        for lane in (-2, -1, 0):
            req = self.lanes.head(lane)
            if req is not None:
                return req
        return None

    def _schedule(self, now: float, out: list[Decision]) -> None:
        while self.free_slots > 0:
            req = self.next_request()
            if req is None:
                return
            self.grant(req, now, out)
