"""Reject-and-retry: what agent runtimes do today — no queue; when the pool is full, refuse.

A request gets a free slot at once or is refused ("worker pool has no free workers"). The queue
then lives in the clients: run with `SimConfig(retry_refused=True)`, each refused holder retries
after a seeded uniform 1.5–3 s jitter, and whichever retry lands on a free slot wins — there is no
order of service at all, so the client that retries hardest (or luckiest) wins. A session revoked
or drained comes back the same way. Classes, quotas and weights are ignored.
"""

from __future__ import annotations

from scheduler.core.model import Request
from scheduler.core.types import Decision, Refused, RefuseReason
from scheduler.sim.baselines.common import Baseline


class RejectRetry(Baseline):
    name = "reject-retry"

    def _admit(self, req: Request, now: float, out: list[Decision]) -> None:
        if self.free_slots > 0:
            self.grant(req, now, out)
        else:
            out.append(Refused(req.session, RefuseReason.QUEUE_FULL, "worker pool has no free workers"))

    def _pass(self, now: float, out: list[Decision]) -> None:
        return  # nothing waits: a freed slot stays free until some retry lands on it
