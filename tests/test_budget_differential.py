"""The budget core decides the same on random event runs as the core it was optimized from.

The hot path (request and settle) was made cheap without changing a decision: this test replays
seeded random runs (requests of every class, settles with more or less than the estimate, 429s,
withdrawals, foreign and second settles, orphan charges, ticks at the wake-ups asked for) over
several policies, and compares a fingerprint of every decision (floats to 9 significant digits)
with the one the unoptimized core gave. A change of decision, of order, or of wake-up fails it;
a deliberate change of semantics must update FINGERPRINT (say why in the commit).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import hashlib
import random
from typing import Any

import pytest
from budget_script import BUDGET, B, E, G, event, policy

from scheduler.core.budget.core import Budgets
from scheduler.core.budget.places import queued
from scheduler.core.budget.types import (
    BudgetName,
    BudgetTick,
    Charge,
    PermitGranted,
    PermitId,
    PermitQueued,
    Usage,
)
from scheduler.core.types import TenantName

FINGERPRINT = "b60cd0478cb7feeb99e54c7ed91c12fca4a78ff552994316ba82c381bc7ed123"

WHO = [("g", G), ("b", B), ("c", B), ("b", E), ("e", E), ("c", E), ("z", B), ("g", B)]

POLICIES: list[dict[str, Any]] = [
    {},
    {"fairness": {"usageHalfLifeSeconds": 0}},
    {"budget": {"maxPending": 6, "maxPendingPerTenant": 3}},
    {"budget": {"inputTokensPerMinute": 4000, "outputTokensPerMinute": 2000}},
    {"budget": {"permitTTLSeconds": 5}},
]


def _norm(x: Any) -> Any:
    if isinstance(x, float):
        return f"{x:.9g}"
    if isinstance(x, enum.Enum):
        return x.value
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, *(_norm(getattr(x, f.name)) for f in dataclasses.fields(x)))
    if isinstance(x, tuple | list):
        return tuple(_norm(v) for v in x)
    return x


def _policy(keys: dict[str, Any]) -> Any:
    return policy(budget=keys.get("budget"), **{k: v for k, v in keys.items() if k != "budget"})


def _run(
    seed: int, keys: dict[str, Any], probe: bool = False, fast: bool = True, twin: bool = False
) -> list[Any]:
    """A seeded run's log; `twin`: also a core without the one-step paths, fed the same events,
    must decide exactly the same (==, not to 9 digits) and end each event in the same state."""
    rnd = random.Random(seed)
    core = Budgets(_policy(keys), 0.0, fast=fast)
    slow = Budgets(_policy(keys), 0.0, fast=False) if twin else None
    now, wake = 0.0, None
    log: list[Any] = []
    open_: dict[str, PermitGranted] = {}
    waiting: set[str] = set()
    n = 0

    def apply(t: float, ev: Any) -> None:
        nonlocal wake
        out = core.handle(ev, t)
        if slow is not None:
            assert slow.handle(ev, t) == out
            assert _state(slow) == _state(core)
        wake = out.wake_at
        log.append((_norm(t), _norm(out.wake_at)))
        if probe:
            _probe(core, t)
        for d in out.decisions:
            log.append(_norm(d))
            pid = getattr(d, "permit", None)
            if isinstance(d, PermitGranted):
                open_[d.permit] = d
                waiting.discard(d.permit)
            elif isinstance(d, PermitQueued):
                waiting.add(d.permit)
            elif pid is not None and type(d).__name__ != "SettleRefused":
                open_.pop(pid, None)
                waiting.discard(pid)

    for _ in range(rnd.randint(20, 120)):
        now += rnd.choice([0.0, 0.0, 0.01, 0.3, 1.0, 4.0, 17.0]) * rnd.random()
        while wake is not None and wake <= now:
            apply(wake, BudgetTick())
        kind = rnd.choices(["req", "settle", "withdraw", "tick", "odd"], [6, 4, 1, 1, 1])[0]
        if kind == "req":
            n += 1
            tenant, qos = rnd.choice(WHO)
            inp, out = rnd.choice([0, 10, 200, 900, 3000]), rnd.choice([0, 50, 400, 2500])
            apply(now, event(("req", now, f"p{n}", tenant, qos, inp, out)))
        elif kind == "settle" and open_:
            pid = rnd.choice(sorted(open_))
            e = open_[pid].estimate
            f = rnd.choice([0.0, 0.5, 1.0, 1.7])
            retry = rnd.choice([None, None, None, 0.0, 2.0])
            apply(now, event(("settle", now, pid, e.input_tokens * f, e.output_tokens * f, retry)))
        elif kind == "withdraw" and waiting:
            apply(now, event(("withdraw", now, rnd.choice(sorted(waiting)))))
        elif kind == "odd":
            pick = rnd.randint(0, 2)
            if pick == 0 and open_:  # another session's settle
                apply(now, event(("settle", now, rnd.choice(sorted(open_)), 1, 1, None, "intruder")))
            elif pick == 1:  # a closed or unknown permit
                apply(now, event(("settle", now, f"p{rnd.randint(1, n + 1)}", 1, 1)))
            else:  # a former leader's permit
                tenant, qos = rnd.choice(WHO)
                u = Usage(rnd.choice([0, 300]), rnd.choice([0, 700]))
                ev = Charge(PermitId(f"old{n}"), "s-old", TenantName(tenant), BudgetName(BUDGET), qos, u)
                apply(now, ev)
        else:
            apply(now, BudgetTick())
    return log


def _state(core: Budgets) -> list[Any]:
    """Every number a later decision reads, exactly: buckets, shares, the limit's feedback."""

    def bucket(b: Any) -> Any:
        return None if b is None else (tuple(b.tokens), b.last, tuple(b.rate), tuple(b.cap))

    out: list[Any] = []
    for book in core.books.values():
        out.append(
            (book.name, bucket(book.shared), book.factor, book.ceiling, book.bound, book.blocked_until,
             book.last_decrease, book.next_recovery, book.throttled_at, book.waiting, book.wake,
             sorted((p.id, p.granted_at, p.expires_at, p.borrowed, p.counted) for p in book.permits.values()))
        )  # fmt: skip
        for sh in book.shares.values():
            out.append(
                (sh.tenant, bucket(sh.leaf), bucket(sh.nominal), *(bucket(c) for c in sh.ceilings),
                 sh.usage, sh.usage_at, sh.in_flight, sh.waiting, [[q.id for q in qu] for qu in sh.queues])
            )  # fmt: skip
    return out


def _probe(core: Budgets, now: float) -> None:
    """`positions` tells each waiting permit what `queued` would with every meter refilled to
    now (on a copy: it refills them; `positions` reads them as of now without moving them)."""
    told = {q.permit: q for q in core.positions(now)}
    twin = copy.deepcopy(core)
    for book in twin.books.values():
        for share in book.shares.values():  # `queued` reads the meters as they were last moved
            for meter in (share.nominal, *share.ceilings):
                if meter is not None:
                    meter.refill(now)
        waiting = [p for p in book.permits.values() if p.granted_at is None]
        assert sorted(told) == sorted(p.id for p in waiting) or book.name != BUDGET
        for p in waiting:
            want, got = queued(book, p, now), told[p.id]
            assert (got.position, got.reason) == (want.position, want.reason), (got, want)
            if book.shared.last != now:
                continue  # not served at `now` (a refused settle): positions refills, queued not
            if want.estimated_wait_s is None:
                assert got.estimated_wait_s is None
            else:
                assert got.estimated_wait_s == pytest.approx(want.estimated_wait_s, rel=1e-9, abs=1e-9)


def fingerprint(probe: bool = False, seeds: int = 40, fast: bool = True) -> str:
    h = hashlib.sha256()
    for i, keys in enumerate(POLICIES):
        for seed in range(seeds):
            for entry in _run(1000 * i + seed, keys, probe, fast):
                h.update(repr(entry).encode())
    return h.hexdigest()


def test_the_optimized_core_decides_as_the_original_did() -> None:
    assert fingerprint() == FINGERPRINT


def test_the_one_step_paths_decide_as_the_full_pass() -> None:
    """A request nobody else waits with (Book.serve_alone) and a settle's pass with nobody
    waiting (Book.after_close, a pass without its wake-up) decide as the full `serve` each time:
    the runs hit them granted, waiting on a bucket, and blocked by a throttle."""
    assert fingerprint(fast=False) == FINGERPRINT
    for i, keys in enumerate(POLICIES):
        for seed in range(40):
            _run(1000 * i + seed, keys, twin=True)


def test_positions_tell_what_queued_would_and_change_no_decision() -> None:
    assert fingerprint(probe=True, seeds=8) == fingerprint(seeds=8)


if __name__ == "__main__":  # the fingerprint of the code checked out (run from the root)
    print(fingerprint())
