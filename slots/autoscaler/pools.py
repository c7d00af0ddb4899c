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
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry

from scheduler.core.views import PoolView
from scheduler.policy.model import DEFAULT_POOL, Policy, PoolSpec
from slots.actuators.base import Actuator
from slots.autoscaler.decision import ScaleConfig, ScaleDecision, ScaleHistory, ScaleInput, decide
from slots.autoscaler.demand import (
    CoreDemand,
    Membership,
    Vitals,
    scale_input_from_pool,
    weighted_demand_of_pool,
)
from slots.autoscaler.loop import Autoscaler
from slots.autoscaler.metrics import AutoscalerMetrics

__all__ = ["PoolAutoscalers", "PoolsDemand", "default_pool_name"]

log = logging.getLogger("slotsched.autoscaler")


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

    def scale_input(self, pool: str) -> tuple[ScaleInput, ScaleDecision]:
        """The pool's decision input, and the decision an undamped loop would make now: what the
        demand gauges export while no built-in loop runs (KEDA's HPA sizes the pool instead)."""
        if self._check is not None:
            self._check()
        policy = self._policy().for_pool(pool)
        inp = scale_input_from_pool(self._describe(pool), policy.pool.slots_per_worker, 0.0)
        return inp, decide(inp, ScaleConfig.from_policy(policy), ScaleHistory())


#: How often `PoolAutoscalers.run` checks which pools it leads (per-pool leadership).
ACTIVE_POLL_S = 1.0


class PoolAutoscalers:
    """Every pool's autoscaler, by pool name, in the policy's order: one loop per pool
    `make_actuator(spec, several)` gives an actuator for (None: that pool is not autoscaled);
    with one pool, the loop and its metrics are as before pools. Pools added by a live policy
    change get theirs at the next `reconcile` (which `run` calls every period).

    `active(pool)` (per-pool leadership: this replica leads the pool) runs a pool's loop only
    while it says yes, checked every `ACTIVE_POLL_S`: a pool's size is set by its leader alone."""

    def __init__(
        self,
        policy: Callable[[], Policy],
        describe: Callable[[str | None], PoolView],
        membership: Membership,
        make_actuator: Callable[[PoolSpec, bool], Actuator | None],
        *,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
        period_s: float = 15.0,
        active: Callable[[str], bool] | None = None,
        vitals: Callable[[], Mapping[str, Vitals]] | None = None,
    ) -> None:
        """`vitals`: each worker's memory and age from its heartbeats (recycling reads them)."""
        self._active = active
        self._vitals = vitals
        self._policy = policy
        self._describe = describe
        self._membership = membership
        self._make_actuator = make_actuator
        self._clock = clock
        self._registry = registry
        self.period_s = period_s
        # Whether pools are labelled is fixed at start: one pool's metrics stay as before
        # pools, and a series does not change its labels under a running Prometheus.
        self.several = len(policy().pool_specs()) > 1
        self._metrics = (
            AutoscalerMetrics(registry, pooled=True) if registry is not None and self.several else None
        )
        self.loops: dict[str, Autoscaler] = {}
        self.actuators: dict[str, Actuator] = {}
        self._declined: set[str] = set()  # pools make_actuator gave no actuator for
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stops: dict[str, asyncio.Event] = {}
        self.reconcile()

    def reconcile(self) -> tuple[list[str], list[str]]:
        """Give each pool of the policy in force its loop, and drop the loops of pools it no
        longer has: (added, removed). A removed pool is retired by the core (it drains); its
        workers stay with its actuator's target, which the operator removes with the pool."""
        specs = self._policy().pool_specs()
        names = {spec.name for spec in specs}
        added: list[str] = []
        for spec in specs:
            name = spec.name
            if name in self.loops or name in self._declined:
                continue
            actuator = self._make_actuator(spec, self.several)
            if actuator is None:
                self._declined.add(name)
                continue
            if self.loops and not self.several:
                log.warning(
                    "pool %s added live: autoscaled, its autoscaler metrics unlabelled until restart", name
                )
            self.actuators[name] = actuator
            self.loops[name] = Autoscaler(
                CoreDemand(_bound(self._describe, name), _projected(self._policy, name), self._vitals),
                self._membership,
                actuator,
                _projected(self._policy, name),
                clock=self._clock,
                registry=None if self.several or self.loops else self._registry,
                metrics=self._metrics,
                pool=name if self.several else None,
                period_s=self.period_s,
            )
            added.append(name)
        removed = [name for name in self.loops if name not in names]
        for name in removed:
            del self.loops[name]
            self._close(self.actuators.pop(name))
            stop = self._stops.pop(name, None)
            if stop is not None:
                stop.set()
            self._tasks.pop(name, None)
        self._declined &= names
        return added, removed

    @property
    def first(self) -> Autoscaler | None:
        return next(iter(self.loops.values()), None)

    def tick(self, now: float) -> dict[str, object]:
        """One full pass of every pool's loop (tests, the simulator)."""
        return {name: a.tick(now) for name, a in self.loops.items()}

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Every pool's loop, side by side, until `stop` (or cancelled); each period the pools
        are reconciled with the policy in force (a pool added live starts autoscaling)."""
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                self.reconcile()
                for name, auto in self.loops.items():
                    on = self._active is None or self._active(name)
                    if on and name not in self._tasks:
                        self._stops[name] = own = asyncio.Event()
                        self._tasks[name] = asyncio.create_task(auto.run(own), name=f"autoscaler-{name}")
                    elif not on and name in self._tasks:  # the pool is led elsewhere now
                        self._stops.pop(name).set()
                        self._tasks.pop(name)
                wait = self.period_s if self._active is None else min(self.period_s, ACTIVE_POLL_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
        finally:
            for own in self._stops.values():
                own.set()
            tasks = list(self._tasks.values())
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.clear()
            self._stops.clear()

    def close(self) -> None:
        for actuator in self.actuators.values():
            self._close(actuator)

    @staticmethod
    def _close(actuator: Actuator) -> None:
        close = getattr(actuator, "close", None)
        if close is not None:
            close()


def _bound(describe: Callable[[str | None], PoolView], name: str) -> Callable[[], PoolView]:
    return lambda: describe(name)


def _projected(policy: Callable[[], Policy], name: str) -> Callable[[], Policy]:
    return lambda: policy().for_pool(name)
