"""The budget core the shell drives: every budget of the policy (a `Book` each), the permits routed
to theirs, requests checked and refused at once where they could never be served.

    budgets = Budgets(policy, now)          # every bucket empty: the window assumed spent
    outcome = budgets.handle(event, now)    # PermitRequest | Settle | Withdraw | BudgetTick
    outcome.decisions, outcome.wake_at      # decisions in order; arm one timer for wake_at
    budgets.apply_policy(new_policy, now)   # a policy change, state carried over

Pure and deterministic, as the slot core: time is passed in, nothing is read or drawn. The slot
core knows nothing of budgets, and budgets nothing of slots: the shell passes a permit's tenant
and class (its session's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from scheduler.core.budget.book import Book, Permit
from scheduler.core.budget.places import positions, queued
from scheduler.core.budget.shares import BE, CLASS_OF, CLASSES, G, Share, carry, make_share
from scheduler.core.budget.types import (
    DIMENSION_NAMES,
    MAX_TOKENS_PER_CALL,
    BudgetDecision,
    BudgetEvent,
    BudgetTick,
    BudgetView,
    Charge,
    Outcome,
    OwnerGone,
    PermitEnded,
    PermitEndReason,
    PermitId,
    PermitQueued,
    PermitRefused,
    PermitRefuseReason,
    PermitRequest,
    PermitWithdrawn,
    Settle,
    SettleRefused,
    SettleRefuseReason,
    Usage,
    Vec,
    Withdraw,
)
from scheduler.policy.model import Policy

# The request field each dimension of an estimate comes from (total tokens: input + output).
_FIELDS = ("estimate.requests", "estimate.input_tokens", "estimate.output_tokens", "estimate")
# A provider's retry-after beyond this is not a throttle we wait out on its word.
MAX_RETRY_AFTER_S = 3600.0


_NUMBERS = (int, float)  # exact types: a bool is not a count
# The decisions after which a permit is neither open nor waiting (exact types: the union is closed).
_CLOSING = frozenset({PermitEnded, PermitWithdrawn, PermitRefused})


def usage_problem(u: Usage, name: str) -> tuple[str, str] | None:
    """(field, message) for a usage or an estimate no call could have, or None."""
    i, o, r = u.input_tokens, u.output_tokens, u.requests
    if (
        type(i) in _NUMBERS and type(o) in _NUMBERS and type(r) in _NUMBERS
        and 0 <= i <= MAX_TOKENS_PER_CALL and 0 <= o <= MAX_TOKENS_PER_CALL
        and 0 <= r <= MAX_TOKENS_PER_CALL
    ):  # fmt: skip
        return None  # the common case, in a few comparisons (NaN fails them: checked below)
    for fld, v in (
        ("input_tokens", u.input_tokens),
        ("output_tokens", u.output_tokens),
        ("requests", u.requests),
    ):
        path = f"{name}.{fld}"
        if isinstance(v, bool) or not isinstance(v, int | float):
            return path, f"{path}: expected a number, got {type(v).__name__}"
        if math.isnan(v) or math.isinf(v):
            return path, f"{path}: expected a finite number, got {v!r}"
        if v < 0:
            return path, f"{path}: must not be negative, got {v!r}"
        if v > MAX_TOKENS_PER_CALL:
            return path, f"{path}: {v!r} is more than any call uses (at most {MAX_TOKENS_PER_CALL})"
    return None


def _retry_after(wait: float | None) -> float:
    """As the slot queue's caps: half the estimated wait, between 1 and 60 s (5 s without one)."""
    return 5.0 if wait is None else min(60.0, max(1.0, wait / 2.0))


class Budgets:
    def __init__(self, policy: Policy, now: float, fast: bool = True) -> None:
        """`fast`: the books' one-step paths (Book.serve_alone, Book.after_close), which decide
        as the full pass does; False only to check that (tests/test_budget_differential.py)."""
        self.policy = policy
        self.fast = fast
        self.books: dict[str, Book] = {}
        self.tenants = frozenset(t.name for t in policy.tenants)
        self.where: dict[PermitId, Book] = {}
        # The permits each owner asked for (some closed since: checked when read, pruned as it
        # grows), so that its session's end closes its own without scanning every book.
        self.by_owner: dict[str, list[PermitId]] = {}
        for spec in policy.budgets:
            self.books[spec.name] = Book(
                spec, self._shares(policy, spec.name, now), self._half_life(policy), now, fast
            )

    @staticmethod
    def _half_life(policy: Policy) -> float:
        return policy.fairness.usage_half_life_s

    @staticmethod
    def _shares(policy: Policy, budget: str, now: float) -> dict[str, Share]:
        spec = policy.budget(budget)
        assert spec is not None
        shares = {}
        for t in policy.tenants:
            s = make_share(t, spec, now)
            if s is not None:
                shares[t.name] = s
        return shares

    # --- the surface --------------------------------------------------------------------------

    def handle(self, event: BudgetEvent, now: float) -> Outcome:
        out: list[BudgetDecision] = []
        if isinstance(event, PermitRequest):
            self._request(event, now, out)
        elif isinstance(event, Settle):
            self._settle(event, now, out)
        elif isinstance(event, Withdraw):
            self._withdraw(event, now, out)
        elif isinstance(event, Charge):
            self._charge(event, now, out)
        elif isinstance(event, OwnerGone):
            self._owner_gone(event, now, out)
        elif isinstance(event, BudgetTick):
            for book in self.books.values():
                book.serve(now, out)
        else:  # pragma: no cover - the union is closed
            raise TypeError(f"not a budget event: {event!r}")
        return self._outcome(out)

    def wake_at(self) -> float | None:
        soonest = None
        for b in self.books.values():
            if b.wake is not None and (soonest is None or b.wake < soonest):
                soonest = b.wake
        return soonest

    def views(self) -> tuple[BudgetView, ...]:
        return tuple(b.view() for b in self.books.values())

    def positions(self, now: float) -> tuple[PermitQueued, ...]:
        """Every waiting permit's place now (position, estimated wait, reason), changing nothing:
        the shell tells a waiter anew when its position or reason moved."""
        return tuple(q for b in self.books.values() if b.waiting for q in positions(b, now))

    def permit_owner(self, permit: PermitId) -> str | None:
        book = self.where.get(permit)
        p = None if book is None else book.permits.get(permit)
        return None if p is None else p.owner

    def _outcome(self, out: list[BudgetDecision]) -> Outcome:
        for d in out:
            if type(d) in _CLOSING:
                self.where.pop(d.permit, None)  # type: ignore[union-attr]
        return Outcome(tuple(out), self.wake_at())

    # --- permits ------------------------------------------------------------------------------

    def _refuse(
        self, out: list[BudgetDecision], ev: PermitRequest, reason: PermitRefuseReason, message: str,
        field: str = "", retry_after_s: float | None = None,
    ) -> None:  # fmt: skip
        out.append(PermitRefused(ev.permit, ev.budget, reason, message, field, retry_after_s))

    def _request(self, ev: PermitRequest, now: float, out: list[BudgetDecision]) -> None:
        R = PermitRefuseReason
        book = self.books.get(ev.budget)
        if ev.permit in self.where:
            return self._refuse(
                out, ev, R.DUPLICATE_PERMIT, f"permit {ev.permit!r} is open or waiting already"
            )
        if book is None:
            names = ", ".join(repr(n) for n in self.books) or "none"
            return self._refuse(
                out, ev, R.UNKNOWN_BUDGET, f"unknown budget {ev.budget!r}: the policy's budgets are {names}"
            )
        if ev.tenant not in self.tenants:
            return self._refuse(out, ev, R.UNKNOWN_TENANT, f"tenant {ev.tenant!r} is not in the policy")
        cls = CLASS_OF[ev.qos]
        share = book.shares.get(ev.tenant)
        if share is None or not share.allowed(cls, book.on):
            return self._refuse(
                out, ev, R.NO_SHARE,
                f"tenant {ev.tenant!r} has no {ev.qos.value} share of budget {ev.budget!r} "
                "(spec.tenants[].budgets): it could never be served",
            )  # fmt: skip
        problem = usage_problem(ev.estimate, "estimate")
        if problem is not None:
            return self._refuse(out, ev, R.INVALID_ESTIMATE, problem[1], problem[0])
        est = ev.estimate.vector()
        too_large = self._too_large(book, share, cls, est)
        if too_large is not None:
            return self._refuse(out, ev, R.ESTIMATE_TOO_LARGE, too_large[1], too_large[0])
        book.seq += 1
        p = Permit(ev.permit, ev.owner, share, cls, est, ev.estimate, est[book.unit], book.seq, now)
        book.enqueue(p)
        self.where[p.id] = book
        mine = self.by_owner.get(ev.owner)
        if mine is None:
            self.by_owner[ev.owner] = [p.id]
        else:
            mine.append(p.id)
            if len(mine) > 64 and len(mine) & (len(mine) - 1) == 0:  # at powers of two: amortized
                mine[:] = [q for q in mine if q in self.where]
        if book.waiting == 1:
            book.serve_alone(p, now, out)  # nobody else waits: one step (the hot path)
        else:
            book.serve(now, out)
        if p.granted_at is not None:
            return None
        full = self._queue_full(book, p)
        if full is None:
            out.append(queued(book, p, now))
            return None
        wait = queued(book, p, now).estimated_wait_s
        book.dequeue(p)
        self._refuse(out, ev, full[0], full[1], retry_after_s=_retry_after(wait))
        book.serve(now, out)  # it may have headed the queue
        return None

    @staticmethod
    def _too_large(book: Book, share: Share, cls: int, est: Vec) -> tuple[str, str] | None:
        """An estimate above a bucket's capacity (one minute of its rate) never fits."""
        known = book.capacities.get((share.tenant, cls))
        if known is None:
            known = book.capacities[(share.tenant, cls)] = Budgets._capacity(book, share, cls)
        cap, where = known
        for d in book.on:
            if est[d] > cap[d]:
                return _FIELDS[d], (
                    f"{_FIELDS[d]}: {est[d]:g} {DIMENSION_NAMES[d]} is more than {where} of budget "
                    f"{book.name!r} holds ({cap[d]:g} a minute): it could never be granted"
                )
        return None

    @staticmethod
    def _capacity(book: Book, share: Share, cls: int) -> tuple[list[float], str]:
        """What a permit of the share's class fits in at most, and where that is (fixed for the
        book's life: its shares and rates come with the policy)."""
        own = share.limit[cls]
        assert own is not None
        cap = list(own)
        where = f"the tenant's {CLASSES[cls].value} rate"
        if cls != G:
            shared = book.shared_capacity()
            for d in book.on:
                if shared[d] < cap[d]:
                    cap[d], where = (
                        shared[d],
                        "the budget's shared rate (its limit less the Guaranteed rates)",
                    )
        return cap, where

    def _queue_full(self, book: Book, p: Permit) -> tuple[PermitRefuseReason, str] | None:
        """The waiting caps, as the slot queue's: BestEffort refused at a fraction of them."""
        spec = book.spec
        fraction = self.policy.queue.best_effort_fraction if p.cls == BE else 1.0
        cap, tcap = spec.max_pending * fraction, spec.max_pending_per_tenant * fraction
        if book.waiting - 1 >= cap:
            return PermitRefuseReason.QUEUE_FULL, (
                f"budget {book.name!r} has {book.waiting - 1} permits waiting (maxPending {spec.max_pending})"
            )
        if p.share.waiting - 1 >= tcap:
            return PermitRefuseReason.TENANT_QUEUE_FULL, (
                f"tenant {p.share.tenant!r} has {p.share.waiting - 1} permits waiting on budget "
                f"{book.name!r} (maxPendingPerTenant {spec.max_pending_per_tenant})"
            )
        return None

    def _open(
        self, permit: PermitId, owner: str, waiting: bool, now: float, out: list[BudgetDecision]
    ) -> Permit | None:
        """The permit, after its book is brought to `now`; a SettleRefused if it is not open (not
        waiting, for a withdrawal) or is another owner's."""
        book = self.where.get(permit)
        if book is not None:
            book.serve(now, out, wake=False)  # the caller's next pass finds it (else below)
        p = None if book is None else book.permits.get(permit)
        if p is None or (p.granted_at is None) != waiting:
            state = "waiting" if waiting else "open"
            out.append(
                SettleRefused(permit, SettleRefuseReason.NOT_OPEN, f"permit {permit!r} is not {state}")
            )
        elif p.owner != owner:
            out.append(
                SettleRefused(permit, SettleRefuseReason.NOT_OWNER, f"permit {permit!r} is another session's")
            )
        else:
            return p
        if book is not None:
            book.serve_wake(now)
        return None

    def _settle(self, ev: Settle, now: float, out: list[BudgetDecision]) -> None:
        problem = usage_problem(ev.usage, "usage")
        retry = ev.throttled_retry_after_s
        if (
            problem is None
            and retry is not None
            and (
                isinstance(retry, bool)
                or not isinstance(retry, int | float)
                or not 0 <= retry <= MAX_RETRY_AFTER_S
            )
        ):
            problem = (
                "throttled_retry_after_s",
                f"throttled_retry_after_s: expected 0 to {MAX_RETRY_AFTER_S:g} s, got {retry!r}",
            )
        if problem is not None:
            out.append(SettleRefused(ev.permit, SettleRefuseReason.INVALID_USAGE, problem[1], problem[0]))
            return
        p = self._open(ev.permit, ev.owner, False, now, out)
        if p is None:
            return
        book = self.where[p.id]
        book.close(p, ev.usage.vector(), PermitEndReason.SETTLED, now, out, throttled=retry is not None)
        if ev.reported is not None:
            book.adopt(ev.reported, now, out)
        if retry is not None:
            book.throttled(p, float(retry), now, out)
            book.serve(now, out)
        elif ev.reported is not None:
            book.serve(now, out)
        else:
            book.after_close(now, out)  # a refund may grant waiters

    def _charge(self, ev: Charge, now: float, out: list[BudgetDecision]) -> None:
        """A permit granted now with a zero estimate and settled at once: its whole usage a debt."""
        if ev.permit in self.where:
            out.append(
                SettleRefused(ev.permit, SettleRefuseReason.NOT_OPEN, f"permit {ev.permit!r} is open here")
            )
            return
        problem = usage_problem(ev.usage, "usage")
        book = self.books.get(ev.budget)
        share = None if book is None else book.shares.get(ev.tenant)
        cls = CLASS_OF[ev.qos]
        if problem is None and (book is None or share is None or not share.allowed(cls, book.on)):
            problem = (
                "budget",
                f"budget: {ev.budget!r} is not a budget tenant {ev.tenant!r} has a {ev.qos.value} share of",
            )
        if problem is not None:
            out.append(SettleRefused(ev.permit, SettleRefuseReason.INVALID_USAGE, problem[1], problem[0]))
            return
        assert book is not None and share is not None
        zero = Usage(0.0, 0.0, 0.0)
        book.seq += 1
        p = Permit(ev.permit, ev.owner, share, cls, zero.vector(), zero, 0.0, book.seq, now)
        p.granted_at, p.borrowed, p.counted = now, cls != G, cls != G
        book.permits[p.id] = p
        book.close(p, ev.usage.vector(), PermitEndReason.SETTLED, now, out)
        book.serve(now, out)

    def _owner_gone(self, ev: OwnerGone, now: float, out: list[BudgetDecision]) -> None:
        """Its waiting permits withdrawn, its open ones closed at their estimate (the call may
        be in flight: charging the estimate is the side that cannot overrun the provider)."""
        mine = self.by_owner.pop(ev.owner, [])
        books = [b for b in self.books.values() if any(self.where.get(q) is b for q in mine)]
        for book in books:
            book.serve(now, out)  # to now first: a permit past its TTL expires as it would have
        for pid in mine:
            at = self.where.get(pid)
            p = None if at is None else at.permits.get(pid)
            if at is None or p is None or p.owner != ev.owner:
                continue
            if p.granted_at is None:
                at.withdraw(p, now, out)
            else:
                at.close(p, p.estimate, PermitEndReason.SESSION_ENDED, now, out)
        for book in books:
            book.serve(now, out)  # a withdrawal may let those behind it through

    def _withdraw(self, ev: Withdraw, now: float, out: list[BudgetDecision]) -> None:
        p = self._open(ev.permit, ev.owner, True, now, out)
        if p is None:
            return
        book = self.where[p.id]
        book.withdraw(p, now, out)
        book.serve(now, out)

    # --- a policy change ----------------------------------------------------------------------

    def apply_policy(self, policy: Policy, now: float) -> Outcome:
        """Put `policy` in force: budgets kept keep their state (buckets clamped to new caps, the
        effective limit, open permits); new ones start empty; waiting permits the new policy
        could never serve, and those of a budget removed, are refused (POLICY_CHANGED)."""
        out: list[BudgetDecision] = []
        for book in self.books.values():
            book.serve(now, out)
        old_books, self.books, self.policy = self.books, {}, policy
        self.tenants = frozenset(t.name for t in policy.tenants)
        for spec in policy.budgets:
            book = Book(spec, self._shares(policy, spec.name, now), self._half_life(policy), now, self.fast)
            old = old_books.pop(spec.name, None)
            if old is not None:
                self._inherit(book, old, now, out)
            self.books[spec.name] = book
        for old in old_books.values():  # removed: its waiters are refused, its open permits dropped
            self._refuse_waiting(old.permits.values(), old, "its budget was removed from the policy", out)
        self.where = {pid: b for b in self.books.values() for pid in b.permits}
        for owner in list(self.by_owner):
            mine = [q for q in self.by_owner[owner] if q in self.where]
            if mine:
                self.by_owner[owner] = mine
            else:
                del self.by_owner[owner]
        for book in self.books.values():
            book.serve(now, out)
        return self._outcome(out)

    def _inherit(self, book: Book, old: Book, now: float, out: list[BudgetDecision]) -> None:
        for name, s in book.shares.items():
            if name in old.shares:
                carry(old.shares[name], s)
        book.factor, book.blocked_until = old.factor, old.blocked_until
        book.last_decrease, book.next_recovery = old.last_decrease, old.next_recovery
        book.throttled_at = old.throttled_at
        # A stated limit is a fraction of the configured one: kept only while that is the same
        # (else the next statement sets it again).
        book.ceiling = old.ceiling if old.configured == book.configured else 1.0
        book.rescale()
        book.shared.last = old.shared.last
        book.shared.tokens = [min(t, c) for t, c in zip(old.shared.tokens, book.shared.cap, strict=True)]
        book.seq, book.expiry = old.seq, old.expiry
        refused: list[Permit] = []
        for p in sorted(old.permits.values(), key=lambda q: q.seq):
            share = book.shares.get(p.share.tenant)
            if p.granted_at is not None:
                p.share = share if share is not None else p.share  # refunds go to its new buckets
                book.permits[p.id] = p
            elif (
                share is None
                or not share.allowed(p.cls, book.on)
                or self._too_large(book, share, p.cls, p.estimate)
            ):
                refused.append(p)
            else:
                p.share = share
                book.enqueue(p)
        self._refuse_waiting(refused, old, "the new policy could never serve it", out)

    @staticmethod
    def _refuse_waiting(permits: Iterable[Permit], book: Book, why: str, out: list[BudgetDecision]) -> None:
        for p in permits:
            if p.granted_at is None:
                out.append(
                    PermitRefused(
                        p.id,
                        book.name,
                        PermitRefuseReason.POLICY_CHANGED,
                        f"permit {p.id!r} on budget {book.name!r}: {why}",
                    )
                )
