"""The loop's PermitDesk around the budget core: a waiting permit's watcher is told its new place
when its position or reason changes (and only then), and a session's end closes its permits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from budget_script import B, policy

from scheduler.core.budget.types import (
    BudgetName,
    BudgetTick,
    OwnerGone,
    PermitEnded,
    PermitEndReason,
    PermitGranted,
    PermitId,
    PermitQueued,
    PermitRequest,
    PermitWithdrawn,
    Settle,
    Usage,
    Withdraw,
)
from scheduler.core.types import TenantName
from scheduler.server.permits import PermitDesk


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ask(desk: PermitDesk, pid: str, owner: str, tenant: str, tokens: float) -> Any:
    ev = PermitRequest(PermitId(pid), owner, TenantName(tenant), BudgetName("llm"), B, Usage(tokens, 0.0))
    return next(d for d in desk.handle(ev, tenant) if getattr(d, "permit", None) == pid)


def on_loop(body: Callable[[], None]) -> None:
    async def main() -> None:
        body()

    asyncio.run(main())


def test_a_waiter_is_told_again_only_when_its_position_or_reason_moves() -> None:
    def body() -> None:
        clock = Clock()
        desk = PermitDesk(policy(), clock)  # budget_script: 6,000 tokens a minute, starts empty
        told: dict[str, list[tuple[str, int, str]]] = {}
        for i, owner in enumerate(("s-a", "s-b", "s-c")):
            first = ask(desk, f"p{i}", owner, "b", 900)
            assert isinstance(first, PermitQueued) and first.position == i
            told[first.permit] = []

            def tell(d: Any, pid: str = first.permit) -> None:
                kind = "queued" if isinstance(d, PermitQueued) else "granted"
                told[pid].append((kind, getattr(d, "position", -1), getattr(d, "reason", "")))

            desk.watch(first.permit, tell)
        clock.now = 1.0
        desk.handle(Withdraw(PermitId("p3"), "nobody"))  # refused, nothing moves: nobody told
        assert told == {"p0": [], "p1": [], "p2": []}
        desk.handle(Withdraw(PermitId("p0"), "s-a"))  # the head leaves: those behind move up
        assert told["p1"] == [("queued", 0, "budget_exhausted")]
        assert told["p2"] == [("queued", 1, "budget_exhausted")]
        clock.now = 10.5  # the shared bucket refills 90 a second: p1's 900 granted, p2 moves up
        desk.handle(BudgetTick())
        assert told["p1"][-1][0] == "granted"
        assert told["p2"] == [("queued", 1, "budget_exhausted"), ("queued", 0, "budget_exhausted")]
        desk.close()

    on_loop(body)


def test_a_sessions_end_closes_its_open_permits_at_their_estimate_and_withdraws_its_waiting() -> None:
    def body() -> None:
        clock = Clock()
        desk = PermitDesk(policy(), clock)
        clock.now = 60.0  # a full minute: 6,000 tokens
        granted = ask(desk, "p1", "s-a", "b", 1000)
        waiting = ask(desk, "p2", "s-a", "b", 3500)  # above b's Burstable limit left (60%)
        other = ask(desk, "p3", "s-b", "c", 500)
        assert isinstance(granted, PermitGranted) and isinstance(other, PermitGranted)
        assert isinstance(waiting, PermitQueued)
        out = desk.handle(OwnerGone("s-a"))
        ended = [d for d in out if isinstance(d, PermitEnded)]
        assert [(d.permit, d.reason, d.charged[3], d.refunded[3]) for d in ended] == [
            ("p1", PermitEndReason.SESSION_ENDED, 1000.0, 0.0)
        ]
        assert [d.permit for d in out if isinstance(d, PermitWithdrawn)] == ["p2"]
        # The other session's permit stays open; the ended one's settle finds it closed.
        assert desk.budgets.permit_owner(PermitId("p3")) == "s-b"
        refused = desk.handle(Settle(PermitId("p1"), "s-a", Usage(10.0, 0.0)))
        assert [type(d).__name__ for d in refused] == ["SettleRefused"]
        desk.session_ended("s-b")
        assert desk.budgets.permit_owner(PermitId("p3")) is None
        desk.close()

    on_loop(body)
