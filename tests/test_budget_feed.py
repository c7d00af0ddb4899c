"""What an active session spends of a budget a minute (the autoscaler's cap reads it)."""

from __future__ import annotations

import pytest

from scheduler.core.budget.feed import SessionRates

T = (0.0, 0.0, 0.0, 1.0)  # one total token


def tokens(n: float) -> tuple[float, float, float, float]:
    return (1.0, 0.0, 0.0, n)


@pytest.mark.parametrize(
    ("charges", "now", "want"),
    [
        pytest.param([], 30.0, None, id="nothing_charged"),
        # The current minute alone, while no complete one is known.
        pytest.param(
            [(10.0, "a", 600), (20.0, "a", 400), (30.0, "b", 1000)], 40.0, (1.5, 1000), id="partial_only"
        ),
        # Complete minutes only, once there are: minute 0 has a and b (2 session-minutes, 3000
        # tokens), minute 1 has a alone (1000): 4000 / 3; minute 2's partial count is left out.
        pytest.param(
            [(10.0, "a", 1000), (20.0, "b", 2000), (70.0, "a", 1000), (125.0, "c", 9999)],
            130.0,
            (1.0, 4000 / 3),
            id="complete_minutes_per_session_minute",
        ),  # fmt: skip
        # Past the window (5 minutes): forgotten.
        pytest.param([(10.0, "a", 1000)], 60.0 * 7, None, id="window_passed"),
    ],
)
def test_per_session_rate(
    charges: list[tuple[float, str, float]], now: float, want: tuple[float, float] | None
) -> None:
    r = SessionRates()
    for t, who, n in charges:
        r.observe("llm", who, tokens(n), t)
    got = r.per_session("llm", now)
    assert (None if got is None else (got[0], got[3])) == (None if want is None else pytest.approx(want))


def test_a_budget_the_policy_dropped_is_forgotten() -> None:
    r = SessionRates()
    r.observe("llm", "a", T, 1.0)
    r.forget({"other"})
    assert r.per_session("llm", 2.0) is None
