"""One leader for every pool (`slotsched serve --state redis…`, the default `--leadership
replica`): the replica (journal, recovery, election; scheduler/state/replica.py) and what runs
only on the leader (the reaper, the autoscaler, health SERVING). Per-pool leadership is
scheduler/pool_leadership.py's.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from scheduler.listen import default_advertise
from scheduler.policy.model import Policy
from scheduler.server.app import GrpcServer
from scheduler.server.loop import SchedulerLoop
from scheduler.server.metrics import Metrics
from scheduler.server.registry import WorkerRegistry

if TYPE_CHECKING:
    from scheduler.kube.policy_watch import PolicyWatcher
    from scheduler.serve import RunningServer, StateOptions


class ReplicaLeadership:
    """Redis mode: the replica (journal, recovery, election) and what runs only on the leader.

    The gRPC server sees only `serving` (its leader gate); the replica calls `on_lead` and
    `on_step_down`, which start and stop the reaper and the autoscaler and flip health."""

    def __init__(
        self,
        redis_url: str,
        state: StateOptions,
        loop: SchedulerLoop,
        registry: WorkerRegistry,
        policy: Policy,
        metrics: Metrics,
        register_static_pool: Callable[[], None] | None,
        watcher: PolicyWatcher | None = None,
    ) -> None:
        from scheduler.state.redis_connect import redact
        from scheduler.state.redis_store import RedisStore
        from scheduler.state.replica import Replica, StateMetrics

        loop.shutting_down = True  # nothing runs on the core until this replica leads
        store = RedisStore(
            redis_url,
            state.prefix,
            state.replica_id or f"{os.uname().nodename}-{os.getpid()}",
            # One slow call must not outlast the leader lease it is meant to keep.
            timeout_s=min(1.0, state.leader_ttl_s / 3),
        )
        self._loop = loop
        self._registry = registry
        self._policy = policy
        self._register_static_pool = register_static_pool
        self._watcher = watcher
        self._running: RunningServer | None = None
        self._grpc: GrpcServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.replica = Replica(
            store,
            loop,
            registry,
            policy,
            StateMetrics(metrics.registry),
            on_lead=self._on_lead,
            on_step_down=self._on_step_down,
            leader_ttl_s=state.leader_ttl_s,
            snapshot_every=state.snapshot_every,
            snapshot_interval_s=state.snapshot_interval_s,
            campaign_interval_s=state.campaign_interval_s,
            where=redact(redis_url),
            on_store=self._on_store,
        )
        self._advertise = state.advertise
        loop.journal = self.replica

    def serving(self) -> bool:
        return self.replica.leading()

    def leader(self) -> str | None:
        """Where the leader is, as a standby last read it (for NOT_LEADER); None while this
        replica leads but refuses (its renewal is late): it must not send clients to itself."""
        return None if self.replica.serving else self.replica.leader_address

    async def start(self, running: RunningServer, grpc_server: GrpcServer) -> None:
        self._running, self._grpc = running, grpc_server
        running.replica = self.replica
        self.replica.advertise = self._advertise or default_advertise(running.host, running.port)
        running._tasks.append(asyncio.create_task(_cancel_on_exit(self._tasks)))
        try:
            await self.replica.start()
        except BaseException:
            await running.stop(0)
            raise
        if self.replica.fatal is not None:
            await running.stop(0)
            raise RuntimeError(f"cannot recover the state: {self.replica.fatal}")

    async def _on_lead(self, fresh: bool) -> None:
        assert self._running is not None and self._grpc is not None
        if fresh:
            self._loop.apply_policy(self._policy)  # journaled first: replay never depends on today's file
            if self._register_static_pool is not None:
                self._register_static_pool()
        if self._watcher is not None:
            # The object is the truth, not the journal: the new leader applies its latest version
            # (journaled like any ApplyPolicy) and reports it in the object's status.
            await self._watcher.resync()
        if not self.replica.serving:
            return  # stepped down meanwhile (its first batch failed): no reaper, autoscaler or SERVING
        self._tasks.append(asyncio.create_task(self._registry.run_reaper()))
        if self._running.autoscalers is not None:
            self._tasks.append(asyncio.create_task(self._running.autoscalers.run()))
        await self._grpc.set_serving(True)

    async def _on_store(self, down: str | None) -> None:
        if self._grpc is not None:
            await self._grpc.set_store(down is None)

    async def _on_step_down(self) -> None:
        assert self._grpc is not None
        for t in self._tasks:
            t.cancel()
        self._tasks.clear()
        await self._grpc.set_serving(False)


async def _cancel_on_exit(tasks: list[asyncio.Task[None]]) -> None:
    """Cancels the leader-only tasks when the server's own tasks are cancelled (stop)."""
    try:
        await asyncio.Event().wait()
    finally:
        for t in tasks:
            t.cancel()
