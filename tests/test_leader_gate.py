"""The leader gate (scheduler/server/leader_gate.py) on a real grpc.aio server over loopback, with
every service assembled as `slotsched serve --state redis://…` assembles them: while the replica
does not serve, every rpc shape of the gated services (unary, a stream written with
`context.write`, an async-generator stream, the bidirectional Channel) answers UNAVAILABLE
NOT_LEADER naming the leader, before authentication and before the request is looked at (garbage
bytes too); health and reflection stay open; once serving, the servicers answer themselves."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from scheduler.api.gen.externalscaler import externalscaler_pb2, externalscaler_pb2_grpc
from scheduler.api.gen.slotsched.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    workers_pb2,
    workers_pb2_grpc,
)
from scheduler.core.types import WorkerId
from scheduler.policy.yaml_io import load_policy
from scheduler.server.app import assemble
from scheduler.server.auth import Authenticator
from scheduler.server.errors import LEADER_KEY
from scheduler.server.loop import SchedulerLoop
from scheduler.server.registry import WorkerRegistry
from tests.grpc_fixtures import ADMIN_TOKEN, TOKENS, B, policy_yaml

LEADER = "10.0.0.7:50051"


def _info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    md = dict(err.trailing_metadata() or ())
    status = status_pb2.Status.FromString(md["grpc-status-details-bin"])
    info = error_details_pb2.ErrorInfo()
    assert any(d.Unpack(info) for d in status.details), "no ErrorInfo"
    return info


async def _channel_call(stub: Any, md: Any) -> Any:
    """As the SDK drives it (client/mux.py): one call, requests written, events read."""
    call = stub.Channel(metadata=md)
    req = scheduler_pb2.ChannelRequest()
    req.commands.add(ref=1, acquire=scheduler_pb2.AcquireRequest(session_id="s", qos=B))
    with contextlib.suppress(grpc.aio.AioRpcError):  # already refused: read() says why
        await call.write(req)
    while True:
        await call.read()


async def _keda_stream(stub: Any, md: Any) -> Any:
    ref = externalscaler_pb2.ScaledObjectRef(name="pool", namespace="default")
    async for _ in stub.StreamIsActive(ref, metadata=md):
        return


async def _first_event(stub: Any, md: Any) -> Any:
    call = stub.Acquire(scheduler_pb2.AcquireRequest(session_id="s", qos=B), metadata=md)
    return await call.read()


# (what, call(stubs, metadata)) over every rpc shape and every gated service.
CALLS: list[tuple[str, Any]] = [
    ("Scheduler.Acquire (stream, context.write)", lambda s, md: _first_event(s["sched"], md)),
    (
        "Scheduler.Renew (unary)",
        lambda s, md: s["sched"].Renew(scheduler_pb2.RenewRequest(session_id="s", lease_id="x"), metadata=md),
    ),
    ("Scheduler.Channel (bidirectional)", lambda s, md: _channel_call(s["sched"], md)),
    (
        "Workers.Heartbeat (unary)",
        lambda s, md: s["workers"].Heartbeat(workers_pb2.HeartbeatRequest(worker_id="w"), metadata=md),
    ),
    (
        "Admin.DescribePool (unary)",
        lambda s, md: s["admin"].DescribePool(admin_pb2.DescribePoolRequest(), metadata=md),
    ),
    ("ExternalScaler.StreamIsActive (async generator)", lambda s, md: _keda_stream(s["keda"], md)),
]


def _run(body: Any) -> None:
    async def go() -> None:
        with tempfile.TemporaryDirectory(prefix="slotsched-gate-") as d:
            path = os.path.join(d, "policy.yaml")
            with open(path, "w") as f:
                f.write(policy_yaml())
            policy, _ = load_policy(path)
        loop = SchedulerLoop(policy)
        registry = WorkerRegistry(loop, 5.0)
        for i in range(policy.pool.workers):
            registry.register(WorkerId(f"local-{i}"), "local", policy.pool.slots_per_worker, {}, static=True)
        auth = Authenticator(True, lambda: loop.core.policy)
        serving = [False]
        app = assemble(loop, registry, auth, lambda: 0.0, serving=lambda: serving[0], leader=lambda: LEADER)
        port = app.server.add_insecure_port("127.0.0.1:0")
        await app.server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stubs = {
                    "sched": scheduler_pb2_grpc.SchedulerStub(ch),  # type: ignore[no-untyped-call]
                    "workers": workers_pb2_grpc.WorkersStub(ch),  # type: ignore[no-untyped-call]
                    "admin": admin_pb2_grpc.AdminStub(ch),  # type: ignore[no-untyped-call]
                    "keda": externalscaler_pb2_grpc.ExternalScalerStub(ch),
                    "health": health_pb2_grpc.HealthStub(ch),  # type: ignore[no-untyped-call]
                    "channel": ch,
                }
                await app.set_serving(False)  # as the replica does while it is a standby
                await body(stubs, serving)
        finally:
            await app.server.stop(None)

    asyncio.run(go())


@pytest.mark.parametrize(("what", "call"), CALLS, ids=[c[0] for c in CALLS])
@pytest.mark.parametrize("credential", ["tenant", "admin", "none"])
def test_a_replica_that_does_not_serve_names_the_leader_for_every_rpc_shape(
    what: str, call: Any, credential: str
) -> None:
    token = {"tenant": TOKENS["acme"], "admin": ADMIN_TOKEN, "none": None}[credential]
    md = () if token is None else (("authorization", f"Bearer {token}"),)

    async def body(stubs: dict[str, Any], serving: list[bool]) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await asyncio.wait_for(call(stubs, md), 10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, what
        assert dict(e.value.trailing_metadata() or ())[LEADER_KEY] == LEADER
        info = _info(e.value)
        assert (info.reason, info.metadata["leader"]) == ("NOT_LEADER", LEADER)

    _run(body)


def test_health_stays_open_garbage_is_refused_as_not_leader_and_serving_opens_the_gate() -> None:
    async def body(stubs: dict[str, Any], serving: list[bool]) -> None:
        # Health answers on a standby (Kubernetes reads NOT_SERVING from it: no traffic routed).
        resp = await stubs["health"].Check(health_pb2.HealthCheckRequest(service=""))
        assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
        # So does reflection (grpcurl against a standby still lists the services).
        reflect = reflection_pb2_grpc.ServerReflectionStub(stubs["channel"])
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        async for answer in reflect.ServerReflectionInfo(iter([ask])):
            names = {s.name for s in answer.list_services_response.service}
            assert "slotsched.v1.Scheduler" in names
            break
        # Bytes that are no RenewRequest: the gate answers first (the leader will judge them).
        raw = stubs["channel"].unary_unary("/slotsched.v1.Scheduler/Renew")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw(b"\xff\xff\xff\xff garbage", metadata=(("authorization", f"Bearer {TOKENS['acme']}"),))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and _info(e.value).reason == "NOT_LEADER"

        serving[0] = True  # now the servicers answer, each in its own words
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw(b"\xff\xff\xff\xff garbage", metadata=(("authorization", f"Bearer {TOKENS['acme']}"),))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # the wire guard, behind the gate
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stubs["sched"].Renew(scheduler_pb2.RenewRequest(session_id="s", lease_id="x"))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED  # no credential
        md = (("authorization", f"Bearer {TOKENS['acme']}"),)
        event = await asyncio.wait_for(_first_event(stubs["sched"], md), 10)
        assert event.WhichOneof("event") == "granted"
        pool = await stubs["admin"].DescribePool(
            admin_pb2.DescribePoolRequest(), metadata=(("authorization", f"Bearer {ADMIN_TOKEN}"),)
        )
        assert (pool.capacity, pool.free) == (2, 1)

    _run(body)
