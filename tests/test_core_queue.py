"""The queue's rules in the core (docs/design.md, "Waiting, queue caps and refusals"): the caps
hold for every request that is not granted at once, whether or not a slot is free, and a
waiter's reason comes from one function (`Core.queued`), which the Queued decision, the
session view (GetSession) and the server's re-sent Queued events all read."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from scheduler.core.types import BlockedReason, Queued, Refused, RefuseReason, SessionId
from scheduler.policy.model import Policy
from tests.core_script import Driver, policy, summary, tenant

# prod may hold 2 Burstable leases (its limit); wide may hold any number.
PROD = tenant("prod", nominal=0, limit=2)
WIDE = tenant("wide", nominal=0, limit=100, be=100)
BATCH = tenant("batch", be=1)
OTHER = tenant("other", nominal=0, limit=1)


def _acquires(tenant_name: str, cls: str, first: int, n: int) -> list[tuple[str, ...]]:
    return [("acquire", f"{tenant_name}{i}", tenant_name, cls) for i in range(first, first + n)]


@dataclass(frozen=True)
class CapCase:
    policy: Policy
    steps: list[tuple[str, ...]]
    want: list[str]  # the last step's decisions


CAP_CASES = {
    # 4 slots, prod holds its 2 (2 slots free): 8 of its requests wait (tenant cap 8), the 9th
    # waiting one is refused, though 2 slots are free.
    "tenant_at_its_limit_meets_the_tenant_cap_with_slots_free": CapCase(
        policy(PROD, WIDE, max_pending=10, per_tenant=8),
        [("add", "w0", 4), *_acquires("prod", "b", 1, 2 + 8), ("acquire", "prod11", "prod", "b")],
        ["refused prod11 tenant_queue_full"],
    ),
    # prod's 8 waiters and other's 2 (at its limit of 1) fill the pool cap of 10 with a slot
    # free: prod's next is refused for the pool's cap.
    "requests_that_wait_meet_the_pool_cap_with_a_slot_free": CapCase(
        policy(PROD, OTHER, max_pending=10, per_tenant=9),
        [
            ("add", "w0", 4),
            *_acquires("prod", "b", 1, 2 + 8),
            *_acquires("other", "b", 1, 1 + 2),
            ("acquire", "prod11", "prod", "b"),
        ],
        ["refused prod11 queue_full"],
    ),
    # BestEffort is refused at 80% of the tenant cap (6.4 of 8): 7 wait, the 8th is refused,
    # with 3 slots free.
    "besteffort_at_its_limit_meets_its_fraction_of_the_cap_with_slots_free": CapCase(
        policy(BATCH, max_pending=100, per_tenant=8),
        [("add", "w0", 4), *_acquires("batch", "be", 1, 1 + 7), ("acquire", "batch9", "batch", "be")],
        ["refused batch9 tenant_queue_full"],
    ),
    # The pool's queue is full of prod's waiters, but wide is below its limit and a slot is free:
    # granted at once, so the caps do not apply to it.
    "a_request_granted_at_once_skips_the_caps": CapCase(
        policy(PROD, WIDE, max_pending=8, per_tenant=8),
        [("add", "w0", 4), *_acquires("prod", "b", 1, 2 + 8), ("acquire", "wide1", "wide", "b")],
        ["granted wide1 w0/2"],
    ),
    # No slot free: the caps hold as they always did.
    "no_slot_free_the_tenant_cap_holds": CapCase(
        policy(WIDE, max_pending=100, per_tenant=3),
        [("add", "w0", 1), *_acquires("wide", "b", 1, 1 + 3), ("acquire", "wide5", "wide", "b")],
        ["refused wide5 tenant_queue_full"],
    ),
}


@pytest.mark.parametrize("name", list(CAP_CASES))
def test_queue_caps(name: str) -> None:
    case = CAP_CASES[name]
    d = Driver(case.policy)
    assert d.run(case.steps) == case.want


def test_the_cap_refusal_with_a_slot_free_carries_retry_after() -> None:
    d = Driver(policy(PROD, max_pending=10, per_tenant=8))
    d.run([("add", "w0", 4), *_acquires("prod", "b", 1, 2 + 8)])
    (refused,) = d.step(("acquire", "prod11", "prod", "b"))
    assert isinstance(refused, Refused) and refused.reason is RefuseReason.TENANT_QUEUE_FULL
    assert refused.retry_after_s >= 1.0 and refused.pool == "default"
    assert d.core.describe().free == 2 and d.core.describe().pending[1] == 8


# ---------------------------------------------------------------- why a session waits

SRE = tenant("sre", g=2, nominal=1, limit=4)
PRODUCT = tenant("product", weight=2, nominal=2, limit=6)
BATCH_BE = tenant("batch")
# serve's defaults: 4 workers of 2 slots, floor 2; product's 6 and batch's 2 fill the 8 slots.
FULL = (
    [("add", f"w{i}", 2) for i in range(4)] + _acquires("product", "b", 1, 6) + _acquires("batch", "be", 1, 2)
)
SERVE = policy(SRE, PRODUCT, BATCH_BE, floor=2)

# (steps, then the waiter asked about, its reason); the first reason that applies
# (docs/design.md, "Why it waits").
REASONS = {
    "besteffort_beyond_quota": (FULL + [("acquire", "batch3", "batch", "be")], "batch3", "tenant_quota"),
    "burstable_at_its_limit": (FULL + [("acquire", "product7", "product", "b")], "product7", "tenant_limit"),
    "guaranteed_with_a_yield_for_it": (FULL + [("acquire", "g1", "sre", "g")], "g1", "yield_pending"),
    "guaranteed_within_quota_no_victim_left": (
        FULL + [("acquire", f"g{i}", "sre", "g") for i in range(1, 4)],
        "g3",
        "pool_exhausted",
    ),
    "burstable_below_nominal_no_slot": (
        [("add", "w0", 1), ("acquire", "x", "sre", "g"), ("acquire", "s1", "sre", "b")],
        "s1",
        "pool_exhausted",
    ),
}


@pytest.mark.parametrize("name", list(REASONS))
def test_one_reason_for_a_waiter(name: str) -> None:
    steps, waiter, reason = REASONS[name]
    d = Driver(SERVE)
    d.run(steps)
    q = d.core.queued(SessionId(waiter))
    view = d.core.session(SessionId(waiter))
    assert q is not None and view is not None
    assert q.reason is BlockedReason(reason)
    # the session view (GetSession) is the same answer, field for field
    assert (view.position, view.estimated_wait_s, view.pool, view.reason) == (
        q.position,
        q.estimated_wait_s,
        q.pool,
        q.reason.value,
    )


def test_the_queued_decision_is_the_same_answer() -> None:
    d = Driver(SERVE)
    d.run(FULL)
    (told,) = d.step(("acquire", "batch3", "batch", "be"))
    assert isinstance(told, Queued) and told == d.core.queued(SessionId("batch3"))
    assert summary(told) == "queued batch3"
    assert d.core.queued(SessionId("product1")) is None  # holds: not a waiter
