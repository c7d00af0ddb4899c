"""Observing many pools (issue 24), over real gRPC on loopback: Admin.DescribePool per pool (its
name, labels and every pool's name; empty: the default; unknown: INVALID_ARGUMENT naming it),
ListLeases / ListQueue entries with their pool (and a waiter's reason) and a pool filter, the
metrics' `pool` series, and `slotsched status` listing each pool and each waiter's reason."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
import yaml

from scheduler.api.gen.slotsched.v1 import admin_pb2, workers_pb2
from scheduler.cli.status_table import status_main
from scheduler.policy.identities import hash_token
from tests.grpc_fixtures import (
    ADMIN_TOKEN,
    TOKENS,
    WORKER_TOKEN,
    B,
    Client,
    next_event,
    policy_yaml,
    running_server,
)
from tests.test_server_ops import scrape


def two_pools_yaml() -> str:
    """The test policy with two pools, no static workers: cpu (2 slots a worker), gpu (1)."""
    doc: dict[str, Any] = yaml.safe_load(policy_yaml(floor=0))
    spec = doc["spec"]
    del spec["pool"]
    spec["pools"] = [
        {
            "name": "cpu",
            "labels": {"kind": "cpu"},
            "slotsPerWorker": 2,
            "workers": 0,
            "minWorkers": 0,
            "maxWorkers": 4,
            "floor": 0,
        },
        {
            "name": "gpu",
            "labels": {"kind": "gpu", "gpu": "a100"},
            "slotsPerWorker": 1,
            "workers": 0,
            "minWorkers": 0,
            "maxWorkers": 4,
            "floor": 0,
        },
    ]
    spec["tenants"] = [
        {
            "name": "acme",
            "guaranteed": 0,
            "burstable": {"nominal": 2, "limit": 4},
            "tokens": [hash_token(TOKENS["acme"])],
        }
    ]
    spec["access"]["workers"] = [
        {"tokens": [hash_token(WORKER_TOKEN)], "workerIdPrefix": "w", "maxSlots": 8, "pools": ["cpu", "gpu"]}
    ]
    return yaml.safe_dump(doc, sort_keys=False)


def test_two_pools_observed_through_admin_metrics_and_status(capsys: pytest.CaptureFixture[str]) -> None:
    reasons: list[str] = []
    with running_server(two_pools_yaml()) as server:

        async def go() -> None:
            async with (
                Client(server.target, token=TOKENS["acme"]) as acme,
                Client(server.target, token=WORKER_TOKEN) as worker,
                Client(server.target, token=ADMIN_TOKEN) as admin,
            ):
                for wid, slots, pool in (("w-cpu-1", 2, "cpu"), ("w-gpu-1", 1, "gpu")):
                    req = workers_pb2.RegisterRequest(
                        worker_id=wid, address="10.0.0.9:1", slots=slots, pool=pool
                    )
                    await worker.workers.Register(req, metadata=worker.md)
                a1 = acme.acquire("a1", B, pool="cpu")
                assert (await next_event(a1)).granted.lease.pool == "cpu"
                a2 = acme.acquire("a2", B, pool="gpu")
                assert (await next_event(a2)).granted.lease.pool == "gpu"
                a3 = acme.acquire("a3", B, pool="gpu")  # the gpu pool's one slot is held
                queued = (await next_event(a3)).queued
                assert queued.pool == "gpu" and queued.reason
                reasons.append(queued.reason)

                md = admin.md
                cpu = await admin.admin.DescribePool(admin_pb2.DescribePoolRequest(pool="cpu"), metadata=md)
                gpu = await admin.admin.DescribePool(admin_pb2.DescribePoolRequest(pool="gpu"), metadata=md)
                first = await admin.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=md)
                assert (cpu.pool, list(cpu.pools), dict(cpu.labels)) == (
                    "cpu",
                    ["cpu", "gpu"],
                    {"kind": "cpu"},
                )
                assert (cpu.capacity, cpu.free, [w.worker_id for w in cpu.workers]) == (2, 1, ["w-cpu-1"])
                assert (gpu.pool, dict(gpu.labels)) == ("gpu", {"kind": "gpu", "gpu": "a100"})
                assert (gpu.capacity, gpu.free, [w.worker_id for w in gpu.workers]) == (1, 0, ["w-gpu-1"])
                assert sum(c.pending for c in gpu.classes) == 1 and sum(c.pending for c in cpu.classes) == 0
                assert first.pool == "cpu"  # no pool named `default`: the policy's first

                for call, req in (
                    (admin.admin.DescribePool, admin_pb2.DescribePoolRequest(pool="tpu")),
                    (admin.admin.ListLeases, admin_pb2.ListLeasesRequest(pool="tpu")),
                    (admin.admin.ListQueue, admin_pb2.ListQueueRequest(pool="tpu")),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await call(req, metadata=md)
                    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert "'tpu'" in (e.value.details() or "")

                leases = await admin.admin.ListLeases(admin_pb2.ListLeasesRequest(), metadata=md)
                assert sorted(lease.pool for lease in leases.leases) == ["cpu", "gpu"]
                only = await admin.admin.ListLeases(admin_pb2.ListLeasesRequest(pool="gpu"), metadata=md)
                assert [lease.session_id for lease in only.leases] == ["a2"]
                queue = await admin.admin.ListQueue(admin_pb2.ListQueueRequest(), metadata=md)
                assert [(e.session_id, e.pool, e.reason) for e in queue.entries] == [
                    ("a3", "gpu", queued.reason)
                ]
                none = await admin.admin.ListQueue(admin_pb2.ListQueueRequest(pool="cpu"), metadata=md)
                assert list(none.entries) == []

                m = scrape(server.metrics_url)
                assert m[("slotsched_capacity_slots", (("pool", "cpu"),))] == 2
                assert m[("slotsched_capacity_slots", (("pool", "gpu"),))] == 1
                assert m[("slotsched_free_slots", (("pool", "cpu"),))] == 1
                assert m[("slotsched_free_slots", (("pool", "gpu"),))] == 0
                for pool in ("cpu", "gpu"):
                    key = (("class", "burstable"), ("pool", pool), ("tenant", "acme"))
                    assert m[("slotsched_grants_total", key)] == 1
                    assert m[("slotsched_held_leases", key)] == 1
                    assert m[("slotsched_pending_sessions", key)] == (1 if pool == "gpu" else 0)
                assert m[("slotsched_waits_total", (("pool", "gpu"), ("reason", queued.reason)))] == 1
                assert m[("slotsched_waits_total", (("pool", "cpu"), ("reason", queued.reason)))] == 0
                assert not any(dict(labels).get("pool") == "default" for _, labels in m)

                rc = await asyncio.to_thread(status_main, server.target, False, ADMIN_TOKEN, None)
                assert rc == 0
                for call in (a1, a2, a3):
                    call.cancel()

        asyncio.run(go())
    out = capsys.readouterr().out
    assert "pool cpu (kind=cpu): capacity 2 slots, free 1, floor 0, 1 workers, busy 1, queue 0" in out
    assert (
        "pool gpu (gpu=a100, kind=gpu): capacity 1 slots, free 0, floor 0, 1 workers, busy 1, queue 1" in out
    )
    waiter = next(line for line in out.splitlines() if line.startswith("a3 "))
    assert waiter.split()[1:5] == ["acme", "burstable", "gpu", reasons[0]]


def test_one_pool_is_observed_as_before_pools(capsys: pytest.CaptureFixture[str]) -> None:
    with running_server(policy_yaml()) as server:

        async def go() -> None:
            async with Client(server.target, token=ADMIN_TOKEN) as admin:
                pool = await admin.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=admin.md)
                assert (pool.pool, list(pool.pools), pool.capacity) == ("default", ["default"], 2)
                named = await admin.admin.DescribePool(
                    admin_pb2.DescribePoolRequest(pool="default"), metadata=admin.md
                )
                assert named.capacity == 2
            assert await asyncio.to_thread(status_main, server.target, False, ADMIN_TOKEN, None) == 0

        asyncio.run(go())
        m = scrape(server.metrics_url)
        assert m[("slotsched_capacity_slots", (("pool", "default"),))] == 2
        assert {dict(labels)["pool"] for name, labels in m if name == "slotsched_grants_total"} == {"default"}
    out = capsys.readouterr().out
    assert out.startswith("pool: capacity 2 slots, free 2, floor 1, 2 workers\n")


def test_refusals_naming_unknown_pools_share_one_label_value() -> None:
    """A caller naming random pools must not grow the metrics' label set (found by the Node
    client: the per-session Acquire of an unknown pool failed with UNKNOWN in the metrics)."""
    from scheduler.core.types import Acquire, QoS, Refused, RefuseReason, SessionId, TenantName
    from scheduler.server.metrics import NO_POOL_LABEL, Metrics

    m = Metrics()
    m._set_tenants(["acme"], ["cpu", "gpu"])
    for i in range(50):
        ev = Acquire(SessionId(f"s{i}"), TenantName("acme"), QoS.BURSTABLE, pool=f"random-{i}")
        m.observe([Refused(ev.session, RefuseReason.UNKNOWN_POOL, "unknown pool", pool=ev.pool)], 0.0, ev)
    assert m.pools == ("cpu", "gpu")
    assert m.refusals[(NO_POOL_LABEL, "acme", RefuseReason.UNKNOWN_POOL)] == 50
    assert not any(key[0].startswith("random-") for key in m.refusals)
