"""`slotsched serve` without `--state`: one loop for every pool, its state in memory only.

Wires: the loop's static workers at once, every service over the one loop (no leader gate:
this server always serves), health SERVING from the start, then the reaper and the autoscaler's
loops once the port is bound."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from scheduler.app.one_loop import OneLoopParts
from scheduler.app.running import Build, RunningServer
from scheduler.grants import GrantKeyring
from scheduler.policy.model import Policy
from scheduler.server.app import GrpcServer, assemble_router
from scheduler.server.auth import Authenticator
from scheduler.server.policy_log import PolicyLog
from slots.autoscaler.pools import PoolAutoscalers, PoolsDemand

if TYPE_CHECKING:
    from scheduler.kube.policy_watch import PolicyWatcher


class Memory:
    durable = False

    def __init__(self, build: Build) -> None:
        self.parts = OneLoopParts(build)
        self.router = self.parts.router
        self.fatal_event, self.fatal = self.parts.fatal_event, self.parts.fatal
        if build.static_pool:
            self.parts.register_static_pool()

    def policy(self) -> Policy:
        # Read on every call (auth, fairness, rate limits: seven times an Acquire): one hop, not two.
        return self.parts.loop.core.policy

    def bind_watcher(self, watcher: PolicyWatcher, secure: bool, plog: PolicyLog) -> None:
        self.parts.bind_watcher(watcher, secure, plog)

    def demand(self) -> PoolsDemand:
        return self.parts.demand()

    def assemble(
        self, auth: Authenticator, keys: GrantKeyring, plog: PolicyLog, demand: PoolsDemand
    ) -> GrpcServer:
        parts = self.parts
        return assemble_router(parts.router, auth, demand, parts.slots_per_worker, keys, plog)

    def autoscalers(
        self, env: Mapping[str, str], scheduler: str, metrics: CollectorRegistry, period_s: float
    ) -> PoolAutoscalers | None:
        return self.parts.autoscalers(env, scheduler, metrics, period_s)

    async def start(self, running: RunningServer, grpc_server: GrpcServer) -> None:
        running._tasks.append(asyncio.create_task(self.parts.registry.run_reaper()))
        if running.autoscalers is not None:
            running._tasks.append(asyncio.create_task(running.autoscalers.run()))

    def state_line(self) -> str | None:
        return None

    def begin_shutdown(self) -> None:
        self.parts.begin_shutdown()

    async def stop(self) -> None:
        pass

    def close(self) -> None:
        self.parts.close()
