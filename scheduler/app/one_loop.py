"""The parts of a server with one loop for every pool (memory.py and one_leader.py): the loop,
its registry, the router of that one loop, KEDA's demand from its core, the policy object
applied to it, and its autoscaler's loops."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from scheduler.app.running import Build
from scheduler.autoscale_wiring import pool_autoscalers, register_static_workers
from scheduler.policy.errors import Problem
from scheduler.policy.model import Policy
from scheduler.server.app import one_loop
from scheduler.server.loop import SchedulerLoop
from scheduler.server.policy_log import PolicyLog
from scheduler.server.pool_routes import OneLoop
from scheduler.server.registry import WorkerRegistry
from slots.autoscaler.pools import PoolAutoscalers, PoolsDemand

if TYPE_CHECKING:
    from scheduler.kube.policy_watch import Outcome, PolicyWatcher


class OneLoopParts:
    def __init__(self, build: Build) -> None:
        self.build = build
        self.loop = SchedulerLoop(build.policy, build.metrics)
        self.registry = WorkerRegistry(self.loop, build.heartbeat_interval_s)
        self.router: OneLoop = one_loop(self.loop, self.registry, build.keys)
        self.fatal_event = asyncio.Event()  # one loop's failures are its replica's (one_leader.py)
        self.fatal: BaseException | None = None

    def policy(self) -> Policy:
        return self.loop.core.policy

    def register_static_pool(self) -> None:
        """local-N; of several pools local-<pool>-N, each in its pool."""
        register_static_workers(self.registry, self.build.policy)

    def demand(self) -> PoolsDemand:
        loop = self.loop

        def serving() -> None:
            # A standby's (or a stepped-down leader's) core is stale: end KEDA's stream so it
            # reconnects through the Service to the leader, rather than read frozen demand.
            if loop.shutting_down:
                raise RuntimeError("this replica is not serving")

        return PoolsDemand(lambda name: loop.core.describe(name), lambda: loop.core.policy, serving)

    def slots_per_worker(self) -> int:
        return self.loop.core.policy.pool.slots_per_worker

    def autoscalers(
        self, env: Mapping[str, str], scheduler: str, metrics: CollectorRegistry, period_s: float
    ) -> PoolAutoscalers | None:
        return pool_autoscalers(self.loop, self.registry, env, scheduler, metrics, period_s)

    def bind_watcher(self, watcher: PolicyWatcher, secure: bool, plog: PolicyLog) -> None:
        """Every new version of the SchedulingPolicy object goes Admin.ApplyPolicy's path."""
        from scheduler.kube.policy_watch import Outcome

        loop = self.loop

        async def apply(policy: Policy, warnings: list[Problem]) -> Outcome:
            if loop.shutting_down:  # a standby (or stopping): the leader applies it; we do on taking the lead
                return Outcome(False, "Standby", "", report=False)
            if secure and not policy.access.admins:  # Admin.ApplyPolicy's refusal, for the same reason
                return Outcome(
                    False,
                    "NoAdmins",
                    "spec.access.admins is empty: it would lock every operator out of the "
                    "Admin service; the policy in force is unchanged",
                )
            old = loop.core.policy
            loop.apply_policy(policy)
            generation = plog.next_generation()
            await loop.durable()
            plog.applied(generation, old, policy, f"the object {watcher.ref}")
            return Outcome(True, "Applied", f"policy {policy.name} in force")

        watcher.bind(apply, reporting=lambda: not loop.shutting_down)

    def begin_shutdown(self) -> None:
        self.loop.begin_shutdown()

    def close(self) -> None:
        self.loop.close()
