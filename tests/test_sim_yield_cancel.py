"""The simulator's holders react to YieldCancelled: a checkpoint-and-yield not yet done is called
off and the holder runs on (no Yield, no second grant). The decisions come from the real core."""

from __future__ import annotations

from typing import Any

from scheduler.core.engine import Core
from scheduler.core.types import (
    Decision,
    Event,
    Granted,
    QoS,
    Release,
    Yield,
    YieldCancelled,
    YieldRequested,
)
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.workload import Period, SessionPlan

POLICY = Policy(
    pool=PoolSpec(slots_per_worker=2, workers=1, floor=0),
    timing=TimingSpec(yield_grace_s=10, lease_ttl_s=30, min_runtime_s=0),
    queue=QueueSpec(max_pending=100, max_pending_per_tenant=100),
    tenants=(
        TenantSpec("alpha", burstable_nominal=1, burstable_limit=1),
        TenantSpec("beta", burstable_nominal=0, burstable_limit=2),
    ),
)


class Recording(Core):
    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.log: list[tuple[float, Event, list[Decision]]] = []

    def handle(self, event: Event, now: float) -> list[Decision]:
        out = super().handle(event, now)
        self.log.append((now, event, out))
        return out


def _plan(sid: str, tenant: str, at: float, hold: float) -> SessionPlan:
    return SessionPlan(sid, tenant, QoS.BURSTABLE, [Period(hold_s=hold, think_s=None, arrival_s=at)])


def test_a_holder_whose_yield_is_called_off_runs_on() -> None:
    # beta holds both slots; alpha (nominal 1) arrives at 4 s: b2 (newest) is asked to yield and
    # needs 2 s to checkpoint. b1 finishes at 5 s, alpha takes its slot, b2's yield is called off.
    plans = [_plan("b1", "beta", 0, 5), _plan("b2", "beta", 0, 20), _plan("a1", "alpha", 4, 3)]
    sim = Simulator(POLICY, plans, SimConfig(checkpoint_s=2.0), decider=Recording)
    stats = sim.run()
    core: Any = sim.core
    decisions = [(now, d) for now, _, out in core.log for d in out]
    events = [ev for _, ev, _ in core.log]
    assert [(now, d.lease.session) for now, d in decisions if isinstance(d, YieldRequested)] == [(4.0, "b2")]
    assert [(now, d.lease.session) for now, d in decisions if isinstance(d, YieldCancelled)] == [(5.0, "b2")]
    assert not [ev for ev in events if isinstance(ev, Yield)]
    assert [d.lease.session for _, d in decisions if isinstance(d, Granted)] == ["b1", "b2", "a1"]
    assert stats.revocations == 0 and stats.work_lost == 0
    assert stats.completed == 3
    # b2 ran its 20 s on its first lease, in one go.
    assert [now for now, ev, _ in core.log if isinstance(ev, Release) and ev.session == "b2"] == [20.0]


def test_a_called_off_yield_is_no_preemption_in_the_stats() -> None:
    # The same run: one yield asked, then cancelled; the holder lost nothing and was not preempted.
    plans = [_plan("b1", "beta", 0, 5), _plan("b2", "beta", 0, 20), _plan("a1", "alpha", 4, 3)]
    stats = Simulator(POLICY, plans, SimConfig(checkpoint_s=2.0)).run()
    assert stats.preemptions == 0
    assert stats.to_json()["preemptions"] == 0
