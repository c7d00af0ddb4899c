"""Routers: which unit a call goes to. A unit is a `SchedulerLoop` with its `SessionOps` and
`WorkerRegistry`; every servicer takes a `Router` of units and serves each call on the unit it
routes to, never asking which serving mode runs (scheduler/app/ chooses the router).

`OneLoop`: a server's one loop (every pool in one core), the router of `serve` in memory and of
one leader for every pool. Every call goes to that loop; while it does not serve (shutting
down, a standby) a call is UNAVAILABLE (a replicated server's leader gate has named the leader
before the call reached a servicer: scheduler/server/leader_gate.py).

`PoolRoutes`: per-pool leadership (`serve --leadership pool`, wired by scheduler/app/pools.py):
which of a replica's pool units a call goes to, or the NOT_LEADER that sends the caller to the
pool's leader.

With per-pool leadership a replica holds one unit per pool of the policy: a `SchedulerLoop`
over `Policy.for_pool(pool)`, its `SessionOps` and `WorkerRegistry`, and its own `Replica` and
store under the pool's prefix. A unit either leads its pool here (its loop serves), follows
the pool's journal as a hot standby (its loop is `shutting_down`: this replica is the pool's
successor), or holds nothing of it (`hot` false: neither owner nor successor). The rules
(docs/design.md, "Pools across replicas"):

* a call about a live session goes to the unit whose core holds it, wherever the request says
  it should go (as a re-attach ignores placement today);
* a new Acquire goes to its **first candidate** (`placement.candidates` over the whole policy:
  its pool, else the first pool its selector matches, else the default; resume compatibility and
  quota applied): the same pool on every replica, from the policy alone, so two replicas never
  send a caller back and forth. The request is rewritten to name that pool only: the unit's core
  knows no other. Deviation: fallback across pools is not tried under per-pool leadership (a
  free slot in a pool led elsewhere is known only as of that pool's journal);
* a unit that does not lead here answers `errors.pool_not_led(pool, its leader)`;
* a call about a session (or worker) no unit here holds, on a replica holding some pool cold:
  UNAVAILABLE NOT_LEADER (`errors.not_held_here`), never a NOT_FOUND it cannot know; a read of
  a pool held cold (DescribePool, KEDA): NOT_LEADER naming its leader;
* a call about no live session goes to the first unit leading here (it answers NOT_FOUND as
  today), else to the first unit;
* a worker's call goes to the unit whose registry holds it (Register: the pool it names; a
  worker registered in another pool deregisters first);
* a permit (RequestPermit, SettlePermit: `Command.by_budget`) goes to its budget's **home**
  unit (`budget_home`: from the policy alone, so every replica agrees), wherever its session
  is, since a budget is counted in one place; led elsewhere, NOT_LEADER naming the home pool,
  its leader and the budget. Its session is checked where this replica holds it
  (`permit_class`), else the class the request declares is drawn on, from the tenant's own
  share (decision 0018).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.core.placement import Catalog, candidates, default_pool
from scheduler.core.types import Acquire, QoS, Refused, SessionId, TenantName
from scheduler.core.views import PoolView
from scheduler.policy.model import Policy
from scheduler.server import convert, errors
from scheduler.server.loop import NO_PLACEMENT, SchedulerLoop
from scheduler.server.registry import WorkerRegistry
from scheduler.server.session_ops import SessionOps, placement_of, qos_of, snapshot_of

__all__ = ["OneLoop", "PoolLeader", "PoolRoutes", "PoolUnit", "Router", "budget_home"]


def budget_home(policy: Policy, budget: str) -> str:
    """The pool a budget is counted in under per-pool leadership, from the policy alone (every
    replica agrees): the first pool naming it in `spec.pools[].budgets`, else the default pool,
    else the first pool. A budget the policy does not have goes there too (its unit refuses it)."""
    specs = policy.pool_specs()
    for spec in specs:
        if budget in spec.budgets:
            return spec.name
    return default_pool(policy) or specs[0].name


@dataclass(frozen=True)
class PoolLeader:
    """Who leads a pool now, as its leader lease says (Admin.DescribePool, `slotsched status`)."""

    replica_id: str  # "": none now (being handed over)
    address: str  # "": not published yet
    term: str  # new at every win of the lease


async def _no_leader() -> PoolLeader | None:
    return None


@dataclass
class PoolUnit:
    """One loop's part of a replica: its loop, and where its leader is when not here."""

    pool: str
    loop: SchedulerLoop
    ops: SessionOps
    registry: WorkerRegistry
    #: Where the pool's leader is when another replica leads it (NOT_LEADER names it). None: a
    #: loop not led per pool (`OneLoop`'s), whose failures are its own to tell.
    leader: Callable[[], str | None] | None = None
    #: The pool's leader lease still holds here (the replica's `leading`: within the local
    #: deadline of its last renewal), so a leader frozen past it answers nothing from its stale
    #: core, reads included, before it even notices.
    lease_holds: Callable[[], bool] = lambda: True
    #: Who leads the pool now, read from the state store (None: it did not answer, or the loop
    #: is not led per pool).
    leadership: Callable[[], Awaitable[PoolLeader | None]] = _no_leader
    #: This core holds the pool as of its journal (it leads it, or follows it hot). False: the
    #: replica is neither the pool's owner nor its successor and holds nothing of it (cold), so
    #: it can tell nothing about the pool's sessions, workers or demand.
    hot: Callable[[], bool] = lambda: True
    #: This unit's desk counts the budget now (per-pool leadership: it is the budget's home and
    #: leads here); what DescribePool shows of budgets (another desk's would read idle).
    counts: Callable[[str], bool] = lambda budget: True

    @property
    def leads(self) -> bool:
        return not self.loop.shutting_down and self.lease_holds()

    def refusal(self, budget: str = "") -> errors.RpcFailure:
        """What a call to this unit gets here while it does not serve: NOT_LEADER naming the
        pool's leader (and the `budget` of a permit, whose home this pool is), or (a loop not
        led per pool) UNAVAILABLE shutting down."""
        if self.leader is None:
            return errors.unavailable()
        return errors.pool_not_led(self.pool, self.leader(), budget)

    def ended(self, failure: errors.RpcFailure) -> errors.RpcFailure:
        """What a call this unit was serving is told when the unit stops serving it (`failure`
        says why the loop stopped): a pool's unit sends the caller to the pool's leader."""
        return failure if self.leader is None else self.refusal()

    def settles(self) -> bool:
        """Whether a read waits for what is in flight to the store: not on a unit following a
        pool led elsewhere (its core holds only what the pool's journal does)."""
        return self.leader is None or not self.loop.shutting_down


class Router(Protocol):
    """What a servicer asks of its units (module doc); RpcFailure where the answer is a refusal."""

    units: dict[str, PoolUnit]

    def policy(self) -> Policy: ...
    def names(self) -> tuple[str, ...]: ...
    def first(self) -> PoolUnit: ...
    def bound(self) -> PoolUnit | None: ...
    def check_open(self) -> None: ...
    def for_pool(self, name: str) -> PoolUnit: ...
    def for_session(self, tenant: str, session_id: str) -> PoolUnit: ...
    def for_acquire(self, tenant: str, request: scheduler_pb2.AcquireRequest) -> PoolUnit: ...
    def for_permit(self, tenant: str, request: Any) -> PoolUnit: ...
    def for_worker(self, worker_id: str) -> PoolUnit: ...
    def for_register(self, worker_id: str, pool: str) -> PoolUnit: ...
    def applying(self) -> SchedulerLoop: ...
    def describe(self, name: str | None) -> PoolView: ...


class OneLoop:
    """The router of a server's one loop (module doc): every call goes to it."""

    def __init__(self, unit: PoolUnit) -> None:
        self.unit = unit
        self.units = {unit.pool: unit}

    def policy(self) -> Policy:
        return self.unit.loop.core.policy

    def names(self) -> tuple[str, ...]:
        return self.unit.loop.core.names()

    def first(self) -> PoolUnit:
        return self.unit

    def bound(self) -> PoolUnit:
        """The unit every call goes to: a Channel serves it from its start."""
        return self.unit

    def check_open(self) -> None:
        """Before a call is read: UNAVAILABLE while the loop does not serve."""
        if self.unit.loop.shutting_down:
            raise errors.unavailable()

    def for_pool(self, name: str) -> PoolUnit:
        return self.unit  # the core itself refuses a pool it does not have

    def for_session(self, tenant: str, session_id: str) -> PoolUnit:
        unit = self.unit
        if unit.loop.shutting_down:
            raise errors.unavailable()
        return unit

    def for_acquire(self, tenant: str, request: scheduler_pb2.AcquireRequest) -> PoolUnit:
        return self.for_session(tenant, request.session_id)  # the core places it among its pools

    def for_permit(self, tenant: str, request: Any) -> PoolUnit:
        return self.for_session(tenant, request.session_id)  # one loop counts every budget

    def for_worker(self, worker_id: str) -> PoolUnit:
        return self.unit

    def for_register(self, worker_id: str, pool: str) -> PoolUnit:
        return self.unit

    def applying(self) -> SchedulerLoop:
        """The loop a policy applied through Admin.ApplyPolicy goes to."""
        return self.unit.loop

    def describe(self, name: str | None) -> PoolView:
        return self.unit.loop.core.describe(name)


class PoolRoutes:
    """The units of one replica, by pool, in the policy's order."""

    def __init__(self, units: Mapping[str, PoolUnit], policy: Callable[[], Policy]) -> None:
        if not units:
            raise ValueError("no pool unit")
        self.units = dict(units)
        self._policy = policy
        self._catalog: Catalog | None = None
        for unit in self.units.values():
            # A budget's home unit may not hold the permit's session: it is looked up here, on
            # every unit of this replica; its end reaches the home desks here the same way.
            unit.ops.permit_class = self.permit_class
            unit.loop.ends_permits = self.session_ended
            unit.counts = partial(self._counts, unit)

    def policy(self) -> Policy:
        """The whole policy (each unit's core runs under its pool's projection)."""
        return self._policy()

    def _cat(self) -> Catalog:
        policy = self._policy()
        if self._catalog is None or self._catalog.policy is not policy:
            self._catalog = Catalog.of(policy)  # once per policy, not per call
        return self._catalog

    def _served(self, unit: PoolUnit) -> PoolUnit:
        if not unit.leads:
            raise unit.refusal()
        return unit

    def first(self) -> PoolUnit:
        return next(iter(self.units.values()))

    def names(self) -> tuple[str, ...]:
        return tuple(self.units)

    def bound(self) -> None:
        """None: a Channel serves the pool of its first command (the SDK keeps one per pool)."""
        return None

    def check_open(self) -> None:
        """Nothing refuses a call before it is routed: its pool's unit decides."""

    def applying(self) -> SchedulerLoop:
        raise errors.failed_precondition(
            "per-pool leadership: each pool is led by its own replica, so apply the policy at "
            "its source (the --policy file on every replica, or the --policy-source object)"
        )

    def for_pool(self, name: str) -> PoolUnit:
        """The unit of the pool a request names (none: `default_pool`), leading here or not;
        INVALID_ARGUMENT for a pool the policy does not have."""
        unit = self.units.get(name or default_pool(self._policy()) or "")
        if unit is None:
            raise errors.unknown_pool(name, tuple(self.units))
        return unit

    def describe(self, name: str | None) -> PoolView:
        """A pool's view from its unit here, led or followed (KEDA, the autoscaler); a pool held
        cold here: NOT_LEADER naming its leader (an empty view would read as no demand)."""
        unit = self.for_pool(name or "")
        if not unit.hot():
            raise unit.refusal()
        return unit.loop.core.describe(name)

    def _unknown_here(self) -> None:
        """Nothing here holds it: NOT_FOUND only if every pool is held here (led or followed);
        else it may live in a pool held cold here, so NOT_LEADER, to be asked again at its
        pool's leader (the SDK's route follows it there), never a NOT_FOUND read as a lost lease."""
        cold = [u for u in self.units.values() if not u.hot()]
        if cold:
            raise errors.not_held_here(len(self.units) - len(cold), len(self.units))

    def holding_worker(self, worker_id: str) -> PoolUnit | None:
        """The unit whose registry holds the worker (of the pools held here, led or followed)."""
        for unit in self.units.values():
            if worker_id in unit.registry.workers:
                return unit
        return None

    def for_worker(self, worker_id: str) -> PoolUnit:
        """Where a worker's Heartbeat, Drain or Deregister goes: the unit holding it; unknown
        everywhere, a unit led here (it answers NOT_FOUND, as with one pool)."""
        unit = self.holding_worker(worker_id)
        if unit is None:
            self._unknown_here()
            unit = next((u for u in self.units.values() if u.leads), self.first())
        return self._served(unit)

    def for_register(self, worker_id: str, pool: str) -> PoolUnit:
        """Where a Register goes: the pool it names. Ids are one worker's everywhere: a
        re-register into another pool deregisters first (FAILED_PRECONDITION)."""
        live = self.holding_worker(worker_id)
        unit = self.for_pool(pool)
        if live is not None and live is not unit:
            raise errors.failed_precondition(
                f"worker {worker_id!r} is registered in pool {live.pool!r}: Deregister first"
            )
        return self._served(unit)

    def holding(self, tenant: str, session_id: str) -> PoolUnit | None:
        """The unit whose core holds the session (leading or following), if any."""
        key = convert.session_key(tenant, session_id)
        for unit in self.units.values():
            if unit.loop.core.session(key) is not None:
                return unit
        return None

    def for_session(self, tenant: str, session_id: str) -> PoolUnit:
        """Where a Renew, Release, Yield, GetSession or Withdraw goes."""
        unit = self.holding(tenant, session_id)
        if unit is not None:
            return self._served(unit)
        self._unknown_here()
        here = next((u for u in self.units.values() if u.leads), None)
        return here if here is not None else self._served(self.first())

    def for_acquire(self, tenant: str, request: scheduler_pb2.AcquireRequest) -> PoolUnit:
        """Where an Acquire goes; a new one is rewritten to name its pool. RpcFailure: the
        placement's refusal (unknown pool, no eligible pool, no quota), or NOT_LEADER."""
        unit = self.holding(tenant, request.session_id)
        if unit is not None:
            return self._served(unit)
        where = placement_of(request)  # INVALID_ARGUMENT for a malformed placement
        if where is NO_PLACEMENT and len(self.units) == 1:
            return self._served(self.first())
        key = convert.session_key(tenant, request.session_id)
        ev = Acquire(key, TenantName(tenant), qos_of(request), snapshot_of(request, "resume_from"), *where)
        cands = candidates(self._cat(), ev)
        if isinstance(cands, Refused):
            metrics = self.first().loop.metrics  # no loop saw it: counted here (every refusal is)
            if metrics is not None:
                metrics.count_refused(cands, tenant)
            raise errors.from_refused(cands, tenant)
        pool = cands[0]
        unit = self.units.get(pool)
        if unit is None:  # the policy names a pool this replica has no unit for yet (a change in flight)
            raise errors.pool_not_led(pool, None)
        request.pool = pool
        request.selector.clear()
        del request.fallback_pools[:]
        return self._served(unit)

    # ------------------------------------------------------------------ permits

    def for_permit(self, tenant: str, request: Any) -> PoolUnit:
        """Where a RequestPermit or SettlePermit goes: its budget's home unit (`budget_home`),
        if it leads here; else NOT_LEADER naming the home pool, its leader and the budget."""
        if not request.budget:
            raise errors.invalid_argument(
                "budget", "required: under per-pool leadership it says where the permit is counted"
            )
        pool = budget_home(self._policy(), request.budget)
        unit = self.units.get(pool)
        if unit is None:  # a pool this replica has no unit for yet (a change in flight)
            raise errors.pool_not_led(pool, None, request.budget)
        if not unit.leads:
            raise unit.refusal(request.budget)
        return unit

    def permit_class(self, key: SessionId, session_id: str, declared: int) -> QoS | errors.RpcFailure:
        """The class a permit of the session draws in (decision 0018): the session's own where a
        unit here holds it (leads or follows its pool); NOT_FOUND when every pool is led here
        and none has it; else (its pool held cold here, or followed: a follower's journal may
        not have the session's grant yet) the class the request declares, drawn on the tenant's
        own share like any permit, so no tenant can reach another's."""
        for unit in self.units.values():
            view = unit.loop.core.session(key)
            if view is not None:
                return QoS(view.qos)
        if all(u.leads for u in self.units.values()):
            return errors.not_found(f"no live session {session_id}: a permit is for a session")
        qos = convert.PB_TO_QOS.get(declared)
        if qos is None:
            raise errors.invalid_argument(
                "qos", "required: this replica does not hold the session's pool, so name its class"
            )
        return qos

    def _counts(self, unit: PoolUnit, budget: str) -> bool:
        return unit.leads and budget_home(self._policy(), budget) == unit.pool

    def session_ended(self, key: SessionId) -> None:
        """A session's end (on any unit here, led or followed) closes its permits on every
        unit's desk here: the one counting its budget is its home's, not its pool's."""
        for unit in self.units.values():  # per release: a lookup a unit, a call only where it holds permits
            desk = unit.loop.permits
            if key in desk.budgets.by_owner:
                desk.session_ended(key)
