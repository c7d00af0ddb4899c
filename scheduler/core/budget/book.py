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
  within its class ceiling, in the order of service `TIERS`, then fair share, then arrival.

`serve` is the pass: refill, expire permits past their TTL, recover the limit, grant what fits;
the head of the shared queue blocks those behind it (a large permit is never starved by small
ones), except a waiter whose own leaf covers it.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Iterable
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
    PermitQueued,
    PermitWaitReason,
    PermitWithdrawn,
    Usage,
    Vec,
)
from scheduler.policy.model import BudgetSpec

RECOVERY_PERIOD_S = 60.0  # the effective limit recovers one step a minute without a throttle


class Tier(enum.IntEnum):
    """The order of service among borrowers of the shared bucket, first served first."""

    BURSTABLE_NOMINAL = 0  # Burstable within its nominal rate
    BURSTABLE_BEYOND = 1  # Burstable beyond it (within its limit)
    BEST_EFFORT = 2


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


class Book:
    def __init__(self, spec: BudgetSpec, shares: dict[str, Share], half_life: float, now: float) -> None:
        self.spec = spec
        self.name = BudgetName(spec.name)
        self.on = dims_on(spec)
        self.configured = limits_vec(spec)
        self.shares = shares
        self.half_life = half_life
        # Tokens count fair share where the budget limits any; else requests do.
        self.unit = TOKENS if any(d != 0 for d in self.on) else 0
        self.factor = 1.0
        self.blocked_until: float | None = None
        self.last_decrease: float | None = None
        self.next_recovery: float | None = None
        # Empty: a new leader assumes the window fully spent (it can never overrun the provider).
        self.shared = Bucket.per_minute(self.on, ZERO, now)
        self.permits: dict[PermitId, Permit] = {}
        self.waiting = 0
        self.expiry: list[tuple[float, int, PermitId]] = []
        self.seq = 0
        self.wake: float | None = None
        self.rescale()

    # --- rates --------------------------------------------------------------------------------

    def effective(self) -> Vec:
        f = self.factor
        c = self.configured
        return (c[0] * f, c[1] * f, c[2] * f, c[3] * f)

    def reserved_total(self) -> list[float]:
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
        total = self.reserved_total()
        scale = [min(1.0, eff[d] / total[d]) if total[d] > 0 else 1.0 for d in range(4)]
        for s in self.shares.values():
            lim = s.limit[G]
            if s.leaf is not None and lim is not None:
                s.leaf.rescale((lim[0] * scale[0], lim[1] * scale[1], lim[2] * scale[2], lim[3] * scale[3]))
        rest = [max(0.0, eff[d] - total[d] * scale[d]) for d in range(4)]
        self.shared.rescale((rest[0], rest[1], rest[2], rest[3]))

    def shared_capacity(self) -> list[float]:
        """The shared bucket's cap at the configured limit: a borrowing estimate above it never fits."""
        total = self.reserved_total()
        return [max(0.0, self.configured[d] - total[d]) for d in range(4)]

    # --- the pass -----------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        over = [0.0, 0.0, 0.0, 0.0]
        for s in self.shares.values():
            if s.leaf is not None:
                o = s.leaf.advance(now)
                for d in self.on:
                    over[d] += o[d]
        self.shared.advance(now)
        self.shared.add(over)

    def serve(self, now: float, out: list[BudgetDecision]) -> None:
        self.advance(now)
        self._expire(now, out)
        self._recover(now, out)
        if self.blocked_until is not None and now >= self.blocked_until:
            self.blocked_until = None
        if self.blocked_until is None:
            self._serve_guaranteed(now, out)
            self._serve_shared(now, out)
        self.wake = self._wake(now)

    def _serve_guaranteed(self, now: float, out: list[BudgetDecision]) -> None:
        for s in self.shares.values():
            q = s.queues[G]
            while q and s.leaf is not None and s.leaf.covers(q[0].estimate):
                self._grant(q[0], now, out)

    def tier(self, p: Permit, now: float) -> Tier:
        if p.cls == BE:
            return Tier.BEST_EFFORT
        meter = p.share.nominal
        if meter is not None:
            meter.advance(now)
            if meter.covers(p.estimate):
                return Tier.BURSTABLE_NOMINAL
        return Tier.BURSTABLE_BEYOND

    def key(self, p: Permit, now: float) -> tuple[Tier, float, int]:
        return (self.tier(p, now), p.share.share(now, self.half_life), p.seq)

    def within_ceiling(self, p: Permit, now: float) -> bool:
        ceiling = p.share.ceilings[p.cls]
        if ceiling is None:
            return True
        ceiling.advance(now)
        return ceiling.covers(p.estimate)

    def head(self, now: float) -> Permit | None:
        """The first borrower in the order of service among those within their ceilings."""
        best: Permit | None = None
        best_key: tuple[Tier, float, int] | None = None
        for s in self.shares.values():
            for cls in (B, BE):
                q = s.queues[cls]
                if not q or not self.within_ceiling(q[0], now):
                    continue
                k = self.key(q[0], now)
                if best_key is None or k < best_key:
                    best, best_key = q[0], k
        return best

    def _serve_shared(self, now: float, out: list[BudgetDecision]) -> None:
        while (p := self.head(now)) is not None and self.shared.covers(p.estimate):
            self._grant(p, now, out)

    def _grant(self, p: Permit, now: float, out: list[BudgetDecision]) -> None:
        s = p.share
        s.queues[p.cls].popleft()
        s.waiting -= 1
        self.waiting -= 1
        if p.cls == G:
            assert s.leaf is not None
            s.leaf.take(p.estimate)
        else:
            p.borrowed = True
            self.shared.take(p.estimate)
            ceiling = s.ceilings[p.cls]
            if ceiling is not None:
                ceiling.take(p.estimate)
            if p.cls != BE and s.nominal is not None:
                s.nominal.advance(now)
                s.nominal.take(p.estimate, floor=True)
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
            for b in (s.ceilings[p.cls], s.nominal if p.cls != BE else None):
                if b is not None:
                    b.advance(now)
                    b.give(refund)
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
        """The provider throttled `p`'s call. One decrease per episode: a permit granted before
        the last decrease (or with it) was sent at the old limit, so its 429 says nothing of the
        new one (as TCP halves once per window, not once per lost packet)."""
        fb = self.spec.feedback
        changed = False
        if self.last_decrease is None or (p.granted_at is not None and p.granted_at > self.last_decrease):
            new = max(fb.minimum, self.factor * fb.decrease)
            self.last_decrease = now
            if new < self.factor:
                self.factor = new
                changed = True
        until = now + retry_after_s
        if retry_after_s > 0 and (self.blocked_until is None or until > self.blocked_until):
            self.blocked_until = until
            changed = True
        if self.factor < 1.0:
            self.next_recovery = max(now, self.blocked_until or now) + RECOVERY_PERIOD_S
        if changed:
            self.rescale()
            out.append(self._limit_changed(LimitChangeReason.THROTTLED))

    def _recover(self, now: float, out: list[BudgetDecision]) -> None:
        fb = self.spec.feedback
        while self.next_recovery is not None and now >= self.next_recovery:
            self.factor = min(1.0, self.factor + fb.recovery_per_minute)
            self.next_recovery = self.next_recovery + RECOVERY_PERIOD_S if self.factor < 1.0 else None
            self.rescale()
            out.append(self._limit_changed(LimitChangeReason.RECOVERED))

    # --- waiting ------------------------------------------------------------------------------

    def enqueue(self, p: Permit) -> None:
        self.permits[p.id] = p
        p.share.queues[p.cls].append(p)
        p.share.waiting += 1
        self.waiting += 1

    def dequeue(self, p: Permit) -> None:
        del self.permits[p.id]
        p.share.queues[p.cls].remove(p)
        p.share.waiting -= 1
        self.waiting -= 1

    def withdraw(self, p: Permit, now: float, out: list[BudgetDecision]) -> None:
        self.dequeue(p)
        out.append(PermitWithdrawn(p.id, self.name, now - p.requested_at))

    def _lent_rate(self) -> list[float]:
        """The refill full leaves lend the shared bucket now (a wait estimate counts it)."""
        lent = [0.0, 0.0, 0.0, 0.0]
        for s in self.shares.values():
            if s.leaf is not None and s.leaf.full():
                for d in self.on:
                    lent[d] += s.leaf.rate[d]
        return lent

    def queued(self, p: Permit, now: float) -> PermitQueued:
        """Where a waiting permit stands: the permits ahead of it on what it waits on, the time
        their estimates and its own take to refill, and why."""
        s = p.share
        own = s.bucket(p.cls)
        mine = list(s.queues[p.cls])
        need_own = _sum(q.estimate for q in mine[: mine.index(p) + 1])
        own_wait = 0.0 if own is None else own.wait(need_own, capped=False)
        if p.cls == G:
            position, shared_wait = mine.index(p), 0.0
        else:
            k = self.key(p, now)
            ahead = [
                q for t in self.shares.values() for c in (B, BE) for q in t.queues[c]
                if q is not p and self.key(q, now) < k
            ]  # fmt: skip
            position = len(ahead)
            need = _sum([*(q.estimate for q in ahead), p.estimate])
            shared_wait = self.shared.wait(need, self._lent_rate(), capped=False)
        wait = max(own_wait, shared_wait)
        if self.blocked_until is not None:
            reason = PermitWaitReason.PROVIDER_THROTTLED
            wait = max(wait, self.blocked_until - now)
        elif p.cls == G or (own is not None and not own.covers(need_own)):
            reason = PermitWaitReason.TENANT_BUDGET
        else:
            reason = PermitWaitReason.BUDGET_EXHAUSTED
        return PermitQueued(p.id, self.name, position, None if math.isinf(wait) else wait, reason)

    def _wake(self, now: float) -> float | None:
        """The earliest time something here may change without an event: a retry-after passing,
        a permit's TTL, a recovery step, a waiter's refill."""
        times: list[float] = []
        if self.blocked_until is not None:
            times.append(self.blocked_until)
        while self.expiry and self.permits.get(self.expiry[0][2]) is None:
            heapq.heappop(self.expiry)  # settled: drop it, so the next TTL is the top
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
            out.append(self.shared.wait(head.estimate, self._lent_rate()))
        return out

    def view(self) -> BudgetView:
        eff = self.effective()
        return BudgetView(
            self.name, self.factor, eff, self.configured, self.shared.level(), self.waiting,
            len(self.permits) - self.waiting, self.blocked_until,
        )  # fmt: skip


def _sum(vs: Iterable[Vec]) -> Vec:
    t = [0.0, 0.0, 0.0, 0.0]
    for v in vs:
        for d in range(4):
            t[d] += v[d]
    return (t[0], t[1], t[2], t[3])
