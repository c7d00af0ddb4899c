"""Invariants of the budget core under random load (hypothesis), driven as the shell drives it:
events at increasing times, and a BudgetTick at every wake-up the core asks for.

* the fleet never sends more than the provider would admit: in each dimension, what the permits
  have cost so far (granted estimates, less refunds, plus charges above them) plus what the
  buckets hold never exceeds the limit times the time since the start (a new core starts empty);
* Guaranteed within its reserved rate is granted within one refill of its estimate, whatever
  the others do;
* no permit is lost: each request is granted, queued or refused at once, and each queued permit
  is in the end granted or withdrawn;
* no grant while the provider's retry-after runs, and the effective limit stays within
  [minimum, 1] of the configured one;
* the same events give the same decisions.
"""

from __future__ import annotations

import math
from typing import Any

from budget_script import B, E, G, event, policy, summary
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.budget.core import Budgets
from scheduler.core.budget.types import (
    BudgetDecision,
    BudgetTick,
    LimitChanged,
    PermitEnded,
    PermitGranted,
    PermitQueued,
    PermitRefused,
    PermitWithdrawn,
)

LIMIT_PER_S = 100.0  # budget_script's policy: 6,000 tokens and 6,000 requests a minute
G_RATE = 10.0  # g reserves 10%

# An op: (kind, dt, tenant/class choice, a, b, pick)
ops = st.lists(
    st.tuples(
        st.sampled_from(["req", "req", "req", "settle", "settle", "withdraw", "tick"]),
        st.floats(0, 20),
        st.integers(0, 4),
        st.integers(0, 3000),
        st.integers(0, 800),
        st.integers(0, 10**6),
        st.floats(0, 2.5),
    ),
    max_size=60,
)
WHO = [("b", B), ("c", B), ("b", E), ("e", E), ("c", E)]


class Driver:
    """Runs ops like the shell: ticks at the wake-ups asked for, tracks permits by state."""

    def __init__(self, throttles: bool = False, **keys: Any) -> None:
        self.core = Budgets(policy(**keys), 0.0)
        self.now = 0.0
        self.wake: float | None = None
        self.n = 0
        self.throttles = throttles
        self.waiting: dict[str, Any] = {}
        self.open: dict[str, Any] = {}
        self.log: list[tuple[float, BudgetDecision]] = []
        self.asked: list[str] = []

    def at(self, now: float, ev: Any) -> list[BudgetDecision]:
        # The shell's one timer: a wake-up due before this event fires first.
        while self.wake is not None and self.wake <= now:
            self._apply(self.wake, BudgetTick())
        return self._apply(now, ev)

    def _apply(self, now: float, ev: Any) -> list[BudgetDecision]:
        assert now >= self.now
        self.now = now
        out = self.core.handle(ev, now)
        assert out.wake_at is None or out.wake_at > now, (ev, now, out.wake_at)
        self.wake = out.wake_at
        for d in out.decisions:
            self.log.append((now, d))
            if isinstance(d, PermitQueued):
                self.waiting[d.permit] = d
            elif isinstance(d, PermitGranted):
                self.waiting.pop(d.permit, None)
                self.open[d.permit] = d
            elif isinstance(d, PermitEnded):
                self.open.pop(d.permit)
            elif isinstance(d, PermitWithdrawn | PermitRefused):
                self.waiting.pop(d.permit, None)
        self.check_rate()
        return list(out.decisions)

    def step(self, op: tuple[Any, ...]) -> None:
        kind, dt, who, a, b, pick, f = op
        now = self.now + dt
        if kind == "req":
            self.n += 1
            pid = f"p{self.n}"
            tenant, qos = WHO[who]
            self.asked.append(pid)
            out = self.at(now, event(("req", now, pid, tenant, qos, a, b)))
            mine = [summary(d)[0] for d in out if getattr(d, "permit", None) == pid]
            assert len(mine) == 1 and mine[0] in ("granted", "queued", "refused"), (pid, out)
        elif kind == "settle" and (mine := sorted(p for p in self.open if p.startswith("p"))):
            pid = mine[pick % len(mine)]
            g = self.open[pid]
            retry = (f * 10) if self.throttles and pick % 3 == 0 else None
            usage = (g.estimate.input_tokens * f, g.estimate.output_tokens * f)
            self.at(now, event(("settle", now, pid, *usage, retry)))
        elif kind == "withdraw" and (mine := sorted(p for p in self.waiting if p.startswith("p"))):
            pid = mine[pick % len(mine)]
            self.at(now, event(("withdraw", now, pid)))
        else:
            self.at(now, BudgetTick())

    def check_rate(self) -> None:
        """Cost so far + tokens held <= limit x time, per dimension (no throttle in play)."""
        if self.throttles:
            return
        book = self.core.books["llm"]
        for d in book.on:
            held = book.shared.tokens[d] + sum(s.leaf.tokens[d] for s in book.shares.values() if s.leaf)
            cost = 0.0
            for _, x in self.log:
                if isinstance(x, PermitGranted):
                    cost += x.estimate.vector()[d]
                elif isinstance(x, PermitEnded):
                    cost -= x.refunded[d]
            assert cost + held <= LIMIT_PER_S * self.now * (1 + 1e-9) + 1e-6, (d, cost, held, self.now)

    def drain(self) -> None:
        """Settle everything open at its estimate, until nobody waits."""
        for _ in range(1000):
            if not self.waiting:
                return
            if self.open:
                pid = sorted(self.open)[0]
                e = self.open[pid].estimate
                self.at(self.now, event(("settle", self.now, pid, e.input_tokens, e.output_tokens)))
            self.at(max(self.now + 1.0, self.wake or 0.0), BudgetTick())
        raise AssertionError(f"permits still waiting: {sorted(self.waiting)}")


@settings(max_examples=150, deadline=None)
@given(ops)
def test_the_fleet_never_sends_more_than_the_limit_and_no_permit_is_lost(
    script: list[tuple[Any, ...]],
) -> None:
    drv = Driver()
    for op in script:
        drv.step(op)
    drv.drain()
    decided: dict[str, list[str]] = {}
    for _, d in drv.log:
        pid = getattr(d, "permit", None)
        if pid is not None:
            decided.setdefault(pid, []).append(summary(d)[0])
    for pid in drv.asked:
        kinds = decided[pid]
        if kinds[0] == "queued":
            assert kinds[1] in ("granted", "withdrawn"), (pid, kinds)
        else:
            assert kinds[0] in ("granted", "refused"), (pid, kinds)


@settings(max_examples=100, deadline=None)
@given(ops, st.lists(st.tuples(st.floats(0, 30), st.integers(0, 590), st.floats(0, 1)), max_size=25))
def test_guaranteed_within_its_reserved_rate_is_granted_within_one_refill(
    others: list[tuple[Any, ...]], mine: list[tuple[float, int, float]]
) -> None:
    """g asks at most its reserved rate (each permit after the refill of the one before);
    whatever the others do, each is granted within the refill of its own estimate."""
    drv = Driver()
    script: list[tuple[float, Any]] = []
    t = 0.0
    for op in others:
        t += op[1]
        script.append((t, op))
    t_g, asks = 0.0, list[tuple[float, int, float]]()
    for gap, tokens, frac in mine:
        asks.append((t_g + gap, tokens, frac))
        t_g += gap + max(tokens, 1) / G_RATE  # the refill of this one, in tokens and requests
    script += [(at, ("g", tokens, frac)) for at, tokens, frac in asks]
    script.sort(key=lambda x: x[0])
    due: dict[str, tuple[float, float]] = {}
    fraction: dict[str, float] = {}
    for at, op in script:
        if op[0] == "g":
            drv.n += 1
            pid = f"g{drv.n}"
            due[pid], fraction[pid] = (at, at + max(op[1], 1) / G_RATE), op[2]
            drv.at(at, event(("req", at, pid, "g", G, op[1], 0)))
        else:
            drv.step((op[0], at - drv.now, *op[2:]))
        # g settles as soon as it is granted, at most its estimate (its TTL would charge that).
        for pid in [p for p in drv.open if p.startswith("g")]:
            e = drv.open[pid].estimate
            drv.at(drv.now, event(("settle", drv.now, pid, e.input_tokens * fraction[pid], 0)))
    drv.at(drv.now + 1000, BudgetTick())
    granted: dict[str, float] = {d.permit: t for t, d in drv.log if isinstance(d, PermitGranted)}
    for pid, (asked, by) in due.items():
        assert pid in granted, pid
        assert granted[pid] <= by + 1e-6, (pid, asked, by, granted[pid])


@settings(max_examples=100, deadline=None)
@given(ops)
def test_no_grant_while_the_provider_says_wait_and_the_limit_stays_in_bounds(
    script: list[tuple[Any, ...]],
) -> None:
    drv = Driver(throttles=True)
    for op in script:
        drv.step(op)
    blocked_until = -math.inf
    factor, last_cut = 1.0, -math.inf
    for t, d in drv.log:
        if isinstance(d, LimitChanged):
            assert 0.05 - 1e-12 <= d.factor <= 1.0
            if d.factor < factor - 1e-12:  # a decrease: at most one per episode (a window)
                assert t >= last_cut + 60.0 - 1e-9, (t, last_cut)
                last_cut = t
            factor = d.factor
            if d.blocked_until is not None:
                blocked_until = max(blocked_until, d.blocked_until)
        if isinstance(d, PermitGranted):
            assert t >= blocked_until - 1e-9, (t, blocked_until)


@settings(max_examples=50, deadline=None)
@given(ops)
def test_the_same_events_give_the_same_decisions(script: list[tuple[Any, ...]]) -> None:
    runs = []
    for _ in range(2):
        drv = Driver(throttles=True)
        for op in script:
            drv.step(op)
        runs.append(drv.log)
    assert runs[0] == runs[1]
