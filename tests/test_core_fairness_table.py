"""Decision table for the rules of issue 23 (docs/design.md, "Who gets the next free slot" and
"Checkpoint-and-yield preemption"): class order below the nominal tiers, BestEffort's minimum
share, usage over time, the share window, victim ties, no self-preemption. Each case fails on
the rule it names being broken; the summaries are those of the last step (tests/core_script.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import pytest

from scheduler.core.engine import Core
from scheduler.core.types import Tick, YieldRequested
from scheduler.policy.model import Policy
from scheduler.state import state_read, state_write
from tests.core_script import Driver, policy, tenant

A = tenant("a", nominal=0, limit=4)
B_ = tenant("b", nominal=0, limit=4)
P = tenant("p", nominal=0, limit=4)  # both Burstable (beyond nominal) and BestEffort
C = tenant("c")  # BestEffort only
OPS = tenant("ops", g=2)
SRE = tenant("sre", g=1)  # Guaranteed and BestEffort


def fair(pol: Policy, **kw: Any) -> Policy:
    return dataclasses.replace(pol, fairness=dataclasses.replace(pol.fairness, **kw))


# The share window's cases: x, y, z BestEffort; x holds w0/0-2, z holds w0/3. No preemption (min
# runtime beyond the steps), no usage (the share is what is held), leases that do not expire.
WINDOW = fair(
    policy(tenant("x"), tenant("y"), tenant("z"), min_runtime=1000, ttl=1e6),
    usage_half_life_s=0,
    share_window_s=100,
)
HOLD_3_1: list[tuple[Any, ...]] = [
    ("add", "w0", 4),
    ("acquire", "x0", "x", "be"),
    ("acquire", "x2", "x", "be"),
    ("acquire", "x3", "x", "be"),
    ("acquire", "z0", "z", "be"),
]


@dataclass
class Case:
    policy: Policy
    steps: list[tuple[Any, ...]]
    want: list[str]


CASES: dict[str, Case] = {
    # One shared tier: across tenants the share decides, not the class. a holds a slot (share 1),
    # c nothing (share 0): c's BestEffort request goes before a's older Burstable one (with no
    # minimum share for BestEffort, which has nothing to do with it).
    "besteffort_of_a_lower_share_goes_before_another_tenants_burstable": Case(
        fair(policy(A, C), usage_half_life_s=0, best_effort_min_share=0.0),
        [
            ("add", "w0", 2),
            ("acquire", "a0", "a", "b"),
            ("acquire", "a2", "a", "b"),
            (1, "acquire", "a1", "a", "b"),
            (2, "acquire", "c1", "c", "be"),
            (3, "release", "a0"),
        ],
        ["ended a0 released", "granted c1 w0/0"],
    ),
    "a_tenants_burstable_goes_before_its_own_older_besteffort": Case(
        policy(P),
        [
            ("add", "w0", 1),
            ("acquire", "p0", "p", "b"),
            (1, "acquire", "x1", "p", "be"),
            (2, "acquire", "p1", "p", "b"),
            (3, "release", "p0"),
        ],
        ["ended p0 released", "granted p1 w0/0"],
    ),
    # BestEffort's minimum share: a BestEffort waiter may take a borrowing Burstable lease only
    # while BestEffort holds less than its minimum share of the borrowed slots. a's two Burstable
    # leases (beyond its nominal of 0) are the only victims; c's waiter is below a (0 < 2).
    "besteffort_below_its_minimum_share_takes_a_burstable_victim": Case(
        fair(policy(A, C, min_runtime=10), best_effort_min_share=0.5, usage_half_life_s=0),
        [
            ("add", "w0", 2),
            ("acquire", "a0", "a", "b"),
            ("acquire", "a1", "a", "b"),
            (1, "acquire", "c1", "c", "be"),
            (11, "tick"),
        ],
        ["yield a1 fair_share"],
    ),
    "besteffort_without_a_minimum_share_takes_no_burstable_victim": Case(
        fair(policy(A, C, min_runtime=10), best_effort_min_share=0.0, usage_half_life_s=0),
        [
            ("add", "w0", 2),
            ("acquire", "a0", "a", "b"),
            ("acquire", "a1", "a", "b"),
            (1, "acquire", "c1", "c", "be"),
            (11, "tick"),
        ],
        [],
    ),
    # One slot, two tenants: with usage over time, the holder's tenant has used two min runtimes
    # of a slot more than the waiter's (21 slot-seconds, min runtime 10): fairness preemption,
    # though the instantaneous shares (1 against 0) forbid it. One min runtime for the swap
    # itself, one more so that after holding the slot one min runtime the waiter's tenant is
    # still no above the holder's (no ping-pong: the next case).
    "usage_over_time_rotates_a_slot_when_tenants_outnumber_slots": Case(
        fair(policy(tenant("x"), tenant("y"), min_runtime=10), usage_half_life_s=600, usage_sampling_s=1),
        [("add", "w0", 1), ("acquire", "x0", "x", "be"), ("acquire", "y0", "y", "be"), (21, "tick")],
        ["yield x0 fair_share"],
    ),
    # The no-ping-pong margin: at 11 s x has used 1.1 min runtimes of a slot. Taking the slot
    # would leave y's share (1) only 0.1 below x's (0 + 1.1): within one min runtime of holding
    # it, y would be above x, and x would take it straight back.
    "a_fairness_preemption_leaves_the_preemptor_a_min_runtime_below_the_victims_tenant": Case(
        fair(policy(tenant("x"), tenant("y"), min_runtime=10), usage_half_life_s=600, usage_sampling_s=1),
        [("add", "w0", 1), ("acquire", "x0", "x", "be"), ("acquire", "y0", "y", "be"), (11, "tick")],
        [],
    ),
    # With usage, a tenant never takes more than the victim's tenant holds: x holds 3 of 4 slots
    # and has used them long (a big usage lead), y holds 1; y's waiter takes one slot (1 < 3),
    # then at 2 against 2 (after the swap) no more, whatever x's usage.
    "with_usage_a_preemption_never_takes_beyond_the_victims_holding": Case(
        fair(
            policy(tenant("x"), tenant("y"), min_runtime=10, ttl=1e6),
            usage_half_life_s=600,
            usage_sampling_s=1,
        ),
        [
            ("add", "w0", 4),
            ("acquire", "x0", "x", "be"),
            ("acquire", "x1", "x", "be"),
            ("acquire", "x2", "x", "be"),
            ("acquire", "y0", "y", "be"),
            (300, "acquire", "y1", "y", "be"),
            (300, "acquire", "y2", "y", "be"),
        ],
        ["queued y2"],
    ),
    # Without usage the share is what is held and does not grow with holding: no margin. x holds
    # 2, y none: y may take one (1 against 1 after), as before.
    "without_usage_no_margin_a_two_to_none_split_still_preempts": Case(
        fair(policy(tenant("x"), tenant("y"), min_runtime=10, ttl=1e6), usage_half_life_s=0),
        [
            ("add", "w0", 2),
            ("acquire", "x0", "x", "be"),
            ("acquire", "x1", "x", "be"),
            ("acquire", "y0", "y", "be"),
            (11, "tick"),
        ],
        ["yield x1 fair_share"],
    ),
    "without_usage_over_time_a_share_below_one_slot_never_preempts": Case(
        fair(policy(tenant("x"), tenant("y"), min_runtime=10), usage_half_life_s=0),
        [("add", "w0", 1), ("acquire", "x0", "x", "be"), ("acquire", "y0", "y", "be"), (11, "tick")],
        [],
    ),
    # Usage decays: y held the slot long ago, x only lately; x's recent use counts more.
    "a_waiter_whose_use_has_decayed_takes_the_slot": Case(
        fair(
            policy(tenant("x"), tenant("y"), min_runtime=10, ttl=1e6),
            usage_half_life_s=60,
            usage_sampling_s=1,
        ),
        [
            ("add", "w0", 1),
            ("acquire", "y0", "y", "be"),
            (100, "release", "y0"),
            (100, "acquire", "x0", "x", "be"),
            (400, "acquire", "y1", "y", "be"),  # y's 100 slot-s have halved 5 times since
        ],
        ["yield x0 fair_share", "queued y1"],
    ),
    # The share window (spec.fairness.shareWindowSeconds W = 100; usage off, so the share is what
    # is held). x holds 3 of 4 slots (share 3), y none (share 0); x1 waits from t=1, y1 arrives
    # later; z's slot frees. x1's key is 1 + 100 * 3/4 = 76: y1 goes first only if it arrived
    # before 76, never if it arrived W or more after x1, whatever the shares.
    "within_the_window_a_lower_share_goes_ahead_of_an_older_request": Case(
        WINDOW,
        [*HOLD_3_1, (1, "acquire", "x1", "x", "be"), (60, "acquire", "y1", "y", "be"), (61, "release", "z0")],
        ["ended z0 released", "granted y1 w0/3"],
    ),
    "beyond_the_window_the_older_request_goes_first_whatever_the_shares": Case(
        WINDOW,
        [
            *HOLD_3_1,
            (1, "acquire", "x1", "x", "be"),
            (101, "acquire", "y1", "y", "be"),
            (102, "release", "z0"),
        ],
        ["ended z0 released", "granted x1 w0/3"],
    ),
    "without_a_window_the_share_alone_decides": Case(
        fair(WINDOW, share_window_s=0),
        [
            *HOLD_3_1,
            (1, "acquire", "x1", "x", "be"),
            (900, "acquire", "y1", "y", "be"),
            (901, "release", "z0"),
        ],
        ["ended z0 released", "granted y1 w0/3"],
    ),
    # The same in tier 3 (Burstable beyond nominal): a holds one borrowed slot (share 1, so a1's
    # key is 1 + 100 / 2 = 51), b none.
    "tier_3_within_the_window_a_lower_share_goes_first": Case(
        fair(policy(A, B_, tenant("z"), min_runtime=1000, ttl=1e6), usage_half_life_s=0, share_window_s=100),
        [
            ("add", "w0", 2),
            ("acquire", "a0", "a", "b"),
            ("acquire", "z0", "z", "be"),
            (1, "acquire", "a1", "a", "b"),
            (40, "acquire", "b1", "b", "b"),
            (41, "release", "z0"),
        ],
        ["ended z0 released", "granted b1 w0/1"],
    ),
    "tier_3_beyond_the_window_the_older_request_goes_first": Case(
        fair(policy(A, B_, tenant("z"), min_runtime=1000, ttl=1e6), usage_half_life_s=0, share_window_s=100),
        [
            ("add", "w0", 2),
            ("acquire", "a0", "a", "b"),
            ("acquire", "z0", "z", "be"),
            (1, "acquire", "a1", "a", "b"),
            (60, "acquire", "b1", "b", "b"),
            (61, "release", "z0"),
        ],
        ["ended z0 released", "granted a1 w0/1"],
    ),
    # a and b hold one slot each (equal shares); a was preempted before, so b yields this time.
    "a_victim_tie_goes_to_the_tenant_least_recently_preempted": Case(
        policy(tenant("a"), tenant("b"), OPS),
        [
            ("add", "w0", 2),
            ("acquire", "a1", "a", "be"),
            ("acquire", "b1", "b", "be"),
            ("acquire", "g1", "ops", "g"),  # tie: a yields (by name)
            (1, "yield", "a1"),  # g1 granted, a1 queued
            (2, "release", "g1"),  # a1 granted again
            (3, "acquire", "g2", "ops", "g"),
        ],
        ["yield b1 guaranteed", "queued g2"],
    ),
    # Within a tenant: a2 was preempted and granted again (the newest grant); a1 never was.
    "within_a_tenant_a_session_never_preempted_yields_before_one_preempted_before": Case(
        policy(tenant("a"), OPS),
        [
            ("add", "w0", 2),
            ("acquire", "a1", "a", "be"),
            ("acquire", "a2", "a", "be"),
            ("acquire", "g1", "ops", "g"),  # the newest grant, a2, yields
            (1, "yield", "a2"),
            (2, "release", "g1"),  # a2 granted again: now the newest
            (3, "acquire", "g2", "ops", "g"),
        ],
        ["yield a1 guaranteed", "queued g2"],
    ),
    # sre's Guaranteed request never asks sre's own BestEffort lease to yield: c's yields, though
    # sre's share is higher.
    "a_guaranteed_request_takes_another_tenants_lease_not_its_own": Case(
        policy(SRE, C),
        [
            ("add", "w0", 3),
            ("acquire", "s1", "sre", "be"),
            ("acquire", "s2", "sre", "be"),
            ("acquire", "c1", "c", "be"),
            ("acquire", "g1", "sre", "g"),
        ],
        ["yield c1 guaranteed", "queued g1"],
    ),
    "a_request_with_only_its_own_tenants_leases_to_take_waits": Case(
        policy(SRE),
        [("add", "w0", 1), ("acquire", "s1", "sre", "be"), ("acquire", "g1", "sre", "g")],
        ["queued g1"],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_decision(name: str) -> None:
    case = CASES[name]
    assert Driver(case.policy).run(case.steps) == case.want


def test_a_state_without_usage_loads_with_usage_at_zero() -> None:
    """A state document an older build wrote has no `fairness` part: it loads, usage from zero."""
    pol = fair(policy(tenant("x"), tenant("y"), min_runtime=10), usage_half_life_s=600, usage_sampling_s=1)
    d = Driver(pol)
    d.run([("add", "w0", 1), ("acquire", "x0", "x", "be"), ("acquire", "y0", "y", "be"), (5, "tick")])
    doc = state_write.core_doc(d.core.export_records())
    assert any(row[0] == "x" and row[1] > 0 for row in doc["fairness"]["usage"])
    del doc["fairness"]
    core = Core.from_records(pol, state_read.core_records(json.loads(json.dumps(doc))))
    assert {t.name: t.share for t in core.describe().tenants} == {"x": 1.0, "y": 0.0}
    # Usage counts again from the load on: after 21 s more x has used two min runtimes (the swap
    # and the no-ping-pong margin).
    out = core.handle(Tick(), 26.5)
    assert [(type(o).__name__, o.lease.session) for o in out if isinstance(o, YieldRequested)] == [
        ("YieldRequested", "x0")
    ]


def test_a_new_share_window_reorders_the_waiters_at_once() -> None:
    """A policy change of `shareWindowSeconds` re-keys every waiter: y1 (share 0) was ahead of
    the older x1 (share 3) in share order; under a window of 100 s it arrived too late for that."""
    d = Driver(fair(WINDOW, share_window_s=0))
    d.run([*HOLD_3_1, (1, "acquire", "x1", "x", "be"), (101, "acquire", "y1", "y", "be")])
    assert d.core.apply_policy(WINDOW, 102) == []
    assert d.run([(103, "release", "z0")]) == ["ended z0 released", "granted x1 w0/3"]
