"""The provider's stated limit (its rate-limit response headers, carried by a settle): the budget
core adopts it at once, below the configured limit only, so no 429 is needed to learn it
(docs/design.md, "Token budgets"; docs/decisions/0016-provider-reported-limits.md). Budget `llm`
of tests/budget_script.py: 6,000 tokens and 6,000 requests a minute."""

from __future__ import annotations

import math
from typing import Any

import pytest
from budget_script import BUDGET, E, event, policy, summary

from scheduler.core.budget.core import Budgets
from scheduler.core.budget.types import BudgetTick, PermitId, ReportedLimits, Settle, Usage


def _settle(pid: str, reported: ReportedLimits | None, retry: float | None = None) -> Settle:
    return Settle(PermitId(pid), "s-" + pid, Usage(100, 0), retry, reported)


def _run(core: Budgets, steps: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    seen: list[tuple[Any, ...]] = []
    for step in steps:
        if step[0] == "stated":  # ("stated", t, id, ReportedLimits[, retry])
            ev: Any = _settle(step[2], step[3], step[4] if len(step) > 4 else None)
        else:
            ev = event(step)
        seen.extend(summary(d) for d in core.handle(ev, float(step[1])).decisions)
    return seen


def _factor(core: Budgets) -> float:
    (v,) = [v for v in core.views() if v.name == BUDGET]
    return round(v.factor, 4)


@pytest.mark.parametrize(
    ("stated", "factor"),
    [
        (ReportedLimits(tokens=4800.0), 0.8),
        (ReportedLimits(requests=3000.0, tokens=5400.0), 0.5),  # the lowest over what both limit
        (ReportedLimits(tokens=12000.0), 1.0),  # never above the configured limit
        (ReportedLimits(input_tokens=600.0), 1.0),  # a dimension the budget does not limit
        (ReportedLimits(tokens=math.nan, requests=-1.0), 1.0),  # nonsense is ignored
        (ReportedLimits(tokens=0.0), 1.0),
    ],
)
def test_a_stated_limit_below_the_configured_is_adopted(stated: ReportedLimits, factor: float) -> None:
    core = Budgets(policy(), 0.0)
    seen = _run(core, [("req", 0, "p1", "e", E, 100, 0), ("tick", 2), ("stated", 3, "p1", stated)])
    assert _factor(core) == factor
    assert (("limit", "reported", factor) in seen) == (factor < 1.0)
    (v,) = core.views()
    assert v.limits_per_minute[3] == pytest.approx(6000 * factor)


def test_a_settle_that_states_nothing_changes_nothing() -> None:
    core = Budgets(policy(), 0.0)
    _run(core, [("req", 0, "p1", "e", E, 100, 0), ("tick", 2), ("stated", 3, "p1", None)])
    assert _factor(core) == 1.0


def test_a_loss_point_above_the_stated_limit_is_forgotten_and_recovery_climbs_to_it() -> None:
    """A 429 at the configured limit cuts to 0.7 and would plateau at 0.8 (of the level that drew
    it); the provider then states 0.9: the 429 is explained by the configured number, so recovery
    returns to 0.9, and no higher."""
    core = Budgets(policy(), 0.0)
    seen = _run(
        core,
        [
            ("req", 0, "p1", "e", E, 100, 0),
            ("tick", 2),
            ("settle", 3, "p1", 0, 0, 0.0),  # throttled: 0.7
            ("req", 3, "p2", "e", E, 100, 0),
            ("tick", 5),
            ("stated", 6, "p2", ReportedLimits(tokens=5400.0)),
            *[("tick", 3 + 60 * k) for k in range(1, 8)],
        ],
    )
    assert [s for s in seen if s[0] == "limit"] == [
        ("limit", "throttled", 0.7),
        ("limit", "recovered", 0.75),
        ("limit", "recovered", 0.8),
        ("limit", "recovered", 0.85),
        ("limit", "recovered", 0.9),
    ]
    assert _factor(core) == 0.9


def test_a_higher_statement_replaces_a_lower_one() -> None:
    """A tier upgrade: the provider states more than before; recovery climbs to the new limit."""
    core = Budgets(policy(), 0.0)
    _run(
        core,
        [
            ("req", 0, "p1", "e", E, 100, 0),
            ("tick", 2),
            ("stated", 3, "p1", ReportedLimits(tokens=3000.0)),
            ("req", 3, "p2", "e", E, 100, 0),
            ("tick", 6),
            ("stated", 7, "p2", ReportedLimits(tokens=3600.0)),
        ],
    )
    assert _factor(core) == 0.5
    for k in range(1, 4):
        core.handle(BudgetTick(), 7 + 60.0 * k)
    assert _factor(core) == 0.6


def test_a_429_below_the_stated_limit_still_cuts() -> None:
    """A key shared with someone else: the stated limit is not all ours, and the 429 path still
    finds what is."""
    core = Budgets(policy(), 0.0)
    seen = _run(
        core,
        [
            ("req", 0, "p1", "e", E, 100, 0),
            ("tick", 2),
            ("stated", 3, "p1", ReportedLimits(tokens=4800.0), 1.0),
        ],
    )
    assert [s for s in seen if s[0] == "limit"] == [("limit", "reported", 0.8), ("limit", "throttled", 0.56)]
