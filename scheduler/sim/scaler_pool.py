"""A pool hook that lets a baseline autoscaler rule (`autoscalers.py`) size the simulated pool.

Why a hook of its own: `elastic.ElasticPool` runs slotsched's autoscaler loop, whose drain asks
sessions to checkpoint and yield. The baselines act the way their platforms do, and that is part
of what is compared:

- scale-up: new workers are ready `autoscaler.start_delay_s` after being asked for (as in
  ElasticPool); a scale-down first cancels workers still starting;
- `removal="deployment"` (HPA, KEDA: a Deployment's replica count): the ReplicaSet deletes the
  newest pods, busy or not; a deleted pod takes no new sessions and is killed after a 30 s
  termination grace — sessions still on it are revoked and lose their work since their grant;
- `removal="idle"` (custom loops that see the runtime): only workers holding no lease leave, at
  once; a scale-down finds fewer idle workers than it wants and removes those.

Worker-seconds are counted as ElasticPool counts them (`ElasticStats`: starting, ready and
terminating workers), and a scale action is one decision that changed the pool.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from scheduler.core.lifecycle import WorkerState
from scheduler.core.types import WorkerDraining, WorkerId, WorkerRemoved
from scheduler.sim.autoscalers import Observation, Rule
from scheduler.sim.elastic import ElasticStats
from scheduler.sim.simulator import Simulator

_EPS = 1e-9
STARTING, READY, TERMINATING = "starting", "ready", "terminating"


class ScalerPool:
    def __init__(self, rule: Rule, termination_grace_s: float = 30.0) -> None:
        self.rule = rule
        self.grace_s = termination_grace_s
        self.workers: dict[str, str] = {}  # id -> phase, in creation order
        self._timers: list[tuple[float, str, str]] = []  # (when, "boot" | "kill", worker)
        self._next_sync = 0.0
        self._seq = 0
        self.stats: ElasticStats | None = None

    # ------------------------------------------------------------------ PoolHook

    def start(self, sim: Simulator) -> None:
        if not isinstance(sim.stats, ElasticStats):
            sim.stats = ElasticStats(sim.policy)  # before the run records anything
        self.stats = sim.stats
        lo, hi = self._bounds(sim)
        for _ in range(min(max(sim.policy.pool.workers, lo), hi)):
            wid = self._new_id()
            self.workers[wid] = READY
            sim.add_worker(WorkerId(wid), sim.policy.pool.slots_per_worker)
        self._count(sim)
        sim.schedule_hook(0.0)

    def fire(self, sim: Simulator, now: float) -> None:
        while self._timers and self._timers[0][0] <= now + _EPS:
            _, what, wid = heapq.heappop(self._timers)
            phase = self.workers.get(wid)
            if what == "boot" and phase == STARTING:
                self.workers[wid] = READY
                sim.add_worker(WorkerId(wid), sim.policy.pool.slots_per_worker)
            elif what == "kill" and phase == TERMINATING:
                self._remove(sim, wid)
        if now + _EPS >= self._next_sync:
            self._next_sync = now + self.rule.sync_s
            sim.schedule_hook(self._next_sync)
            lo, hi = self._bounds(sim)
            want = min(max(self.rule.desired(self._observe(sim, now)), lo), hi)
            if self._scale(sim, now, want):
                assert self.stats is not None
                self.stats.scale_actions += 1
        self._count(sim)

    # ------------------------------------------------------------------ acting

    def _scale(self, sim: Simulator, now: float, want: int) -> bool:
        replicas = [w for w, p in self.workers.items() if p in (STARTING, READY)]
        if want > len(replicas):
            delay = sim.policy.autoscaler.start_delay_s
            for _ in range(want - len(replicas)):
                wid = self._new_id()
                self.workers[wid] = STARTING
                self._timer(sim, now + delay, "boot", wid)
            return True
        excess = len(replicas) - want
        if excess <= 0:
            return False
        changed = False
        for wid in reversed(replicas):  # newest first; starting ones are cancelled outright
            if excess == 0:
                break
            if self.workers[wid] == STARTING:
                del self.workers[wid]
                excess, changed = excess - 1, True
        busy = {w.worker_id: w.busy for w in sim.core.describe().workers}
        for wid in reversed([w for w in replicas if self.workers.get(w) == READY]):
            if excess == 0:
                break
            if self.rule.removal == "idle":
                if busy.get(WorkerId(wid), 0) == 0:
                    self._remove(sim, wid)
                    excess, changed = excess - 1, True
            else:
                self.workers[wid] = TERMINATING
                sim.apply(WorkerDraining(WorkerId(wid), None))  # out of the endpoints: no new sessions
                sim.stats.capacity_changed(now, sim.core.describe().capacity)
                self._timer(sim, now + self.grace_s, "kill", wid)
                excess, changed = excess - 1, True
        return changed

    def _remove(self, sim: Simulator, wid: str) -> None:
        del self.workers[wid]
        sim.apply(WorkerRemoved(WorkerId(wid)))  # leases still on it are revoked: work lost
        sim.stats.capacity_changed(sim.now, sim.core.describe().capacity)

    # ------------------------------------------------------------------ helpers

    def _observe(self, sim: Simulator, now: float) -> Observation:
        view = sim.core.describe()
        ready = [w for w in view.workers if w.state is WorkerState.READY]
        starting = sum(1 for p in self.workers.values() if p == STARTING)
        retrying = sim.retrying()
        waiting = [q + r for q, r in zip(view.pending, retrying, strict=True)]
        return Observation(
            now=now,
            replicas=len(ready) + starting,
            ready=len(ready),
            idle=sum(1 for w in ready if w.busy == 0),
            pending=(waiting[0], waiting[1], waiting[2]),
            held=view.held,
            oldest_wait_s=max(view.oldest_wait_s, default=0.0),
            slots_per_worker=sim.policy.pool.slots_per_worker,
        )

    def _bounds(self, sim: Simulator) -> tuple[int, int]:
        pool = sim.policy.pool
        lo = pool.min_workers if self.rule.min_replicas is None else self.rule.min_replicas
        return lo, pool.max_workers

    def _timer(self, sim: Simulator, at: float, what: str, wid: str) -> None:
        heapq.heappush(self._timers, (at, what, wid))
        sim.schedule_hook(at)

    def _count(self, sim: Simulator) -> None:
        assert self.stats is not None
        self.stats.workers_changed(sim.now, len(self.workers))

    def _new_id(self) -> str:
        self._seq += 1
        return f"a{self._seq:03d}"


def factory(make_rule: Callable[[], Rule]) -> Callable[[], ScalerPool]:
    """A fresh pool (and rule, with its history) for each run."""
    return lambda: ScalerPool(make_rule())
