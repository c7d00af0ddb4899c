"""The warm pool a budget run's sessions hold slots of: a slot per active period (a session keeps
it through `idle_release_s` of idleness, as the trace import assumes), served in class order then
arrival, and an autoscaler that sizes it. Each tenant's slot quota is counted (what it holds per
class against its Guaranteed and Burstable nominal), for the cap's quota claims.

Why not the slot core here: the slot comparison (`simulate --compare`'s slot table) measures how
slots are scheduled; this one measures how tokens are, so every budget contender gets the same
plain slot gate and the same autoscaler, and only the token limiter differs. The autoscaler is
the HPA shape slotsched's uses (desired = ceil(demand / slots per worker) within min and max,
scale up at once after a start delay, scale down to the highest desired of the stabilization
window, draining workers before removal); with `cap` it also applies slotsched's budget cap, the
server autoscaler's own (`slots.autoscaler.decision.budget_cap`, reason `budget`): a scale-up
stops at the workers the budget's effective rate can feed, ÷ the observed rate of an active
session, but never withholds a slot from a waiter with a quota claim (Guaranteed within its
tenant's guaranteed, Burstable below its nominal), never below the ready workers or min_workers
(a budget is not demand: the cap adds no worker and drains none).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from scheduler.core.views import BudgetFeed
from slots.autoscaler import decision

STARTING, READY, DRAINING, GONE = range(4)


@dataclass(frozen=True)
class PoolConfig:
    workers: int
    slots_per_worker: int = 2
    min_workers: int = 1
    max_workers: int | None = None
    autoscale: bool = False
    cap: bool = False  # the budget cap on desired workers (slotsched's autoscaler)
    period_s: float = 15.0
    start_delay_s: float = 5.0
    stabilization_s: float = 300.0
    drain_timeout_s: float = 120.0  # a draining worker's sessions move to free slots after this
    idle_release_s: float = 30.0
    # Each tenant's slot quota: (tenant, guaranteed, Burstable nominal, weight); a tenant not
    # listed has none (all it holds is borrowed, weight 1).
    quotas: tuple[tuple[str, int, int, float], ...] = ()

    @property
    def ceiling(self) -> int:
        return max(self.workers, self.max_workers or self.workers)


def budget_cap(feed: BudgetFeed, slots_per_worker: int, held: int = 0, claimed: int = 0) -> int | None:
    """Workers the budget can feed (None: no rate observed yet, no cap): the server autoscaler's
    very rule, asked through its pure decision's input; `held` slots are busy, `claimed` waiters
    have a quota claim."""
    return decision.budget_cap(
        decision.ScaleInput(
            now=0.0,
            workers=(),
            slots_per_worker=slots_per_worker,
            busy_by_class={"all": held} if held else {},
            pending_by_class={},
            claimed_pending=claimed,
            oldest_wait_by_class={},
            floor_slots=0,
            mean_hold_s=0.0,
            budgets=(feed,),
        )
    )


@dataclass
class Worker:
    state: int
    ready_at: float
    held: int = 0
    drain_at: float = 0.0


@dataclass
class SlotGate:
    cfg: PoolConfig
    workers: list[Worker] = field(default_factory=list)
    waiting: list[tuple[int, int, object, str]] = field(default_factory=list)  # (class, seq, who, tenant)
    held_by: dict[str, list[int]] = field(default_factory=dict)  # per tenant, slots held per class
    seq: int = 0
    held: int = 0
    desired_log: deque[tuple[float, int]] = field(default_factory=deque)
    paid_s: float = 0.0
    last: float = 0.0

    def __post_init__(self) -> None:
        self.workers = [Worker(READY, 0.0) for _ in range(self.cfg.workers)]
        self.quota = {t: (g, n, w) for t, g, n, w in self.cfg.quotas}

    def _pay(self, now: float) -> None:
        paid = sum(1 for w in self.workers if w.state != GONE)
        self.paid_s += paid * max(0.0, now - self.last)
        self.last = max(self.last, now)

    def paid(self) -> int:
        return sum(1 for w in self.workers if w.state != GONE)

    def ready(self) -> int:
        return sum(1 for w in self.workers if w.state == READY)

    def capacity(self) -> int:
        return self.ready() * self.cfg.slots_per_worker

    def ask(self, cls: int, who: object, tenant: str = "") -> None:
        heapq.heappush(self.waiting, (cls, self.seq, who, tenant))
        self.seq += 1

    def claimed(self) -> int:
        """Waiters with a quota claim: per tenant, Guaranteed waiters up to what its guaranteed
        leaves free, Burstable ones up to its nominal (the slot core's tiers 1 and 2, which it
        serves by preemption when no slot is free)."""
        waiting: dict[str, list[int]] = {}
        for cls, _, _, tenant in self.waiting:
            waiting.setdefault(tenant, [0, 0, 0])[cls] += 1
        n = 0
        for tenant, w in waiting.items():
            g, nominal, _ = self.quota.get(tenant, (0, 0, 1.0))
            held = self.held_by.get(tenant, [0, 0, 0])
            n += min(w[0], max(0, g - held[0])) + min(w[1], max(0, nominal - held[1]))
        return n

    def grant(self) -> list[tuple[object, int]]:
        """Hand free slots to waiters in order: (who, the worker whose slot it is)."""
        out = []
        spw = self.cfg.slots_per_worker
        while self.waiting:
            free = next((i for i, w in enumerate(self.workers) if w.state == READY and w.held < spw), None)
            if free is None:
                break
            cls, _, who, tenant = heapq.heappop(self.waiting)
            self.held_by.setdefault(tenant, [0, 0, 0])[cls] += 1
            self.workers[free].held += 1
            self.held += 1
            out.append((who, free))
        return out

    def release(self, worker: int, now: float, cls: int = 0, tenant: str = "") -> None:
        self._pay(now)
        held = self.held_by.get(tenant)
        if held is not None:
            held[cls] -= 1
        w = self.workers[worker]
        w.held -= 1
        self.held -= 1
        if w.state == DRAINING and w.held == 0:
            w.state = GONE

    def moves(self, now: float) -> list[tuple[int, int]]:
        """Sessions on workers draining past the drain timeout move to free slots on ready ones,
        as the server asks them to yield within `drainTimeoutSeconds` (their checkpoint time is
        not counted; one with no free slot to go to stays): (from, to) per session moved."""
        self._pay(now)
        out: list[tuple[int, int]] = []
        spw = self.cfg.slots_per_worker
        for i, w in enumerate(self.workers):
            if w.state != DRAINING or now - w.drain_at < self.cfg.drain_timeout_s:
                continue
            while w.held:
                to = next((j for j, v in enumerate(self.workers) if v.state == READY and v.held < spw), None)
                if to is None:
                    return out
                w.held -= 1
                self.workers[to].held += 1
                out.append((i, to))
            w.state = GONE
        return out

    def start_ready(self, now: float) -> None:
        """Workers whose start delay is over become ready."""
        self._pay(now)
        for w in self.workers:
            if w.state == STARTING and w.ready_at <= now + 1e-9:
                w.state = READY

    def scale(self, now: float, cap: int | None) -> float | None:
        """One autoscaler period; the time a new worker is ready (None: none started)."""
        self._pay(now)
        c = self.cfg
        demand = self.held + len(self.waiting)
        desired = min(c.ceiling, max(c.min_workers, math.ceil(demand / c.slots_per_worker)))
        active = [w for w in self.workers if w.state in (STARTING, READY)]
        if c.cap and cap is not None:  # decide's step 4b: bounds a scale-up, drains nothing
            desired = min(desired, max(len(active), c.min_workers, cap))
        self.desired_log.append((now, desired))
        while self.desired_log and self.desired_log[0][0] < now - c.stabilization_s:
            self.desired_log.popleft()
        if desired > len(active):
            more = desired - len(active)
            for w in self.workers:  # a draining worker is the cheapest to bring back
                if more and w.state == DRAINING:
                    w.state, more = READY, more - 1
            ready_at = now + c.start_delay_s
            for _ in range(more):
                self.workers.append(Worker(STARTING, ready_at))
            return ready_at if more else None
        target = max(d for _, d in self.desired_log)
        excess = len(active) - target
        # Drain the least busy first (free workers leave at once).
        for w in sorted(active, key=lambda w: (w.held, -self.workers.index(w))):
            if excess <= 0:
                break
            w.state, w.drain_at = (GONE if w.held == 0 else DRAINING), now
            excess -= 1
        return None
