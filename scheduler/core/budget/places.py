"""Where a budget's waiting permits stand (docs/design.md, "Token budgets"): a waiter's position
among those ahead of it on what it waits on, the time their estimates and its own take to refill,
and why it waits. `queued` tells one permit as the pass leaves it (the core's PermitQueued);
`positions` tells every waiter at once without moving a bucket (the shell's re-tell of waiters
whose place changed), reading the meters as they would be now.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from scheduler.core.budget.book import Book, Permit, Tier
from scheduler.core.budget.buckets import Bucket
from scheduler.core.budget.shares import BE, B, G
from scheduler.core.budget.types import PermitId, PermitQueued, PermitWaitReason, Vec


def queued(book: Book, p: Permit, now: float) -> PermitQueued:
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
        k = book.key(p, now)
        ahead = [
            q for t in book.shares.values() for c in (B, BE) for q in t.queues[c]
            if q is not p and book.key(q, now) < k
        ]  # fmt: skip
        position = len(ahead)
        need = _sum([*(q.estimate for q in ahead), p.estimate])
        shared_wait = book.shared.wait(need, book.lent_rate(), capped=False)
    wait = max(own_wait, shared_wait)
    if book.blocked_until is not None:
        reason = PermitWaitReason.PROVIDER_THROTTLED
        wait = max(wait, book.blocked_until - now)
    elif p.cls == G or (own is not None and not own.covers(need_own)):
        reason = PermitWaitReason.TENANT_BUDGET
    else:
        reason = PermitWaitReason.BUDGET_EXHAUSTED
    return PermitQueued(p.id, book.name, position, None if math.isinf(wait) else wait, reason)


def positions(book: Book, now: float) -> list[PermitQueued]:
    """Every waiting permit's place as `queued` would tell it now, in one pass (sorted once,
    prefix sums), moving no bucket: a query the shell makes to tell waiters whose position
    or reason changed, which must not change what the core decides next."""
    out: list[PermitQueued] = []
    if not book.waiting:
        return out
    blocked = book.blocked_until is not None
    lent = book.lent_rate()
    borrowers = [
        (_peek_key(book, q, now), q)
        for s in book.borrowers.values() for c in (B, BE) for q in s.queues[c]
    ]  # fmt: skip
    borrowers.sort(key=lambda kq: kq[0])
    shared_need = [0.0, 0.0, 0.0, 0.0]
    shared_wait: dict[PermitId, float] = {}
    for _, q in borrowers:
        for d in range(4):
            shared_need[d] += q.estimate[d]
        need = (shared_need[0], shared_need[1], shared_need[2], shared_need[3])
        shared_wait[q.id] = _peek(book.shared, now).wait(need, lent, capped=False)
    rank = {q.id: i for i, (_, q) in enumerate(borrowers)}
    for s in book.shares.values():
        if not s.waiting:
            continue
        for cls in (G, B, BE):
            own = s.bucket(cls)
            peeked = None if own is None else _peek(own, now)
            need_own = [0.0, 0.0, 0.0, 0.0]
            for i, q in enumerate(s.queues[cls]):
                for d in range(4):
                    need_own[d] += q.estimate[d]
                mine: Vec = (need_own[0], need_own[1], need_own[2], need_own[3])
                wait = 0.0 if peeked is None else peeked.wait(mine, capped=False)
                position = i if cls == G else rank[q.id]
                if cls != G:
                    wait = max(wait, shared_wait[q.id])
                if blocked:
                    reason = PermitWaitReason.PROVIDER_THROTTLED
                    wait = max(wait, (book.blocked_until or now) - now)
                elif cls == G or (peeked is not None and not peeked.covers(mine)):
                    reason = PermitWaitReason.TENANT_BUDGET
                else:
                    reason = PermitWaitReason.BUDGET_EXHAUSTED
                est = None if math.isinf(wait) else wait
                out.append(PermitQueued(q.id, book.name, position, est, reason))
    return out


def _peek_key(book: Book, p: Permit, now: float) -> tuple[Tier, float, int, int]:
    """`Book.key` without refilling a meter or decaying a share (the same arithmetic)."""
    if p.cls == BE:
        tier = Tier.SHARED
    else:
        meter = p.share.nominal
        covered = meter is not None and _peek(meter, now).covers(p.estimate)
        tier = Tier.BURSTABLE_NOMINAL if covered else Tier.SHARED
    s = p.share
    if book.half_life <= 0:
        share = s.in_flight / s.weight
    elif now > s.usage_at:
        share = s.usage * math.pow(2.0, -(now - s.usage_at) / book.half_life) / s.weight
    else:
        share = s.usage / s.weight
    return (tier, share, p.cls, p.seq)


def _peek(b: Bucket, now: float) -> Bucket:
    """A copy of `b` refilled to `now`: what it would hold, the original untouched."""
    copy = Bucket(b.on, b.rate, b.cap, list(b.tokens), b.last)
    copy.refill(now)
    return copy


def _sum(vs: Iterable[Vec]) -> Vec:
    t = [0.0, 0.0, 0.0, 0.0]
    for v in vs:
        for d in range(4):
            t[d] += v[d]
    return (t[0], t[1], t[2], t[3])
