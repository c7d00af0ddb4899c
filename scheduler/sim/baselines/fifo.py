"""One FIFO queue, no classes: the simplest scheduler with a queue.

Every request waits in one line, oldest arrival first (a session revoked by a drain keeps its
original place); a free slot goes to the head. Class, quota, tenant and weight are ignored, and
nothing is ever preempted, so a Guaranteed request waits behind every BestEffort one ahead of it.
"""

from __future__ import annotations

from scheduler.core.types import Decision
from scheduler.policy.model import Policy
from scheduler.sim.baselines.common import Baseline, Lanes, Request


class Fifo(Baseline):
    name = "fifo"

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.lanes: Lanes[int] = Lanes(self.waiting)

    def _admit(self, req: Request, now: float, out: list[Decision]) -> None:
        self.wait(req)
        self.lanes.push(0, (req.arrival,), req)

    def _schedule(self, now: float, out: list[Decision]) -> None:
        while self.free_slots > 0:
            req = self.lanes.head(0)
            if req is None:
                return
            self.grant(req, now, out)
