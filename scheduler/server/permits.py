"""The token budgets on the event loop: the loop owns one `PermitDesk` beside the slot core
(docs/design.md, "Token budgets"). It drives the pure budget core (`scheduler/core/budget/`):
passes it the time, keeps the one timer for its `wake_at`, names the permits, tells a waiting
permit's watcher (a Channel's ref, a unary call's future) of its grant or refusal, and feeds the
metrics and the log. Domain types only: the wire is session_ops.py's.

Not journaled: a new leader's core starts every bucket empty (the window assumed spent, so it
can never overrun the provider), and a permit it never issued is charged as a debt when settled
(`Charge`). Permit ids carry this desk's incarnation, so a settle of one of its own closed
permits (PERMIT_CLOSED) is told from one of a former leader (charged).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from typing import Protocol

from scheduler.core.budget.core import Budgets
from scheduler.core.budget.feed import SessionRates
from scheduler.core.budget.types import (
    BudgetDecision,
    BudgetEvent,
    BudgetTick,
    BudgetView,
    LimitChanged,
    OwnerGone,
    PermitEnded,
    PermitGranted,
    PermitId,
    PermitQueued,
    PermitRefused,
    PermitWithdrawn,
    SettleRefused,
    SettleRefuseReason,
    Withdraw,
)
from scheduler.core.views import BudgetFeed
from scheduler.policy.model import Policy

log = logging.getLogger("slotsched.budgets")

VIEWS_EVERY_S = 0.5  # the budget gauges' freshness

#: Told a waiting permit's later decisions: a new place (a PermitQueued, when its position or
#: reason changed), then its grant, or a refusal when the policy changed.
#: A SettleRefused (NOT_OPEN) ends the wait of a permit withdrawn by its session (its end, or a
#: settle with `withdraw` while the request still waits).
Watcher = Callable[[PermitGranted | PermitRefused | PermitQueued | SettleRefused], None]


class BudgetMetrics(Protocol):
    """What the desk reports (scheduler/server/metrics.py implements it)."""

    def observe_budget(self, decision: BudgetDecision, tenant: str) -> None: ...

    def budget_views(self, views: tuple[BudgetView, ...]) -> None: ...


class PermitDesk:
    def __init__(
        self, policy: Policy, clock: Callable[[], float], metrics: BudgetMetrics | None = None
    ) -> None:
        self._clock = clock
        self.budgets = Budgets(policy, clock())
        self.metrics = metrics
        self.incarnation = secrets.token_hex(4)
        self._issued = 0
        self._watchers: dict[PermitId, Watcher] = {}
        self._tenants: dict[PermitId, str] = {}  # a waiting permit's tenant, for its metrics
        self._ending = False  # handling a session's end: its waiters are told their wait ended
        self._told: dict[PermitId, tuple[int, str]] = {}  # a waiter's last (position, reason) told
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        self.closed = False
        self._views_at = 0.0
        self.rates = SessionRates()  # what an active session spends a minute (the autoscaler's cap)
        if metrics is not None:
            metrics.budget_views(self.budgets.views())

    def new_id(self) -> PermitId:
        self._issued += 1
        return PermitId(f"{self.incarnation}.{self._issued}")

    def issued_here(self, permit: str) -> bool:
        """A permit id this desk named (open, or closed since): not a former leader's."""
        head, _, n = permit.partition(".")
        return head == self.incarnation and n.isdigit() and 0 < int(n) <= self._issued

    def handle(self, event: BudgetEvent, tenant: str = "") -> tuple[BudgetDecision, ...]:
        """Apply one event now; tell watchers and metrics; re-arm the timer."""
        now = self._clock()
        outcome = self.budgets.handle(event, now)
        self._after(outcome.decisions, outcome.wake_at, tenant, now)
        return outcome.decisions

    def watch(self, permit: PermitId, watcher: Watcher) -> Callable[[], None]:
        """Tell `watcher` of the waiting permit's new places, then its grant or refusal; the
        returned function gives up (withdraws the permit if it still waits: its caller left)."""
        self._watchers[permit] = watcher

        def cancel() -> None:
            if self._watchers.pop(permit, None) is not None and not self.closed:
                owner = self.budgets.permit_owner(permit)
                if owner is not None:
                    self.handle(Withdraw(permit, owner))

        return cancel

    def feeds(self, names: tuple[str, ...]) -> tuple[BudgetFeed, ...]:
        """The budgets `names` (a pool's) with what an active session was charged a minute
        lately, for the autoscaler's cap; a budget nobody was charged on lately is left out."""
        now = self._clock()
        views: dict[str, BudgetView] = {v.name: v for v in self.budgets.views()}
        out = []
        for name in names:
            view = views.get(name)
            rate = self.rates.per_session(name, now)
            if view is not None and rate is not None:
                out.append(BudgetFeed(name, view.limits_per_minute, rate))
        return tuple(out)

    def session_ended(self, owner: str) -> None:
        """The session is over: its waiting permits withdrawn, its open ones closed at their
        estimate (the core's OwnerGone)."""
        if owner in self.budgets.by_owner and not self.closed:
            self._ending = True
            try:
                self.handle(OwnerGone(owner))
            finally:
                self._ending = False

    def apply_policy(self, policy: Policy) -> None:
        self.rates.forget({b.name for b in policy.budgets})
        now = self._clock()
        outcome = self.budgets.apply_policy(policy, now)
        self._after(outcome.decisions, outcome.wake_at, "", now)

    def views(self) -> tuple[BudgetView, ...]:
        return self.budgets.views()

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None

    # ------------------------------------------------------------------ after each event

    def _after(
        self, decisions: tuple[BudgetDecision, ...], wake_at: float | None, tenant: str, now: float
    ) -> None:
        """Tell watchers, metrics and the log of an event's decisions (made at `now`)."""
        metrics = self.metrics
        for d in decisions:
            if type(d) is PermitEnded and not self._watchers:  # (the hot path: a settle's end)
                self._told.pop(d.permit, None)
                self.rates.observe(d.budget, d.owner, d.charged, now)
                tenant = d.tenant
            elif isinstance(d, PermitQueued):
                self._tenants[d.permit] = tenant
                self._told[d.permit] = (d.position, d.reason.value)
            elif isinstance(d, PermitGranted | PermitRefused):
                who = d.tenant if isinstance(d, PermitGranted) else self._tenants.get(d.permit, tenant)
                self._tenants.pop(d.permit, None)
                self._told.pop(d.permit, None)
                watcher = self._watchers.pop(d.permit, None)
                if metrics is not None:
                    metrics.observe_budget(d, who)
                if watcher is not None:
                    watcher(d)
                continue
            elif isinstance(d, LimitChanged):
                log.info(
                    "budget %s: effective limit %.0f%% of configured (%s)%s",
                    d.budget, d.factor * 100, d.reason.value,
                    "" if d.blocked_until is None else f", blocked {d.blocked_until - now:.1f} s",
                )  # fmt: skip
            elif isinstance(d, PermitEnded | PermitWithdrawn):
                gone = self._watchers.pop(d.permit, None)
                self._told.pop(d.permit, None)
                # A wait ends with its permit: withdrawn by its session's end or by a settle
                # (`withdraw`) while its request still waits on another call or ref. A caller
                # that left withdrew through `watch`'s cancel, which popped its watcher first.
                if gone is not None and isinstance(d, PermitWithdrawn):
                    why = "its session ended" if self._ending else "withdrawn by its session"
                    gone(SettleRefused(d.permit, SettleRefuseReason.NOT_OPEN, f"permit {d.permit!r}: {why}"))
                if isinstance(d, PermitEnded):
                    self.rates.observe(d.budget, d.owner, d.charged, now)
                tenant = self._tenants.pop(d.permit, tenant) if isinstance(d, PermitWithdrawn) else d.tenant
            if metrics is not None:
                metrics.observe_budget(d, tenant)
        if metrics is not None and decisions and now >= self._views_at:
            # The gauges' views, at most every VIEWS_EVERY_S (a scrape reads them; building
            # them per permit cost a fifth of its time).
            self._views_at = now + VIEWS_EVERY_S
            metrics.budget_views(self.budgets.views())
        if self._watchers and decisions:
            self._retell(now)
        self._arm(wake_at)

    def _retell(self, now: float) -> None:
        """Tell each watched waiter its new place when its position or reason changed since it
        was last told (as a slot's queue stream does; an estimate alone moving is not news)."""
        for q in self.budgets.positions(now):
            watcher = self._watchers.get(q.permit)
            if watcher is None:
                continue
            place = (q.position, q.reason.value)
            if self._told.get(q.permit) != place:
                self._told[q.permit] = place
                watcher(q)

    def _arm(self, wake_at: float | None) -> None:
        """One timer at the core's next wake-up; a later one leaves an earlier timer armed (it
        ticks harmlessly and re-arms)."""
        if wake_at is None or self.closed or (self._armed_at is not None and self._armed_at <= wake_at):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = wake_at
        delay = max(0.001, wake_at - self._clock() + 0.001)
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._armed_at = None
        if not self.closed:
            self.handle(BudgetTick())
