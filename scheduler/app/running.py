"""A running server, and what a serving mode gives the composition root (`Mode`).

A mode (memory.py, one_leader.py, pools.py) says what it wires: its units and their router,
whether it journals, the gate in front of the services, what starts once the port is bound,
and what stops. The root (root.py) does the rest the same way for every mode: the policy, the
keys, metrics, the gRPC server over the mode's router, the ports, the autoscaler's loops.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health
from prometheus_client import CollectorRegistry

from scheduler.app.options import StateOptions
from scheduler.grants import GrantKeyring
from scheduler.listen import close_metrics_http
from scheduler.policy.model import Policy
from scheduler.server.app import GrpcServer
from scheduler.server.auth import Authenticator
from scheduler.server.loop import SchedulerLoop
from scheduler.server.metrics import Metrics
from scheduler.server.policy_log import PolicyLog
from scheduler.server.pool_routes import Router
from scheduler.server.registry import WorkerRegistry
from slots.autoscaler.loop import Autoscaler
from slots.autoscaler.pools import PoolAutoscalers, PoolsDemand

if TYPE_CHECKING:  # kubernetes and the state store are imported only when asked for
    from scheduler.kube.policy_watch import PolicyWatcher
    from scheduler.state.config import StateUrl
    from scheduler.state.replica import Replica


@dataclass(frozen=True)
class Build:
    """What every mode is built from."""

    policy: Policy
    state: StateOptions
    url: StateUrl | None  # None: memory
    metrics: Metrics
    keys: GrantKeyring
    watcher: PolicyWatcher | None
    heartbeat_interval_s: float
    static_pool: bool


class Mode(Protocol):
    """A serving mode's wiring (module doc)."""

    @property
    def router(self) -> Router: ...  # the units every servicer serves
    @property
    def fatal_event(self) -> asyncio.Event: ...  # set when the state cannot be recovered: `serve` exits 1
    @property
    def fatal(self) -> BaseException | None: ...  # why
    @property
    def durable(self) -> bool: ...  # journaled: health waits for the store and the lead
    def policy(self) -> Policy: ...  # what callers are authenticated by
    def bind_watcher(self, watcher: PolicyWatcher, secure: bool, plog: PolicyLog) -> None: ...
    def demand(self) -> PoolsDemand: ...  # each pool's demand, for KEDA and the demand gauges
    def assemble(
        self, auth: Authenticator, keys: GrantKeyring, plog: PolicyLog, demand: PoolsDemand
    ) -> GrpcServer: ...
    def autoscalers(
        self, env: Mapping[str, str], scheduler: str, metrics: CollectorRegistry, period_s: float
    ) -> PoolAutoscalers | None: ...
    async def start(self, running: RunningServer, grpc_server: GrpcServer) -> None: ...
    def state_line(self) -> str | None: ...  # `serve`'s "slotsched state:" line
    def begin_shutdown(self) -> None: ...
    async def stop(self) -> None: ...
    def close(self) -> None: ...


class LedPools(Protocol):
    """`--leadership pool`'s view for callers (scheduler/app/pools.py's PoolLeadership)."""

    def led_here(self) -> tuple[str, ...]: ...
    def bind_watcher(self, watcher: PolicyWatcher, secure: bool, plog: PolicyLog) -> None: ...


@dataclass
class RunningServer:
    port: int
    metrics_port: int | None
    host: str
    secure: bool
    policy: Policy
    loop: SchedulerLoop  # the first unit's (the only one, of one loop)
    registry: WorkerRegistry  # the first unit's
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    mode: Mode
    _httpd: WSGIServer | None = None
    autoscaler: Autoscaler | None = None  # the first pool's loop (the only one, of one pool)
    autoscalers: PoolAutoscalers | None = None  # every pool's loop, by pool
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stopped: bool = False
    replica: Replica | None = None  # one leader for every pool
    #: Makes grants and tags lease ids; workers get their keys from it in Register and Heartbeat.
    grant_keys: GrantKeyring = field(default_factory=GrantKeyring.generate)
    transport: str = "plaintext"  # TlsFiles.describe() of the gRPC port
    pools: LedPools | None = None  # --leadership pool: every pool's unit and replica

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    async def begin_shutdown(self) -> None:
        """Health NOT_SERVING, new calls UNAVAILABLE, open streams ended with UNAVAILABLE."""
        await self.health.enter_graceful_shutdown()
        self.mode.begin_shutdown()

    async def stop(self, grace: float | None = 1.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.begin_shutdown()
        await self.mode.stop()  # resign at once: a standby takes over without waiting a TTL
        if self._httpd is not None:
            # shutdown() waits out serve_forever's 0.5 s poll; nothing needs to wait for it.
            threading.Thread(target=close_metrics_http, args=(self._httpd,), daemon=True).start()
        await self.server.stop(grace)
        for t in self._tasks:
            t.cancel()
        # Let them run their `finally` (a watcher's stop, a leader's task list) before the loop
        # closes; an exception of a task that had already failed is dropped here, not leaked.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.autoscalers is not None:
            # The local actuator stops the worker processes it started, waiting for each to exit:
            # off the event loop.
            await asyncio.to_thread(self.autoscalers.close)
        self.mode.close()
