"""Each baseline's defining behaviour, as tables: deciders (a script of events in, the decisions that
matter out) and autoscaler rules (observations in, replicas out).

Every case drives a decider directly (no simulator) on a tiny pool, so what is asserted is the
baseline's rule and nothing else; a last table runs every decider through the simulator to show
that they all speak the core's decisions (SimStats works unchanged).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from scheduler.core.engine import Core
from scheduler.core.types import (
    Acquire,
    Decision,
    Ended,
    EndReason,
    Event,
    Expired,
    Granted,
    QoS,
    Queued,
    Refused,
    Rejected,
    Release,
    Revoked,
    SessionId,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerDraining,
    WorkerId,
    Yield,
    YieldCause,
    YieldRequested,
)
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.sim.autoscalers import Hpa, Keda, Observation, Polling, QueueStep, Rule, WeightedFormula
from scheduler.sim.baselines.common import Baseline
from scheduler.sim.baselines.fifo import Fifo
from scheduler.sim.baselines.kueue_classic import KueueClassic
from scheduler.sim.baselines.priority_kill import PriorityKill
from scheduler.sim.baselines.reject_retry import RejectRetry
from scheduler.sim.baselines.strict_priority import StrictPriority
from scheduler.sim.scaler_pool import ScalerPool
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.workload import Period, SessionPlan

G, B, BE = QoS.GUARANTEED, QoS.BURSTABLE, QoS.BEST_EFFORT
D = TypeVar("D")
ALL: list[type[Baseline]] = [RejectRetry, Fifo, StrictPriority, PriorityKill, KueueClassic]


def policy(slots: int = 1, tenants: tuple[TenantSpec, ...] = (), ttl: float = 1e6) -> Policy:
    """A one-worker pool; scripts renew nothing, so leases live long unless a test says otherwise."""
    specs = tenants or (
        TenantSpec("a", guaranteed=2, burstable_nominal=1, burstable_limit=8),
        TenantSpec("b", guaranteed=2, burstable_nominal=1, burstable_limit=8),
    )
    return Policy(
        pool=PoolSpec(slots_per_worker=slots, workers=1, min_workers=1, max_workers=1, floor=0),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=ttl, min_runtime_s=0),
        queue=QueueSpec(max_pending=1000, max_pending_per_tenant=1000),
        tenants=specs,
    )


def acq(s: str, qos: QoS, tenant: str = "a") -> Acquire:
    return Acquire(SessionId(s), TenantName(tenant), qos)


@dataclass
class Run:
    """Decisions of a script, with the leases granted so far by session (for releases)."""

    out: list[tuple[float, Decision]] = field(default_factory=list)

    def of(self, kind: type[D]) -> list[D]:
        return [d for _, d in self.out if isinstance(d, kind)]

    def granted(self) -> list[str]:
        return [d.lease.session for d in self.of(Granted)]


Step = tuple[float, Event | Callable[[dict[str, Granted]], Event]]


def drive(cls: type[Baseline], pol: Policy, script: list[Step]) -> Run:
    d = cls(pol)
    run = Run()
    leases: dict[str, Granted] = {}
    for d0 in d.handle(WorkerAdded(WorkerId("w0"), pol.pool.slots_per_worker), 0.0):
        run.out.append((0.0, d0))
    for t, ev in script:
        event = ev(leases) if callable(ev) else ev
        for dec in d.handle(event, t):
            run.out.append((t, dec))
            if isinstance(dec, Granted):
                leases[dec.lease.session] = dec
    return run


def release(s: str) -> Callable[[dict[str, Granted]], Event]:
    def make(leases: dict[str, Granted]) -> Event:
        lease = leases[s].lease
        return Release(lease.session, lease.lease_id, lease.epoch)

    return make


# ---------------------------------------------------------------- the defining behaviours


@dataclass(frozen=True)
class Case:
    name: str
    cls: type[Baseline]
    script: list[Step]
    check: Callable[[Run], None]
    slots: int = 1
    tenants: tuple[TenantSpec, ...] = ()


def _fifo_ignores_class(r: Run) -> None:
    assert r.granted() == ["be1", "be2", "g"]  # G waited behind a BestEffort that came first
    assert not r.of(YieldRequested) and not r.of(Revoked)


def _strict_serves_class_first_never_preempts(r: Run) -> None:
    assert r.granted() == ["be1", "g", "be2"]
    assert not r.of(YieldRequested) and not r.of(Revoked)
    g = next(d for d in r.of(Granted) if d.lease.session == "g")
    assert g.waited_s == pytest.approx(98.0)  # the whole rest of be1's hold


def _kill_loses_work_and_requeues(r: Run) -> None:
    (yr,) = r.of(YieldRequested)
    (rv,) = r.of(Revoked)
    assert isinstance(yr, YieldRequested) and isinstance(rv, Revoked)
    assert yr.deadline == 50.0 and yr.lease.session == "be1"  # zero grace: a kill
    assert rv.lost_slot_seconds == pytest.approx(50.0)  # all of be1's work since its grant
    assert r.granted() == ["be1", "g", "be1"]  # g at once; be1 again when g is done
    assert [d.session for d in r.of(Queued)] == ["be1"]


def _kill_spares_equal_class(r: Run) -> None:
    assert not r.of(Revoked) and r.granted() == ["b1"]
    assert [d.session for d in r.of(Queued)] == ["b2"]


def _reject_never_queues(r: Run) -> None:
    assert not r.of(Queued)
    refused = r.of(Refused)
    assert [d.session for d in refused] == ["be2", "g"]
    assert r.granted() == ["be1", "be2"]  # the retry that landed on the free slot won


def _kueue_evicts_own_lower_priority(r: Run) -> None:
    (rv,) = r.of(Revoked)
    assert isinstance(rv, Revoked) and rv.lease.session == "a-be" and rv.lost_slot_seconds == 20
    assert r.granted() == ["a-be", "a-g"]


def _kueue_reclaims_from_a_borrowing_tenant_even_guaranteed(r: Run) -> None:
    # b holds 2 slots against a nominal of 1 (borrowing); a is within its nominal of 1: it reclaims,
    # taking b's most recently admitted workload — a Guaranteed one (priority is a label in Kueue).
    (rv,) = r.of(Revoked)
    assert isinstance(rv, Revoked) and rv.lease.session == "b-g2"
    assert r.granted()[-1] == "a-b"


def _kueue_borrower_cannot_evict_others(r: Run) -> None:
    assert not r.of(Revoked) and r.granted() == ["b-be1", "b-be2", "a-b1"]
    assert [d.session for d in r.of(Queued)] == ["a-b2"]


KUEUE_TENANTS = (
    TenantSpec("a", guaranteed=0, burstable_nominal=1, burstable_limit=8),
    TenantSpec("b", guaranteed=0, burstable_nominal=1, burstable_limit=8),
)

CASES = [
    Case(
        "fifo ignores class",
        Fifo,
        [
            (0, acq("be1", BE)),
            (1, acq("be2", BE)),
            (2, acq("g", G)),
            (100, release("be1")),
            (150, release("be2")),
        ],
        _fifo_ignores_class,
    ),
    Case(
        "strict priority serves class first and never preempts",
        StrictPriority,
        [
            (0, acq("be1", BE)),
            (1, acq("be2", BE)),
            (2, acq("g", G)),
            (100, release("be1")),
            (110, release("g")),
        ],
        _strict_serves_class_first_never_preempts,
    ),
    Case(
        "priority-kill loses the victim's work and requeues it",
        PriorityKill,
        [(0, acq("be1", BE)), (50, acq("g", G)), (60, release("g"))],
        _kill_loses_work_and_requeues,
    ),
    Case(
        "priority-kill never preempts an equal class",
        PriorityKill,
        [(0, acq("b1", B)), (5, acq("b2", B))],
        _kill_spares_equal_class,
    ),
    Case(
        "reject-retry refuses when full and never queues",
        RejectRetry,
        [
            (0, acq("be1", BE)),
            (1, acq("be2", BE)),
            (2, acq("g", G)),
            (10, release("be1")),
            (12, acq("be2", BE)),
        ],
        _reject_never_queues,
    ),
    Case(
        "kueue evicts a lower priority of the same queue",
        KueueClassic,
        [(0, acq("a-be", BE)), (20, acq("a-g", G))],
        _kueue_evicts_own_lower_priority,
    ),
    Case(
        "kueue reclaims nominal quota from a borrowing queue",
        KueueClassic,
        [(0, acq("b-g1", G, "b")), (1, acq("b-g2", G, "b")), (2, acq("a-b", B, "a"))],
        _kueue_reclaims_from_a_borrowing_tenant_even_guaranteed,
        slots=2,
        tenants=(
            TenantSpec("a", guaranteed=0, burstable_nominal=1, burstable_limit=8),
            TenantSpec("b", guaranteed=1, burstable_nominal=0, burstable_limit=8),
        ),
    ),
    Case(
        "kueue: a queue beyond its nominal cannot evict another queue",
        KueueClassic,
        [
            (0, acq("b-be1", BE, "b")),
            (0, acq("b-be2", BE, "b")),
            (1, acq("a-b1", B, "a")),
            (2, acq("a-b2", B, "a")),
        ],
        _kueue_borrower_cannot_evict_others,
        slots=3,
        tenants=KUEUE_TENANTS,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_defining_behaviour(case: Case) -> None:
    case.check(drive(case.cls, policy(case.slots, case.tenants), case.script))


# ---------------------------------------------------------------- the shared contract


@pytest.mark.parametrize("cls", ALL, ids=[c.name for c in ALL])
def test_an_unrenewed_lease_expires_after_the_ttl_and_stale_calls_are_rejected(cls: type[Baseline]) -> None:
    d = cls(policy(ttl=30))
    d.handle(WorkerAdded(WorkerId("w0"), 1), 0.0)
    (g,) = [x for x in d.handle(acq("s", BE), 0.0) if isinstance(x, Granted)]
    assert d.next_deadline() == 30.0
    (exp,) = d.handle(Tick(), 30.0)
    assert isinstance(exp, Expired) and exp.lost_slot_seconds == 30.0
    (rej,) = d.handle(Release(g.lease.session, g.lease.lease_id, g.lease.epoch), 31.0)
    assert isinstance(rej, Rejected)


@pytest.mark.parametrize("cls", ALL, ids=[c.name for c in ALL])
def test_a_drain_asks_to_yield_and_the_yield_requeues_with_the_snapshot(cls: type[Baseline]) -> None:
    d = cls(policy())
    d.handle(WorkerAdded(WorkerId("w0"), 1), 0.0)
    (g,) = [x for x in d.handle(acq("s", B), 0.0) if isinstance(x, Granted)]
    (yr,) = d.handle(WorkerDraining(WorkerId("w0"), yield_within_s=5.0), 10.0)
    assert isinstance(yr, YieldRequested) and yr.cause is YieldCause.DRAIN and yr.deadline == 15.0
    assert d.describe().capacity == 0
    out = d.handle(Yield(g.lease.session, g.lease.lease_id, g.lease.epoch), 12.0)
    assert isinstance(out[0], Ended) and out[0].reason is EndReason.YIELDED
    # No slot is left: the session waits (queued), or is refused to retry (reject-retry).
    assert isinstance(out[1], Refused if cls is RejectRetry else Queued)
    d.handle(WorkerAdded(WorkerId("w1"), 1), 20.0)
    if cls is not RejectRetry:
        (lease, _state) = next(iter(d.leases()))
        assert lease.session == "s" and lease.slot.worker == "w1"


# ---------------------------------------------------------------- through the simulator


def _plans() -> list[SessionPlan]:
    out = []
    for i in range(24):
        qos = (G, B, BE)[i % 3]
        tenant = "ab"[i % 2]
        periods = [Period(20.0 + i, None, float(i)), Period(15.0, 10.0, 0.0)]
        out.append(SessionPlan(f"s{i}", tenant, qos, periods))
    return out


@pytest.mark.parametrize("cls", [Core, *ALL], ids=["slotsched", *[c.name for c in ALL]])
def test_every_decider_runs_the_simulator_to_completion_with_sim_stats(
    cls: Callable[[Policy], object],
) -> None:
    pol = policy(slots=4, ttl=30)
    plans = _plans()
    sim = Simulator(pol, plans, SimConfig(retry_refused=True, sample_every_s=5.0), decider=cls)  # type: ignore[arg-type]
    stats = sim.run()
    j = stats.to_json()
    assert j["completed"] == len(plans) and j["unfinished"] == 0
    assert sum(len(w) for w in stats.waits.values()) >= 2 * len(plans)
    assert all(s.busy <= s.capacity for s in stats.samples)
    useful = sum(p.total_hold_s for p in plans)
    held = stats.busy_slot_seconds
    # Lost work is redone, no more; a checkpoint-and-yield costs at most its checkpoint time.
    overhead = stats.preemptions * SimConfig().checkpoint_s if cls is Core else 0.0
    assert useful + stats.work_lost - 1e-6 <= held <= useful + stats.work_lost + overhead + 1e-6
    if cls in (RejectRetry, Fifo, StrictPriority):
        assert stats.preemptions == 0 and stats.work_lost == 0


# ---------------------------------------------------------------- baseline autoscaler rules


def obs(
    now: float, replicas: int, waiting: int = 0, held: int = 0, idle: int = 0, oldest: float = 0.0
) -> Observation:
    return Observation(now, replicas, replicas, idle, (0, waiting, 0), (0, held, 0), oldest, 2)


def test_hpa_tolerance_rate_limit_and_scale_down_stabilization() -> None:
    hpa = Hpa(target_per_worker=2)
    assert hpa.desired(obs(0, 10, waiting=21)) == 10  # 21 / (10 x 2) within the 0.1 tolerance
    assert hpa.desired(obs(15, 2, waiting=40)) == 6  # wants 20; at most max(4 pods, 100%) per sync
    assert hpa.desired(obs(30, 6, waiting=0)) == 6  # wants 0; the 300 s window still holds 20
    assert hpa.desired(obs(400, 6, waiting=0)) == 0  # the window has passed


def test_keda_activates_from_zero_and_cools_down_to_zero() -> None:
    k = Keda()
    assert k.desired(obs(0, 0, waiting=3)) == 1  # activation at a poll
    assert k.desired(obs(15, 1, waiting=30)) == 5  # the HPA: ceil(30 / listLength 5), +4 at most
    assert k.desired(obs(30, 5, waiting=0)) == 5  # no activity, but the cooldown runs 300 s
    assert k.desired(obs(330, 5, waiting=0)) == 0


def test_weighted_formula_counts_running_once_and_waiting_by_class_with_a_cooldown() -> None:
    f = WeightedFormula()
    o = Observation(0, 1, 1, 0, (2, 2, 4), (1, 1, 0), 0.0, 2)  # 2 + 3*2 + 2 + 0.5*4 = 12
    assert f.desired(o) == 7  # int(12 / 2) + 1
    assert f.desired(Observation(10, 7, 7, 0, (0, 0, 0), (0, 0, 0), 0.0, 2)) == 7  # cooldown: 30 s
    assert f.desired(Observation(40, 7, 7, 5, (0, 0, 0), (0, 0, 0), 0.0, 2)) == 1


def test_polling_steps_by_min_5_or_half_with_cooldowns() -> None:
    p = Polling()
    assert p.desired(obs(0, 20, waiting=101)) == 25  # > 5 per worker: + min(5, 50%)
    assert p.desired(obs(30, 25, oldest=31)) == 25  # crowded again, but 60 s up cooldown
    assert p.desired(obs(60, 25, oldest=31)) == 30
    assert p.desired(obs(75, 30, idle=2)) == 28  # nothing waits: removes idle workers only
    assert p.desired(obs(90, 28, idle=9)) == 28  # 120 s down cooldown


def test_queue_step_rule_needs_two_busy_samples_up_and_twelve_idle_down() -> None:
    d = QueueStep()
    assert d.desired(obs(0, 2, waiting=1)) == 2
    assert d.desired(obs(3, 2, waiting=1)) == 3
    ups = [d.desired(obs(6 + 3 * i, 3, waiting=1)) for i in range(3)]
    assert ups == [3, 3, 3]  # 12 s cooldown after the last +1
    downs = [d.desired(obs(100 + 3 * i, 3, idle=1)) for i in range(12)]
    assert downs == [3] * 11 + [2]


@pytest.mark.parametrize(("rule", "revoked"), [(Hpa, True), (Polling, False)], ids=["deployment", "idle"])
def test_scale_down_kills_busy_pods_only_for_a_deployment(rule: Callable[[], Rule], revoked: bool) -> None:
    pol = Policy(
        pool=PoolSpec(slots_per_worker=1, workers=4, min_workers=1, max_workers=4, floor=0),
        timing=TimingSpec(lease_ttl_s=30),
        queue=QueueSpec(max_pending=100, max_pending_per_tenant=100),
        tenants=(TenantSpec("a", burstable_nominal=4, burstable_limit=4),),
    )
    # Four long sessions fill the pool; nothing ever waits, so both rules want a smaller pool.
    plans = [SessionPlan(f"s{i}", "a", B, [Period(2000.0, None, 0.0)]) for i in range(4)]
    stats = Simulator(pol, plans, SimConfig(), hook=ScalerPool(rule())).run()
    assert stats.completed == 4
    assert (stats.revocations > 0 and stats.work_lost > 0) is revoked
    assert stats.worker_seconds > 0 and (stats.scale_actions > 0) is revoked
