"""The autoscaler loop does not add workers the pool's token budgets cannot feed: the server's
PermitDesk sees what active sessions are charged, the pool's view carries it (with_budgets), the
loop's decision caps the scale-up with reason `budget`, in its log and its metrics."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from scheduler.autoscale_wiring import with_budgets
from scheduler.core.budget.types import BudgetName, PermitGranted, PermitRequest, Settle, Usage
from scheduler.core.types import QoS, TenantName
from scheduler.policy.model import (
    AutoscalerSpec,
    BudgetRate,
    BudgetSpec,
    Policy,
    PoolSpec,
    TenantBudgetQuota,
    TenantSpec,
    TimingSpec,
)
from scheduler.server.permits import PermitDesk
from slots.autoscaler.demand import CoreDemand, CoreMembership
from slots.autoscaler.loop import Autoscaler
from tests.test_autoscaler_loop import World


def budget_policy(nominal: int = 0) -> Policy:
    """Tenant t's sessions are Burstable; with a slot `nominal` of 0 they all borrow (the cap may
    withhold their workers), up to it they have a quota claim (it never does)."""
    share = TenantBudgetQuota("llm", burstable_nominal=BudgetRate(percent=100))
    return Policy(
        pool=PoolSpec(slots_per_worker=2, workers=0, min_workers=1, max_workers=6, floor=0, budgets=("llm",)),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=10_000, min_runtime_s=10_000),
        autoscaler=AutoscalerSpec(scale_down_stabilization_s=60, scale_down_cooldown_s=0),
        tenants=(TenantSpec("t", burstable_nominal=nominal, burstable_limit=20, budgets=(share,)),),
        budgets=(BudgetSpec("llm", tokens_per_minute=40_000),),
    )


def spend(desk: PermitDesk, session: str, tokens: float) -> None:
    """One permit of the session, granted at once, settled with `tokens` used."""
    pid = desk.new_id()
    est = Usage(1000.0, 1000.0)
    ev = PermitRequest(pid, session, TenantName("t"), BudgetName("llm"), QoS.BURSTABLE, est)
    assert any(isinstance(d, PermitGranted) for d in desk.handle(ev, "t"))
    desk.handle(Settle(pid, session, Usage(tokens / 2, tokens / 2)), "t")


def test_the_pool_grows_only_as_far_as_its_budget_feeds_its_sessions() -> None:
    asyncio.run(_scenario(nominal=0, desired=2, reason="budget"))


def test_the_cap_never_withholds_a_worker_from_a_session_with_a_quota_claim() -> None:
    """The same sessions within the tenant's slot nominal: the slot core would serve them by
    preemption anyway (and the budget serves a nominal ahead of borrowers), so the cap is the 6
    workers that hold them, and only the scale-up rate (4 pods a period) bounds the step."""
    asyncio.run(_scenario(nominal=20, desired=5, reason="scale_up_rate_limited"))


async def _scenario(nominal: int, desired: int, reason: str) -> None:
    policy = budget_policy(nominal)
    w = World(policy)
    desk = PermitDesk(policy, lambda: w.now)
    w.auto = auto = Autoscaler(
        CoreDemand(lambda: with_budgets(w.core.describe(), w.core.policy, desk), lambda: w.core.policy),
        CoreMembership(w.submit),
        w.actuator,
        lambda: w.core.policy,
        clock=lambda: w.now,
        registry=(reg := CollectorRegistry()),
    )
    auto.tick(0.0)  # one worker: min_workers
    # Minute 1: four active sessions each charged 10k tokens (the budget started empty:
    # by t=60 its bucket holds a minute). 40k a minute feeds 4 such sessions: 2 workers.
    w.at(60.0)
    for i in range(4):
        spend(desk, f"t/s{i}", 10_000)
    w.at(121.0)
    w.acquire(*(f"s{i}" for i in range(12)))  # 12 slots of demand: 6 workers
    r = auto.tick(121.0)
    assert r.decision is not None
    cap = 2 if reason == "budget" else 6  # the busy slots and the claimed waiters count
    assert (r.decision.desired, r.decision.reason.value, r.decision.budget_workers) == (desired, reason, cap)
    assert len(w.actuator.workers) == desired
    assert w.actuator.notes[-1].reason == reason
    up = "slotsched_autoscaler_decisions_total"
    assert reg.get_sample_value(up, {"direction": "up", "reason": reason}) == 1
    assert reg.get_sample_value("slotsched_autoscaler_budget_cap_workers") == cap
    desk.close()
