"""Every refused Acquire is counted, in the pool it was refused in (docs/design.md, "Pools"):
a refusal before placement (no pool named of several, no pool matching, a pool the policy lacks)
is in no pool, `pool=""` (metrics.NO_POOL_LABEL), never the default pool's series nor the name
the caller sent; counted whether a loop saw it (one leader) or routing refused it before any
loop (per-pool leadership). Read from the metrics registry, and over real gRPC."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.core.types import (
    Acquire,
    QoS,
    Refused,
    RefuseReason,
    SessionId,
    TenantName,
    WorkerAdded,
    WorkerId,
)
from scheduler.grants import GrantKeyring
from scheduler.policy.yaml_io import parse_policy
from scheduler.server import errors
from scheduler.server.loop import SchedulerLoop
from scheduler.server.metrics import NO_POOL_LABEL, Metrics
from scheduler.server.pool_routes import PoolRoutes, PoolUnit
from scheduler.server.registry import WorkerRegistry
from scheduler.server.session_ops import SessionOps
from tests.grpc_fixtures import TOKENS, B, Client, pools_policy_yaml, running_server
from tests.test_pools_observe import two_pools_yaml
from tests.test_server_ops import scrape

NOT_PLACED = (RefuseReason.UNKNOWN_POOL, RefuseReason.NO_POOL_NAMED, RefuseReason.NO_ELIGIBLE_POOL)


def _refused(m: Metrics, pool: str, reason: RefuseReason, tenant: str = "acme") -> float | None:
    return m.registry.get_sample_value(
        "slotsched_refusals_total", {"pool": pool, "reason": reason.value, "tenant": tenant}
    )


@pytest.mark.parametrize("reason", NOT_PLACED)
def test_a_refusal_before_placement_is_in_no_pool(reason: RefuseReason) -> None:
    m = Metrics()
    m._set_tenants(["acme"], ["cpu", "gpu"])
    for i in range(20):  # a pool the policy lacks is the caller's string: never a label
        ev = Acquire(SessionId(f"s{i}"), TenantName("acme"), QoS.BURSTABLE, pool=f"garbage-{i}")
        m.observe([Refused(ev.session, reason, "refused", pool=ev.pool)], 0.0, ev)
    assert _refused(m, NO_POOL_LABEL, reason) == 20
    assert _refused(m, "cpu", reason) is None  # not the default (first) pool's series
    assert m.pools == ("cpu", "gpu")
    assert {pool for pool, _, _ in m.refusals} == {"cpu", "gpu", NO_POOL_LABEL}


def test_a_refusal_in_a_pool_keeps_its_pool() -> None:
    m = Metrics()
    m._set_tenants(["acme"], ["cpu", "gpu"])
    ev = Acquire(SessionId("s"), TenantName("acme"), QoS.BURSTABLE, pool="gpu")
    m.observe([Refused(ev.session, RefuseReason.QUEUE_FULL, "full", pool="gpu")], 0.0, ev)
    assert _refused(m, "gpu", RefuseReason.QUEUE_FULL) == 1
    assert _refused(m, NO_POOL_LABEL, RefuseReason.QUEUE_FULL) is None  # no such series


def test_every_refusal_is_counted_over_grpc() -> None:
    """Two pools (cpu, gpu), none `default`: an unknown pool, an unknown fallback, none named, a
    selector matching none: each counted once under pool="" and its reason."""
    with running_server(two_pools_yaml()) as server:

        async def go() -> None:
            async with Client(server.target, TOKENS["acme"]) as acme:
                for kw in (
                    {"pool": "nosuch"},
                    {"pool": "cpu", "fallback_pools": ["zzz"]},
                    {},
                    {"selector": {"kind": "tpu"}},
                ):
                    call = acme.acquire("s1", B, **kw)
                    with pytest.raises(grpc.aio.AioRpcError):
                        async for _ in call:
                            pass

        asyncio.run(go())
        series = {
            (dict(labels)["pool"], dict(labels)["reason"]): v
            for (name, labels), v in scrape(server.metrics_url).items()
            if name == "slotsched_refusals_total" and v and dict(labels)["tenant"] == "acme"
        }
    assert series == {("", "unknown_pool"): 2, ("", "no_pool_named"): 1, ("", "no_eligible_pool"): 1}


def test_per_pool_routing_counts_the_refusals_it_makes() -> None:
    """Per-pool leadership refuses an unplaceable Acquire before any loop: counted all the same."""

    async def main() -> Metrics:
        policy, _ = parse_policy(pools_policy_yaml(workers_per_pool=0))
        metrics = Metrics()
        units = {}
        for name in policy.pool_names():
            loop = SchedulerLoop(policy.for_pool(name), metrics)
            loop.submit(WorkerAdded(WorkerId(f"w-{name}"), 1, pool=name))
            ops = SessionOps(loop, GrantKeyring.generate())
            units[name] = PoolUnit(name, loop, ops, WorkerRegistry(loop, 5.0), leader=lambda: None)
        routes = PoolRoutes(units, lambda: policy)
        req = scheduler_pb2.AcquireRequest(session_id="s1", qos=B, pool="nosuch-42")
        with pytest.raises(errors.RpcFailure):
            routes.for_acquire("acme", req)
        return metrics

    m = asyncio.run(main())
    assert _refused(m, NO_POOL_LABEL, RefuseReason.UNKNOWN_POOL) == 1
    assert not any("nosuch" in pool for pool, _, _ in m.refusals)


def test_a_refusal_by_a_pools_core_names_that_pool() -> None:
    """Placed in gpu, refused there (a tenant the policy lacks): the refusal names gpu, so its
    series is gpu's, not the first pool's."""
    from scheduler.core.pools import Pools

    policy, _ = parse_policy(pools_policy_yaml(workers_per_pool=0))
    out = Pools(policy).handle(Acquire(SessionId("s"), TenantName("nobody"), QoS.BURSTABLE, pool="gpu"), 0.0)
    assert [(type(d), getattr(d, "reason", None), getattr(d, "pool", None)) for d in out] == [
        (Refused, RefuseReason.UNKNOWN_TENANT, "gpu")
    ]
