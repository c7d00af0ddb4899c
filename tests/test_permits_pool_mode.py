"""Permits under per-pool leadership (scheduler/server/pool_routes.py; docs/design.md, "Token
budgets"; decision 0018): a budget is counted at its home pool's unit, whichever pool its
sessions are in; a home led elsewhere answers NOT_LEADER naming the home pool, its leader and
the budget; the session's class is its own where a unit here holds it, else the one declared,
drawn on the tenant's own share; a session's end closes its permits at the home. Real loops, one
per pool under `Policy.only_pool`, as a replica holds them. A new leader term counts afresh
under a new incarnation, so the old term's permits are charged as debts when settled.
Over real gRPC and redis with three replicas: tests/test_permits_pools_wire.py."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.core.budget.types import PermitId
from scheduler.grants import GrantKeyring
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import parse_policy
from scheduler.server import convert, errors
from scheduler.server.loop import SchedulerLoop
from scheduler.server.permits import PermitDesk
from scheduler.server.pool_routes import PoolRoutes, PoolUnit, budget_home
from scheduler.server.registry import WorkerRegistry
from scheduler.server.session_ops import SessionOps
from tests.budget_fixtures import (
    BUDGET,
    HOME,
    budget_policy_yaml,
    permit_request,
    pools_budget_policy_yaml,
    settle_request,
)

B = common_pb2.QOS_CLASS_BURSTABLE
G = common_pb2.QOS_CLASS_GUARANTEED
ELSEWHERE = "10.0.0.2:50051"
KEYS = GrantKeyring.generate()


def _policy() -> Policy:
    policy, _ = parse_policy(pools_budget_policy_yaml(workers_per_pool=0))
    return policy


def _routes(led: set[str], cold: frozenset[str] = frozenset()) -> PoolRoutes:
    """One unit per pool, leading the pools `led` (the others followed hot, or held `cold`)."""
    policy = _policy()
    units = {}
    for name in policy.pool_names():
        loop = SchedulerLoop(policy.only_pool(name))
        loop.shutting_down = name not in led
        units[name] = PoolUnit(
            name, loop, SessionOps(loop, KEYS), WorkerRegistry(loop, 5.0), leader=lambda: ELSEWHERE,
            hot=lambda name=name: name not in cold,  # type: ignore[misc]
        )  # fmt: skip
    return PoolRoutes(units, lambda: policy)


def _session(routes: PoolRoutes, tenant: str, sid: str, pool: str) -> None:
    """A live (queued: no workers) session of `tenant` in `pool`, where its pool's unit has it."""
    req = scheduler_pb2.AcquireRequest(session_id=sid, qos=B, pool=pool)
    unit = routes.for_acquire(tenant, req)
    unit.ops.open(tenant, req)
    assert routes.holding(tenant, sid) is unit


def _permit(routes: PoolRoutes, tenant: str, req: scheduler_pb2.RequestPermitRequest) -> object:
    unit = routes.for_permit(tenant, req)
    return unit.ops.request_permit(tenant, req)


def test_the_home_of_a_budget_is_the_first_pool_naming_it_else_the_default() -> None:
    policy = _policy()
    assert budget_home(policy, BUDGET) == HOME  # cpu-b names it before gpu; cpu-a names none
    assert budget_home(policy, "nope") == "cpu-a"  # no `default` pool: the first
    one, _ = parse_policy(budget_policy_yaml())
    assert budget_home(one, BUDGET) == one.pool_names()[0]


def test_sessions_of_two_pools_draw_on_one_count_at_the_home() -> None:
    async def main() -> None:
        routes = _routes(led={"cpu-a", "cpu-b", "gpu"})
        _session(routes, "acme", "a", "cpu-a")
        _session(routes, "acme", "b", "gpu")
        home = routes.units[HOME].loop.permits
        # The first asks for a third of a minute of the budget, within its nominal share (buckets
        # start empty: it waits); the second, also within nominal, comes after it.
        first = _permit(routes, "acme", permit_request("a", inp=10_000, out=10_000))
        second = _permit(routes, "acme", permit_request("b"))
        assert isinstance(first, scheduler_pb2.PermitEvent) and first.HasField("queued")
        assert isinstance(second, scheduler_pb2.PermitEvent) and second.HasField("queued")
        # One count: both named by the home's desk, the second waiting behind the first.
        for ev in (first, second):
            assert home.issued_here(ev.permit_id)
        assert second.queued.position >= 1 and second.queued.reason == "budget_exhausted"
        for name in ("cpu-a", "gpu"):
            assert not routes.units[name].loop.permits.budgets.by_owner  # counted nowhere else

    asyncio.run(main())


def test_a_home_led_elsewhere_answers_not_leader_naming_it() -> None:
    async def main() -> None:
        routes = _routes(led={"cpu-a", "gpu"})  # cpu-b (the home) led by another replica
        _session(routes, "acme", "a", "cpu-a")
        with pytest.raises(errors.RpcFailure) as e:
            routes.for_permit("acme", permit_request("a"))
        f = e.value
        assert f.code is grpc.StatusCode.UNAVAILABLE
        md = dict(f.metadata)
        assert (md[wire.POOL], md[wire.LEADER], md[wire.BUDGET]) == (HOME, ELSEWHERE, BUDGET)
        settle = scheduler_pb2.SettlePermitRequest(session_id="a", permit_id="x.1", budget=BUDGET)
        with pytest.raises(errors.RpcFailure) as e:
            routes.for_permit("acme", settle)
        assert dict(e.value.metadata)[wire.BUDGET] == BUDGET
        settle.budget = ""  # nothing says where it is counted
        with pytest.raises(errors.RpcFailure) as e:
            routes.for_permit("acme", settle)
        assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT and "budget" in e.value.message

    asyncio.run(main())


def test_the_class_is_the_sessions_where_held_else_the_declared_one_of_its_own_share() -> None:
    async def main() -> None:
        # Every pool held here: an unknown session is NOT_FOUND, whatever it declares.
        routes = _routes(led={"cpu-a", "cpu-b", "gpu"})
        req = permit_request("ghost")
        req.qos = B
        out = _permit(routes, "acme", req)
        assert isinstance(out, errors.RpcFailure) and out.code is grpc.StatusCode.NOT_FOUND
        # cpu-a only followed here: its journal may not have a session granted a moment ago
        # on its leader, so an unknown session draws on the class declared, not NOT_FOUND.
        following = _routes(led={"cpu-b", "gpu"})
        req = permit_request("just-granted")
        req.qos = B
        out = _permit(following, "acme", req)
        assert isinstance(out, scheduler_pb2.PermitEvent), out
        # A session held here: its own class (Burstable), not the Guaranteed one declared, of
        # which globex has no share.
        _session(routes, "globex", "g", "cpu-a")
        req = permit_request("g")
        req.qos = G
        out = _permit(routes, "globex", req)
        assert isinstance(out, scheduler_pb2.PermitEvent)

        # cpu-a held cold here: its sessions are unknown, so the class declared is drawn on.
        routes = _routes(led={"cpu-b", "gpu"}, cold=frozenset({"cpu-a"}))
        with pytest.raises(errors.RpcFailure) as e:
            _permit(routes, "globex", permit_request("g"))  # none declared
        assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT and "qos" in e.value.message
        req = permit_request("g")
        req.qos = G  # globex has no Guaranteed share of the budget: refused, nothing drawn
        out = _permit(routes, "globex", req)
        assert isinstance(out, errors.RpcFailure) and out.code is grpc.StatusCode.PERMISSION_DENIED
        assert "no guaranteed share" in out.message
        req.qos = B
        out = _permit(routes, "globex", req)
        assert isinstance(out, scheduler_pb2.PermitEvent)
        # Drawn as globex's, owned by (globex, g): acme's session of the same id cannot settle it.
        settle = scheduler_pb2.SettlePermitRequest(
            session_id="g", permit_id=out.permit_id, budget=BUDGET, withdraw=True
        )
        refused = routes.for_permit("acme", settle).ops.settle_permit("acme", settle)
        assert isinstance(refused, errors.RpcFailure) and "PERMIT_NOT_OWNER" in str(refused.reason)

    asyncio.run(main())


def test_a_sessions_end_in_its_pool_closes_its_permits_at_the_home() -> None:
    async def main() -> None:
        routes = _routes(led={"cpu-a", "cpu-b", "gpu"})
        _session(routes, "acme", "g", "gpu")
        out = _permit(routes, "acme", permit_request("g"))
        assert isinstance(out, scheduler_pb2.PermitEvent)
        home = routes.units[HOME].loop.permits
        assert home.budgets.permit_owner(PermitId(out.permit_id)) is not None
        assert routes.units["gpu"].loop.withdraw_queued(convert.session_key("acme", "g"))
        assert home.budgets.permit_owner(PermitId(out.permit_id)) is None

    asyncio.run(main())


def test_a_pools_autoscaler_cap_reads_its_budgets_feed_at_the_home() -> None:
    from scheduler.autoscale_wiring import with_budgets

    async def main() -> None:
        routes = _routes(led={"cpu-a", "cpu-b", "gpu"})
        _session(routes, "acme", "g", "gpu")
        home = routes.units[HOME]
        out = await _granted(routes, "acme", permit_request("g", inp=10, out=10))
        settle = settle_request("g", out.permit_id, 5, 5, budget=BUDGET)
        assert not isinstance(
            routes.for_permit("acme", settle).ops.settle_permit("acme", settle), errors.RpcFailure
        )
        policy = _policy()
        gpu = routes.units["gpu"].loop.core.describe("gpu")

        def desk_of(budget: str) -> PermitDesk | None:  # as app/pools.py: the home's, where it leads
            unit = routes.units[budget_home(policy, budget)]
            return unit.loop.permits if unit.leads else None

        (feed,) = with_budgets(gpu, policy, desk_of).budgets  # gpu's sessions draw on llm
        assert feed.budget == BUDGET and feed.per_session_per_minute[0] > 0
        assert with_budgets(gpu, policy, routes.units["gpu"].loop.permits).budgets == ()  # not its desk
        home.loop.shutting_down = True  # led elsewhere: no cap from here
        assert with_budgets(gpu, policy, desk_of).budgets == ()

    asyncio.run(main())


async def _granted(routes: PoolRoutes, tenant: str, req: scheduler_pb2.RequestPermitRequest) -> Any:
    """A small permit, once the home's buckets (empty at first) refill enough to grant it."""
    unit = routes.for_permit(tenant, req)
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    first = unit.ops.request_permit(tenant, req)
    give_up = unit.ops.follow_permit(tenant, first, lambda o: done.done() or done.set_result(o))
    out = first if give_up is None else await asyncio.wait_for(done, 30)
    assert isinstance(out, scheduler_pb2.PermitEvent) and out.HasField("granted"), out
    return out


def test_a_budgets_gauges_are_its_home_desks_on_a_replica_of_several_units() -> None:
    from scheduler.app.pools import _HomeViews
    from scheduler.server.budget_metrics import BudgetMetrics

    async def main() -> None:
        routes = _routes(led={"cpu-a", "cpu-b", "gpu"})
        _session(routes, "acme", "a", "cpu-a")
        policy = _policy()
        metrics, merged = BudgetMetrics(lambda t: t or ""), {}
        views = {p: _HomeViews(metrics, p, lambda: policy, merged) for p in routes.units}
        out = _permit(routes, "acme", permit_request("a", inp=10_000, out=10_000))  # waits at the home
        assert isinstance(out, scheduler_pb2.PermitEvent) and out.HasField("queued")
        views[HOME].budget_views(routes.units[HOME].loop.permits.views())
        for pool in ("cpu-a", "gpu"):  # a desk not counting the budget (a take-over's new desk)
            views[pool].budget_views(routes.units[pool].loop.permits.views())
        (view,) = metrics.views
        assert view.waiting == 1  # the home's, not an idle desk's
        views[HOME].forget()  # the home steps down here: its next leader shows the budget
        assert metrics.views == ()

    asyncio.run(main())


def test_a_new_term_names_permits_afresh() -> None:
    async def main() -> None:
        loop = SchedulerLoop(parse_policy(budget_policy_yaml())[0])
        old = loop.permits.new_id()
        assert loop.permits.issued_here(old)
        loop.resume()
        assert not loop.permits.issued_here(old) and loop.permits.new_id() != old
        loop.close()

    asyncio.run(main())
