"""Operating the server: /metrics over HTTP, health, reflection, the Admin views, `status`, dev
mode, and a real SIGTERM to a server subprocess that must exit 0 with its streams ended cleanly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from prometheus_client.parser import text_string_to_metric_families

from scheduler.api.gen.slotsched.v1 import admin_pb2, common_pb2, workers_pb2
from scheduler.cli.status_table import render, status_main
from scheduler.grants import core_lease_id
from scheduler.policy.yaml_io import parse_policy
from tests.grpc_fixtures import (
    ADMIN_TOKEN,
    BE,
    TOKENS,
    B,
    Client,
    G,
    ServerThread,
    next_event,
    policy_yaml,
    running_server,
    served_target,
    status_of,
    until,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def server() -> Iterator[ServerThread]:
    """A secure-mode server on the default test policy (capacity 2, floor 1)."""
    with running_server(policy_yaml()) as s:
        yield s


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_scraped_over_http_match_the_scenario(server: ServerThread) -> None:
    async def go() -> None:
        async with (
            Client(server.target, token=TOKENS["acme"]) as acme,
            Client(server.target, token=TOKENS["batch"]) as batch,
            Client(server.target, token=TOKENS["globex"]) as globex,
        ):
            a1 = acme.acquire("a1", B)
            assert (await next_event(a1)).WhichOneof("event") == "granted"
            b1 = batch.acquire("b1", BE)  # the idle floor slot, lent to BestEffort
            assert (await next_event(b1)).WhichOneof("event") == "granted"
            b2 = batch.acquire("b2", BE)
            assert (await next_event(b2)).WhichOneof("event") == "queued"
            refused = globex.acquire("g", BE)
            assert (await status_of(refused))[0] == grpc.StatusCode.PERMISSION_DENIED

            m = scrape(server.metrics_url)
            assert (
                m[
                    (
                        "slotsched_grants_total",
                        (("class", "burstable"), ("pool", "default"), ("tenant", "acme")),
                    )
                ]
                == 1
            )
            assert (
                m[
                    (
                        "slotsched_grants_total",
                        (("class", "besteffort"), ("pool", "default"), ("tenant", "batch")),
                    )
                ]
                == 1
            )
            assert (
                m[
                    (
                        "slotsched_grants_total",
                        (("class", "guaranteed"), ("pool", "default"), ("tenant", "acme")),
                    )
                ]
                == 0
            )
            assert (
                m[
                    (
                        "slotsched_time_to_slot_seconds_count",
                        (("class", "burstable"), ("pool", "default"), ("tenant", "acme")),
                    )
                ]
                == 1
            )
            assert (
                m[
                    (
                        "slotsched_pending_sessions",
                        (("class", "besteffort"), ("pool", "default"), ("tenant", "batch")),
                    )
                ]
                == 1
            )
            assert (
                m[
                    (
                        "slotsched_pending_sessions",
                        (("class", "burstable"), ("pool", "default"), ("tenant", "acme")),
                    )
                ]
                == 0
            )
            assert (
                m[
                    (
                        "slotsched_held_leases",
                        (("class", "burstable"), ("pool", "default"), ("tenant", "acme")),
                    )
                ]
                == 1
            )
            assert (
                m[
                    (
                        "slotsched_held_leases",
                        (("class", "besteffort"), ("pool", "default"), ("tenant", "batch")),
                    )
                ]
                == 1
            )
            assert m[("slotsched_fair_share", (("pool", "default"), ("tenant", "batch")))] == 1.0
            assert m[("slotsched_fair_share", (("pool", "default"), ("tenant", "acme")))] == 0.0
            assert m[("slotsched_capacity_slots", (("pool", "default"),))] == 2
            assert m[("slotsched_floor_slots", (("pool", "default"),))] == 1
            assert (
                m[
                    (
                        "slotsched_refusals_total",
                        (("pool", "default"), ("reason", "no_quota"), ("tenant", "globex")),
                    )
                ]
                == 1
            )
            assert m[("slotsched_decision_latency_seconds_count", ())] >= 5
            preempted = (
                "slotsched_preemptions_total",
                (
                    ("cause", "guaranteed"),
                    ("pool", "default"),
                    ("preemptor_tenant", "acme"),
                    ("victim_tenant", "batch"),
                ),
            )
            assert m[preempted] == 0

            g1 = acme.acquire("g1", G)  # reclaims the floor from b1
            assert (await next_event(g1)).WhichOneof("event") == "queued"
            assert (await next_event(b1)).WhichOneof("event") == "yield_requested"
            m = scrape(server.metrics_url)
            assert m[preempted] == 1
            assert (
                m[
                    (
                        "slotsched_pending_sessions",
                        (("class", "guaranteed"), ("pool", "default"), ("tenant", "acme")),
                    )
                ]
                == 1
            )
            assert m[("slotsched_yields_total", ())] == 0
            assert m[("slotsched_work_lost_slot_seconds_total", ())] == 0
            for call in (a1, b1, b2, g1):
                call.cancel()

    asyncio.run(go())


def test_health_and_reflection(server: ServerThread) -> None:
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "slotsched.v1.Scheduler", "slotsched.v1.Workers", "slotsched.v1.Admin"):
            resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING, service

        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
        assert {"slotsched.v1.Scheduler", "slotsched.v1.Workers", "slotsched.v1.Admin"} <= services
        assert "grpc.health.v1.Health" in services

        server.call_async(lambda r: r.begin_shutdown())
        resp = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_admin_policy_round_trip_and_apply(server: ServerThread) -> None:
    async def go() -> None:
        async with Client(server.target, token=ADMIN_TOKEN) as c:
            got = await c.admin.GetPolicy(admin_pb2.GetPolicyRequest(), metadata=c.md)
            policy, _ = parse_policy(got.yaml)
            assert got.name == "test" and policy.pool.floor == 1
            assert policy.access == parse_policy(policy_yaml())[0].access  # roles round-trip too

            new = policy_yaml(floor=0, workers=2)
            dry = await c.admin.ApplyPolicy(
                admin_pb2.ApplyPolicyRequest(yaml=new, dry_run=True), metadata=c.md
            )
            assert not dry.applied
            pool = await c.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=c.md)
            assert pool.floor == 1
            done = await c.admin.ApplyPolicy(admin_pb2.ApplyPolicyRequest(yaml=new), metadata=c.md)
            assert done.applied
            pool = await c.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=c.md)
            assert (pool.capacity, pool.free, pool.floor) == (2, 2, 0)

    asyncio.run(go())


def test_list_leases_and_queue_page_through(server: ServerThread) -> None:
    async def go() -> None:
        async with (
            Client(server.target, token=TOKENS["batch"]) as c,
            Client(server.target, token=ADMIN_TOKEN) as admin,
        ):
            calls, kinds = [], []
            for i in range(5):  # one at a time: the order of arrival is the order in the queue
                calls.append(c.acquire(f"s{i}", BE))
                kinds.append((await next_event(calls[-1])).WhichOneof("event"))
            assert kinds == ["granted", "granted", "queued", "queued", "queued"]

            seen, token = [], ""
            while True:
                page = await admin.admin.ListLeases(
                    admin_pb2.ListLeasesRequest(page_size=1, page_token=token), metadata=admin.md
                )
                seen += [lease.session_id for lease in page.leases]
                token = page.next_page_token
                if not token:
                    break
            assert seen == ["s0", "s1"]

            first = await admin.admin.ListQueue(admin_pb2.ListQueueRequest(page_size=2), metadata=admin.md)
            rest = await admin.admin.ListQueue(
                admin_pb2.ListQueueRequest(page_size=2, page_token=first.next_page_token), metadata=admin.md
            )
            entries = list(first.entries) + list(rest.entries)
            assert [e.session_id for e in entries] == ["s2", "s3", "s4"]
            assert [e.position for e in entries] == [0, 1, 2]
            assert all(e.tenant == "batch" and e.qos == BE for e in entries)
            assert not rest.next_page_token
            only = await admin.admin.ListQueue(admin_pb2.ListQueueRequest(tenant="acme"), metadata=admin.md)
            assert list(only.entries) == []
            for call in calls:
                call.cancel()

    asyncio.run(go())


def test_status_prints_a_table_and_json(server: ServerThread, capsys: pytest.CaptureFixture[str]) -> None:
    assert status_main(server.target, False, ADMIN_TOKEN, None) == 0
    out = capsys.readouterr().out
    assert "capacity 2 slots" in out and "floor 1" in out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("tenant"))
    acme = next(line for line in lines if line.startswith("acme"))
    assert len(acme) <= len(header) + 2  # aligned columns
    assert status_main(server.target, True, ADMIN_TOKEN, None) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["capacity"] == 2 and {t["tenant"] for t in doc["tenants"]} == {"acme", "globex", "batch"}
    assert status_main(server.target, False, "wrong-token", None) == 1
    assert "PERMISSION_DENIED" in capsys.readouterr().err


def test_status_table_lists_workers_their_state_and_leases(
    server: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    """Workers with slots, state (ready/draining), heartbeat and the leases they hold, by id and tenant."""

    async def go() -> None:
        async with Client(server.target, token=ADMIN_TOKEN) as admin:
            await admin.workers.Register(
                workers_pb2.RegisterRequest(worker_id="w-ext", address="10.0.0.9:7000", slots=2),
                metadata=admin.md,
            )
            await admin.workers.Heartbeat(workers_pb2.HeartbeatRequest(worker_id="w-ext"), metadata=admin.md)
            async with (
                Client(server.target, token=TOKENS["acme"]) as acme,
                Client(server.target, token=TOKENS["globex"]) as globex,
            ):
                calls = [acme.acquire("s-acme", G), globex.acquire("s-globex", B)]
                leases = [(await until(c, "granted")).granted.lease for c in calls]
                held = {lease.tenant: lease for lease in leases}
                acme_worker = held["acme"].slot.worker_id
                await admin.workers.Drain(workers_pb2.DrainRequest(worker_id=acme_worker), metadata=admin.md)
                assert await asyncio.to_thread(status_main, server.target, False, ADMIN_TOKEN, None) == 0
                for c in calls:
                    c.cancel()
        out = capsys.readouterr().out
        rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
        assert "worker" in rows and "leases" in rows["worker"] and "state" in rows["worker"]
        assert set(held) == {"acme", "globex"}
        for tenant, lease in held.items():
            row = rows[lease.slot.worker_id]
            assert f"{core_lease_id(lease.lease_id)} {tenant} (" in row, row  # admins see untagged ids
            assert " 1/1 " in row, row  # busy/slots
        assert rows[acme_worker].split()[1] == "draining"
        globex_row = rows[held["globex"].slot.worker_id]
        assert globex_row.split()[1] == "ready"
        ext = rows["w-ext"].split()
        assert ext[1:3] == ["ready", "0/2"] and "10.0.0.9:7000" in ext and ext[-1] == "-", ext
        assert " 0s ago " in rows["w-ext"]  # its heartbeat; the static local-N send none
        assert rows["local-0"].split()[3] == "-"

    asyncio.run(go())


def test_status_table_keeps_a_busy_worker_row_short() -> None:
    pool = admin_pb2.DescribePoolResponse(capacity=8, free=2)
    pool.workers.add(worker_id="big", address="h:1", slots=8, busy=6, state=admin_pb2.WORKER_STATE_ACTIVE)
    leases = [
        common_pb2.Lease(
            lease_id=f"big/{i}#1",
            slot=common_pb2.Slot(worker_id="big", index=i),
            tenant="acme",
            qos=common_pb2.QOS_CLASS_BEST_EFFORT,
            state=common_pb2.LEASE_STATE_YIELDING if i == 0 else common_pb2.LEASE_STATE_ACTIVE,
        )
        for i in range(6)
    ]
    row = next(line for line in render(pool, leases).splitlines() if line.startswith("big"))
    assert "big/0#1 acme (BE, yielding), big/1#1 acme (BE)" in row
    assert "big/3#1" in row and "big/4#1" not in row and row.endswith(", +2 more")
    failed = next(line for line in render(pool, None).splitlines() if line.startswith("big"))
    assert failed.split()[2] == "6/8" and failed.endswith("?")  # listing failed: the count remains


def test_status_explains_that_it_needs_an_admin_token(
    server: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    assert status_main(server.target, False, TOKENS["acme"], None) == 1
    err = capsys.readouterr().err
    assert "PERMISSION_DENIED" in err and "tenant 'acme'" in err
    assert "admin token" in err and "spec.access.admins" in err
    assert status_main(server.target, False, None, None) == 1
    err = capsys.readouterr().err
    assert "UNAUTHENTICATED" in err and "--token" in err and "spec.access.admins" in err


def test_insecure_dev_mode_takes_the_tenant_from_a_header(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="slotsched.server")
    with running_server(None) as srv:
        assert sum("INSECURE" in r.message for r in caplog.records) == 1

        async def go() -> None:
            async with Client(srv.target, tenant="sre") as c:
                call = c.acquire("x", G)
                lease = (await next_event(call)).granted.lease
                assert lease.tenant == "sre"
                call.cancel()
            async with Client(srv.target) as c:
                assert (await status_of(c.acquire("x", B)))[0] == grpc.StatusCode.UNAUTHENTICATED
            async with Client(srv.target, tenant="nobody") as c:
                assert (await status_of(c.acquire("x", B)))[0] == grpc.StatusCode.PERMISSION_DENIED

        asyncio.run(go())
        assert status_main(srv.target, False, None, None) == 0


_SERVE = textwrap.dedent(
    """
    import asyncio, sys
    from scheduler.serve import serve_forever
    sys.exit(asyncio.run(serve_forever(sys.argv[1], "127.0.0.1:0", "127.0.0.1:0", grace_s=10.0)))
    """
)


def test_sigterm_ends_streams_cleanly_and_exits_zero(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(policy)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        target = served_target(proc)

        async def go() -> tuple[grpc.StatusCode, str, float]:
            async with Client(target, token=TOKENS["acme"]) as c:
                call = c.acquire("long-running", B)
                assert (await next_event(call, timeout=10)).WhichOneof("event") == "granted"
                t0 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                code, details = await status_of(call)
                return code, details, time.monotonic() - t0

        code, details, took = asyncio.run(go())
        # Ended by the server with a status (not a broken connection): re-attach elsewhere.
        assert code == grpc.StatusCode.UNAVAILABLE and "shutting down" in details
        assert took < 10  # within the grace (long: a busy machine is slow to stop a process)
        assert proc.wait(timeout=30) == 0
        rest = proc.stdout.read()
        assert "shutting down" in rest and "stopped" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
