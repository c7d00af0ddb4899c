"""The budget core's decisions, as tables: immediate refusals, and scripted scenarios of permits
(budget `llm`: 100 tokens a second; g reserves 10 a second, the shared bucket refills 90; see
tests/budget_script.py). docs/design.md, "Token budgets", states each rule."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from budget_script import BUDGET, B, E, G, event, policy, run, summary

from scheduler.core.budget.core import Budgets
from scheduler.core.budget.types import (
    BudgetName,
    BudgetTick,
    LimitChanged,
    PermitId,
    PermitQueued,
    PermitRefused,
    PermitRequest,
    Usage,
)
from scheduler.core.types import QoS, TenantName

NAN, INF = math.nan, math.inf


def request(
    tenant: str = "e",
    qos: QoS = E,
    inp: float = 100,
    out: float = 0,
    budget: str = BUDGET,
    requests: float = 1,
) -> PermitRequest:
    return PermitRequest(
        PermitId("p"), "s", TenantName(tenant), BudgetName(budget), qos, Usage(inp, out, requests)
    )


REFUSALS: list[tuple[str, PermitRequest, str, str]] = [
    ("unknown budget", request(budget="nope"), "unknown_budget", ""),
    ("unknown tenant", request(tenant="nobody"), "unknown_tenant", ""),
    ("a tenant naming no share of the budget", request(tenant="z"), "no_share", ""),
    ("a class with no share: Guaranteed without a reserved rate", request(tenant="e", qos=G), "no_share", ""),
    (
        "a class with no share: Burstable of a Guaranteed-only tenant",
        request(tenant="g", qos=B),
        "no_share",
        "",
    ),
    ("a negative estimate", request(inp=-1), "invalid_estimate", "estimate.input_tokens"),
    ("a NaN estimate", request(out=NAN), "invalid_estimate", "estimate.output_tokens"),
    ("an infinite estimate", request(inp=INF), "invalid_estimate", "estimate.input_tokens"),
    ("an absurd estimate", request(out=1e10), "invalid_estimate", "estimate.output_tokens"),
    ("negative requests", request(requests=-1), "invalid_estimate", "estimate.requests"),
    # g's leaf holds a minute of its 600 a minute: 601 never fits.
    (
        "above the Guaranteed leaf's capacity",
        request(tenant="g", qos=G, inp=601),
        "estimate_too_large",
        "estimate",
    ),
    # b's limit is 60%: 3,600 a minute.
    (
        "above the Burstable limit's capacity",
        request(tenant="b", qos=B, inp=3601),
        "estimate_too_large",
        "estimate",
    ),
    # The shared bucket holds the limit less the reserved rates: 5,400.
    ("above the shared bucket's capacity", request(inp=3000, out=2401), "estimate_too_large", "estimate"),
    ("requests above capacity", request(requests=5401), "estimate_too_large", "estimate.requests"),
]


@pytest.mark.parametrize(("case", "req", "reason", "field"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_permit_that_could_never_be_served_is_refused_at_once(
    case: str, req: PermitRequest, reason: str, field: str
) -> None:
    core = Budgets(policy(), 0.0)
    out = core.handle(req, 0.0)
    assert len(out.decisions) == 1, out
    d = out.decisions[0]
    assert isinstance(d, PermitRefused)
    assert (d.reason.value, d.field) == (reason, field), d.message
    if field:
        assert field in d.message  # the message names the field, for the caller to fix
    assert out.wake_at is None and core.views()[0].waiting == 0


def test_a_permit_id_open_or_waiting_is_refused_as_a_duplicate() -> None:
    core = Budgets(policy(), 0.0)
    core.handle(request(), 0.0)
    d = core.handle(request(), 0.0).decisions
    assert [summary(x) for x in d] == [("refused", "p", "duplicate_permit", "")]


Step = tuple[Any, ...]
SCENARIOS: list[tuple[str, dict[str, Any], list[Step], list[Step]]] = [
    (
        "a new core starts empty: Guaranteed waits on its own rate, then is granted",
        {},
        [("req", 0, "p1", "g", G, 60, 0), ("tick", 6)],
        [("queued", "p1", "tenant_budget", 0), ("granted", "p1")],
    ),
    (
        "Guaranteed within its reserved rate never waits on borrowers",
        {},
        [("req", 0, "p1", "e", E, 5400, 0), ("req", 0, "p2", "g", G, 60, 0), ("tick", 6)],
        [("queued", "p1", "budget_exhausted", 0), ("queued", "p2", "tenant_budget", 0), ("granted", "p2")],
    ),
    (
        "class order: Burstable within nominal before an older BestEffort",
        {},
        [("req", 0, "p1", "e", E, 900, 0), ("req", 0, "p2", "b", B, 900, 0), ("tick", 10), ("tick", 20)],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("queued", "p2", "budget_exhausted", 0),
            ("granted", "p2"),
            ("granted", "p1"),
        ],
    ),
    (
        "Burstable beyond its nominal goes after Burstable within it",
        {},
        [
            ("req", 0, "p1", "b", B, 1200, 0),
            ("tick", 13.4),
            ("req", 13.4, "p2", "b", B, 600, 0),
            ("req", 13.5, "p3", "c", B, 600, 0),
            ("tick", 20.2),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("queued", "p2", "budget_exhausted", 0),
            ("queued", "p3", "budget_exhausted", 0),
            ("granted", "p3"),
        ],
    ),
    (
        "fair share: the tenant that borrowed less recently goes first",
        {
            "tenants": [
                {"name": "e", "budgets": [{"budget": BUDGET}]},
                {"name": "f", "budgets": [{"budget": BUDGET}]},
            ]
        },
        [
            ("req", 0, "p1", "e", E, 900, 0),
            ("tick", 10),
            ("req", 10, "p2", "e", E, 900, 0),
            ("req", 10, "p3", "f", E, 900, 0),
            ("tick", 20),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("queued", "p2", "budget_exhausted", 0),
            ("queued", "p3", "budget_exhausted", 0),
            ("granted", "p3"),
        ],
    ),
    (
        "the head blocks smaller permits behind it: a large permit is never starved",
        {},
        [("req", 0, "p1", "e", E, 5000, 0), ("req", 1, "p2", "c", E, 100, 0), ("tick", 5), ("tick", 55.6)],
        [("queued", "p1", "budget_exhausted", 0), ("queued", "p2", "budget_exhausted", 1), ("granted", "p1")],
    ),
    (
        "unused reserved rate is lent: a full leaf overflows to the shared bucket",
        {},
        # From t=60 g's leaf is full: 90 + 10 a second refill the shared bucket (864 without).
        [("req", 0, "p1", "e", E, 5400, 0), ("tick", 60), ("req", 60, "p2", "e", E, 950, 0), ("tick", 69.6)],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("queued", "p2", "budget_exhausted", 0),
            ("granted", "p2"),
        ],
    ),
    (
        "reserved rate is not lent while its owner waits",
        {},
        [
            ("req", 0, "p1", "e", E, 5400, 0),
            ("tick", 60),
            ("req", 60, "p2", "g", G, 600, 0),
            ("req", 60, "p3", "g", G, 60, 0),
            ("req", 60, "p4", "e", E, 950, 0),
            ("tick", 66),
            ("tick", 69.6),
            ("tick", 70.6),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("granted", "p2"),
            ("queued", "p3", "tenant_budget", 0),
            ("queued", "p4", "budget_exhausted", 0),
            ("granted", "p3"),
            ("granted", "p4"),
        ],
    ),
    (
        "a refund at settle grants a waiter at once",
        {},
        [
            ("req", 0, "p1", "e", E, 5400, 0),
            ("tick", 60),
            ("req", 60, "p2", "e", E, 900, 0),
            ("settle", 61, "p1", 1000, 0),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("queued", "p2", "budget_exhausted", 0),
            ("ended", "p1", "settled"),
            ("granted", "p2"),
        ],
    ),
    (
        "a settle above the estimate is a debt the next grants wait out",
        {},
        [
            ("req", 0, "p1", "e", E, 5400, 0),
            ("tick", 60),
            ("settle", 60, "p1", 10800, 0),
            ("req", 60, "p2", "e", E, 100, 0),
            ("tick", 100),
            ("tick", 115.5),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("ended", "p1", "settled"),
            ("queued", "p2", "budget_exhausted", 0),
            ("granted", "p2"),
        ],
    ),
    (
        "a permit is settled once, by its own session",
        {},
        [
            ("req", 0, "p1", "e", E, 100, 0),
            ("tick", 2),
            ("settle", 3, "p1", 50, 0, None, "intruder"),
            ("settle", 3, "p1", 50, 0),
            ("settle", 4, "p1", 50, 0),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("settle_refused", "p1", "not_owner"),
            ("ended", "p1", "settled"),
            ("settle_refused", "p1", "not_open"),
        ],
    ),
    (
        "a permit not settled within its TTL is charged its estimate and closed",
        {"budget": {"permitTTLSeconds": 30}},
        [("req", 0, "p1", "e", E, 100, 0), ("tick", 2), ("tick", 32), ("settle", 33, "p1", 50, 0)],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("ended", "p1", "expired"),
            ("settle_refused", "p1", "not_open"),
        ],
    ),
    (
        "a waiting permit is withdrawn by its own session; the one behind it moves up",
        {},
        [
            ("req", 0, "p1", "e", E, 5400, 0),
            ("req", 0, "p2", "c", E, 100, 0),
            ("withdraw", 2, "p1", "intruder"),
            ("withdraw", 2, "p1"),
            ("withdraw", 3, "p2"),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("queued", "p2", "budget_exhausted", 1),
            ("settle_refused", "p1", "not_owner"),
            ("withdrawn", "p1"),
            ("granted", "p2"),
            ("settle_refused", "p2", "not_open"),  # granted: settle it, not withdraw it
        ],
    ),
    (
        "a throttle: one decrease per episode, no grant until the retry-after, a step back a minute",
        {},
        [
            ("req", 0, "p1", "e", E, 100, 0),
            ("req", 0, "p2", "b", B, 100, 0),
            ("tick", 3),
            ("settle", 3, "p1", 0, 0, 5.0),
            ("settle", 3, "p2", 0, 0, 5.0),  # granted before the decrease: no second one
            ("req", 4, "p3", "e", E, 100, 0),
            ("tick", 8),
            ("tick", 68),
            ("settle", 70, "p3", 0, 0, 0.0),  # granted within a window of the decrease: no second
            ("req", 70, "p4", "e", E, 100, 0),
            ("tick", 72),
            ("settle", 72, "p4", 0, 0, 0.0),  # granted a window after it: the limit drops again
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("queued", "p2", "budget_exhausted", 0),
            ("granted", "p2"),
            ("granted", "p1"),
            ("ended", "p1", "settled"),
            ("limit", "throttled", 0.7),
            ("ended", "p2", "settled"),
            ("queued", "p3", "provider_throttled", 0),
            ("granted", "p3"),
            ("limit", "recovered", 0.75),
            ("ended", "p3", "settled"),
            ("queued", "p4", "budget_exhausted", 0),
            ("granted", "p4"),
            ("ended", "p4", "settled"),
            ("limit", "throttled", 0.525),
        ],
    ),
    (
        "no compounding within an episode: the throttle empties the shared bucket, and a permit "
        "granted after the retry-after but within the window cuts nothing",
        {},
        [
            ("req", 0, "p1", "e", E, 100, 0),
            ("tick", 60),
            ("settle", 60, "p1", 0, 0, 1.0),
            ("req", 60, "p2", "e", E, 100, 0),
            ("tick", 61),  # a full bucket would grant it here, into the provider's deficit
            ("tick", 62),  # 70 a second refill it (0.7 of 100)
            ("settle", 62, "p2", 0, 0, 1.0),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("ended", "p1", "settled"),
            ("limit", "throttled", 0.7),
            ("queued", "p2", "provider_throttled", 0),
            ("granted", "p2"),
            ("ended", "p2", "settled"),
            ("limit", "throttled", 0.7),  # a new retry-after, logged; the limit unchanged
        ],
    ),
    (
        "recovery stops below the last throttled level: at the plateau, a third of the way from "
        "the cut back to it; no step above it while the limit does not bind",
        {},
        [
            ("req", 0, "p1", "e", E, 100, 0),
            ("tick", 2),
            ("settle", 3, "p1", 0, 0, 0.0),
            ("tick", 63),
            ("tick", 123),
            ("tick", 183),
            ("tick", 243),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("ended", "p1", "settled"),
            ("limit", "throttled", 0.7),
            ("limit", "recovered", 0.75),
            ("limit", "recovered", 0.8),
        ],
    ),
    (
        "above the plateau the limit is probed slowly, and only after a minute in which it bound",
        {},
        [
            ("req", 0, "p1", "e", E, 100, 0),
            ("tick", 2),
            ("settle", 3, "p1", 0, 0, 0.0),
            ("tick", 63),
            ("tick", 123),
            ("req", 123, "p2", "e", E, 4000, 0),  # the shared bucket holds 3,900: it binds
            ("req", 123, "p3", "c", E, 4000, 0),
            ("tick", 183),
            ("tick", 243),
            ("tick", 303),  # nobody waited since 243: no step
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("ended", "p1", "settled"),
            ("limit", "throttled", 0.7),
            ("limit", "recovered", 0.75),
            ("limit", "recovered", 0.8),
            ("queued", "p2", "budget_exhausted", 0),
            ("queued", "p3", "budget_exhausted", 1),
            ("limit", "recovered", 0.8012),  # a fortieth of the 5% step
            ("granted", "p2"),
            ("limit", "recovered", 0.8025),
            ("granted", "p3"),
        ],
    ),
    (
        "a grant beyond nominal never eats the nominal (as a borrowing slot lease is not a "
        "nominal one): the tenant's next permit within it is served in the nominal tier",
        {},
        [
            ("req", 0, "p1", "b", B, 1200, 0),
            ("tick", 13.4),  # within b's nominal (its meter: 1,200, 20 a second)
            ("req", 13.4, "p2", "b", B, 600, 0),
            ("tick", 20.2),  # beyond it: counted in b's share, its meter untouched
            ("req", 20.2, "p3", "e", E, 2700, 0),
            ("tick", 50.3),  # the shared bucket spent again; b's meter back to ~740
            ("req", 50.3, "p4", "b", B, 700, 0),  # within nominal
            ("req", 50.3, "p5", "c", B, 1300, 0),  # beyond c's, at share 0
            ("tick", 58.2),
            ("withdraw", 58.3, "p5"),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("queued", "p2", "budget_exhausted", 0),
            ("granted", "p2"),
            ("queued", "p3", "budget_exhausted", 0),
            ("granted", "p3"),
            ("queued", "p4", "budget_exhausted", 0),
            ("queued", "p5", "budget_exhausted", 1),
            ("granted", "p4"),
            ("withdrawn", "p5"),
        ],
    ),
    (
        "beyond nominal, Burstable and BestEffort share one tier by weighted share: a light "
        "tenant's BestEffort before a heavy tenant's Burstable beyond its nominal",
        {},
        [
            ("req", 0, "p1", "b", B, 1200, 0),
            ("tick", 13.4),  # within its nominal: not counted in its share
            ("req", 13.4, "p2", "b", B, 600, 0),
            ("tick", 20.2),  # beyond it: counted
            ("req", 20.2, "p3", "b", B, 600, 0),
            ("req", 20.2, "p4", "e", E, 600, 0),
            ("tick", 27),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("granted", "p1"),
            ("queued", "p2", "budget_exhausted", 0),
            ("granted", "p2"),
            ("queued", "p3", "budget_exhausted", 0),
            ("queued", "p4", "budget_exhausted", 0),
            ("granted", "p4"),
        ],
    ),
    (
        "queue caps: the tenant's, then the budget's (BestEffort at 80% of them); a grant is never refused",
        {"budget": {"maxPending": 2, "maxPendingPerTenant": 1}},
        [
            ("req", 0, "p1", "e", E, 5400, 0),
            ("req", 0, "p2", "e", E, 100, 0),
            ("req", 0, "p3", "c", B, 100, 0),
            ("req", 0, "p4", "b", B, 100, 0),
            ("req", 2, "p5", "g", G, 10, 0),
        ],
        [
            ("queued", "p1", "budget_exhausted", 0),
            ("refused", "p2", "tenant_queue_full", ""),
            ("queued", "p3", "budget_exhausted", 0),
            ("refused", "p4", "queue_full", ""),
            ("granted", "p5"),  # Guaranteed, from its leaf (20 by now)
            ("granted", "p3"),  # and the shared bucket's 180 serve its head
        ],
    ),
]


@pytest.mark.parametrize(("case", "keys", "steps", "expected"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_a_scenario_decides_as_the_design_says(
    case: str, keys: dict[str, Any], steps: list[Step], expected: list[Step]
) -> None:
    seen, _ = run(Budgets(policy(**keys), 0.0), steps)
    assert seen == expected


def test_waiting_says_its_estimate_and_the_next_wake_up_is_when_it_fits() -> None:
    core = Budgets(policy(), 0.0)
    # g's leaf refills 10 a second: 60 tokens in 6 s.
    out = core.handle(event(("req", 0, "p1", "g", G, 60, 0)), 0.0)
    q = out.decisions[0]
    assert isinstance(q, PermitQueued)
    assert q.estimated_wait_s == pytest.approx(6.0)
    assert out.wake_at == pytest.approx(6.0)
    # Two borrowers: the second's estimate counts the first's (90 a second: 900 + 450 -> 15 s).
    core.handle(event(("req", 0, "p2", "e", E, 900, 0)), 0.0)
    q2 = core.handle(event(("req", 0, "p3", "c", E, 450, 0)), 0.0).decisions[0]
    assert isinstance(q2, PermitQueued) and q2.position == 1
    assert q2.estimated_wait_s == pytest.approx(15.0)
    # Granted at the wake-up it asked for, not a tick later.
    tick = core.handle(BudgetTick(), out.wake_at or 0.0)
    assert ("granted", "p1") in [summary(d) for d in tick.decisions]


def test_a_queue_full_refusal_carries_a_retry_after() -> None:
    core = Budgets(policy(budget={"maxPendingPerTenant": 1}), 0.0)
    core.handle(event(("req", 0, "p1", "c", B, 1000, 0)), 0.0)
    d = core.handle(event(("req", 0, "p2", "c", B, 100, 0)), 0.0).decisions[0]
    assert isinstance(d, PermitRefused) and d.reason.value == "tenant_queue_full"
    assert d.retry_after_s is not None and 1.0 <= d.retry_after_s <= 60.0


def test_a_throttle_never_cuts_below_the_minimum_and_is_logged_with_the_limits() -> None:
    core = Budgets(policy(budget={"feedback": {"decrease": 0.1, "minimum": 0.2}}), 0.0)
    run(core, [("req", 0, "p1", "e", E, 100, 0), ("tick", 2)])
    out = core.handle(event(("settle", 2, "p1", 0, 0, 1.0)), 2.0)
    change = [d for d in out.decisions if isinstance(d, LimitChanged)]
    assert len(change) == 1
    assert change[0].factor == pytest.approx(0.2)
    assert change[0].limits_per_minute == pytest.approx((1200.0, 0.0, 0.0, 1200.0))
    assert change[0].blocked_until == pytest.approx(3.0)
    assert out.wake_at == pytest.approx(3.0)


def test_a_policy_change_keeps_what_was_spent_and_refuses_waiters_it_cannot_serve() -> None:
    core = Budgets(policy(), 0.0)
    steps = [("req", 0, "p1", "e", E, 5400, 0), ("tick", 60), ("req", 60, "p2", "b", B, 900, 0)]
    seen, _ = run(core, steps)
    assert ("granted", "p1") in seen
    # b loses its share: its waiter is refused. The window spent at t=60 is not refilled by the
    # change: 61 s in, the shared bucket holds one second of refill (90 + 10 lent), not a minute.
    tenants: list[dict[str, Any]] = [
        {"name": "g", "budgets": [{"budget": BUDGET, "guaranteed": {"percent": 10}}]},
        {"name": "b"},
        {"name": "e", "budgets": [{"budget": BUDGET}]},
    ]
    new = policy(tenants=tenants)
    out = core.apply_policy(new, 61.0)
    assert [summary(d) for d in out.decisions] == [("refused", "p2", "policy_changed", "")]
    assert core.views()[0].shared_available[3] == pytest.approx(100.0)
    # The open permit still settles against its budget.
    ended = core.handle(event(("settle", 62, "p1", 100, 0)), 62.0).decisions
    assert [summary(d) for d in ended] == [("ended", "p1", "settled")]
    # A budget removed: its waiters are refused, its open permits forgotten.
    seen, _ = run(core, [("req", 63, "p3", "e", E, 5000, 0), ("req", 63, "p4", "e", E, 5000, 0)])
    assert seen == [("granted", "p3"), ("queued", "p4", "budget_exhausted", 0)]  # p1's refund
    gone = core.apply_policy(replace(new, budgets=()), 64.0)
    assert [summary(d) for d in gone.decisions] == [("refused", "p4", "policy_changed", "")]
    assert core.views() == () and core.wake_at() is None
