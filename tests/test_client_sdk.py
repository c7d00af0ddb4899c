"""The client SDK (scheduler/client): error mapping, proto conversion, and whole sessions over real
gRPC against the real server (tests/grpc_fixtures.py).

Why real gRPC throughout: the SDK's job is the stream's corner cases (re-attach after a broken
connection, yield and re-grant, expiry after a crash), which a mocked stub would not exercise.
pytest-asyncio is not used: async tests run their body with `asyncio.run`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from datetime import UTC, datetime, timedelta

import grpc
import grpc.aio
import pytest

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.client import (
    AcquireTimeout,
    AsyncClient,
    InvalidArgument,
    LeaseInfo,
    NoQuota,
    NotFound,
    Phase,
    Qos,
    QueueFull,
    QueueInfo,
    SessionInfo,
    Slot,
    SlotschedError,
    SnapshotRef,
    StaleLease,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
)

# ------------------------------------------------------------------ conversion to and from protos


def test_qos_round_trip_and_parse() -> None:
    for q in Qos:
        assert Qos.from_proto(q.to_proto()) is q
    assert Qos.parse("BestEffort") is Qos.BESTEFFORT
    assert Qos.parse("best_effort") is Qos.BESTEFFORT
    assert Qos.parse(Qos.GUARANTEED) is Qos.GUARANTEED
    with pytest.raises(ValueError):
        Qos.from_proto(common_pb2.QOS_CLASS_UNSPECIFIED)
    with pytest.raises(ValueError):
        Qos.parse("platinum")


def test_snapshot_ref_round_trip() -> None:
    created = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    ref = SnapshotRef(uri="s3://b/k", size_bytes=12, sha256="ab" * 32, created=created)
    assert SnapshotRef.from_proto(ref.to_proto()) == ref
    bare = SnapshotRef(uri="file:///x")
    assert not bare.to_proto().HasField("created")
    assert SnapshotRef.from_proto(bare.to_proto()) == bare
    with pytest.raises(ValueError):
        SnapshotRef(uri="")


def test_lease_info_round_trip_and_unset_fields() -> None:
    now = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
    lease = LeaseInfo(
        session_id="s1",
        lease_id="L1",
        epoch=7,
        slot=Slot("w-0", 1),
        worker_address="127.0.0.1:7000",
        expires_at=now + timedelta(seconds=30),
        resume_from=SnapshotRef(uri="file:///snap"),
        qos=Qos.BURSTABLE,
        tenant="acme",
        granted_at=now,
    )
    assert LeaseInfo.from_proto(lease.to_proto()) == lease
    assert str(lease.slot) == "w-0/1"
    # Unset submessages come back as None, not as empty values.
    bare = LeaseInfo.from_proto(common_pb2.Lease(lease_id="L2", session_id="s2", epoch=1))
    assert bare.resume_from is None and bare.expires_at is None and bare.qos is None


def test_queue_and_session_info_from_proto() -> None:
    q = scheduler_pb2.Queued(position=3)
    assert QueueInfo.from_proto(q) == QueueInfo(3, None)
    q.estimated_wait.FromMilliseconds(1500)
    assert QueueInfo.from_proto(q) == QueueInfo(3, 1.5)
    assert QueueInfo.from_proto(QueueInfo(2, 0.25).to_proto()) == QueueInfo(2, 0.25)

    st = scheduler_pb2.SessionState(
        session_id="s",
        state=scheduler_pb2.SESSION_PHASE_QUEUED,
        position=4,
        qos=common_pb2.QOS_CLASS_GUARANTEED,
    )
    info = SessionInfo.from_proto(st)
    assert info.phase is Phase.QUEUED and info.queue == QueueInfo(4, None) and info.lease is None
    assert info.qos is Qos.GUARANTEED
    ended = SessionInfo.from_proto(
        scheduler_pb2.SessionState(
            session_id="s",
            state=scheduler_pb2.SESSION_PHASE_ENDED,
            end_reason=scheduler_pb2.END_REASON_EXPIRED,
        )
    )
    assert ended.phase is Phase.ENDED and ended.end_reason == "expired"


# ------------------------------------------------------------------ status -> typed error, over real gRPC

# A server that fails GetSession with the status named by the session id, so the errors mapped
# are the real objects both gRPC stacks produce (trailing metadata included).
_ABORTS: dict[str, tuple[grpc.StatusCode, tuple[tuple[str, str], ...]]] = {
    "full": (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        (("retry-after-ms", "2500"), ("estimated-wait-ms", "40000")),
    ),
    "full-bare": (grpc.StatusCode.RESOURCE_EXHAUSTED, ()),
    "quota": (grpc.StatusCode.PERMISSION_DENIED, ()),
    "stale": (grpc.StatusCode.FAILED_PRECONDITION, ()),
    "gone": (grpc.StatusCode.NOT_FOUND, ()),
    "late": (grpc.StatusCode.DEADLINE_EXCEEDED, ()),
    "down": (grpc.StatusCode.UNAVAILABLE, ()),
    "who": (grpc.StatusCode.UNAUTHENTICATED, ()),
    "bad": (grpc.StatusCode.INVALID_ARGUMENT, ()),
    "other": (grpc.StatusCode.ABORTED, ()),
}
_EXPECTED: dict[str, type[SlotschedError]] = {
    "full": QueueFull,
    "full-bare": QueueFull,
    "quota": NoQuota,
    "stale": StaleLease,
    "gone": NotFound,
    "late": AcquireTimeout,
    "down": Unavailable,
    "who": Unauthenticated,
    "bad": InvalidArgument,
    "other": SlotschedError,
}


def _abort_get_session(request: scheduler_pb2.GetSessionRequest, context: grpc.ServicerContext) -> None:
    code, md = _ABORTS[request.session_id]
    context.set_trailing_metadata(md)
    context.abort(code, f"because {request.session_id}")


@pytest.fixture(scope="module")
def abort_server() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.method_handlers_generic_handler(
        "slotsched.v1.Scheduler",
        {
            "GetSession": grpc.unary_unary_rpc_method_handler(
                _abort_get_session,
                request_deserializer=scheduler_pb2.GetSessionRequest.FromString,
                response_serializer=scheduler_pb2.SessionState.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def _check_mapped(err: SlotschedError, name: str) -> None:
    assert type(err) is _EXPECTED[name], (name, err)
    assert err.code is _ABORTS[name][0]
    assert f"because {name}" in str(err)


def test_error_mapping_sync_rpc_error(abort_server: str) -> None:
    from scheduler.api.gen.slotsched.v1 import scheduler_pb2_grpc

    with grpc.insecure_channel(abort_server) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        for name in _ABORTS:
            with pytest.raises(grpc.RpcError) as info:
                stub.GetSession(scheduler_pb2.GetSessionRequest(session_id=name), timeout=5)
            _check_mapped(from_rpc_error(info.value), name)
            full = from_rpc_error(info.value)
            if name == "full":
                assert isinstance(full, QueueFull)
                assert full.retry_after_s == 2.5 and full.estimated_wait_s == 40.0


def test_error_mapping_aio_through_client(abort_server: str) -> None:
    async def body() -> None:
        async with AsyncClient(abort_server, tenant="t") as client:
            for name in _ABORTS:
                with pytest.raises(SlotschedError) as info:
                    await client.get_session(name)
                _check_mapped(info.value, name)
                assert isinstance(info.value.__cause__, grpc.aio.AioRpcError)  # chained with `from`
                if name == "full":
                    assert isinstance(info.value, QueueFull)
                    assert info.value.retry_after_s == 2.5 and info.value.estimated_wait_s == 40.0
                if name == "full-bare":
                    assert isinstance(info.value, QueueFull)
                    assert info.value.retry_after_s is None and info.value.estimated_wait_s is None

    asyncio.run(body())
