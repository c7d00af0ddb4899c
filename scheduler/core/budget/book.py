"""One budget's permits: a hierarchical token bucket (as Linux tc's HTB: an assured rate and a
ceiling per leaf), its order of service, and its effective limit under the provider's feedback
(docs/design.md, "Token budgets").

Per dimension (requests, input, output, total tokens, those the budget limits):

* each tenant's Guaranteed leaf is refilled at its reserved rate (scaled down, pro rata, when the
  effective limit falls below their sum) and lends what overflows it to the shared bucket;
* the shared bucket is refilled at the effective limit less the reserved rates, and holds a
  minute of that at most: every bucket together never holds more than a minute of the effective
  limit, nor refills faster than it, so the fleet cannot send more than the provider's window;
* a Guaranteed permit draws on its leaf only (its reserved rate is also its ceiling, as a slot
  quota's `guaranteed` is); Burstable and BestEffort permits borrow from the shared bucket, each
  within its class ceiling, in the order of service (`Tier`: Burstable within nominal, then
  Burstable beyond it and BestEffort by weighted share, a tenant's Burstable before its own
  BestEffort), then arrival.

`serve` is the pass: refill, expire permits past their TTL, recover the limit, grant what fits;
the head of the shared queue blocks those behind it (a large permit is never starved by small
ones), except a waiter whose own leaf covers it.
"""

from __future__ import annotations

import enum
import heapq
import math
from dataclasses import dataclass

from scheduler.core.budget.buckets import ZERO, Bucket, vsub
from scheduler.core.budget.shares import BE, CLASSES, B, G, Share, dims_on, limits_vec
from scheduler.core.budget.types import (
    TOKENS,
    BudgetDecision,
    BudgetName,
    BudgetView,
    LimitChanged,
    LimitChangeReason,
    PermitEnded,
    PermitEndReason,
    PermitGranted,
    PermitId,
    PermitWithdrawn,
    ReportedLimits,
    Usage,
    Vec,
)
from scheduler.policy.model import BudgetSpec

RECOVERY_PERIOD_S = 60.0  # the effective limit recovers one step a minute without a throttle
EPISODE_S = 60.0  # a throttle episode: the provider's window (a minute) after a decrease
PROBE_SLOWDOWN = 40.0  # above the plateau, recovery steps are this many times smaller


class Tier(enum.IntEnum):
    """The order of service among borrowers of the shared bucket, first served first: the slot
    order's tiers 2 and 3 (docs/design.md, "Who gets the next free slot"), one rule for both."""

    BURSTABLE_NOMINAL = 0  # Burstable within its nominal rate
    SHARED = 1  # Burstable beyond it and BestEffort, by weighted share across tenants


@dataclass(slots=True, eq=False)
class Permit:
    id: PermitId
    owner: str
    share: Share
    cls: int
    estimate: Vec
    usage: Usage  # the estimate as asked
    amount: float  # in fair-share units (tokens, or requests for a budget of requests only)
    seq: int
    requested_at: float
    granted_at: float | None = None
    expires_at: float = math.inf
    borrowed: bool = False
    counted: bool = False  # granted in the shared tier: its tokens count in its tenant's share


class Book:
    def __init__(
        self, spec: BudgetSpec, shares: dict[str, Share], half_life: float, now: float, fast: bool = True
    ) -> None:
        self.spec = spec
        self.name = BudgetName(spec.name)
        self.on = dims_on(spec)
        self.configured = limits_vec(spec)
        self.shares = shares
        self.half_life = half_life
        # Tokens count fair share where the budget limits any; else requests do.
        self.unit = TOKENS if any(d != 0 for d in self.on) else 0
        self.factor = 1.0
        # The provider's stated limit over the configured one (1: none stated, or above it): the
        # factor never goes above it.
        self.ceiling = 1.0
        self.blocked_until: float | None = None
        self.last_decrease: float | None = None
        self.next_recovery: float | None = None
        self.throttled_at: float | None = None  # the factor the last decrease cut (its loss point)
        self.bound = False  # a borrower waited on the shared bucket since the last recovery step
        # Empty: a new leader assumes the window fully spent (it can never overrun the provider).
        self.shared = Bucket.per_minute(self.on, ZERO, now)
        self.permits: dict[PermitId, Permit] = {}
        self.waiting = 0
        # Waiting permits per class: the pass skips what nobody waits on (the hot path).
        self.waiting_by = [0, 0, 0]
        # The shares with a borrower waiting (Burstable or BestEffort): where the head is looked
        # for. Its order does not matter: the keys of the order of service are all distinct.
        self.borrowers: dict[str, Share] = {}
        # Fixed for the book's life (its shares and their reserved rates come with the policy).
        self.leaves = [s for s in shares.values() if s.leaf is not None]
        self._reserved = self._reserved_total()
        self._shared_capacity = [max(0.0, self.configured[d] - self._reserved[d]) for d in range(4)]
        self.expiry: list[tuple[float, int, PermitId]] = []
        self.seq = 0
        self.wake: float | None = None
        # The one-step paths (`serve_alone`, `after_close`); False: every pass the full `serve`
        # (tests/test_budget_differential.py checks both decide the same).
        self.fast = fast
        # Per (tenant, class): what its permits fit in at most, and where (core.Budgets._too_large).
        self.capacities: dict[tuple[str, int], tuple[list[float], str]] = {}
        self.rescale()

    # --- rates --------------------------------------------------------------------------------

    def effective(self) -> Vec:
        f = self.factor
        c = self.configured
        return (c[0] * f, c[1] * f, c[2] * f, c[3] * f)

    def reserved_total(self) -> list[float]:
        return list(self._reserved)

    def _reserved_total(self) -> list[float]:
        total = [0.0, 0.0, 0.0, 0.0]
        for s in self.shares.values():
            lim = s.limit[G]
            if s.leaf is not None and lim is not None:
                for d in self.on:
                    total[d] += lim[d]
        return total

    def rescale(self) -> None:
        """Rates and caps for the effective limit: leaves at their reserved rates (pro rata below
        their sum), the shared bucket the rest."""
        eff = self.effective()
        total = self._reserved
        scale = [min(1.0, eff[d] / total[d]) if total[d] > 0 else 1.0 for d in range(4)]
        for s in self.shares.values():
            lim = s.limit[G]
            if s.leaf is not None and lim is not None:
                s.leaf.rescale((lim[0] * scale[0], lim[1] * scale[1], lim[2] * scale[2], lim[3] * scale[3]))
        rest = [max(0.0, eff[d] - total[d] * scale[d]) for d in range(4)]
        self.shared.rescale((rest[0], rest[1], rest[2], rest[3]))

    def shared_capacity(self) -> list[float]:
        """The shared bucket's cap at the configured limit: a borrowing estimate above it never fits."""
        return list(self._shared_capacity)

    # --- the pass -----------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        if not self.leaves:
            self.shared.refill(now)
            return
        over = [0.0, 0.0, 0.0, 0.0]
        for s in self.leaves:
            assert s.leaf is not None
            o = s.leaf.advance(now)
            for d in self.on:
                over[d] += o[d]
        self.shared.refill(now)
        self.shared.add(over)

    def serve(self, now: float, out: list[BudgetDecision], wake: bool = True) -> None:
        """The pass (`wake` False: the next wake-up not found, for a caller whose next pass at
        `now` finds it, or `serve_wake`)."""
        self._to(now, out)
        if self.blocked_until is None and self.waiting:
            if self.waiting_by[G]:
                self._serve_guaranteed(now, out)
            self._serve_shared(now, out)
        if wake or not self.fast:
            self.wake = self._wake(now)

    def serve_wake(self, now: float) -> None:
        """The next wake-up, after a `serve(now, out, wake=False)` that nothing followed."""
        self.wake = self._wake(now)

    def _to(self, now: float, out: list[BudgetDecision]) -> None:
        """The pass's first half: refill, expire permits past their TTL, recover the limit
        (each only when due: the tests are the callees' own first ones, inlined on the hot path)."""
        if self.leaves:
            self.advance(now)
        else:
            self.shared.refill(now)  # `advance` without leaves
        if self.expiry and self.expiry[0][0] <= now:
            self._expire(now, out)
        if self.next_recovery is not None and now >= self.next_recovery:
            self._recover(now, out)
        if self.blocked_until is not None and now >= self.blocked_until:
            self.blocked_until = None

    def serve_alone(self, p: Permit, now: float, out: list[BudgetDecision]) -> None:
        """`serve` when `p`, just enqueued, is the only permit waiting (the hot path: a budget
        nobody waits on): the same decisions and the same buckets moved, in one step. `p` is
        then the head if it is within its ceiling; `head` refilled its nominal meter and decayed
        its share while ranking it, so this does too (a meter refilled at two times and one
        refilled at the later only differ in their last bits)."""
        if not self.fast:
            return self.serve(now, out)
        self._to(now, out)
        if self.blocked_until is None:
            if p.cls == G:
                leaf = p.share.leaf
                if leaf is not None and leaf.covers(p.estimate):
                    self._grant(p, now, out)
            elif self.within_ceiling(p, now):
                tier = self.tier(p, now)
                p.share.share(now, self.half_life)
                if self.shared.covers(p.estimate):
                    self._grant(p, now, out, tier)
                else:
                    self.bound = True  # as _serve_shared: the limit held it back
        self.wake = self._wake(now)
        return None

    def after_close(self, now: float, out: list[BudgetDecision]) -> None:
        """`serve` again at the `now` of the pass that closed a permit (a settle): with nobody
        waiting it only finds the next wake-up (the refill, expiries and recovery were done at
        `now` already, and a close changes none of them)."""
        if self.waiting or not self.fast:
            self.serve(now, out)
        else:
            self.wake = self._wake(now)

    def _serve_guaranteed(self, now: float, out: list[BudgetDecision]) -> None:
        for s in self.shares.values():
            q = s.queues[G]
            while q and s.leaf is not None and s.leaf.covers(q[0].estimate):
                self._grant(q[0], now, out)

    def tier(self, p: Permit, now: float) -> Tier:
        if p.cls == BE:
            return Tier.SHARED
        meter = p.share.nominal
        if meter is not None:
            meter.refill(now)
            if meter.covers(p.estimate):
                return Tier.BURSTABLE_NOMINAL
        return Tier.SHARED

    def key(self, p: Permit, now: float) -> tuple[Tier, float, int, int]:
        """Tier, then the tenant's weighted share (in the shared tier its Burstable before its
        own BestEffort: the class ranks after the share), then arrival."""
        return (self.tier(p, now), p.share.share(now, self.half_life), p.cls, p.seq)

    def within_ceiling(self, p: Permit, now: float) -> bool:
        ceiling = p.share.ceilings[p.cls]
        if ceiling is None:
            return True
        ceiling.refill(now)
        return ceiling.covers(p.estimate)

    def head(self, now: float) -> Permit | None:
        """The first borrower in the order of service among those within their ceilings. A
        tenant's head in the shared tier is its Burstable beyond nominal, else its BestEffort
        (the slot order's per-tenant contract); across tenants the share decides, then age."""
        best: Permit | None = None
        best_key: tuple[Tier, float, int] | None = None
        if not self.borrowers:
            return None
        for s in self.borrowers.values():
            shared_taken = False
            for cls in (B, BE):
                q = s.queues[cls]
                if not q or not self.within_ceiling(q[0], now):
                    continue
                tier = self.tier(q[0], now)
                if tier == Tier.SHARED:
                    if shared_taken:
                        continue  # its Burstable beyond nominal goes before its own BestEffort
                    shared_taken = True
                k = (tier, s.share(now, self.half_life), q[0].seq)
                if best_key is None or k < best_key:
                    best, best_key = q[0], k
        return best

    def _serve_shared(self, now: float, out: list[BudgetDecision]) -> None:
        while (p := self.head(now)) is not None:
            if not self.shared.covers(p.estimate):
                self.bound = True  # the limit, not the demand, held someone back: a probe may learn
                return
            self._grant(p, now, out)

    def _grant(self, p: Permit, now: float, out: list[BudgetDecision], tier: Tier | None = None) -> None:
        """Grant `p` (`tier`: its tier at `now`, when the caller has it)."""
        s = p.share
        s.queues[p.cls].popleft()
        s.waiting -= 1
        self.waiting -= 1
        self.waiting_by[p.cls] -= 1
        if p.cls != G and not (s.queues[B] or s.queues[BE]):
            del self.borrowers[s.tenant]
        if p.cls == G:
            assert s.leaf is not None
            s.leaf.take(p.estimate)
        else:
            p.borrowed = True
            # As the slot order's share: only what is borrowed beyond what the tenant can count
            # on (its nominal) weighs against it in the shared tier.
            p.counted = (self.tier(p, now) if tier is None else tier) == Tier.SHARED
            self.shared.take(p.estimate)
            ceiling = s.ceilings[p.cls]
            if ceiling is not None:
                ceiling.take(p.estimate)
            if not p.counted and s.nominal is not None:
                # Within nominal only: a grant beyond it never eats the nominal (as a borrowing
                # slot lease is not a nominal one), it counts in the share instead. (Refilled to
                # `now` already: the tier that found it within nominal did.)
                s.nominal.take(p.estimate, floor=True)
            if p.counted:
                s.decayed(now, self.half_life)
                s.usage += p.amount
                s.in_flight += p.amount
        p.granted_at = now
        p.expires_at = now + self.spec.permit_ttl_s
        heapq.heappush(self.expiry, (p.expires_at, p.seq, p.id))
        out.append(
            PermitGranted(
                p.id, p.owner, s.tenant, self.name, CLASSES[p.cls], p.usage, p.expires_at,
                now - p.requested_at, p.borrowed,
            )
        )  # fmt: skip

    def _expire(self, now: float, out: list[BudgetDecision]) -> None:
        while self.expiry and self.expiry[0][0] <= now:
            exp, _, pid = heapq.heappop(self.expiry)
            p = self.permits.get(pid)
            if p is None or p.granted_at is None or p.expires_at != exp:
                continue  # settled since
            self.close(p, p.estimate, PermitEndReason.EXPIRED, now, out)

    def close(
        self, p: Permit, charged: Vec, reason: PermitEndReason, now: float, out: list[BudgetDecision],
        throttled: bool = False,
    ) -> None:  # fmt: skip
        """End a granted permit charging `charged`: the estimate less that is refunded to the
        buckets it was drawn from (a negative refund is a debt), up to their caps."""
        del self.permits[p.id]
        refund = vsub(p.estimate, charged)
        s = p.share
        if p.cls == G and s.leaf is not None:
            s.leaf.advance(now)
            self.shared.add(s.leaf.give(refund))  # a full leaf lends the rest, as its refill
        elif p.borrowed:
            self.shared.give(refund)
            for b in (s.ceilings[p.cls], s.nominal if not p.counted else None):
                if b is not None:
                    b.refill(now)
                    b.give(refund)
            if p.counted:
                spent = charged[self.unit]
                s.decayed(now, self.half_life)
                s.usage = max(0.0, s.usage + spent - p.amount)
                s.in_flight = max(0.0, s.in_flight - p.amount)
        out.append(
            PermitEnded(
                p.id, p.owner, s.tenant, self.name, CLASSES[p.cls], reason, charged, refund, throttled
            )
        )

    # --- the provider's feedback (AIMD) -------------------------------------------------------

    def _limit_changed(self, reason: LimitChangeReason) -> LimitChanged:
        return LimitChanged(self.name, reason, self.factor, self.effective(), self.blocked_until)

    def throttled(self, p: Permit, retry_after_s: float, now: float, out: list[BudgetDecision]) -> None:
        """The provider throttled `p`'s call: its window is spent, so the shared bucket is emptied
        (a debt kept) and nothing borrowed is granted into the provider's deficit. One decrease
        per episode: a permit granted within a window (a minute) of the last decrease was sent
        while the provider was still paying off the old limit's burst, so its 429 says nothing of
        the new one (as TCP halves once per window, not once per lost packet). A decrease
        remembers the level that drew it (`throttled_at`): recovery stops just below it."""
        fb = self.spec.feedback
        changed = False
        sent = p.granted_at if p.granted_at is not None else now
        if self.last_decrease is None or sent >= self.last_decrease + EPISODE_S:
            self.throttled_at = self.factor
            new = min(self.ceiling, max(fb.minimum, self.factor * fb.decrease))
            self.last_decrease = now
            if new < self.factor:
                self.factor = new
                changed = True
        self.shared.drain()
        until = now + retry_after_s
        if retry_after_s > 0 and (self.blocked_until is None or until > self.blocked_until):
            self.blocked_until = until
            changed = True
        if self.factor < self.ceiling:
            self.next_recovery = max(now, self.blocked_until or now) + RECOVERY_PERIOD_S
        if changed:
            self.rescale()
            out.append(self._limit_changed(LimitChangeReason.THROTTLED))

    def adopt(self, reported: ReportedLimits, now: float, out: list[BudgetDecision]) -> None:
        """The provider stated its limit (its response headers): the effective limit is at once at
        most that, as the same fraction of the configured one in every dimension (the lowest of
        stated ÷ configured over the dimensions the budget limits and the provider states), never
        above the configured one. No 429 is needed to learn it. A later statement replaces it (a
        tier upgrade raises it; recovery climbs to it). A loss point above it is explained by it
        and forgotten: recovery returns to the stated limit, not to a plateau below an overrun
        the configured number caused."""
        ratios = [
            r / self.configured[d]
            for d, r in enumerate(reported.vector())
            if r is not None and d in self.on and math.isfinite(r) and r > 0 and self.configured[d] > 0
        ]
        if not ratios:
            return
        ceiling = min(1.0, min(ratios))
        if ceiling == self.ceiling:
            return
        self.ceiling = ceiling
        if self.throttled_at is not None and self.throttled_at > ceiling:
            self.throttled_at = None
        if self.factor > ceiling:
            self.factor = ceiling
            self.rescale()
            out.append(self._limit_changed(LimitChangeReason.REPORTED))
        elif self.factor < ceiling and self.next_recovery is None:
            self.next_recovery = max(now, self.blocked_until or now) + RECOVERY_PERIOD_S

    def plateau(self) -> float:
        """Where quick recovery stops: a third of the way from the cut back to the last
        throttled level, inside what is known (the provider refused the one, the other is below
        its limit) and on the low side of it (docs/design.md, "Token budgets")."""
        if self.throttled_at is None:
            return 1.0
        return self.throttled_at * (1.0 + 2.0 * self.spec.feedback.decrease) / 3.0

    def _recover(self, now: float, out: list[BudgetDecision]) -> None:
        """A step a minute without a throttle: `recoveryPerMinute` up to the plateau; above it a
        `PROBE_SLOWDOWN`th of that, and only after a minute in which the limit bound (a borrower
        waited on the shared bucket: a minute the demand did not fill says nothing of the
        provider, as TCP does not grow an application-limited window). The loss point is kept
        until the next throttle: a level passed without one says little, since a small excess
        over the real limit drains the provider's burst only after many minutes."""
        fb = self.spec.feedback
        while self.next_recovery is not None and now >= self.next_recovery:
            plateau, before = self.plateau(), self.factor
            if self.factor + 1e-12 < plateau:
                self.factor = min(plateau, self.factor + fb.recovery_per_minute)
            elif self.bound:
                self.factor += fb.recovery_per_minute / PROBE_SLOWDOWN
            self.bound = False
            self.factor = min(self.ceiling, self.factor)
            self.next_recovery = (
                self.next_recovery + RECOVERY_PERIOD_S if self.factor < self.ceiling else None
            )
            if self.factor != before:
                self.rescale()
                out.append(self._limit_changed(LimitChangeReason.RECOVERED))

    # --- waiting ------------------------------------------------------------------------------

    def enqueue(self, p: Permit) -> None:
        self.permits[p.id] = p
        p.share.queues[p.cls].append(p)
        p.share.waiting += 1
        self.waiting += 1
        self.waiting_by[p.cls] += 1
        if p.cls != G:
            self.borrowers[p.share.tenant] = p.share

    def dequeue(self, p: Permit) -> None:
        del self.permits[p.id]
        s = p.share
        s.queues[p.cls].remove(p)
        s.waiting -= 1
        self.waiting -= 1
        self.waiting_by[p.cls] -= 1
        if p.cls != G and not (s.queues[B] or s.queues[BE]):
            del self.borrowers[s.tenant]

    def withdraw(self, p: Permit, now: float, out: list[BudgetDecision]) -> None:
        self.dequeue(p)
        out.append(PermitWithdrawn(p.id, self.name, now - p.requested_at))

    def lent_rate(self) -> list[float]:
        """The refill full leaves lend the shared bucket now (a wait estimate counts it)."""
        lent = [0.0, 0.0, 0.0, 0.0]
        for s in self.leaves:
            if s.leaf is not None and s.leaf.full():
                for d in self.on:
                    lent[d] += s.leaf.rate[d]
        return lent

    def _wake(self, now: float) -> float | None:
        """The earliest time something here may change without an event: a retry-after passing,
        a permit's TTL, a recovery step, a waiter's refill."""
        while self.expiry and self.permits.get(self.expiry[0][2]) is None:
            heapq.heappop(self.expiry)  # settled: drop it, so the next TTL is the top
        if not self.waiting and self.blocked_until is None and self.next_recovery is None:
            return self.expiry[0][0] if self.expiry else None  # (the hot path: the next TTL)
        times: list[float] = []
        if self.blocked_until is not None:
            times.append(self.blocked_until)
        if self.expiry:
            times.append(self.expiry[0][0])
        if self.next_recovery is not None:
            times.append(self.next_recovery)
        if self.blocked_until is None and self.waiting:
            times.extend(now + t for t in self._refills(now) if 0 < t < math.inf)
        return min(times) if times else None

    def _refills(self, now: float) -> list[float]:
        out: list[float] = []
        for s in self.shares.values():
            q = s.queues[G]
            if q and s.leaf is not None:
                out.append(s.leaf.wait(q[0].estimate))
            for cls in (B, BE):
                q = s.queues[cls]
                if not q:
                    continue
                ceiling = s.ceilings[cls]
                if ceiling is not None and not ceiling.covers(q[0].estimate):
                    out.append(ceiling.wait(q[0].estimate))
                elif cls != BE and s.nominal is not None and not s.nominal.covers(q[0].estimate):
                    out.append(s.nominal.wait(q[0].estimate))  # its tier may rise
        head = self.head(now)
        if head is not None:
            out.append(self.shared.wait(head.estimate, self.lent_rate()))
        return out

    def view(self) -> BudgetView:
        eff = self.effective()
        return BudgetView(
            self.name, self.factor, eff, self.configured, self.shared.level(), self.waiting,
            len(self.permits) - self.waiting, self.blocked_until,
        )  # fmt: skip
