"""An elastic pool for the simulator: the autoscaler loop the server runs, in virtual time.

Why the real loop and not a model of it: `ElasticPool` drives `slots.autoscaler.loop.Autoscaler` —
the same gather/decide/drain/remove code and the same pure `decide` — with a simulated actuator,
so what a bench measures (worker-seconds against Guaranteed waits) is what production would do.
Only the outside world is simulated: a worker asked for becomes ready `start_delay_s` later
(AutoscalerSpec), and a removed worker is gone at once.

Recycling: `rss` (worker id, seconds since it started -> resident bytes) models what each worker
would report with its heartbeat, so spec.autoscaler.recycle replaces a leaking worker as the
server's loop would; a worker's start is when it became ready.

Accounting: worker-seconds integrate the workers that exist — starting, ready and draining — as
a cloud bill would; `StaticPool` counts a fixed pool the same way, for comparison. A scale action
is one scale-up asked for or one batch of workers drained. `elastic_report` adds the Guaranteed
waits within quota longer than a target (by default the yield grace period, the bound
design.md promises requests within quota).
"""

from __future__ import annotations

import builtins
import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scheduler.core.types import WorkerDraining, WorkerId, WorkerRemoved
from scheduler.sim.decider import Decider
from scheduler.sim.simulator import Simulator
from scheduler.sim.stats import SimStats
from slots.actuators.base import WorkerInfo, WorkerPhase
from slots.autoscaler.demand import CoreDemand, Vitals
from slots.autoscaler.loop import Autoscaler

_EPS = 1e-9


@dataclass
class ElasticStats(SimStats):
    """SimStats that also integrate the number of workers over time (`worker_seconds`)."""

    _workers: int = 0
    _workers_at: float = 0.0

    def workers_changed(self, now: float, n: int) -> None:
        self.worker_seconds += self._workers * max(0.0, now - self._workers_at)
        self._workers_at, self._workers = now, n

    def finish(self, end: float, core: Decider, counts: tuple[int, int]) -> None:
        super().finish(end, core, counts)
        self.workers_changed(end, self._workers)


def _elastic_stats(sim: Simulator) -> ElasticStats:
    if not isinstance(sim.stats, ElasticStats):
        sim.stats = ElasticStats(sim.policy)  # before the run records anything
    return sim.stats


class _SimActuator:
    """Workers that take `start_delay_s` to come up, then register with the core."""

    def __init__(self, sim: Simulator, stats: ElasticStats, start_delay_s: float) -> None:
        self.sim = sim
        self.stats = stats
        self.start_delay_s = start_delay_s
        self.workers: dict[str, WorkerPhase] = {}
        self.started_at: dict[str, float] = {}
        self._booting: list[tuple[float, str]] = []
        self._seq = 0

    def scale_to(self, n: int) -> None:
        now = self.sim.now
        while len(self.workers) < n:
            wid = self._new_id()
            self.workers[wid] = WorkerPhase.STARTING
            heapq.heappush(self._booting, (now + self.start_delay_s, wid))
            self.sim.schedule_hook(now + self.start_delay_s)
        self.stats.workers_changed(now, len(self.workers))

    def add_ready(self, n: int) -> None:
        """Workers already up (the pool at t=0)."""
        for _ in range(n):
            wid = self._new_id()
            self.workers[wid] = WorkerPhase.RUNNING
            self.started_at[wid] = self.sim.now
            self.sim.add_worker(WorkerId(wid), self.sim.policy.pool.slots_per_worker)
        self.stats.workers_changed(self.sim.now, len(self.workers))

    def _new_id(self) -> str:
        self._seq += 1
        return f"e{self._seq:03d}"

    def boot_due(self, now: float) -> None:
        while self._booting and self._booting[0][0] <= now + _EPS:
            _, wid = heapq.heappop(self._booting)
            if self.workers.get(wid) is WorkerPhase.STARTING:
                self.workers[wid] = WorkerPhase.RUNNING
                self.started_at[wid] = now
                self.sim.add_worker(WorkerId(wid), self.sim.policy.pool.slots_per_worker)

    def remove(self, worker_ids: list[str]) -> None:
        for wid in worker_ids:
            self.workers.pop(wid, None)
            self.started_at.pop(wid, None)
        self.stats.workers_changed(self.sim.now, len(self.workers))

    def list(self) -> list[WorkerInfo]:
        return [WorkerInfo(w, p) for w, p in self.workers.items()]

    def poll_errors(self) -> builtins.list[str]:
        return []


class _SimMembership:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def drain(self, worker_id: WorkerId, yield_within_s: float | None) -> object:
        out = self.sim.apply(WorkerDraining(worker_id, yield_within_s))
        self.sim.stats.capacity_changed(self.sim.now, self.sim.core.describe().capacity)
        return out

    def deregister(self, worker_id: WorkerId) -> object:
        out = self.sim.apply(WorkerRemoved(worker_id))
        self.sim.stats.capacity_changed(self.sim.now, self.sim.core.describe().capacity)
        return out


class ElasticPool:
    """A PoolHook: decides every `period_s`, checks draining workers every `reap_every_s`."""

    def __init__(
        self,
        period_s: float = 15.0,
        *,
        reap_every_s: float = 1.0,
        initial_workers: int | None = None,
        rss: Callable[[str, float], int] | None = None,
    ):
        self.period_s = period_s
        self.rss = rss
        self.recycled: list[str] = []  # workers the loop drained to replace them
        self.reap_every_s = reap_every_s
        self.initial_workers = initial_workers
        self.autoscaler: Autoscaler | None = None
        self._actuator: _SimActuator | None = None
        self._next_tick = 0.0
        self._next_reap: float | None = None

    def start(self, sim: Simulator) -> None:
        stats = _elastic_stats(sim)
        pool, spec = sim.policy.pool, sim.policy.autoscaler
        self._actuator = act = _SimActuator(sim, stats, spec.start_delay_s)
        self.autoscaler = Autoscaler(
            CoreDemand(sim.core.describe, lambda: sim.policy, self._vitals(sim, act)),
            _SimMembership(sim),
            act,
            lambda: sim.policy,
            clock=lambda: sim.now,
            period_s=self.period_s,
            reap_every_s=self.reap_every_s,
        )
        n = self.initial_workers if self.initial_workers is not None else pool.workers
        act.add_ready(min(max(n, pool.min_workers), pool.max_workers))
        self._next_tick = 0.0
        sim.schedule_hook(0.0)

    def _vitals(self, sim: Simulator, act: _SimActuator) -> Callable[[], dict[str, Vitals]] | None:
        rss = self.rss
        if rss is None:
            return None
        return lambda: {w: Vitals(rss(w, sim.now - t), t) for w, t in act.started_at.items()}

    def fire(self, sim: Simulator, now: float) -> None:
        auto, act = self.autoscaler, self._actuator
        assert auto is not None and act is not None, "start() runs first"
        act.boot_due(now)
        if now + _EPS >= self._next_tick:
            self.recycled.extend(auto.tick(now).recycled)
            self._next_tick = now + self.period_s
            sim.schedule_hook(self._next_tick)
        elif auto.busy_draining:
            auto.reap(now)
        if auto.busy_draining and (self._next_reap is None or self._next_reap <= now + _EPS):
            self._next_reap = now + self.reap_every_s
            sim.schedule_hook(self._next_reap)
        sim.stats.scale_actions = auto.actions


class StaticPool:
    """A PoolHook for comparison: `workers` ready from t=0, counted like the elastic pool."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def start(self, sim: Simulator) -> None:
        stats = _elastic_stats(sim)
        for i in range(self.workers):
            sim.add_worker(WorkerId(f"w{i:03d}"), sim.policy.pool.slots_per_worker)
        stats.workers_changed(0.0, self.workers)

    def fire(self, sim: Simulator, now: float) -> None:
        pass


def elastic_report(stats: SimStats, sla_target_s: float | None = None) -> dict[str, Any]:
    """worker_seconds, Guaranteed waits within quota above `sla_target_s` (default: the yield
    grace; what is promised), scale actions."""
    target = stats.policy.timing.yield_grace_s if sla_target_s is None else sla_target_s
    return {
        "worker_seconds": round(stats.worker_seconds, 1),
        "sla_misses": sum(1 for w in stats.guaranteed_waits(beyond_quota=False) if w > target + _EPS),
        "scale_actions": stats.scale_actions,
    }
