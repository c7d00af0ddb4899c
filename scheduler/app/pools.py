"""Per-pool leadership (`slotsched serve --leadership pool`): the wiring of a replica
that holds one unit per pool of the policy, each led by whichever replica the owners table
gives it, so the pools' decisions spread over the replicas and a dead replica costs only its
own pools a take-over.

What a unit is: a `SchedulerLoop` over `Policy.only_pool(pool)`, its `WorkerRegistry` and
`SessionOps` (scheduler/server/pool_routes.py's `PoolUnit`), and a `Replica` over the state
store (scheduler/state/config.py) under the pool's own prefix `PREFIX:POOL` (in a Redis Cluster
the hash tag `{PREFIX:POOL}`: each pool's leader lease, fencing term, journal and snapshot in
one slot, so pools spread over the shards). Each unit's replica is exactly the single-leader
replica: nothing is told before it is durable, a paused old leader can append nothing (fenced),
a take-over applies `Resumed(since)`; the pool's successor (named in the owners table) follows its
journal as a hot standby, and every other replica holds nothing of it (`may_follow`). What
decides who *tries* to lead a pool is `Ownership` (scheduler/state/ownership.py):
a membership of replicas in the store and an owners table spreading the pools evenly
(scheduler/state/pool_owners.py); a replica campaigns only for its pools and hands over a pool
the table gives another (docs/design.md, "Pools across replicas").

Wires: the services over `PoolRoutes` (scheduler/server/pool_routes.py), which routes each call
to its pool's unit; a unit not leading here answers NOT_LEADER naming the pool and its leader.
Health "" is SERVING while this replica is a member (it reaches the store),
`slotsched.pool/<name>` while it leads that pool. The companion autoscaler runs each pool's
loop on that pool's leader (`autoscalers`); KEDA is answered by any replica, each pool's demand
from its unit's core. Left for later (said in docs/design.md): pools added or removed live
(units are made at start), and Admin.ApplyPolicy (a policy applied to one replica would reach
only its pools: it is refused); the policy comes from the file every replica reads, or from
`--policy-source`'s object, which every replica watches and applies to the pools it leads
(`bind_watcher`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from scheduler.app.running import Build, RunningServer
from scheduler.autoscale_wiring import autoscalers, static_workers, vitals_of, with_budgets
from scheduler.core.budget.types import BudgetDecision, BudgetView
from scheduler.core.types import WorkerId
from scheduler.core.views import PoolView
from scheduler.grants import GrantKeyring
from scheduler.policy.errors import Problem
from scheduler.policy.model import Policy
from scheduler.server.app import GrpcServer, assemble_router
from scheduler.server.auth import Authenticator
from scheduler.server.loop import SchedulerLoop
from scheduler.server.permits import BudgetMetrics, PermitDesk
from scheduler.server.policy_log import PolicyLog
from scheduler.server.pool_routes import PoolLeader, PoolRoutes, PoolUnit, budget_home
from scheduler.server.registry import WorkerRegistry
from scheduler.server.session_ops import SessionOps
from slots.autoscaler.demand import MembershipError
from slots.autoscaler.pools import PoolAutoscalers, PoolsDemand

if TYPE_CHECKING:
    from scheduler.kube.policy_watch import Outcome, PolicyWatcher
    from scheduler.state.ownership import Ownership
    from scheduler.state.replica import Replica
    from scheduler.state.store import StateStore

log = logging.getLogger("slotsched.server")


class PoolLeadership:
    """Every pool unit of this replica, their replicas and the ownership that places them."""

    durable = True

    def __init__(self, build: Build) -> None:
        from scheduler.state.metrics import StateMetrics
        from scheduler.state.ownership import Ownership
        from scheduler.state.replica import Replica

        url, state, policy = build.url, build.state, build.policy
        assert url is not None, "root.MODES: per-pool leadership needs a state store"
        self.policy_in_force = policy
        self.replica_id = state.replica()
        timeout_s = state.call_timeout_s()
        self.ownership: Ownership = Ownership(
            url.members(state.prefix, timeout_s),
            self.replica_id,
            "",  # the advertised address, once the port is bound (`start`)
            policy.pool_names,
            member_ttl_s=state.leader_ttl_s,
            beat_interval_s=state.leader_ttl_s / 4,
        )
        self._advertise = state.advertise
        self._static_pool = build.static_pool
        self._grpc: GrpcServer | None = None
        self._watcher: PolicyWatcher | None = None
        self._told = False  # what health "" says now (NOT_SERVING until a member)
        self._seen: tuple[int, frozenset[str], bool] | None = None  # the last table nudged for
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._beat: asyncio.Task[None] | None = None
        self.fatal_event = asyncio.Event()
        self.fatal: BaseException | None = None
        self.units: dict[str, PoolUnit] = {}
        self.replicas: dict[str, Replica] = {}
        self.stores: dict[str, StateStore] = {}
        state_metrics = StateMetrics(build.metrics.registry, pools=True)
        merged: dict[str, BudgetView] = {}  # each budget's gauges, from its home unit's desk
        self._views: dict[str, _HomeViews] = {}
        for name in policy.pool_names():
            own = policy.only_pool(name)  # a whole policy of one pool: it round-trips the journal
            loop = SchedulerLoop(own, build.metrics)
            loop.shutting_down = True  # nothing runs on a pool's core until this replica leads it
            if loop.budget_metrics is not None:  # a budget's gauges are its home desk's only
                views = _HomeViews(loop.budget_metrics, name, self.policy, merged)
                loop.budget_metrics = loop.permits.metrics = views
                views.budget_views(loop.permits.views())
                self._views[name] = views
            registry = WorkerRegistry(loop, build.heartbeat_interval_s)
            store = url.store(f"{state.prefix}:{name}", self.replica_id, timeout_s)
            replica = Replica(
                store,
                loop,
                registry,
                own,
                state_metrics.for_pool(name),
                on_lead=partial(self._on_lead, name),
                on_step_down=partial(self._on_step_down, name),
                leader_ttl_s=state.leader_ttl_s,
                snapshot_every=state.snapshot_every,
                snapshot_interval_s=state.snapshot_interval_s,
                campaign_interval_s=state.campaign_interval_s,
                where=url.redacted,
                may_lead=partial(self.ownership.should_lead, name),
                may_follow=partial(self.ownership.should_follow, name),
                pool=name,
            )
            self.stores[name] = store
            loop.journal = replica
            self.replicas[name] = replica
            ops = SessionOps(loop, build.keys)
            self.units[name] = PoolUnit(
                name, loop, ops, registry, partial(self.leader_of, name), replica.leading,
                partial(self.leadership, name), replica.hot,
            )  # fmt: skip
            self._tasks[name] = []
        self.router = self.routes = PoolRoutes(self.units, self.policy)

    def policy(self) -> Policy:
        """The whole policy in force (each unit's core runs under its pool's projection)."""
        return self.policy_in_force

    def demand(self) -> PoolsDemand:
        """Every replica answers each pool's demand (KEDA) from that pool's unit here."""
        return PoolsDemand(self.routes.describe, self.policy)

    def assemble(
        self, auth: Authenticator, keys: GrantKeyring, plog: PolicyLog, demand: PoolsDemand
    ) -> GrpcServer:
        return assemble_router(self.routes, auth, demand, demand.slots_per_worker, keys, plog)

    def state_line(self) -> str | None:
        led = self.led_here()
        return (
            f"redis, per-pool leadership (replica {self.replica_id}, "
            f"leading {len(led)} of {len(self.units)} pools: {', '.join(led) or 'none yet'})"
        )

    def leader_of(self, pool: str) -> str | None:
        """Where the pool's leader serves, as this replica knows it (None: being elected)."""
        replica = self.replicas[pool]
        if replica.serving:
            return None  # leading here but refusing (a late renewal): never send clients to itself
        me = self.ownership.address
        # The address the pool's lease last published, unless it is this replica's own (stale:
        # published when it led); then the owners table's choice; never itself.
        for address in (replica.leader_address, self.ownership.address_of(pool)):
            if address and address != me:
                return address
        return None

    async def leadership(self, pool: str) -> PoolLeader | None:
        """Who leads `pool` now, from its leader lease: its term token (`<replica id>:<random>`,
        redis_store.py; what the leader's `leading as` line says) and the address published for
        that term (None: the store did not answer)."""
        from scheduler.state.store import StoreUnavailable

        store = self.stores[pool]
        try:
            token, address = await store.leader(), await store.leader_address()
        except StoreUnavailable:
            return None
        return PoolLeader((token or "").rpartition(":")[0], address or "", token or "")

    def led_here(self) -> tuple[str, ...]:
        return tuple(name for name, r in self.replicas.items() if r.serving)

    async def start(self, running: RunningServer, grpc_server: GrpcServer) -> None:
        """Start every pool's replica (each loads its pool and follows it), then join the
        membership, so the table gives pools only to a replica that can take them at once: a
        replica beating while it loads (busy for seconds with a large state) would miss beats,
        drop out and make its pools move twice. Then each pool's autoscaler loop, gated to
        where the pool is led."""
        running.pools = self
        try:
            await self._start(grpc_server, running.host, running.port)
        except BaseException:
            await running.stop(0)
            raise
        if running.autoscalers is not None:
            running._tasks.append(asyncio.create_task(running.autoscalers.run()))

    async def _start(self, grpc_server: GrpcServer, host: str, port: int) -> None:
        from scheduler.listen import default_advertise

        self._grpc = grpc_server
        for pool in self.units:  # a probe of a pool not led here: NOT_SERVING, not NOT_FOUND
            await grpc_server.set_pool(pool, False)
        address = self._advertise or default_advertise(host, port)
        self.ownership.address = address
        for replica in self.replicas.values():
            replica.advertise = address
        await self.ownership.peek()  # the pools it will own or follow: loaded before it joins
        await asyncio.gather(*(r.start() for r in self.replicas.values()))  # none campaigns yet
        fatal = next((r.fatal for r in self.replicas.values() if r.fatal is not None), None)
        if fatal is not None:
            raise RuntimeError(f"cannot recover the state: {fatal}")
        await self._step()  # a member now: its pools' replicas campaign from their next interval
        self._beat = asyncio.get_running_loop().create_task(self._beat_loop())

    async def _step(self) -> None:
        await self.ownership.step()
        member = self.ownership.member
        seen = (self.ownership.version, frozenset(m.replica_id for m in self.ownership.live), member)
        if seen != self._seen:  # the pools' replicas look again at once (Replica.nudge)
            self._seen = seen
            for replica in self.replicas.values():
                replica.nudge()
        if self._grpc is not None and member != self._told:  # health "": a member, or not
            self._told = member
            await self._grpc.set_serving(member)
            await self._grpc.set_store(member)

    async def _beat_loop(self) -> None:
        while True:
            await self._step()
            for name, replica in self.replicas.items():
                if replica.fatal is not None and self.fatal is None:
                    log.error("pool %s: cannot recover the state: %s", name, replica.fatal)
                    self.fatal = replica.fatal
                    self.fatal_event.set()
            await asyncio.sleep(self.ownership.beat_interval_s)

    async def _on_lead(self, pool: str, fresh: bool) -> None:
        unit, replica = self.units[pool], self.replicas[pool]
        assert unit.registry is not None  # every unit of this wiring has one
        if fresh:
            unit.loop.apply_policy(
                self.policy_in_force.only_pool(pool)
            )  # journaled first, as one leader does
            if self._static_pool:
                for wid, slots, in_pool in static_workers(self.policy_in_force):
                    if in_pool == pool:
                        unit.registry.register(wid, "local", slots, {}, static=True, pool=in_pool)
        if self._watcher is not None and not fresh:
            # The object is the truth, not the journal: the pool's new leader applies the latest
            # version every replica's watcher has seen (journaled like any policy change).
            unit.loop.apply_policy(self.policy_in_force.only_pool(pool))
        if not replica.serving:
            return  # stepped down meanwhile (its first batch failed)
        self._tasks[pool].append(asyncio.get_running_loop().create_task(unit.registry.run_reaper()))
        if self._grpc is not None:
            await self._grpc.set_pool(pool, True)

    async def _on_step_down(self, pool: str) -> None:
        if pool in self._views:
            self._views[pool].forget()  # its budgets are counted by its next leader, not here
        for t in self._tasks[pool]:
            t.cancel()
        self._tasks[pool].clear()
        if self._grpc is not None:
            await self._grpc.set_pool(pool, False)

    def autoscalers(
        self, env: Mapping[str, str], scheduler: str, metrics: CollectorRegistry, period_s: float
    ) -> PoolAutoscalers | None:
        """The companion autoscaler of every pool (SLOTSCHED_AUTOSCALER), each pool's loop run
        only while this replica leads it, reading that pool's unit and draining through the
        unit that holds the worker."""
        units = self.units
        return autoscalers(
            self.policy,
            self._describe,
            _RoutedMembership(self.routes),
            self.routes.first().loop.now,
            env,
            scheduler,
            metrics,
            period_s,
            active=lambda name: name in units and units[name].leads,
            vitals=lambda: vitals_of(u.registry for u in units.values()),
        )

    def _describe(self, name: str | None) -> PoolView:
        """A pool's view for its autoscaler, with its budgets' feeds read from each budget's
        home unit where that unit leads here (a budget counted on another replica caps
        nothing here: the cap only withholds scale-ups)."""
        policy = self.policy_in_force
        return with_budgets(self.routes.describe(name), policy, partial(self._home_desk, policy))

    def _home_desk(self, policy: Policy, budget: str) -> PermitDesk | None:
        unit = self.units.get(budget_home(policy, budget))
        return unit.loop.permits if unit is not None and unit.leads else None

    def bind_watcher(self, watcher: PolicyWatcher, secure: bool, plog: PolicyLog) -> None:
        """`--policy-source`: every new version of the SchedulingPolicy object is applied by
        every replica to the pools it leads (each pool's leader applies it to its pool, and
        every replica authenticates by it). The replica leading the first pool writes the
        object's status. Pools added or removed need the replicas restarted (their units are
        made at start): such a version is refused, the policy in force unchanged."""
        from scheduler.kube.policy_watch import Outcome

        self._watcher = watcher
        first = next(iter(self.units))

        async def apply(policy: Policy, warnings: list[Problem]) -> Outcome:
            report = self.units[first].leads
            if secure and not policy.access.admins:  # Admin.ApplyPolicy's refusal, for the same reason
                return Outcome(
                    False, "NoAdmins", "spec.access.admins is empty: the policy in force is unchanged", report
                )
            if set(policy.pool_names()) != set(self.units):
                return Outcome(
                    False,
                    "PoolsChanged",
                    "--leadership pool: pools are added or removed by restarting the replicas one at "
                    "a time with the new policy; the policy in force is unchanged",
                    report,
                )
            old, self.policy_in_force = self.policy_in_force, policy
            generation = plog.next_generation()
            led = [u for u in self.units.values() if u.leads]
            for unit in led:
                unit.loop.apply_policy(policy.only_pool(unit.pool))
            # A budget whose home moved to a unit leading here: that desk counts afresh, from
            # empty, as a new term does (the old home may have granted this minute already).
            homes = {b.name: budget_home(policy, b.name) for b in policy.budgets}
            moved = {home for name, home in homes.items() if budget_home(old, name) != home}
            for unit in led:
                if unit.pool in moved:
                    unit.loop.renew_permits()
            for unit in led:
                await unit.loop.durable()
            plog.applied(generation, old, policy, f"the object {watcher.ref}")
            return Outcome(True, "Applied", f"policy {policy.name} in force on {len(led)} pools here", report)

        watcher.bind(apply, reporting=lambda: self.units[first].leads)

    def begin_shutdown(self) -> None:
        for unit in self.units.values():
            unit.loop.begin_shutdown()

    async def stop(self) -> None:
        """Leave the membership first (the others take the pools at once), then resign each
        pool's lease: a standby wins it within a campaign interval."""
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(BaseException):
                await self._beat
        await self.ownership.leave()
        await asyncio.gather(*(r.stop() for r in self.replicas.values()), return_exceptions=True)
        for tasks in self._tasks.values():
            for t in tasks:
                t.cancel()
        with contextlib.suppress(Exception):
            await self.ownership.members.close()

    def close(self) -> None:
        for unit in self.units.values():
            unit.loop.close()


class _RoutedMembership:
    """The autoscaler's drains and removals, each on the registry of the unit holding the worker."""

    def __init__(self, routes: PoolRoutes) -> None:
        self._routes = routes

    def _registry(self, worker_id: WorkerId) -> WorkerRegistry:
        unit = self._routes.holding_worker(worker_id)
        if unit is None:
            raise MembershipError(f"worker {worker_id} is in no pool here")
        return unit.registry

    def drain(self, worker_id: WorkerId, yield_within_s: float | None) -> object:
        return self._registry(worker_id).drain(worker_id, yield_within_s)

    def deregister(self, worker_id: WorkerId) -> object:
        return self._registry(worker_id).deregister(worker_id)


class _HomeViews:
    """A pool unit's budget reports: its events as they come, but only the views (gauges) of the
    budgets whose home is its pool, merged with the other units' (every unit of the replica
    reports to one `BudgetMetrics`, and a desk that does not count a budget would show it idle)."""

    def __init__(
        self, inner: BudgetMetrics, pool: str, policy: Callable[[], Policy], merged: dict[str, BudgetView]
    ) -> None:
        self._inner = inner
        self._pool = pool
        self._policy = policy
        self._merged = merged  # shared by the replica's units

    def observe_budget(self, decision: BudgetDecision, tenant: str) -> None:
        self._inner.observe_budget(decision, tenant)

    def budget_views(self, views: tuple[BudgetView, ...]) -> None:
        policy, merged = self._policy(), self._merged
        for v in views:
            if budget_home(policy, v.name) == self._pool:
                merged[v.name] = v
        names = {b.name for b in policy.budgets}
        self._inner.budget_views(tuple(v for n, v in merged.items() if n in names))

    def forget(self) -> None:
        """The pool stepped down here: its budgets' gauges go (the next leader's show them)."""
        policy = self._policy()
        for name in [n for n in self._merged if budget_home(policy, n) == self._pool]:
            del self._merged[name]
        self.budget_views(())
