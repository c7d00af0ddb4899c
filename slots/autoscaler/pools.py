"""The autoscaler of many pools: one `Autoscaler` per pool, each sizing its pool alone.

Why one loop per pool and not one loop over all: every pool is a scheduling domain of its own
(docs/design.md, "Pools"), and so is its supply. A pool's loop reads that pool's demand
(`describe(name)`, priority-weighted under `policy.for_pool(name)`: its min, max, weights and
damping), asks that pool's actuator (its `PoolSpec.target`) for workers, and drains only that
pool's workers before removing them: a busy GPU pool never grows the CPU pool, an idle CPU pool
never drains a GPU worker. A policy of one pool is one loop, exactly as before pools.

`PoolsDemand` is the same numbers for the KEDA external scaler: the demand of a pool by name
(absent: the default pool), and its slots per worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from scheduler.core.views import PoolView
from scheduler.policy.model import DEFAULT_POOL, Policy, PoolSpec
from slots.actuators.base import Actuator
from slots.autoscaler.demand import CoreDemand, Membership, weighted_demand_of_pool
from slots.autoscaler.loop import Autoscaler
from slots.autoscaler.metrics import AutoscalerMetrics

__all__ = ["PoolAutoscalers", "PoolsDemand", "default_pool_name"]


def default_pool_name(policy: Policy) -> str:
    """The pool a caller naming none means: the only pool, else `default`, else the first."""
    names = policy.pool_names()
    return DEFAULT_POOL if len(names) > 1 and DEFAULT_POOL in names else names[0]


class PoolsDemand:
    """Weighted demand per pool, in slots (the KEDA metric). `check` raises when the core must
    not be read (a standby's core is stale)."""

    def __init__(
        self,
        describe: Callable[[str | None], PoolView],
        policy: Callable[[], Policy],
        check: Callable[[], None] | None = None,
    ) -> None:
        self._describe = describe
        self._policy = policy
        self._check = check

    def __call__(self, pool: str | None = None) -> float:
        if self._check is not None:
            self._check()
        policy = self._policy()
        name = pool or default_pool_name(policy)
        return weighted_demand_of_pool(self._describe(name), policy.for_pool(name))

    def slots_per_worker(self, pool: str | None = None) -> int:
        policy = self._policy()
        return policy.for_pool(pool or default_pool_name(policy)).pool.slots_per_worker

    def pool_names(self) -> tuple[str, ...]:
        return self._policy().pool_names()


@dataclass
class PoolAutoscalers:
    """Every pool's autoscaler, by pool name, in the policy's order."""

    loops: dict[str, Autoscaler]
    actuators: dict[str, Actuator]

    @classmethod
    def build(
        cls,
        policy: Callable[[], Policy],
        describe: Callable[[str | None], PoolView],
        membership: Membership,
        make_actuator: Callable[[PoolSpec, bool], Actuator | None],
        *,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
        period_s: float = 15.0,
    ) -> PoolAutoscalers:
        """One loop per pool `make_actuator(spec, several)` gives an actuator for (None: that
        pool is not autoscaled). With one pool, the loop and its metrics are as before pools."""
        specs = policy().pool_specs()
        several = len(specs) > 1
        metrics = AutoscalerMetrics(registry, pooled=True) if registry is not None and several else None
        loops: dict[str, Autoscaler] = {}
        actuators: dict[str, Actuator] = {}
        for spec in specs:
            actuator = make_actuator(spec, several)
            if actuator is None:
                continue
            name = spec.name
            actuators[name] = actuator
            loops[name] = Autoscaler(
                CoreDemand(_bound(describe, name), _projected(policy, name)),
                membership,
                actuator,
                _projected(policy, name),
                clock=clock,
                registry=None if several else registry,
                metrics=metrics,
                pool=name if several else None,
                period_s=period_s,
            )
        return cls(loops, actuators)

    @property
    def first(self) -> Autoscaler | None:
        return next(iter(self.loops.values()), None)

    def tick(self, now: float) -> dict[str, object]:
        """One full pass of every pool's loop (tests, the simulator)."""
        return {name: a.tick(now) for name, a in self.loops.items()}

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Every pool's loop, side by side, until `stop` (or cancelled)."""
        await asyncio.gather(*(a.run(stop) for a in self.loops.values()))

    def close(self) -> None:
        for actuator in self.actuators.values():
            close = getattr(actuator, "close", None)
            if close is not None:
                close()


def _bound(describe: Callable[[str | None], PoolView], name: str) -> Callable[[], PoolView]:
    return lambda: describe(name)


def _projected(policy: Callable[[], Policy], name: str) -> Callable[[], Policy]:
    return lambda: policy().for_pool(name)
