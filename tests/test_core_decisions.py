"""Decision table for the policy core: one case per rule of DESIGN.md, named after the rule.

Each case runs a script of steps against a fresh core and compares the decisions of the last
step (as readable summaries); some cases also check a detail with `check`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler.core.types import SessionId
from scheduler.policy.model import Policy
from tests.core_script import Driver, policy, summary, tenant

SRE = tenant("sre", g=2, nominal=1, limit=4)
OPS = tenant("ops", g=1)
PROD = tenant("prod", nominal=0, limit=4)
BATCH = tenant("batch")
A = tenant("a")
C = tenant("c")


@dataclass
class Case:
    policy: Policy
    steps: list[tuple[Any, ...]]
    want: list[str]
    check: Callable[[Driver], None] | None = field(default=None)


def _resume_is(session: str, uri: str) -> Callable[[Driver], None]:
    def check(d: Driver) -> None:
        view = d.core.session(SessionId(session))
        assert view is not None and view.lease is not None
        assert view.lease.resume_from is not None and view.lease.resume_from.uri == uri

    return check


def _borrowed_is(d: Driver, tenant: str, n: int) -> None:
    (view,) = [t for t in d.core.describe().tenants if t.name == tenant]
    assert view.borrowed == n, view


def _epoch_is(session: str, epoch: int) -> Callable[[Driver], None]:
    def check(d: Driver) -> None:
        view = d.core.session(SessionId(session))
        assert view is not None and view.lease is not None and view.lease.epoch == epoch

    return check


CASES: dict[str, Case] = {
    "grant_at_once_when_a_slot_is_free": Case(
        policy(tenant("t", nominal=1, limit=2)),
        [("add", "w0", 2), ("acquire", "s1", "t", "b")],
        ["granted s1 w0/0"],
    ),
    "wait_in_queue_when_full_not_rejected": Case(
        policy(BATCH),
        [("add", "w0", 1), ("acquire", "x1", "batch", "be"), ("acquire", "x2", "batch", "be")],
        ["queued x2"],
    ),
    "zero_quota_class_refused_at_once": Case(
        policy(BATCH), [("add", "w0", 1), ("acquire", "s", "batch", "g")], ["refused s no_quota"]
    ),
    "unknown_tenant_refused": Case(
        policy(BATCH), [("add", "w0", 1), ("acquire", "s", "nobody", "be")], ["refused s unknown_tenant"]
    ),
    "one_live_lease_or_request_per_session": Case(
        policy(BATCH),
        [("add", "w0", 1), ("acquire", "s", "batch", "be"), ("acquire", "s", "batch", "be")],
        ["refused s duplicate_session"],
    ),
    "guaranteed_quota_caps_held_leases": Case(
        policy(OPS),
        [("add", "w0", 2), ("acquire", "g1", "ops", "g"), ("acquire", "g2", "ops", "g")],
        ["queued g2"],
    ),
    "burstable_limit_caps_held_leases": Case(
        policy(tenant("t", nominal=1, limit=1)),
        [("add", "w0", 2), ("acquire", "b1", "t", "b"), ("acquire", "b2", "t", "b")],
        ["queued b2"],
    ),
    "besteffort_limit_caps_held_leases": Case(
        policy(tenant("t", be=1)),
        [("add", "w0", 2), ("acquire", "x1", "t", "be"), ("acquire", "x2", "t", "be")],
        ["queued x2"],
    ),
    "idle_floor_is_lent_to_preemptible_work": Case(
        policy(BATCH, floor=2),
        [("add", "w0", 2), ("acquire", "x1", "batch", "be"), ("acquire", "x2", "batch", "be")],
        ["granted x2 w0/1"],
    ),
    "floor_lent_to_burstable_below_nominal_only_as_borrowed": Case(
        policy(tenant("prod", nominal=2, limit=2), OPS, floor=1),
        [
            ("add", "w0", 2),
            ("acquire", "p1", "prod", "b"),
            ("acquire", "p2", "prod", "b"),  # within nominal, but on the floor: lent, preemptible
            (1, "acquire", "g1", "ops", "g"),
        ],
        ["yield p2 guaranteed", "queued g1"],
    ),
    "borrowed_burstable_promoted_to_nominal_when_the_floor_allows": Case(
        policy(tenant("prod", nominal=2, limit=3), OPS, floor=1),
        [
            ("add", "w0", 3),
            ("acquire", "p1", "prod", "b"),
            ("acquire", "p2", "prod", "b"),
            ("acquire", "p3", "prod", "b"),  # borrowing: beyond nominal
            ("release", "p1"),  # p3 is promoted: the tenant is back within its nominal
            (1, "acquire", "g1", "ops", "g"),
        ],
        ["granted g1 w0/0"],
        lambda d: _borrowed_is(d, "prod", 0),
    ),
    "guaranteed_preempts_besteffort_with_grace_deadline": Case(
        policy(SRE, BATCH, floor=2),
        [
            ("add", "w0", 2),
            ("acquire", "x1", "batch", "be"),
            ("acquire", "x2", "batch", "be"),
            (1, "acquire", "g1", "sre", "g"),
        ],
        ["yield x2 guaranteed", "queued g1"],
    ),
    "victim_besteffort_before_borrowing_burstable": Case(
        policy(OPS, PROD, BATCH),
        [
            ("add", "w0", 2),
            (0, "acquire", "x1", "batch", "be"),
            (1, "acquire", "p1", "prod", "b"),
            (2, "acquire", "g1", "ops", "g"),
        ],
        ["yield x1 guaranteed", "queued g1"],
    ),
    "victim_from_tenant_furthest_above_share": Case(
        policy(OPS, A, C),
        [
            ("add", "w0", 3),
            (0, "acquire", "a1", "a", "be"),
            (1, "acquire", "a2", "a", "be"),
            (2, "acquire", "c1", "c", "be"),
            (3, "acquire", "g1", "ops", "g"),
        ],
        ["yield a2 guaranteed", "queued g1"],
    ),
    "victim_loses_least_work_newest_grant": Case(
        policy(OPS, A),
        [
            ("add", "w0", 2),
            (0, "acquire", "a1", "a", "be"),
            (5, "acquire", "a2", "a", "be"),
            (6, "acquire", "g1", "ops", "g"),
        ],
        ["yield a2 guaranteed", "queued g1"],
    ),
    "guaranteed_lease_never_a_victim": Case(
        policy(SRE, OPS),
        [
            ("add", "w0", 2),
            ("acquire", "g1", "sre", "g"),
            ("acquire", "g2", "sre", "g"),
            ("acquire", "g3", "ops", "g"),
        ],
        ["queued g3"],
    ),
    "one_victim_per_waiting_request": Case(
        policy(SRE, BATCH),
        [
            ("add", "w0", 2),
            ("acquire", "x1", "batch", "be"),
            ("acquire", "x2", "batch", "be"),
            (1, "acquire", "g1", "sre", "g"),
            (
                2,
                "tick",
            ),
        ],
        [],
    ),
    "second_waiter_gets_its_own_victim": Case(
        policy(SRE, BATCH),
        [
            ("add", "w0", 2),
            ("acquire", "x1", "batch", "be"),
            ("acquire", "x2", "batch", "be"),
            (1, "acquire", "g1", "sre", "g"),
            (2, "acquire", "g2", "sre", "g"),
        ],
        ["yield x1 guaranteed", "queued g2"],
    ),
    "burstable_below_nominal_preempts_borrowed_capacity": Case(
        policy(tenant("prod", nominal=1, limit=2), BATCH),
        [
            ("add", "w0", 2),
            ("acquire", "x1", "batch", "be"),
            ("acquire", "x2", "batch", "be"),
            (1, "acquire", "p1", "prod", "b"),
        ],
        ["yield x2 nominal", "queued p1"],
    ),
    "fairness_preemption_waits_for_min_runtime": Case(
        policy(A, C, min_runtime=30, ttl=100),
        [
            ("add", "w0", 2),
            (0, "acquire", "a1", "a", "be"),
            (0, "acquire", "a2", "a", "be"),
            (1, "acquire", "c1", "c", "be"),
        ],
        ["queued c1"],
    ),
    "fairness_preemption_after_min_runtime": Case(
        policy(A, C, min_runtime=30, ttl=100),
        [
            ("add", "w0", 2),
            (0, "acquire", "a1", "a", "be"),
            (0, "acquire", "a2", "a", "be"),
            (1, "acquire", "c1", "c", "be"),
            (31, "tick"),
        ],
        ["yield a2 fair_share"],
    ),
    "fairness_only_if_requester_share_stays_le_victims": Case(
        policy(A, C, min_runtime=30, ttl=100),
        [
            ("add", "w0", 2),
            (0, "acquire", "a1", "a", "be"),
            (0, "acquire", "c1", "c", "be"),
            (1, "acquire", "c2", "c", "be"),
            (40, "tick"),
        ],
        [],
    ),
    "fairness_never_preempts_own_tenant": Case(
        policy(A, min_runtime=30, ttl=100),
        [
            ("add", "w0", 2),
            (0, "acquire", "a1", "a", "be"),
            (0, "acquire", "a2", "a", "be"),
            (1, "acquire", "a3", "a", "be"),
            (40, "tick"),
        ],
        [],
    ),
    "fairness_respects_weights": Case(
        policy(tenant("a", weight=1), tenant("c", weight=3), min_runtime=30, ttl=100),
        [
            ("add", "w0", 4),
            (0, "acquire", "a1", "a", "be"),
            (0, "acquire", "a2", "a", "be"),
            (0, "acquire", "a3", "a", "be"),
            (0, "acquire", "c1", "c", "be"),
            (1, "acquire", "c2", "c", "be"),
            (40, "tick"),
        ],
        # c after: 2/3 <= a after: 2/1, so c takes one of a's slots.
        ["yield a3 fair_share"],
    ),
    "order_guaranteed_before_older_burstable": Case(
        policy(SRE, PROD, BATCH),
        [
            ("add", "w0", 1),
            (0, "acquire", "x1", "batch", "be"),
            (1, "acquire", "p1", "prod", "b"),
            (2, "acquire", "g1", "sre", "g"),
            (3, "yield", "x1"),
        ],
        ["ended x1 yielded", "granted g1 w0/0", "queued x1"],
    ),
    "order_nominal_lowest_usage_ratio_first": Case(
        policy(
            tenant("p", nominal=2, limit=2), tenant("q", nominal=2, limit=2), tenant("r", nominal=1, limit=1)
        ),
        [
            ("add", "w0", 2),
            (0, "acquire", "p1", "p", "b"),
            (0, "acquire", "r1", "r", "b"),
            (1, "acquire", "p2", "p", "b"),
            (2, "acquire", "q1", "q", "b"),
            (3, "release", "r1"),
        ],
        ["ended r1 released", "granted q1 w0/1"],
    ),
    "order_shared_lowest_weighted_share_first": Case(
        policy(A, C),
        [
            ("add", "w0", 2),
            (0, "acquire", "a1", "a", "be"),
            (0, "acquire", "c1", "c", "be"),
            (1, "acquire", "a2", "a", "be"),
            (2, "acquire", "c2", "c", "be"),
            (3, "release", "c1"),
        ],
        ["ended c1 released", "granted c2 w0/1"],
    ),
    "order_ties_go_to_oldest_request": Case(
        policy(A, C, tenant("z", nominal=1, limit=1)),
        [
            ("add", "w0", 3),
            (0, "acquire", "a1", "a", "be"),
            (0, "acquire", "c1", "c", "be"),
            (0, "acquire", "z1", "z", "b"),
            (1, "acquire", "c2", "c", "be"),
            (2, "acquire", "a2", "a", "be"),
            (3, "release", "z1"),
        ],
        ["ended z1 released", "granted c2 w0/2"],
    ),
    "yielded_session_resumes_from_its_snapshot": Case(
        policy(SRE, BATCH),
        [
            ("add", "w0", 1),
            (0, "acquire", "x1", "batch", "be"),
            (1, "acquire", "g1", "sre", "g"),
            (2, "yield", "x1", "s3://b/batch/x1/1.snap"),
            (3, "release", "g1"),
        ],
        ["ended g1 released", "granted x1 w0/0"],
        _resume_is("x1", "s3://b/batch/x1/1.snap"),
    ),
    "yield_deadline_revokes_and_requeues": Case(
        policy(SRE, BATCH, grace=10),
        [
            ("add", "w0", 1),
            (0, "acquire", "x1", "batch", "be"),
            (1, "acquire", "g1", "sre", "g"),
            (11, "tick"),
        ],
        ["revoked x1 yield_deadline", "granted g1 w0/0", "queued x1"],
        _epoch_is("g1", 3),  # grant 1, revoke moves it on, grant 3
    ),
    "stale_epoch_refused_after_revoke": Case(
        policy(SRE, BATCH, grace=10),
        [
            ("add", "w0", 1),
            (0, "acquire", "x1", "batch", "be"),
            (1, "acquire", "g1", "sre", "g"),
            (11, "tick"),
            (12, "stale", "x1"),
        ],
        ["rejected x1 stale_epoch"],
    ),
    "another_sessions_lease_refused": Case(
        policy(BATCH),
        [
            ("add", "w0", 2),
            ("acquire", "x1", "batch", "be"),
            ("acquire", "x2", "batch", "be"),
            ("steal", "x2", "x1"),
        ],
        ["rejected x2 not_holder"],
    ),
    "unknown_lease_not_found": Case(
        policy(BATCH), [("add", "w0", 1), ("bogus", "zz")], ["rejected zz not_found"]
    ),
    "unrenewed_lease_expires_after_ttl": Case(
        policy(BATCH, ttl=30),
        [
            ("add", "w0", 1),
            (0, "acquire", "x1", "batch", "be"),
            (1, "acquire", "x2", "batch", "be"),
            (30, "tick"),
        ],
        ["expired x1", "granted x2 w0/0"],
    ),
    "renew_extends_the_lease": Case(
        policy(BATCH, ttl=30),
        [
            ("add", "w0", 1),
            (0, "acquire", "x1", "batch", "be"),
            (1, "acquire", "x2", "batch", "be"),
            (20, "renew", "x1"),
            (31, "tick"),
        ],
        [],
    ),
    "resumed_after_an_outage_no_lease_expires_for_it": Case(
        policy(BATCH, ttl=30),
        [
            ("add", "w0", 1),
            (0, "acquire", "x1", "batch", "be"),
            (1, "acquire", "x2", "batch", "be"),
            (100, "resumed", 10),  # down from 10 to 100: x1 could not renew, it is not expired
            (129, "tick"),
        ],
        [],
    ),
    "resumed_lease_still_expires_a_ttl_later": Case(
        policy(BATCH, ttl=30),
        [
            ("add", "w0", 1),
            (0, "acquire", "x1", "batch", "be"),
            (1, "acquire", "x2", "batch", "be"),
            (100, "resumed", 10),
            (130, "tick"),
        ],
        ["expired x1", "granted x2 w0/0"],
    ),
    "resumed_moves_a_yield_deadline_by_the_outage": Case(
        policy(SRE, BATCH, floor=1, grace=10, ttl=1000),
        [
            ("add", "w0", 1),
            (0, "acquire", "b1", "batch", "be"),
            (0, "acquire", "g1", "sre", "g"),  # b1 is asked to yield by 10
            (5, "resumed", 4),  # down from 4 to 5: the deadline moves to 11
            (10.5, "tick"),
        ],
        [],
    ),
    "resumed_yield_deadline_still_revokes_when_it_passes": Case(
        policy(SRE, BATCH, floor=1, grace=10, ttl=1000),
        [
            ("add", "w0", 1),
            (0, "acquire", "b1", "batch", "be"),
            (0, "acquire", "g1", "sre", "g"),
            (5, "resumed", 4),
            (11, "tick"),
        ],
        ["revoked b1 yield_deadline", "granted g1 w0/0", "queued b1"],
    ),
    "worker_added_again_with_fewer_slots_is_a_new_worker": Case(
        policy(BATCH),
        [
            ("add", "w0", 3),
            ("remove", "w0"),
            ("add", "w0", 1),  # stale free-slot entries of the old w0 (slots 1, 2) are skipped
            (1, "acquire", "x1", "batch", "be"),
            (1, "acquire", "x2", "batch", "be"),
        ],
        ["queued x2"],
    ),
    "no_grants_on_a_draining_worker": Case(
        policy(BATCH),
        [
            ("add", "w0", 1),
            ("add", "w1", 1),
            ("drain", "w0"),
            ("acquire", "x1", "batch", "be"),
            ("acquire", "x2", "batch", "be"),
        ],
        ["queued x2"],
    ),
    "drain_asks_leases_to_yield": Case(
        policy(BATCH),
        [("add", "w0", 1), ("acquire", "x1", "batch", "be"), ("drain", "w0", 5)],
        ["yield x1 drain"],
    ),
    "removed_worker_revokes_and_requeues_elsewhere": Case(
        policy(BATCH),
        [("add", "w0", 1), ("acquire", "x1", "batch", "be"), ("add", "w1", 1), ("remove", "w0")],
        ["revoked x1 worker_removed", "granted x1 w1/0"],
    ),
    "pool_queue_cap_refuses_with_retry_after": Case(
        policy(PROD, max_pending=2),
        [
            ("add", "w0", 1),
            ("acquire", "x1", "prod", "b"),
            ("acquire", "x2", "prod", "b"),
            ("acquire", "x3", "prod", "b"),
            ("acquire", "x4", "prod", "b"),
        ],
        ["refused x4 queue_full"],
    ),
    "besteffort_refused_past_80_percent_of_cap": Case(
        policy(BATCH, max_pending=5),
        [("add", "w0", 1)] + [("acquire", f"x{i}", "batch", "be") for i in range(1, 7)],
        ["refused x6 queue_full"],
    ),
    "tenant_queue_cap_refuses": Case(
        policy(PROD, per_tenant=1),
        [
            ("add", "w0", 1),
            ("acquire", "x1", "prod", "b"),
            ("acquire", "x2", "prod", "b"),
            ("acquire", "x3", "prod", "b"),
        ],
        ["refused x3 tenant_queue_full"],
    ),
    "queued_request_can_be_withdrawn": Case(
        policy(BATCH),
        [
            ("add", "w0", 1),
            ("acquire", "x1", "batch", "be"),
            ("acquire", "x2", "batch", "be"),
            ("withdraw", "x2"),
        ],
        ["ended x2 withdrawn"],
    ),
    "every_grant_bumps_the_slot_epoch": Case(
        policy(BATCH),
        [
            ("add", "w0", 1),
            ("acquire", "x1", "batch", "be"),
            ("acquire", "x2", "batch", "be"),
            ("release", "x1"),
        ],
        ["ended x1 released", "granted x2 w0/0"],
        _epoch_is("x2", 2),
    ),
}

# A yield exists for a waiter: when the waiter leaves, the yield is cancelled unless another
# waiter has the same right to that victim. One slot; beta (nominal 0) holds it as borrowing.
ALPHA = tenant("alpha", nominal=1, limit=1)
ALPHA2 = tenant("alpha", nominal=2, limit=2)
BETA = tenant("beta", nominal=0, limit=2)
BETA_HOLDS = [("add", "w0", 1), ("acquire", "b1", "beta", "b"), (1, "acquire", "a1", "alpha", "b")]


def _holds_unrevoked(session: str, until: float) -> Callable[[Driver], None]:
    """`session` holds an ACTIVE lease again, and nothing happens at its old yield deadline."""

    def check(d: Driver) -> None:
        view = d.core.session(SessionId(session))
        assert view is not None and view.phase == "active", view
        assert d.step((until, "tick")) == []
        view = d.core.session(SessionId(session))
        assert view is not None and view.phase == "active", view

    return check


def _revoked_for(victim: str, waiter: str, at: float) -> Callable[[Driver], None]:
    def check(d: Driver) -> None:
        (out,) = [d.run([(at, "tick")])]
        assert out[:2] == [f"revoked {victim} yield_deadline", f"granted {waiter} w0/0"], out

    return check


YIELD_CASES: dict[str, Case] = {
    "withdrawn_waiter_cancels_its_yield": Case(
        policy(ALPHA, BETA),
        [*BETA_HOLDS, (2, "withdraw", "a1")],
        ["ended a1 withdrawn", "cancelled b1"],
        _holds_unrevoked("b1", 11),
    ),
    "waiter_granted_another_slot_cancels_its_yield": Case(
        policy(ALPHA, BETA),
        [
            ("add", "w0", 2),
            ("acquire", "b1", "beta", "b"),
            ("acquire", "b2", "beta", "b"),  # newest: the victim
            (1, "acquire", "a1", "alpha", "b"),
            (2, "release", "b1"),
        ],
        ["ended b1 released", "granted a1 w0/0", "cancelled b2"],
        _holds_unrevoked("b2", 11),
    ),
    "another_waiter_with_the_same_right_takes_the_yield_over": Case(
        policy(ALPHA2, BETA),
        [*BETA_HOLDS[:2], (1, "acquire", "a1", "alpha", "b"), (1, "acquire", "a2", "alpha", "b")]
        + [(2, "withdraw", "a1")],
        ["ended a1 withdrawn"],  # no YieldCancelled, no second YieldRequested
        _revoked_for("b1", "a2", 11),  # the deadline told to b1 at 1 s still holds
    ),
    "a_waiter_without_the_right_does_not_keep_the_yield": Case(
        policy(ALPHA, BETA),
        [*BETA_HOLDS[:2], (1, "acquire", "b2", "beta", "b"), (1, "acquire", "a1", "alpha", "b")]
        + [(2, "withdraw", "a1")],
        ["ended a1 withdrawn", "cancelled b1"],  # b2 may not take its own tenant's slot by force
        _holds_unrevoked("b1", 11),
    ),
    "drain_letting_leases_finish_cancels_a_yield_for_a_waiter": Case(
        policy(ALPHA, BETA),
        [
            ("add", "w0", 1),
            ("add", "w1", 1),
            ("acquire", "b1", "beta", "b"),
            ("acquire", "b2", "beta", "b"),  # newest: the victim, on w1
            (1, "acquire", "a1", "alpha", "b"),
            (2, "drain", "w1"),
        ],
        ["yield b1 nominal", "cancelled b2"],  # the waiter needs a slot on a ready worker
    ),
    "drain_asking_for_yields_keeps_a_yield_for_a_waiter": Case(
        policy(ALPHA, BETA),
        [
            ("add", "w0", 1),
            ("add", "w1", 1),
            ("acquire", "b1", "beta", "b"),
            ("acquire", "b2", "beta", "b"),
            (1, "acquire", "a1", "alpha", "b"),
            (2, "drain", "w1", 5),
        ],
        ["yield b1 nominal"],  # b2's yield now serves the drain, by its first deadline
    ),
}
CASES.update(YIELD_CASES)

# No lease is revoked without a waiter that needed its slot (issue 10 item 1): the falsifying
# examples of the property test (test_core_properties.py), each reduced to a table case.
SRE_B = tenant("sre", nominal=1, limit=2)
WEB_B = tenant("web", nominal=1, limit=2)


def _then(at: float, want: list[str]) -> Callable[[Driver], None]:
    def check(d: Driver) -> None:
        assert d.run([(at, "tick")]) == want

    return check


NO_REVOKE_FOR_NO_ONE: dict[str, Case] = {
    # sre's Burstable lease is within its nominal but lent from the floor (borrowing). Revoked
    # for batch's fairness right, its holder would be a tier-2 waiter, served before batch, and
    # take the slot straight back: it is no fairness victim; sre's BestEffort lease is, once it
    # has run min_runtime.
    "fairness_never_takes_a_borrowed_floor_lease_its_holder_would_take_back": Case(
        policy(SRE_B, BATCH, floor=2, min_runtime=30, ttl=100),
        [
            ("add", "w0", 2),
            ("acquire", "b1", "sre", "b"),  # borrowing: the floor cannot spare the slot
            (20, "acquire", "x0", "sre", "be"),
            (31, "acquire", "x1", "batch", "be"),  # b1 has run min_runtime, x0 not yet
        ],
        ["queued x1"],
        _then(50, ["yield x0 fair_share"]),
    ),
    # The deadline (11) passed before the expiry (30), both seen by one event at 30: the revoke
    # serves a1 at 11, as a tick at 11 would have, not b1 back with the slot g1 frees at 30.
    "timers_fire_in_time_order_a_revoke_serves_its_waiter_first": Case(
        policy(ALPHA, BETA, OPS, ttl=30),
        [
            ("add", "w0", 2),
            ("acquire", "g1", "ops", "g"),  # never renews: expires at 30
            ("acquire", "b1", "beta", "b"),
            (1, "acquire", "a1", "alpha", "b"),  # b1 asked to yield by 11
            (10, "renew", "b1"),
            (30, "tick"),
        ],
        ["revoked b1 yield_deadline", "granted a1 w0/1", "expired g1", "granted b1 w0/0"],
    ),
    # The floor has room since w1 drained: sre's lease lent from the floor is promoted to
    # nominal at once, not left preemptible for web's nominal right to take (a checkpoint spent
    # where a promotion had room); n1 waits for a slot.
    "a_lent_lease_is_promoted_when_the_floor_can_spare_it_not_asked_to_yield": Case(
        policy(SRE_B, WEB_B, BATCH, floor=2),
        [
            ("add", "w0", 1),
            ("add", "w1", 1),
            ("acquire", "s0", "sre", "b"),  # borrowing: the floor cannot spare the slot
            ("acquire", "x1", "batch", "be"),
            ("drain", "w1"),  # the floor is 1 now: room for a nominal lease, s0 promoted
            (1, "acquire", "n1", "web", "b"),
        ],
        ["queued n1"],
    ),
    # The same with n1 already waiting when the drain makes room: the pass promotes s0 before it
    # looks for a victim, so n1 has no right to one.
    "a_lent_lease_is_promoted_before_a_waiter_looks_for_a_victim": Case(
        policy(SRE_B, WEB_B, BATCH, floor=2),
        [
            ("add", "w0", 1),
            ("add", "w1", 1),
            ("acquire", "s0", "sre", "b"),
            ("acquire", "x1", "batch", "be"),
            ("acquire", "n1", "web", "b"),
            (1, "drain", "w1"),
            (11, "tick"),
        ],
        [],
    ),
    # The deadline (11) passed before the event that removes the worker (12): the revoke serves
    # a1 first, as a tick at 11 would have; the removal then takes the slot from a1.
    "a_timer_due_before_an_event_is_served_before_the_event_applies": Case(
        policy(ALPHA, BETA),
        [*BETA_HOLDS, (12, "remove", "w0")],
        [
            "revoked b1 yield_deadline",
            "granted a1 w0/0",
            "revoked a1 worker_removed",
            "queued b1",
            "queued a1",
        ],
    ),
}
CASES.update(NO_REVOKE_FOR_NO_ONE)


def test_a_quota_change_that_takes_the_waiters_right_cancels_its_yield() -> None:
    d = Driver(policy(ALPHA, BETA))
    assert d.run(BETA_HOLDS) == ["yield b1 nominal", "queued a1"]
    out = d.core.apply_policy(policy(tenant("alpha", nominal=0, limit=1), BETA), 2.0)
    assert [type(x).__name__ for x in out] == ["YieldCancelled"], out
    _holds_unrevoked("b1", 11)(d)
    # With the right intact, the yield stays.
    d = Driver(policy(ALPHA, BETA))
    d.run(BETA_HOLDS)
    assert d.core.apply_policy(policy(ALPHA, tenant("beta", nominal=0, limit=1)), 2.0) == []
    assert d.run([(11, "tick")])[:2] == ["revoked b1 yield_deadline", "granted a1 w0/0"]


def test_a_quota_raised_by_a_policy_change_serves_its_waiters_at_once() -> None:
    """A policy is applied between events: its Tick owes the pass, though no timer fires."""
    d = Driver(policy(ALPHA, BETA))
    d.run([("add", "w0", 2), ("acquire", "a1", "alpha", "b")])
    assert d.run([("acquire", "a2", "alpha", "b")]) == ["queued a2"]  # at its limit, a slot free
    out = d.core.apply_policy(policy(ALPHA2, BETA), 1.0)
    assert [summary(x) for x in out] == ["granted a2 w0/1"], out


def test_a_yield_cancelled_and_asked_again_keeps_only_the_new_deadline() -> None:
    """The heap entry of the cancelled yield must not revoke the lease when asked again later."""
    d = Driver(policy(ALPHA, BETA))
    d.run([*BETA_HOLDS, (2, "withdraw", "a1")])  # first yield (deadline 11) cancelled
    assert d.run([(8, "acquire", "a2", "alpha", "b")]) == ["yield b1 nominal", "queued a2"]
    assert d.run([(11, "tick")]) == []  # the old deadline passes harmlessly
    assert d.run([(18, "tick")])[:2] == ["revoked b1 yield_deadline", "granted a2 w0/0"]


def test_a_lent_lease_stops_being_borrowed_when_promoted() -> None:
    d = Driver(policy(SRE_B, WEB_B, BATCH, floor=2))
    for st in (
        ("add", "w0", 1),
        ("add", "w1", 1),
        ("acquire", "s0", "sre", "b"),
        ("acquire", "x1", "batch", "be"),
    ):
        d.step(st)
    borrowed = {t.name: t.borrowed for t in d.core.describe().tenants}
    assert borrowed["sre"] == 1  # lent from the floor: preemptible
    d.step(("drain", "w1"))
    borrowed = {t.name: t.borrowed for t in d.core.describe().tenants}
    assert borrowed["sre"] == 0  # promoted as soon as the floor could spare it


@pytest.mark.parametrize("name", list(CASES))
def test_decision(name: str) -> None:
    case = CASES[name]
    d = Driver(case.policy)
    assert d.run(case.steps) == case.want
    if case.check is not None:
        case.check(d)


def test_refusal_carries_retry_after_and_estimate() -> None:
    d = Driver(policy(PROD, max_pending=1))
    d.run([("add", "w0", 1), ("acquire", "x1", "prod", "b"), ("acquire", "x2", "prod", "b")])
    (refused,) = d.step(("acquire", "x3", "prod", "b"))
    # No lease has ended yet: a retry-after, but no estimated wait (nothing to base it on).
    assert refused.retry_after_s >= 1.0 and refused.estimated_wait_s is None  # type: ignore[union-attr]
    assert "1 of 1" in refused.message  # type: ignore[union-attr]
    d.run([(10, "release", "x1"), (11, "acquire", "x4", "prod", "b")])  # x2 holds now, x4 waits
    (refused,) = d.step((11, "acquire", "x5", "prod", "b"))
    assert refused.estimated_wait_s is not None and refused.estimated_wait_s > 0  # type: ignore[union-attr]


def test_queued_position_counts_requests_ahead() -> None:
    d = Driver(policy(BATCH))
    d.run([("add", "w0", 1), ("acquire", "x1", "batch", "be"), ("acquire", "x2", "batch", "be")])
    (q,) = d.step(("acquire", "x3", "batch", "be"))
    assert q.position == 1 and q.estimated_wait_s is None  # type: ignore[union-attr]
    d.run([(10, "release", "x1")])  # one hold observed: x2 holds, x3 is next
    (q,) = d.step((10, "acquire", "x4", "batch", "be"))
    assert q.position == 1 and q.estimated_wait_s is not None and q.estimated_wait_s > 0  # type: ignore[union-attr]
