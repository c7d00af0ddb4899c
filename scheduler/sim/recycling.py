"""A leaking worker, replaced: spec.autoscaler.recycle in the simulator, with what it cost.

Why a scenario of its own: recycling must lose nothing and never take capacity away. The pool
here is pinned (minWorkers = maxWorkers: at its floor and its ceiling at once, where a drain
before the replacement would cut capacity), busy with the morning hour of the diurnal sample,
and one worker leaks memory until it passes `recycle.memoryBytes`. The autoscaler loop (the
server's, in virtual time) starts a replacement, then drains the leaking worker: its actors
checkpoint, yield and resume from their snapshots on the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from scheduler.core.types import Decision, Granted, YieldCause, YieldRequested
from scheduler.policy.model import Policy
from scheduler.sim.diurnal import DAY_S, RAMP_HOUR, DiurnalStats
from scheduler.sim.elastic import ElasticPool
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.workload import SessionPlan

LEAKER = "e001"  # the first worker of the elastic pool
BASE_RSS = 300 * 2**20
LEAK_PER_S = 2**20  # 1 MiB a second: past 1 GiB after about 12 minutes
THRESHOLD = 2**30


def leaking_rss(worker_id: str, age_s: float) -> int:
    return BASE_RSS + int(LEAK_PER_S * age_s) if worker_id == LEAKER else BASE_RSS


@dataclass
class RecycleStats(DiurnalStats):
    """DiurnalStats that also count drain yields and grants that resumed from a snapshot."""

    drain_yields: set[str] = field(default_factory=set)  # sessions asked to yield by a drain
    resumed: set[str] = field(default_factory=set)  # of those, re-granted from their snapshot

    def record(self, d: Decision, now: float) -> None:
        super().record(d, now)
        if isinstance(d, YieldRequested) and d.cause is YieldCause.DRAIN:
            self.drain_yields.add(d.lease.session)
        elif isinstance(d, Granted) and d.lease.session in self.drain_yields and d.lease.resume_from:
            self.resumed.add(d.lease.session)


@dataclass(frozen=True)
class RecycleOutcome:
    recycled: tuple[str, ...]  # workers drained to be replaced
    work_lost_slot_s: float
    min_capacity_slots: int  # the least capacity seen after start
    floor_slots: int  # minWorkers x slotsPerWorker
    drained_sessions: int
    resumed_sessions: int
    revocations: int


def recycle_policy(policy: Policy, workers: int = 8) -> Policy:
    pool = replace(policy.pool, workers=workers, min_workers=workers, max_workers=workers)
    auto = replace(policy.autoscaler, recycle_memory_bytes=THRESHOLD)
    return replace(policy, pool=pool, autoscaler=auto)


def morning(plans: list[SessionPlan], hours: float = 1.0) -> list[SessionPlan]:
    """The sessions starting in the first `hours` from 9:00 of the first day, moved to time 0."""
    t0 = RAMP_HOUR * 3600.0
    out = []
    for p in plans:
        if t0 <= p.arrival_s < t0 + hours * 3600 and p.arrival_s < DAY_S:
            first = replace(p.periods[0], arrival_s=round(p.periods[0].arrival_s - t0, 3))
            out.append(replace(p, periods=[first, *p.periods[1:]]))
    return out


def run_recycle(policy: Policy, plans: list[SessionPlan], until_s: float = 3600.0) -> RecycleOutcome:
    pol = recycle_policy(policy)
    hook = ElasticPool(15.0, rss=leaking_rss)
    sim = Simulator(pol, morning(plans), SimConfig(until_s=until_s, sample_every_s=60.0), hook=hook)
    stats = sim.stats = RecycleStats(pol)
    sim.run()
    assert hook.autoscaler is not None
    for at, message in hook.autoscaler.errors:
        raise AssertionError(f"autoscaler error at {at}: {message}")
    return RecycleOutcome(
        recycled=tuple(hook.recycled),
        work_lost_slot_s=stats.work_lost,
        min_capacity_slots=stats.min_capacity_after_start or 0,
        floor_slots=pol.pool.min_workers * pol.pool.slots_per_worker,
        drained_sessions=len(stats.drain_yields),
        resumed_sessions=len(stats.resumed),
        revocations=stats.revocations,
    )
