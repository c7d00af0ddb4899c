"""Pools on the wire, the parts tests/test_pools_refusals_wire.py does not cover: workers joining
pools over the Workers service (their credential's pools, the labels handed back, no acting for
another pool's worker, a re-registration compared with the pool it resolves to), a fallback
that queues in its first pool with the reason and is granted there, admin-only pool filters, and
requests too large to judge. Real gRPC over loopback, raw stubs, tokens as metadata."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest
import yaml

from scheduler.api.gen.slotsched.v1 import admin_pb2, common_pb2, scheduler_pb2, workers_pb2
from tests.grpc_fixtures import (
    ADMIN_TOKEN,
    TOKENS,
    WORKER_B_TOKEN,
    WORKER_TOKEN,
    Client,
    pools_policy_yaml,
    running_server,
    until,
)
from tests.test_pools_refusals_wire import details

B = common_pb2.QOS_CLASS_BURSTABLE
S = grpc.StatusCode


def register(wid: str, pool: str, slots: int = 1) -> workers_pb2.RegisterRequest:
    return workers_pb2.RegisterRequest(worker_id=wid, address="10.0.0.9:1", slots=slots, pool=pool)


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value


def test_workers_join_only_their_pools_and_act_only_as_themselves() -> None:
    with running_server(pools_policy_yaml(workers_per_pool=0)) as server:

        async def go() -> None:
            async with Client(server.target, WORKER_TOKEN) as w, Client(server.target, WORKER_B_TOKEN) as b:
                # The first entry lists cpu-a and gpu: cpu-b is refused naming the entry and pool.
                err = await refused(w.workers.Register(register("w-x", "cpu-b"), metadata=w.md))
                assert err.code() is S.PERMISSION_DENIED
                assert details(err)[1] == "WORKER_POOL_DENIED"
                message = err.details() or ""
                assert "'cpu-b'" in message and ".pools" in message and "'cpu-a', 'gpu'" in message, message
                err = await refused(w.workers.Register(register("w-x", "tpu"), metadata=w.md))
                assert err.code() is S.INVALID_ARGUMENT and "tpu" in (err.details() or "")
                # Several pools, none `default`: a worker must name its pool.
                err = await refused(w.workers.Register(register("w-x", ""), metadata=w.md))
                assert err.code() is S.INVALID_ARGUMENT

                got = await b.workers.Register(register("b-1", "cpu-b"), metadata=b.md)
                assert (got.pool, dict(got.compatibility_labels)) == ("cpu-b", {"cpuModel": "sapphire"})
                got = await w.workers.Register(register("w-a", "cpu-a", 2), metadata=w.md)
                assert (got.pool, dict(got.compatibility_labels)) == ("cpu-a", {"cpuModel": "icelake"})
                got = await w.workers.Register(register("w-g", "gpu"), metadata=w.md)
                assert (got.pool, dict(got.compatibility_labels)) == ("gpu", {})  # gpu keeps none
                assert dict(got.labels) == {"kind": "gpu", "gpu": "a100", "cpuModel": "sapphire"}

                # cpu-b's credential cannot act for cpu-a's worker, nor the other way round.
                for client, other in ((b, "w-a"), (w, "b-1")):
                    for call in (
                        client.workers.Heartbeat(
                            workers_pb2.HeartbeatRequest(worker_id=other), metadata=client.md
                        ),
                        client.workers.Drain(workers_pb2.DrainRequest(worker_id=other), metadata=client.md),
                        client.workers.Deregister(
                            workers_pb2.DeregisterRequest(worker_id=other), metadata=client.md
                        ),
                        client.workers.Register(register(other, "cpu-b"), metadata=client.md),
                    ):
                        err = await refused(call)
                        assert err.code() is S.PERMISSION_DENIED, (other, err.details())
                beat = await b.workers.Heartbeat(workers_pb2.HeartbeatRequest(worker_id="b-1"), metadata=b.md)
                assert not beat.draining  # the refusals above changed nothing

                async with Client(server.target, ADMIN_TOKEN) as admin:
                    for pool, ids in (("cpu-a", ["w-a"]), ("cpu-b", ["b-1"]), ("gpu", ["w-g"])):
                        view = await admin.admin.DescribePool(
                            admin_pb2.DescribePoolRequest(pool=pool), metadata=admin.md
                        )
                        assert [x.worker_id for x in view.workers] == ids, pool

        asyncio.run(go())


def test_fallback_queues_in_its_first_pool_and_is_granted_there() -> None:
    with running_server(pools_policy_yaml(workers_per_pool=0)) as server:

        async def go() -> None:
            async with (
                Client(server.target, WORKER_TOKEN) as w,
                Client(server.target, TOKENS["acme"]) as acme,
                Client(server.target, TOKENS["globex"]) as globex,
                Client(server.target, ADMIN_TOKEN) as admin,
            ):
                await w.workers.Register(register("w-a", "cpu-a", 2), metadata=w.md)
                held = [globex.acquire(f"g{i}", B, pool="cpu-a") for i in range(2)]
                for call in held:
                    assert (await until(call, "granted")).granted.lease.pool == "cpu-a"
                # gpu has no worker yet, cpu-a is full: acme (within its quota) queues in gpu.
                wait = acme.acquire("fb", B, pool="gpu", fallback_pools=["cpu-a"])
                queued = (await until(wait, "queued")).queued
                assert (queued.pool, queued.reason) == ("gpu", "pool_exhausted")
                state = await acme.scheduler.GetSession(
                    scheduler_pb2.GetSessionRequest(session_id="fb"), metadata=acme.md
                )
                assert (state.pool, state.wait_reason) == ("gpu", "pool_exhausted")

                # The other tenant can neither see nor end nor renew it, nor globex's in cpu-a.
                for call in (
                    globex.scheduler.GetSession(
                        scheduler_pb2.GetSessionRequest(session_id="fb"), metadata=globex.md
                    ),
                    globex.scheduler.Release(
                        scheduler_pb2.ReleaseRequest(session_id="fb"), metadata=globex.md
                    ),
                    acme.scheduler.GetSession(
                        scheduler_pb2.GetSessionRequest(session_id="g0"), metadata=acme.md
                    ),
                    acme.scheduler.Release(scheduler_pb2.ReleaseRequest(session_id="g0"), metadata=acme.md),
                ):
                    err = await refused(call)
                    assert err.code() in (S.NOT_FOUND, S.PERMISSION_DENIED), err.details()
                # Pool filters are the admin's: a tenant's ListLeases is refused.
                err = await refused(
                    acme.admin.ListLeases(admin_pb2.ListLeasesRequest(pool="cpu-a"), metadata=acme.md)
                )
                assert err.code() is S.PERMISSION_DENIED
                leases = await admin.admin.ListLeases(
                    admin_pb2.ListLeasesRequest(pool="cpu-a"), metadata=admin.md
                )
                assert sorted(x.session_id for x in leases.leases) == ["g0", "g1"]
                none = await admin.admin.ListLeases(
                    admin_pb2.ListLeasesRequest(pool="gpu"), metadata=admin.md
                )
                assert list(none.leases) == []

                # A slot freeing in cpu-a does not move the waiter: it stays in gpu.
                held[0].cancel()
                await asyncio.sleep(0.3)
                state = await acme.scheduler.GetSession(
                    scheduler_pb2.GetSessionRequest(session_id="fb"), metadata=acme.md
                )
                assert state.pool == "gpu" and state.wait_reason == "pool_exhausted"
                # A gpu worker arrives: the waiter is granted where it waited.
                await w.workers.Register(register("w-g", "gpu"), metadata=w.md)
                assert (await until(wait, "granted")).granted.lease.pool == "gpu"
                for call in (held[1], wait):
                    call.cancel()

        asyncio.run(go())


def test_a_reregistration_naming_no_pool_is_compared_with_the_pool_it_resolves_to() -> None:
    """A policy with a `default` pool: a worker of gpu re-registering with the pool unset asks for
    `default`. It used to be kept in gpu (the raw empty pool passed the same-pool check) while
    the response said `default`; now it is replaced into `default`."""
    doc = yaml.safe_load(pools_policy_yaml(workers_per_pool=0))
    spec = doc["spec"]
    spec["pools"][0]["name"] = "default"
    spec["access"]["workers"][0]["pools"] = ["default", "gpu"]
    with running_server(yaml.safe_dump(doc, sort_keys=False)) as server:

        async def go() -> None:
            async with Client(server.target, WORKER_TOKEN) as w, Client(server.target, ADMIN_TOKEN) as admin:
                await w.workers.Register(register("w-1", "gpu"), metadata=w.md)
                again = await w.workers.Register(register("w-1", ""), metadata=w.md)
                assert again.pool == "default"
                for pool, ids in (("default", ["w-1"]), ("gpu", [])):
                    view = await admin.admin.DescribePool(
                        admin_pb2.DescribePoolRequest(pool=pool), metadata=admin.md
                    )
                    assert [x.worker_id for x in view.workers] == ids, pool
                # Naming the pool it is in is idempotent as before.
                same = await w.workers.Register(register("w-1", "default"), metadata=w.md)
                assert same.pool == "default"

        asyncio.run(go())


TOO_LARGE: list[tuple[str, dict[str, Any], str]] = [
    ("10,000 fallback entries", {"pool": "gpu", "fallback_pools": [f"p{i}" for i in range(10_000)]},
     "fallback_pools"),
    ("an over-long selector value", {"selector": {"kind": "c" * 10_000}}, "selector"),
    ("an over-long selector key", {"selector": {"k" * 10_000: "cpu"}}, "selector"),
    ("an over-long pool name", {"pool": "p" * 10_000}, "pool"),
]  # fmt: skip


def test_requests_too_large_are_refused_naming_the_field_and_the_server_serves_on() -> None:
    with running_server(pools_policy_yaml()) as server:

        async def go() -> None:
            async with Client(server.target, TOKENS["acme"]) as c:
                for case, request, field in TOO_LARGE:
                    call = c.acquire("big", B, **request)
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await until(call, "granted")
                    err = e.value
                    assert err.code() is S.INVALID_ARGUMENT, (case, err.code(), err.details())
                    fields = details(err)[0]  # a selector's names its entry: selector['kind']
                    assert len(fields) == 1 and fields[0].startswith(field), (case, fields)
                    assert len(err.details() or "") < 1000, case  # the caller's text is not echoed whole
                ok = c.acquire("after", B, selector={"kind": "cpu"})
                assert (await until(ok, "granted")).granted.lease.pool == "cpu-a"
                ok.cancel()

        asyncio.run(go())
