"""One leader for every pool (`slotsched serve --state URL`, the default `--leadership
replica`): one loop whose replica (journal, recovery, election; scheduler/state/replica.py)
serves only while it holds the leader lease, and what runs only on the leader (the reaper, the
autoscaler, health SERVING).

Wires: the services behind the leader gate (a standby answers NOT_LEADER naming the leader),
health NOT_SERVING until the replica leads and STATE_HEALTH while the store answers, the
static workers and the policy on a fresh store only (the journal holds them otherwise).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from scheduler.app.one_loop import OneLoopParts
from scheduler.app.running import Build, RunningServer
from scheduler.grants import GrantKeyring
from scheduler.listen import default_advertise
from scheduler.policy.model import Policy
from scheduler.server.app import GrpcServer, assemble_router
from scheduler.server.auth import Authenticator
from scheduler.server.policy_log import PolicyLog
from slots.autoscaler.pools import PoolAutoscalers, PoolsDemand

if TYPE_CHECKING:
    from scheduler.kube.policy_watch import PolicyWatcher

log = logging.getLogger("slotsched.server")


class OneLeader:
    """The replica and what runs only on the leader. The gRPC server sees only `serving` (its
    leader gate); the replica calls `_on_lead` and `_on_step_down`, which start and stop the
    reaper and the autoscaler and flip health."""

    durable = True

    def __init__(self, build: Build) -> None:
        from scheduler.state.replica import Replica, StateMetrics

        assert build.url is not None
        self.parts = parts = OneLoopParts(build)
        self.router = parts.router
        loop = parts.loop
        loop.shutting_down = True  # nothing runs on the core until this replica leads
        state = build.state
        store = build.url.store(state.prefix, state.replica(), state.call_timeout_s())
        self._build = build
        self._running: RunningServer | None = None
        self._grpc: GrpcServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.replica = Replica(
            store,
            loop,
            parts.registry,
            build.policy,
            StateMetrics(build.metrics.registry),
            on_lead=self._on_lead,
            on_step_down=self._on_step_down,
            leader_ttl_s=state.leader_ttl_s,
            snapshot_every=state.snapshot_every,
            snapshot_interval_s=state.snapshot_interval_s,
            campaign_interval_s=state.campaign_interval_s,
            where=build.url.redacted,
            on_store=self._on_store,
        )
        self.fatal_event = self.replica.fatal_event
        loop.journal = self.replica
        if build.keys.ephemeral:
            log.warning(
                "no grant key given (--grant-key-file / $SLOTSCHED_GRANT_KEYS): lease ids and grants "
                "signed by this replica are refused after a failover"
            )

    @property
    def fatal(self) -> BaseException | None:
        return self.replica.fatal

    def policy(self) -> Policy:
        return self.parts.policy()

    def bind_watcher(self, watcher: PolicyWatcher, secure: bool, plog: PolicyLog) -> None:
        self.parts.bind_watcher(watcher, secure, plog)

    def serving(self) -> bool:
        return self.replica.leading()

    def leader(self) -> str | None:
        """Where the leader is, as a standby last read it (for NOT_LEADER); None while this
        replica leads but refuses (its renewal is late): it must not send clients to itself."""
        return None if self.replica.serving else self.replica.leader_address

    def demand(self) -> PoolsDemand:
        return self.parts.demand()

    def assemble(
        self, auth: Authenticator, keys: GrantKeyring, plog: PolicyLog, demand: PoolsDemand
    ) -> GrpcServer:
        parts = self.parts
        return assemble_router(
            parts.router,
            auth,
            demand,
            parts.slots_per_worker,
            keys,
            plog,
            serving=self.serving,
            leader=self.leader,
            store_down=self.replica.reach.down,
        )

    def autoscalers(
        self, env: Mapping[str, str], scheduler: str, metrics: CollectorRegistry, period_s: float
    ) -> PoolAutoscalers | None:
        return self.parts.autoscalers(env, scheduler, metrics, period_s)

    async def start(self, running: RunningServer, grpc_server: GrpcServer) -> None:
        self._running, self._grpc = running, grpc_server
        running.replica = self.replica
        self.replica.advertise = self._build.state.advertise or default_advertise(running.host, running.port)
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
        build = self._build
        if fresh:
            self.parts.loop.apply_policy(
                build.policy
            )  # journaled first: replay never depends on today's file
            if build.static_pool:
                self.parts.register_static_pool()
        if build.watcher is not None:
            # The object is the truth, not the journal: the new leader applies its latest version
            # (journaled like any ApplyPolicy) and reports it in the object's status.
            await build.watcher.resync()
        if not self.replica.serving:
            return  # stepped down meanwhile (its first batch failed): no reaper, autoscaler or SERVING
        self._tasks.append(asyncio.create_task(self.parts.registry.run_reaper()))
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

    def state_line(self) -> str | None:
        replica = self.replica
        down = replica.reach.down()  # not a standby: it cannot lead until the store answers
        role = f"{down}; retrying" if down else "leader" if replica.serving else "standby"
        kind = self._build.url.kind.name if self._build.url is not None else "?"
        return f"{kind} ({role}, replica {replica.store.replica_id})"

    def begin_shutdown(self) -> None:
        self.parts.begin_shutdown()

    async def stop(self) -> None:
        await self.replica.stop()  # resign at once: a standby takes over without waiting a TTL

    def close(self) -> None:
        self.parts.close()


async def _cancel_on_exit(tasks: list[asyncio.Task[None]]) -> None:
    """Cancels the leader-only tasks when the server's own tasks are cancelled (stop)."""
    try:
        await asyncio.Event().wait()
    finally:
        for t in tasks:
            t.cancel()
