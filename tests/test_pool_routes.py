"""Per-pool leadership's routing (scheduler/server/pool_routes.py): each call goes to the pool
unit whose core holds its session, a new Acquire to its first candidate (rewritten to name it),
and a unit not leading here answers NOT_LEADER naming the pool and its leader. Real loops, one
per pool under `Policy.for_pool`, as a replica of per-pool leadership holds them."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.core.types import WorkerAdded, WorkerId
from scheduler.grants import GrantKeyring
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import parse_policy
from scheduler.server import errors
from scheduler.server.loop import SchedulerLoop
from scheduler.server.pool_routes import PoolRoutes, PoolUnit
from scheduler.server.registry import WorkerRegistry
from scheduler.server.session_ops import SessionOps
from tests.grpc_fixtures import pools_policy_yaml

B = common_pb2.QOS_CLASS_BURSTABLE
ELSEWHERE = "10.0.0.2:50051"
KEYS = GrantKeyring.generate()


def _policy() -> Policy:
    policy, _ = parse_policy(pools_policy_yaml(workers_per_pool=0))
    return policy


async def _routes(led: set[str]) -> tuple[PoolRoutes, Policy]:
    policy = _policy()
    units = {}
    for name in policy.pool_names():
        loop = SchedulerLoop(policy.for_pool(name))
        loop.submit(WorkerAdded(WorkerId(f"w-{name}"), 1, pool=name))
        loop.shutting_down = name not in led  # a hot standby of the pool
        registry = WorkerRegistry(loop, 5.0)
        units[name] = PoolUnit(name, loop, SessionOps(loop, KEYS), registry, leader=lambda: ELSEWHERE)
    return PoolRoutes(units, lambda: policy), policy


def _acquire(sid: str, **kw: object) -> scheduler_pb2.AcquireRequest:
    return scheduler_pb2.AcquireRequest(session_id=sid, qos=B, **kw)  # type: ignore[arg-type]


def _failure(call: object) -> errors.RpcFailure:
    with pytest.raises(errors.RpcFailure) as e:
        call()  # type: ignore[operator]
    return e.value


@pytest.mark.parametrize(
    ("request_kw", "pool"),
    [
        ({"pool": "gpu"}, "gpu"),  # named
        ({"selector": {"kind": "cpu"}}, "cpu-a"),  # the first pool the selector matches
        ({"pool": "cpu-b", "fallback_pools": ["cpu-a"]}, "cpu-b"),  # its first candidate
    ],
)
def test_a_new_acquire_goes_to_its_first_candidate_named_alone(
    request_kw: dict[str, object], pool: str
) -> None:
    async def main() -> None:
        routes, _ = await _routes(led={"cpu-a", "cpu-b", "gpu"})
        req = _acquire("s1", **request_kw)
        unit = routes.for_acquire("acme", req)
        assert unit.pool == pool
        assert (req.pool, dict(req.selector), list(req.fallback_pools)) == (pool, {}, [])
        # The unit's own core takes the rewritten request: granted there, in that pool.
        stream = unit.ops.open("acme", req)
        view = unit.loop.session(stream.key)
        assert view is not None and view.lease is not None and view.lease.pool == pool

    asyncio.run(main())


def test_a_pool_led_elsewhere_answers_not_leader_naming_the_pool_and_its_leader() -> None:
    async def main() -> None:
        routes, _ = await _routes(led={"cpu-a"})
        f = _failure(lambda: routes.for_acquire("acme", _acquire("s1", pool="gpu")))
        assert f.code is grpc.StatusCode.UNAVAILABLE and f.reason == errors.NOT_LEADER
        assert f.info == {wire.LEADER_INFO: ELSEWHERE, wire.POOL_INFO: "gpu"}
        assert (wire.POOL, "gpu") in f.metadata and (wire.LEADER, ELSEWHERE) in f.metadata
        # A selector's first candidate decides where it goes, the same on every replica.
        f = _failure(lambda: routes.for_acquire("acme", _acquire("s2", selector={"gpu": "a100"})))
        assert f.info[wire.POOL_INFO] == "gpu"

    asyncio.run(main())


def test_a_live_session_is_routed_to_the_unit_holding_it_whatever_the_request_names() -> None:
    async def main() -> None:
        routes, _ = await _routes(led={"cpu-a", "gpu"})
        req = _acquire("s1", pool="gpu")
        unit = routes.for_acquire("acme", req)
        unit.ops.open("acme", req)
        assert routes.for_session("acme", "s1").pool == "gpu"
        assert routes.for_acquire("acme", _acquire("s1", pool="cpu-a")).pool == "gpu"  # a re-attach
        # Another tenant's session of the same id is not that one: no unit holds it.
        assert routes.holding("globex", "s1") is None
        # Once the pool's leader is elsewhere, its sessions are sent there.
        unit.loop.shutting_down = True
        f = _failure(lambda: routes.for_session("acme", "s1"))
        assert f.info[wire.POOL_INFO] == "gpu"
        # A session no unit holds is answered here (NOT_FOUND by the unit that leads).
        assert routes.for_session("acme", "nobody").pool == "cpu-a"

    asyncio.run(main())


@pytest.mark.parametrize(
    ("request_kw", "code", "text"),
    [
        ({"pool": "tpu"}, grpc.StatusCode.INVALID_ARGUMENT, "unknown pool 'tpu'"),
        ({"selector": {"kind": "fpga"}}, grpc.StatusCode.FAILED_PRECONDITION, "kind=fpga"),
        ({"pool": "gpu", "selector": {"kind": "gpu"}}, grpc.StatusCode.INVALID_ARGUMENT, "not both"),
    ],
)
def test_bad_placement_is_refused_by_the_routes_naming_what_is_wrong(
    request_kw: dict[str, object], code: grpc.StatusCode, text: str
) -> None:
    async def main() -> None:
        routes, _ = await _routes(led={"cpu-a", "cpu-b", "gpu"})
        f = _failure(lambda: routes.for_acquire("acme", _acquire("s1", **request_kw)))
        assert f.code is code and text in f.message

    asyncio.run(main())


def test_a_tenant_without_quota_in_the_pool_is_refused_naming_pool_and_class() -> None:
    async def main() -> None:
        routes, _ = await _routes(led={"cpu-a", "cpu-b", "gpu"})
        req = _acquire("s1", pool="gpu")
        unit = routes.for_acquire("globex", req)  # one candidate: the unit's core refuses
        with pytest.raises(errors.RpcFailure) as e:
            unit.ops.open("globex", req)
        assert e.value.code is grpc.StatusCode.PERMISSION_DENIED and "gpu" in e.value.message

    asyncio.run(main())


@pytest.mark.parametrize(
    ("case", "cold", "code"),
    [
        # Every pool held here (led or followed): an unknown session is NOT_FOUND, as ever.
        ("all held", set(), grpc.StatusCode.NOT_FOUND),
        # A pool held cold (neither owner nor successor): the session may live there.
        ("one cold", {"gpu"}, grpc.StatusCode.UNAVAILABLE),
    ],
)
def test_a_session_unknown_here_is_not_found_only_if_every_pool_is_held(
    case: str, cold: set[str], code: grpc.StatusCode
) -> None:
    async def main() -> None:
        routes, _ = await _routes(led={"cpu-a"})  # the others followed hot, or held cold
        for name in cold:
            routes.units[name].hot = lambda: False
        if not cold:  # NOT_FOUND comes from the unit led here, as before
            assert routes.for_session("acme", "nobody").pool == "cpu-a"  # led here: it says NOT_FOUND
            return
        failure = _failure(lambda: routes.for_session("acme", "nobody"))
        assert failure.code is code and failure.reason == errors.NOT_LEADER, case
        assert "holds 2 of 3 pools" in failure.message
        worker = _failure(lambda: routes.for_worker("w-unknown"))
        assert worker.code is code
        # A pool held cold tells no demand (an empty view would read as none): NOT_LEADER
        # naming its leader.
        refused = _failure(lambda: routes.describe("gpu"))
        assert dict(refused.metadata)[wire.POOL] == "gpu"
        assert routes.describe("cpu-a").capacity == 1  # a pool held here answers

    asyncio.run(main())
