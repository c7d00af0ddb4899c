"""The KEDA external scaler on a real loopback gRPC server, called by a client built from KEDA's
own field numbers (not from our generated code), so a renumbered field would fail here."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from scheduler.core.engine import Core
from scheduler.core.types import Acquire, QoS, SessionId, TenantName, WorkerAdded, WorkerId
from scheduler.policy.model import Policy, PoolSpec, TenantSpec
from scheduler.server.keda_service import METRIC_NAME, add_keda_servicer
from slots.autoscaler.demand import weighted_demand_of_pool

F = descriptor_pb2.FieldDescriptorProto


def keda_messages() -> dict[str, Any]:
    """KEDA's pkg/scalers/externalscaler/externalscaler.proto, field by field."""
    fd = descriptor_pb2.FileDescriptorProto(
        name="keda_externalscaler.proto", package="externalscaler", syntax="proto3"
    )

    def msg(name: str, *fields: tuple[str, int, int, str | None, bool]) -> descriptor_pb2.DescriptorProto:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, type_name, repeated in fields:
            f = m.field.add(name=fname, number=number, type=ftype)
            f.label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
            if type_name:
                f.type_name = type_name
        return m

    ref = msg(
        "ScaledObjectRef",
        ("name", 1, F.TYPE_STRING, None, False),
        ("namespace", 2, F.TYPE_STRING, None, False),
        ("scalerMetadata", 3, F.TYPE_MESSAGE, ".externalscaler.ScaledObjectRef.ScalerMetadataEntry", True),
    )
    entry = ref.nested_type.add(name="ScalerMetadataEntry")
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.options.map_entry = True
    msg("IsActiveResponse", ("result", 1, F.TYPE_BOOL, None, False))
    msg("GetMetricSpecResponse", ("metricSpecs", 1, F.TYPE_MESSAGE, ".externalscaler.MetricSpec", True))
    msg(
        "MetricSpec",
        ("metricName", 1, F.TYPE_STRING, None, False),
        ("targetSize", 2, F.TYPE_INT64, None, False),
        ("targetSizeFloat", 3, F.TYPE_DOUBLE, None, False),
    )
    msg(
        "GetMetricsRequest",
        ("scaledObjectRef", 1, F.TYPE_MESSAGE, ".externalscaler.ScaledObjectRef", False),
        ("metricName", 2, F.TYPE_STRING, None, False),
    )
    msg("GetMetricsResponse", ("metricValues", 1, F.TYPE_MESSAGE, ".externalscaler.MetricValue", True))
    msg(
        "MetricValue",
        ("metricName", 1, F.TYPE_STRING, None, False),
        ("metricValue", 2, F.TYPE_INT64, None, False),
        ("metricValueFloat", 3, F.TYPE_DOUBLE, None, False),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    names = (
        "ScaledObjectRef",
        "IsActiveResponse",
        "GetMetricSpecResponse",
        "GetMetricsRequest",
        "GetMetricsResponse",
    )
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"externalscaler.{n}")) for n in names
    }


M = keda_messages()
SERVICE = "/externalscaler.ExternalScaler/"


class KedaClient:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        def unary(method: str, req: str, resp: str) -> Any:
            return channel.unary_unary(
                SERVICE + method,
                request_serializer=M[req].SerializeToString,
                response_deserializer=M[resp].FromString,
            )

        self.is_active = unary("IsActive", "ScaledObjectRef", "IsActiveResponse")
        self.get_metric_spec = unary("GetMetricSpec", "ScaledObjectRef", "GetMetricSpecResponse")
        self.get_metrics = unary("GetMetrics", "GetMetricsRequest", "GetMetricsResponse")
        self.stream_is_active = channel.unary_stream(
            SERVICE + "StreamIsActive",
            request_serializer=M["ScaledObjectRef"].SerializeToString,
            response_deserializer=M["IsActiveResponse"].FromString,
        )


def ref() -> Any:
    return M["ScaledObjectRef"](name="workers", namespace="slots", scalerMetadata={"pool": "default"})


def with_server(
    demand: Callable[[], float], spw: Callable[[], int], body: Callable[[KedaClient, Any], Awaitable[None]]
) -> None:
    async def go() -> None:
        server = grpc.aio.server()
        servicer = add_keda_servicer(server, demand, spw)
        servicer.poll_interval_s = 0.02
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                await body(KedaClient(ch), servicer)
        finally:
            await server.stop(None)

    asyncio.run(go())


def test_is_active_metric_spec_and_metrics() -> None:
    demand = [5.5]

    async def body(c: KedaClient, _: Any) -> None:
        assert (await c.is_active(ref(), timeout=5)).result is True
        spec = await c.get_metric_spec(ref(), timeout=5)
        assert [(s.metricName, s.targetSize, s.targetSizeFloat) for s in spec.metricSpecs] == [
            (METRIC_NAME, 4, 4.0)
        ]
        got = await c.get_metrics(
            M["GetMetricsRequest"](scaledObjectRef=ref(), metricName=METRIC_NAME), timeout=5
        )
        assert [(v.metricName, v.metricValue, v.metricValueFloat) for v in got.metricValues] == [
            (METRIC_NAME, 6, 5.5)
        ]
        demand[0] = 0.0
        assert (await c.is_active(ref(), timeout=5)).result is False
        got = await c.get_metrics(
            M["GetMetricsRequest"](scaledObjectRef=ref(), metricName=METRIC_NAME), timeout=5
        )
        assert got.metricValues[0].metricValue == 0

    with_server(lambda: demand[0], lambda: 4, body)


def test_stream_is_active_pushes_the_state_then_each_change() -> None:
    demand = [0.0]

    async def body(c: KedaClient, _: Any) -> None:
        call = c.stream_is_active(ref())
        first = await asyncio.wait_for(call.read(), 5)
        assert first.result is False
        demand[0] = 2.0
        second = await asyncio.wait_for(call.read(), 5)
        assert second.result is True
        call.cancel()

    with_server(lambda: demand[0], lambda: 2, body)


def test_an_unreadable_demand_is_unavailable() -> None:
    def broken() -> float:
        raise RuntimeError("loop is shutting down")

    async def body(c: KedaClient, _: Any) -> None:
        try:
            await c.is_active(ref(), timeout=5)
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in (e.details() or "")
        else:
            raise AssertionError("expected UNAVAILABLE")

    with_server(broken, lambda: 2, body)


def test_the_demand_of_a_real_core_is_weighted() -> None:
    pol = Policy(
        pool=PoolSpec(slots_per_worker=2, floor=0),
        tenants=(TenantSpec("t", burstable_nominal=10, burstable_limit=10),),
    )
    core = Core(pol)
    core.handle(WorkerAdded(WorkerId("w1"), 2), 0.0)
    for i in range(3):
        core.handle(Acquire(SessionId(f"b{i}"), TenantName("t"), QoS.BURSTABLE), 0.0)
    for i in range(3):
        core.handle(Acquire(SessionId(f"x{i}"), TenantName("t"), QoS.BEST_EFFORT), 0.0)
    # 2 busy + 1 Burstable pending x 1 + 3 BestEffort pending x 0.5 = 4.5 slots

    async def body(c: KedaClient, _: Any) -> None:
        got = await c.get_metrics(
            M["GetMetricsRequest"](scaledObjectRef=ref(), metricName=METRIC_NAME), timeout=5
        )
        assert (got.metricValues[0].metricValue, got.metricValues[0].metricValueFloat) == (5, 4.5)

    with_server(lambda: weighted_demand_of_pool(core.describe(), core.policy), lambda: 2, body)
