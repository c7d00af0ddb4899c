"""One FIFO queue, no classes: the simplest scheduler with a queue.

Every request waits in one line, oldest arrival first (a session revoked by a drain keeps its
original place); a free slot goes to the head. Class, quota, tenant and weight are ignored, and
nothing is ever preempted, so a Guaranteed request waits behind every BestEffort one ahead of it.

It is strict priority (strict_priority.py) with every class in one lane.
"""

from __future__ import annotations

from scheduler.core.model import Request
from scheduler.sim.baselines.strict_priority import StrictPriority


class Fifo(StrictPriority):
    name = "fifo"

    def lane(self, req: Request) -> int:
        return 0  # the first lane served, whatever the class
