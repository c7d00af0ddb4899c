"""slotsched's budgets as a budget-run limiter: the very core the server runs
(`scheduler/core/budget`, `Budgets`), driven in virtual time. A ready call asks for a permit with
its estimate (input tokens known, output bounded by its max tokens); a grant sends it; the call
settles its permit with the usage the provider reported and the limit its headers stated (the
core adopts it: no 429 needed to learn a limit below the configured one); a 429 settles it as
throttled with the provider's retry-after (the core lowers the budget's effective limit and
grants nothing until the retry-after passes) and the call asks for a new permit at once, in its
place by class and share.
"""

from __future__ import annotations

from scheduler.core.budget.core import Budgets
from scheduler.core.budget.types import (
    BudgetName,
    BudgetTick,
    LimitChanged,
    PermitGranted,
    PermitId,
    PermitRefused,
    PermitRequest,
    Settle,
    Usage,
)
from scheduler.core.types import TenantName
from scheduler.policy.model import Policy
from scheduler.sim.budget.engine import BudgetSim, CallRun

_QOS = ("guaranteed", "burstable", "besteffort")


class Slotsched:
    name = "slotsched"

    def __init__(self, policy: Policy, budget: str) -> None:
        self.policy = policy
        self.budget = BudgetName(budget)
        self.sim: BudgetSim | None = None
        self.open: dict[PermitId, CallRun] = {}
        self.wake_armed: float | None = None
        self.refused: list[PermitRefused] = []
        self.limit_changes: list[tuple[float, LimitChanged]] = []
        self.n = 0

    def start(self, sim: BudgetSim) -> None:
        self.sim = sim
        # A leader starts with every bucket empty: the provider's window assumed spent.
        self.core = Budgets(self.policy, 0.0)

    def _apply(self, event: PermitRequest | Settle | BudgetTick, now: float) -> None:
        assert self.sim is not None
        outcome = self.core.handle(event, now)
        granted: list[CallRun] = []
        for d in outcome.decisions:
            if isinstance(d, PermitGranted):
                granted.append(self.open[d.permit])
            elif isinstance(d, PermitRefused):
                # Never on a sample whose policy gives every tenant a share: counted, and the call
                # goes unlimited (so a run with a policy error still ends, and shows it).
                self.refused.append(d)
                granted.append(self.open[d.permit])
            elif isinstance(d, LimitChanged):
                self.limit_changes.append((now, d))
        if outcome.wake_at is not None and (self.wake_armed is None or outcome.wake_at < self.wake_armed):
            self.wake_armed = max(now, outcome.wake_at)
            self.sim.wake_at(self.wake_armed)
        for c in granted:
            self.sim.send(c, now)

    def request(self, c: CallRun, now: float) -> None:
        s = c.session
        self.n += 1
        permit = PermitId(f"{s.plan.session_id}/{c.index}/{self.n}")
        c.handle = permit
        self.open[permit] = c
        est = Usage(c.estimate[1], c.estimate[2], 1.0)
        self._apply(
            PermitRequest(permit, s.plan.session_id, TenantName(s.plan.tenant), self.budget, s.plan.qos, est),
            now,
        )

    def throttled(self, c: CallRun, retry_after_s: float, now: float) -> None:
        assert isinstance(c.handle, str)
        permit = PermitId(c.handle)
        self.open.pop(permit, None)
        assert self.sim is not None
        nothing = Usage(0.0, 0.0, 0.0)
        self._apply(Settle(permit, c.session.plan.session_id, nothing, retry_after_s, self.sim.stated()), now)
        self.request(c, now)

    def done(self, c: CallRun, now: float) -> None:
        assert isinstance(c.handle, str)
        permit = PermitId(c.handle)
        self.open.pop(permit, None)
        used = Usage(float(c.call.input_tokens), float(c.call.output_tokens), 1.0)
        assert self.sim is not None
        self._apply(Settle(permit, c.session.plan.session_id, used, reported=self.sim.stated()), now)

    def wake(self, now: float) -> None:
        if self.wake_armed is None or now < self.wake_armed - 1e-9:
            return
        self.wake_armed = None
        self._apply(BudgetTick(), now)

    def effective_per_min(self) -> float:
        assert self.sim is not None
        for v in self.core.views():
            if v.name == self.budget:
                return v.limits_per_minute[self.sim.dim]
        return 0.0


__all__ = ["Slotsched", "_QOS"]
