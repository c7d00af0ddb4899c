"""Wiring of the supply side per pool, for the composition root (scheduler/app/): the static local workers
and the companion autoscaler, one loop and one actuator per pool.

Why apart from scheduler/app/: the root composes; what each pool gets is decided here once. With
one pool everything is as before pools (workers `local-N`, one loop, the environment's target);
with several, each pool gets its own `local-<pool>-N` workers (registered into it), and its own
autoscaler loop whose actuator scales that pool's `PoolSpec.target` (kubernetes) or starts
workers that join it (local): a pool's demand sizes that pool only (slots/autoscaler/pools.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from prometheus_client import CollectorRegistry

from scheduler.core.types import WorkerId
from scheduler.core.views import BudgetFeed, PoolView
from scheduler.policy.model import Policy, PoolSpec
from scheduler.server.loop import SchedulerLoop
from scheduler.server.permits import PermitDesk
from scheduler.server.registry import WorkerRegistry
from slots.actuators.base import Actuator
from slots.actuators.factory import actuator_from_env
from slots.autoscaler.demand import Membership, Vitals
from slots.autoscaler.pools import PoolAutoscalers

log = logging.getLogger("slotsched.server")


def static_workers(policy: Policy) -> list[tuple[WorkerId, int, str]]:
    """The in-process pool's workers: (id, slots, pool); pool "" for a policy of one pool."""
    specs = policy.pool_specs()
    if len(specs) == 1:
        return [(WorkerId(f"local-{i}"), specs[0].slots_per_worker, "") for i in range(specs[0].workers)]
    return [
        (WorkerId(f"local-{p.name}-{i}"), p.slots_per_worker, p.name) for p in specs for i in range(p.workers)
    ]


def register_static_workers(registry: WorkerRegistry, policy: Policy) -> None:
    for wid, slots, pool in static_workers(policy):
        registry.register(wid, "local", slots, {}, static=True, pool=pool)


def pool_autoscalers(
    loop: SchedulerLoop,
    registry: WorkerRegistry,
    env: Mapping[str, str],
    scheduler: str,
    metrics: CollectorRegistry,
    period_s: float,
) -> PoolAutoscalers | None:
    """Every pool's autoscaler loop (not started), or None when SLOTSCHED_AUTOSCALER is off.
    `scheduler` is the address local workers register at; `metrics` the Prometheus registry."""
    return autoscalers(
        lambda: loop.core.policy,
        # The core is replaced at a recovery (and the desk at a new term): read them each time.
        lambda name: with_budgets(loop.core.describe(name), loop.core.policy, loop.permits),
        registry,
        loop.now,
        env,
        scheduler,
        metrics,
        period_s,
        vitals=lambda: vitals_of([registry]),
    )


def with_budgets(
    view: PoolView, policy: Policy, desk: PermitDesk | Callable[[str], PermitDesk | None]
) -> PoolView:
    """The pool's view with its budgets (spec.pools[].budgets) as the autoscaler's cap reads
    them: the slot core knows nothing of budgets, the loop's PermitDesk counts them. Per-pool
    leadership passes `desk` as a function: the desk counting a budget (its home unit's, when
    it leads here), or None (counted on another replica: no cap from it here)."""
    spec = policy.pool_spec(view.name)
    names = spec.budgets if spec is not None else ()
    if not names:
        return view
    if isinstance(desk, PermitDesk):
        return replace(view, budgets=desk.feeds(names))
    feeds: list[BudgetFeed] = []
    for name in names:
        home = desk(name)
        if home is not None:
            feeds.extend(home.feeds((name,)))
    return replace(view, budgets=tuple(feeds))


def vitals_of(registries: Iterable[WorkerRegistry]) -> dict[str, Vitals]:
    """Each worker's memory and age as its last heartbeat reported them (recycling reads them)."""
    return {
        wid: Vitals(w.rss_bytes, w.started_at)
        for registry in registries
        for wid, w in registry.workers.items()
        if w.last_heartbeat is not None
    }


def autoscalers(
    policy: Callable[[], Policy],
    describe: Callable[[str | None], PoolView],
    membership: Membership,
    clock: Callable[[], float],
    env: Mapping[str, str],
    scheduler: str,
    metrics: CollectorRegistry,
    period_s: float,
    active: Callable[[str], bool] | None = None,
    vitals: Callable[[], Mapping[str, Vitals]] | None = None,
) -> PoolAutoscalers | None:
    """`pool_autoscalers` over any view of the pools: per-pool leadership reads each pool from
    its unit, drains through the unit holding the worker, and runs a pool's loop only where it
    is led (`active`)."""

    def actuator(spec: PoolSpec, several: bool) -> Actuator | None:
        pool = spec.name if several else ""
        return actuator_from_env(
            env, scheduler=scheduler, slots=spec.slots_per_worker, pool=pool, target=spec.target
        )

    loops = PoolAutoscalers(
        policy,
        describe,
        membership,
        actuator,
        clock=clock,
        registry=metrics,
        period_s=period_s,
        active=active,
        vitals=vitals,
    )
    if not loops.loops:
        return None
    kind = env.get("SLOTSCHED_AUTOSCALER")
    log.info("autoscaler on: %s actuator, every %.0f s, pools %s", kind, period_s, ", ".join(loops.loops))
    return loops
