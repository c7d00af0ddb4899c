"""Baseline autoscaler rules: how many workers other autoscalers would ask for, from what they see.

Why these five: they are what teams put in front of an agent pool today, each reading a different
signal. Each rule is a small stateful object (its history, its cooldowns) asked once per sync for
a desired replica count; `scaler_pool.ScalerPool` applies the answer in the simulator. Every
rule drives the same slotsched core, so a comparison isolates how the pool is sized.

- `Hpa` — the Kubernetes HPA with default behaviour on *queue depth per worker* (an AverageValue
  target of `target_per_worker` waiting sessions per replica, by default a worker's slots):
  desired = ceil(pending / target),
  no change within a 0.1 tolerance, scale-down to the highest recommendation of the last 300 s,
  scale-up by at most max(4 pods, 100%) per 15 s, synced every 15 s. Running sessions are not in
  the metric: a full pool with an empty queue looks like no demand.
- `Keda` — KEDA's Redis-list scaler: list length (waiting sessions) with `listLength` 5 per
  replica fed to the HPA above; the operator polls every 30 s, activates 0 → 1 when the list is
  non-empty and scales to zero after a 300 s cooldown without activity (minReplicaCount 0).
- `WeightedFormula` — desired = clamp(int(weighted_depth / jobs_per_executor) + 1), where
  weighted_depth counts running sessions once and waiting ones by class weight 3 / 1 / 0.5 and a
  job per executor is a slot; no change within 30 s of the last one.
- `Polling` — a polling loop: adds workers when waiting sessions exceed 5 per worker or the
  oldest has waited over 30 s; removes idle workers when nothing waits; each step at most
  min(5, 50%) of the pool; 60 s cooldown after a scale-up, 120 s after a scale-down.
- `QueueStep` (`queue-step`) — one worker at a time on queue samples: +1 worker when the queue was
  non-empty at 2 consecutive 3-second samples (12 s cooldown); -1 after 12 consecutive samples
  with an empty queue and an idle worker (45 s cooldown). (Once named `demo`, which read as
  `slotsched demo`.)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Observation:
    now: float
    replicas: int  # ready + starting: what the deployment asks for
    ready: int
    idle: int  # ready workers holding no lease
    pending: tuple[int, int, int]  # waiting sessions by class (G, B, BE)
    held: tuple[int, int, int]
    oldest_wait_s: float
    slots_per_worker: int

    @property
    def waiting(self) -> int:
        return sum(self.pending)


class Rule(Protocol):
    name: str
    sync_s: float  # how often `desired` is asked
    removal: str  # "deployment": pods deleted newest first; "idle": only idle workers removed
    min_replicas: int | None  # None: the policy's minWorkers

    def desired(self, obs: Observation) -> int: ...


class Hpa:
    name = "hpa-queue"
    removal = "deployment"
    min_replicas: int | None = None

    def __init__(
        self,
        target_per_worker: float | None = None,
        tolerance: float = 0.1,
        stabilization_s: float = 300.0,
        up_pods: int = 4,
        up_percent: float = 100.0,
        sync_s: float = 15.0,
    ) -> None:
        self.target = target_per_worker
        self.tolerance = tolerance
        self.stabilization_s = stabilization_s
        self.up_pods = up_pods
        self.up_percent = up_percent
        self.sync_s = sync_s
        self._recs: deque[tuple[float, int]] = deque()

    def step(self, now: float, current: int, metric_total: float) -> int:
        """One HPA sync for an AverageValue metric summing to `metric_total` over the replicas.
        (The sync equals the 15 s scale-up period, so each sync may add max(pods, percent).)"""
        target = self.target or 1.0
        raw = math.ceil(metric_total / target - 1e-9)
        if current > 0 and abs(metric_total / (current * target) - 1) <= self.tolerance:
            raw = current
        self._recs.append((now, raw))
        while self._recs and self._recs[0][0] <= now - self.stabilization_s:
            self._recs.popleft()
        if raw < current:
            return min(current, max(r for _, r in self._recs))
        if raw > current:
            step = max(self.up_pods, math.ceil(current * self.up_percent / 100))
            return min(raw, current + step)
        return current

    def desired(self, obs: Observation) -> int:
        if self.target is None:
            self.target = float(obs.slots_per_worker)
        return self.step(obs.now, obs.replicas, obs.waiting)


class Keda:
    name = "keda-redis"
    removal = "deployment"
    min_replicas: int | None = 0

    def __init__(
        self,
        list_length: float = 5.0,
        polling_s: float = 30.0,
        cooldown_s: float = 300.0,
        sync_s: float = 15.0,
    ) -> None:
        self.hpa = Hpa(list_length, sync_s=sync_s)
        self.polling_s = polling_s
        self.cooldown_s = cooldown_s
        self.sync_s = sync_s
        self._next_poll = 0.0
        self._last_active: float | None = None

    def desired(self, obs: Observation) -> int:
        now, replicas = obs.now, obs.replicas
        if now + 1e-9 >= self._next_poll:  # the KEDA operator's poll: activation and scale to zero
            self._next_poll = now + self.polling_s
            if obs.waiting > 0:
                self._last_active = now
                if replicas == 0:
                    return 1
            elif replicas > 0 and (self._last_active is None or now - self._last_active >= self.cooldown_s):
                return 0
        if replicas == 0:
            return 0
        return max(1, self.hpa.step(now, replicas, obs.waiting))  # the HPA, minReplicas 1


_WEIGHTS = (3.0, 1.0, 0.5)


class WeightedFormula:
    name = "weighted-formula"
    removal = "idle"
    min_replicas: int | None = None

    def __init__(self, cooldown_s: float = 30.0, sync_s: float = 15.0) -> None:
        self.cooldown_s = cooldown_s
        self.sync_s = sync_s
        self._last_change: float | None = None

    def desired(self, obs: Observation) -> int:
        depth = sum(obs.held) + sum(w * n for w, n in zip(_WEIGHTS, obs.pending, strict=True))
        want = int(depth / obs.slots_per_worker) + 1
        if want == obs.replicas or (
            self._last_change is not None and obs.now - self._last_change < self.cooldown_s
        ):
            return obs.replicas
        self._last_change = obs.now
        return want


def _step(replicas: int) -> int:
    return max(1, min(5, replicas // 2))


class Polling:
    name = "polling"
    removal = "idle"
    min_replicas: int | None = None

    def __init__(
        self, up_cooldown_s: float = 60.0, down_cooldown_s: float = 120.0, sync_s: float = 15.0
    ) -> None:
        self.up_cooldown_s = up_cooldown_s
        self.down_cooldown_s = down_cooldown_s
        self.sync_s = sync_s
        self._last_up: float | None = None
        self._last_down: float | None = None

    def desired(self, obs: Observation) -> int:
        now, n = obs.now, obs.replicas
        crowded = obs.waiting > 5 * max(1, obs.ready) or obs.oldest_wait_s > 30.0
        if crowded and (self._last_up is None or now - self._last_up >= self.up_cooldown_s):
            self._last_up = now
            return n + _step(n)
        if (
            obs.waiting == 0
            and obs.idle > 0
            and (self._last_down is None or now - self._last_down >= self.down_cooldown_s)
        ):
            self._last_down = now
            return n - min(obs.idle, _step(n))
        return n


class QueueStep:
    name = "queue-step"
    removal = "idle"
    min_replicas: int | None = None
    sync_s = 3.0

    def __init__(self) -> None:
        self._busy_samples = 0
        self._idle_samples = 0
        self._last_up: float | None = None
        self._last_down: float | None = None

    def desired(self, obs: Observation) -> int:
        now, n = obs.now, obs.replicas
        self._busy_samples = self._busy_samples + 1 if obs.waiting > 0 else 0
        self._idle_samples = self._idle_samples + 1 if obs.waiting == 0 and obs.idle > 0 else 0
        if self._busy_samples >= 2 and (self._last_up is None or now - self._last_up >= 12.0):
            self._last_up, self._busy_samples = now, 0
            return n + 1
        if self._idle_samples >= 12 and (self._last_down is None or now - self._last_down >= 45.0):
            self._last_down, self._idle_samples = now, 0
            return n - 1
        return n
