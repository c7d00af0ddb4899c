"""The client SDK (scheduler/client): error mapping, proto conversion, and whole sessions over real
gRPC against the real server (tests/grpc_fixtures.py).

Why real gRPC throughout: the SDK's job is the stream's corner cases (re-attach after a broken
connection, yield and re-grant, expiry after a crash), which a mocked stub would not exercise.
pytest-asyncio is not used: async tests run their body with `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.client import (
    AcquireTimeout,
    AsyncClient,
    Client,
    GrantFailed,
    InvalidArgument,
    LeaseInfo,
    NoQuota,
    NotFound,
    PermissionDenied,
    Phase,
    QoS,
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
from tests.grpc_fixtures import TOKENS, policy_yaml, running_server

ROOT = Path(__file__).resolve().parents[1]
ACME, GLOBEX, BATCH = TOKENS["acme"], TOKENS["globex"], TOKENS["batch"]

# ------------------------------------------------------------------ conversion to and from protos


def test_qos_round_trip_and_parse() -> None:
    for q in QoS:
        assert QoS.from_proto(q.to_proto()) is q
    assert QoS.parse("BestEffort") is QoS.BESTEFFORT
    from scheduler.client import Qos  # the deprecated alias still imports

    assert Qos is QoS
    assert QoS.parse("best_effort") is QoS.BESTEFFORT
    assert QoS.parse(QoS.GUARANTEED) is QoS.GUARANTEED
    with pytest.raises(ValueError):
        QoS.from_proto(common_pb2.QOS_CLASS_UNSPECIFIED)
    with pytest.raises(ValueError):
        QoS.parse("platinum")


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
        qos=QoS.BURSTABLE,
        tenant="acme",
        granted_at=now,
    )
    assert LeaseInfo.from_proto(lease.to_proto()) == lease
    yielding = replace(lease, yield_deadline=now + timedelta(seconds=5))
    assert LeaseInfo.from_proto(yielding.to_proto()) == yielding
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
    assert info.qos is QoS.GUARANTEED
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
    "quota": PermissionDenied,  # no ErrorInfo reason NO_QUOTA: not told it is a zero quota
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


# ------------------------------------------------------------------ whole sessions against the real server


def _one_slot_policy(**kw: Any) -> str:
    """One worker with one slot, floor 1 (lent to BestEffort while idle); short timings."""
    kw.setdefault("lease_ttl_s", 30)
    kw.setdefault("yield_grace_s", 3)
    return policy_yaml(workers=1, slots_per_worker=1, floor=kw.pop("floor", 1), **kw)


class CuttableProxy:
    """A loopback TCP proxy in front of the server whose connections can be cut: the client sees
    its stream break (UNAVAILABLE, connection reset) while the server keeps running."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> CuttableProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except asyncio.CancelledError:  # the test's loop is closing
            for w in (writer, up_writer):
                w.transport.abort()

    def cut(self) -> int:
        """Reset every open connection (both sides); returns how many were cut."""
        n = len(self._writers)
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()
        return n

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()


def test_async_acquire_release() -> None:
    async def body() -> None:
        async with AsyncClient(server.target, token=ACME) as client:
            async with client.session("s-basic", qos="burstable") as lease:
                assert lease.phase is Phase.HOLDING
                info = lease.lease
                assert info is not None and info.session_id == "s-basic"
                assert info.qos is QoS.BURSTABLE and info.tenant == "acme" and info.epoch >= 1
                assert lease.lease_id == info.lease_id and lease.resume_from is None
                assert info.expires_at is not None and info.expires_at > datetime.now(UTC)
                server_view = await client.get_session("s-basic")
                assert server_view.phase is Phase.HOLDING and server_view.lease is not None
                assert server_view.lease.lease_id == info.lease_id
            assert lease.phase is Phase.ENDED and lease.end_reason == "released" and lease.error is None
            assert lease.ended.is_set() and not lease.lost_lease.is_set()
            after = await client.get_session("s-basic")
            assert after.phase is Phase.ENDED and after.end_reason == "released"

    with running_server(policy_yaml()) as server:
        asyncio.run(body())


def test_refusals_are_typed_errors_from_aenter() -> None:
    policy = _one_slot_policy(floor=0, max_pending_per_tenant=1)
    with running_server(policy) as server:

        async def body() -> None:
            async with AsyncClient(server.target, token=GLOBEX) as globex:
                # globex has no Guaranteed quota: refused at once, never queued.
                with pytest.raises(NoQuota) as no_quota:
                    async with globex.session("g-nope", QoS.GUARANTEED):
                        pytest.fail("entered a session that has no quota")
                assert isinstance(no_quota.value.__cause__, grpc.aio.AioRpcError)
                async with globex.session("first", QoS.BURSTABLE):
                    pass  # one hold observed: from now on waits are estimated
                async with globex.session("holder", QoS.BURSTABLE):
                    # Queued past wait_timeout: withdrawn, AcquireTimeout.
                    t0 = time.monotonic()
                    with pytest.raises(AcquireTimeout):
                        async with globex.session("impatient", QoS.BURSTABLE, wait_timeout_s=0.3):
                            pytest.fail("granted while the only slot is held")
                    assert time.monotonic() - t0 < 5
                    # The tenant's queue cap is 1: a second waiter is refused with a retry hint.
                    waiter = globex.session("waiter", QoS.BURSTABLE)
                    waiter.start()
                    await waiter.wait_until(lambda s: s.queue is not None, 5)
                    with pytest.raises(QueueFull) as full:
                        async with globex.session("one-too-many", QoS.BURSTABLE):
                            pytest.fail("queued past the tenant cap")
                    assert full.value.retry_after_s is not None and full.value.retry_after_s > 0
                    assert full.value.estimated_wait_s is not None and full.value.estimated_wait_s > 0
                    await waiter.release()
                    assert waiter.end_reason == "withdrawn"
                with pytest.raises(InvalidArgument):
                    async with globex.session("x" * 300, QoS.BURSTABLE):
                        pass

        asyncio.run(body())


def test_queue_position_visible_then_granted_on_release() -> None:
    with running_server(_one_slot_policy(floor=0)) as server:

        async def body() -> None:
            async with AsyncClient(server.target, token=ACME) as client:
                holder = client.session("holder", QoS.BURSTABLE)
                await holder.__aenter__()
                first = client.session("first", QoS.BURSTABLE)
                second = client.session("second", QoS.BURSTABLE)
                first.start()
                await first.wait_until(lambda s: s.queue is not None, 5)
                second.start()
                await second.wait_until(lambda s: s.queue is not None, 5)
                assert first.phase is Phase.QUEUED and first.lease is None
                assert first.queue is not None and first.queue.position == 0
                assert second.queue is not None and second.queue.position == 1
                await holder.__aexit__(None, None, None)
                lease = await first.wait_granted(5)
                assert lease.session_id == "first" and first.queue is None
                # The second one moved up: a Queued update is streamed (coalesced, so not at once).
                await second.wait_until(lambda s: s.queue is not None and s.queue.position == 0, 3)
                assert second.phase is Phase.QUEUED
                await first.release()
                await second.wait_granted(5)
                await second.release()

        asyncio.run(body())


def test_besteffort_yields_to_guaranteed_and_resumes_from_its_snapshot() -> None:
    with running_server(_one_slot_policy(yield_grace_s=5)) as server:

        async def body() -> None:
            grants: list[LeaseInfo] = []
            asked: list[LeaseInfo] = []

            def checkpoint(lease: LeaseInfo) -> SnapshotRef:  # a plain def: runs in a thread
                asked.append(lease)
                return SnapshotRef(uri=f"file:///snapshots/{lease.session_id}/{lease.epoch}", size_bytes=42)

            async def start_actor(lease: LeaseInfo) -> None:
                grants.append(lease)

            async with (
                AsyncClient(server.target, token=BATCH) as batch,
                AsyncClient(server.target, token=ACME) as acme,
                batch.session("batch-1", QoS.BESTEFFORT, on_yield=checkpoint, on_grant=start_actor) as be,
            ):
                first = be.lease
                assert first is not None and first.resume_from is None
                assert [g.lease_id for g in grants] == [first.lease_id]
                async with acme.session("urgent", QoS.GUARANTEED) as g:
                    # The slot was yielded to the Guaranteed request (our own stream may report
                    # it a moment after the other client's grant).
                    assert g.slot == first.slot
                    await be.wait_until(lambda s: s.yields == 1, 5)
                    assert be.yields == 1 and be.lease is None and be.phase is Phase.QUEUED
                    assert [a.lease_id for a in asked] == [first.lease_id]
                    # on_yield is told its deadline: the grace of 5 s from the request.
                    deadline = asked[0].yield_deadline
                    assert deadline is not None
                    assert 3 < (deadline - datetime.now(UTC)).total_seconds() <= 5
                    expected = SnapshotRef(uri=f"file:///snapshots/batch-1/{first.epoch}", size_bytes=42)
                    assert be.resume_from == expected
                    assert not be.lost_lease.is_set()
                # Guaranteed released: BestEffort is re-granted from its snapshot.
                second = await be.wait_granted(5)
                assert second.lease_id != first.lease_id and second.epoch > first.epoch
                assert second.resume_from == expected and be.resume_from == expected
                assert be.grants == 2 and [x.resume_from for x in grants] == [None, expected]
                assert be.callback_errors == []

        asyncio.run(body())


def test_failing_on_grant_after_a_regrant_gives_the_slot_back() -> None:
    with running_server(_one_slot_policy(yield_grace_s=5)) as server:

        async def body() -> None:
            starts: list[LeaseInfo] = []

            def checkpoint(lease: LeaseInfo) -> SnapshotRef:
                return SnapshotRef(uri=f"file:///snapshots/{lease.session_id}/{lease.epoch}")

            async def start_actor(lease: LeaseInfo) -> None:
                starts.append(lease)
                if len(starts) > 1:
                    raise RuntimeError("worker refused the restore")

            async with (
                AsyncClient(server.target, token=BATCH) as batch,
                AsyncClient(server.target, token=ACME) as acme,
                batch.session("batch-3", QoS.BESTEFFORT, on_yield=checkpoint, on_grant=start_actor) as be,
            ):
                async with acme.session("urgent-3", QoS.GUARANTEED):
                    await be.wait_until(lambda s: s.yields == 1, 5)
                # Re-granted when the Guaranteed session left; the restore fails: the session
                # releases the lease instead of pinning the only slot with no actor on it.
                await be.wait_until(lambda s: s.ended.is_set(), 5)
                assert len(starts) == 2 and be.lost_lease.is_set()
                assert isinstance(be.error, GrantFailed) and isinstance(be.error.__cause__, RuntimeError)
                assert be.resume_from == SnapshotRef(uri=f"file:///snapshots/batch-3/{starts[0].epoch}")
                # The slot is free: another session gets it at once.
                async with acme.session("next", QoS.BURSTABLE, wait_timeout_s=2) as nxt:
                    assert nxt.slot == starts[1].slot

        asyncio.run(body())


def test_failing_on_yield_does_not_yield_and_is_revoked_at_the_deadline() -> None:
    with running_server(_one_slot_policy(yield_grace_s=0.5)) as server:

        async def body() -> None:
            def broken_checkpoint(lease: LeaseInfo) -> SnapshotRef:
                raise OSError("disk full")

            async with (
                AsyncClient(server.target, token=BATCH) as batch,
                AsyncClient(server.target, token=ACME) as acme,
            ):
                be = batch.session("batch-2", QoS.BESTEFFORT, on_yield=broken_checkpoint)
                await be.__aenter__()
                async with acme.session("urgent-2", QoS.GUARANTEED):
                    await be.wait_until(lambda s: s.phase is Phase.QUEUED, 5)
                    assert be.yields == 0 and be.lost_lease.is_set() and be.lease is None
                    assert [type(e) for e in be.callback_errors] == [OSError]
                    assert be.phase is Phase.QUEUED and be.resume_from is None
                await be.wait_granted(5)
                assert not be.lost_lease.is_set()
                await be.release()

        asyncio.run(body())


def test_a_yield_called_off_during_the_checkpoint_keeps_the_lease() -> None:
    """One slot; beta (nominal 0) holds it; alpha (nominal 1) waits with a 1 s wait_timeout, so
    beta is asked to yield. Alpha is withdrawn while beta's on_yield is still checkpointing:
    beta hears YieldCancelled, keeps its lease (no Yield when the checkpoint returns) and is not
    revoked at the old deadline."""
    tenants = [
        {"name": "acme", "guaranteed": 0, "burstable": {"nominal": 1, "limit": 1}},
        {"name": "globex", "guaranteed": 0, "burstable": {"nominal": 0, "limit": 1}},
    ]
    grace = 2.0
    with running_server(_one_slot_policy(tenants=tenants, floor=0, yield_grace_s=grace)) as server:

        async def body() -> None:
            checkpointing = asyncio.Event()
            finish = asyncio.Event()
            called_off: list[LeaseInfo] = []

            async def checkpoint(lease: LeaseInfo) -> SnapshotRef:
                checkpointing.set()
                await finish.wait()
                return SnapshotRef(uri=f"file:///snapshots/{lease.session_id}/{lease.epoch}")

            def on_cancel(lease: LeaseInfo) -> None:
                called_off.append(lease)

            async with (
                AsyncClient(server.target, token=GLOBEX) as beta,
                AsyncClient(server.target, token=ACME) as alpha,
                beta.session(
                    "beta-1", QoS.BURSTABLE, on_yield=checkpoint, on_yield_cancelled=on_cancel
                ) as held,
            ):
                first = held.lease
                assert first is not None
                waiter = alpha.session("alpha-1", QoS.BURSTABLE, wait_timeout_s=1.0)
                waiter.start()
                await asyncio.wait_for(checkpointing.wait(), 5)
                assert held.phase is Phase.YIELDING
                with pytest.raises(AcquireTimeout):
                    await waiter.wait_granted(5)
                await held.wait_until(lambda s: s.yields_cancelled == 1, 5)
                assert held.phase is Phase.HOLDING and held.lease is not None
                assert held.lease.yield_deadline is None
                assert [x.lease_id for x in called_off] == [first.lease_id]
                finish.set()  # the checkpoint returns: no Yield follows
                await asyncio.sleep(grace + 0.3)  # past the old yield deadline
                assert held.yields == 0 and not held.lost_lease.is_set() and held.callback_errors == []
                assert (held.lease_id, held.epoch) == (first.lease_id, first.epoch)
                view = await beta.get_session("beta-1")
                assert view.phase is Phase.HOLDING and view.lease is not None
                assert view.lease.epoch == first.epoch
            assert held.end_reason == "released" and held.error is None

        asyncio.run(body())


def test_reattach_after_broken_stream_keeps_the_lease() -> None:
    with running_server(_one_slot_policy(floor=0, lease_ttl_s=1.5)) as server:

        async def body() -> None:
            proxy = await CuttableProxy(server.port).start()
            try:
                async with (
                    AsyncClient(f"127.0.0.1:{proxy.port}", token=ACME) as client,
                    AsyncClient(server.target, token=ACME) as direct,
                ):
                    async with client.session("sticky", QoS.BURSTABLE) as lease:
                        before = (lease.lease_id, lease.epoch)
                        for _ in range(2):
                            assert proxy.cut() >= 1
                            await lease.wait_until(lambda s: s.reattaches >= 1 and s._attached, 5)
                            await asyncio.sleep(0.3)
                        assert lease.reattaches >= 2
                        # Longer than the TTL: renewals carried on over the new connection.
                        await asyncio.sleep(2.0)
                        assert (lease.lease_id, lease.epoch) == before
                        assert lease.phase is Phase.HOLDING and not lease.lost_lease.is_set()
                        view = await direct.get_session("sticky")
                        assert view.phase is Phase.HOLDING and view.lease is not None
                        assert (view.lease.lease_id, view.lease.epoch) == before
                    assert lease.end_reason == "released" and lease.error is None
            finally:
                await proxy.close()

        asyncio.run(body())


def test_reattach_gives_up_when_the_server_stays_unavailable() -> None:
    with running_server(_one_slot_policy(floor=0)) as server:

        async def body() -> None:
            client = AsyncClient(server.target, token=ACME, reattach_timeout_s=0.6)
            async with client, client.session("orphan", QoS.BURSTABLE) as lease:
                # Shutting down: open streams end UNAVAILABLE, new calls are refused UNAVAILABLE.
                server.call_async(lambda s: s.begin_shutdown())
                await asyncio.wait_for(lease.ended.wait(), 5)
                assert lease.reattaches >= 2 and lease.lost_lease.is_set()
                assert isinstance(lease.error, Unavailable) and lease.phase is Phase.ENDED
                assert isinstance(lease.error.__cause__, Unavailable)
            # Leaving did not raise: the server would expire the lease.

        asyncio.run(body())


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connections are refused)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_dead_address_fails_soon_saying_it_could_not_connect(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 10 item 9: a session that never reached the server fails after connect_timeout_s
    (not after reattach_timeout_s), names the address, and warns while it retries."""
    target = f"127.0.0.1:{_closed_port()}"

    async def body() -> None:
        async with AsyncClient(target, token=ACME, connect_timeout_s=1.5, reattach_timeout_s=30) as client:
            t0 = time.monotonic()
            with pytest.raises(Unavailable) as ei:
                async with client.session("never", QoS.BURSTABLE):
                    raise AssertionError("granted by nobody")
            took = time.monotonic() - t0
            assert took < 10.0, took  # connect_timeout_s, not reattach_timeout_s (generous: a busy machine)
            message = str(ei.value)
            assert "could not connect" in message and target in message, message
            assert "re-attach" not in message

    caplog.set_level("WARNING", logger="scheduler.client.aio")
    asyncio.run(body())
    retries = [r for r in caplog.records if r.levelname == "WARNING" and target in r.getMessage()]
    assert len(retries) >= 2, caplog.text
    assert AsyncClient("x:1").connect_timeout_s == 10.0  # the documented default
    with pytest.raises(ValueError, match="connect_timeout_s"):
        AsyncClient("x:1", connect_timeout_s=0)


def test_a_silent_address_does_not_hang_the_first_attach() -> None:
    """A listener that accepts and never answers (no HTTP/2): the first Acquire is bounded too."""

    async def body() -> None:
        held: list[asyncio.StreamWriter] = []

        async def accept(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            held.append(w)

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        target = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with AsyncClient(target, token=ACME, connect_timeout_s=1.0) as client:
                t0 = time.monotonic()
                with pytest.raises(Unavailable, match="could not connect") as ei:
                    await client.session("mute", QoS.BURSTABLE).wait_granted(30)
                assert time.monotonic() - t0 < 10.0 and target in str(ei.value)  # generous: a busy machine
        finally:
            for w in held:
                w.transport.abort()
            server.close()

    asyncio.run(body())


def test_sync_client_against_a_dead_address_fails_soon() -> None:
    target = f"127.0.0.1:{_closed_port()}"
    with Client(target, token=ACME, connect_timeout_s=1.0) as client:
        t0 = time.monotonic()
        with pytest.raises(Unavailable, match="could not connect"), client.session("never", QoS.BURSTABLE):
            pass
        assert time.monotonic() - t0 < 10.0  # connect_timeout_s (1 s), generous: a busy machine


def test_sync_client_basic_flow() -> None:
    with running_server(_one_slot_policy(floor=0)) as server:
        granted: list[LeaseInfo] = []
        with Client(server.target, token=ACME) as client:
            with client.session("sync-1", "burstable", on_grant=granted.append) as lease:
                assert lease.phase is Phase.HOLDING and lease.lease is not None
                assert [g.lease_id for g in granted] == [lease.lease_id]
                waiter = client.session("sync-2", QoS.BURSTABLE)
                waiter.start()
                waiter.wait_until(lambda s: s.queue is not None, 5)
                q = waiter.queue
                # One pool: it waits in `default`, beyond its nominal (acme holds its one).
                assert q == QueueInfo(0, q.estimated_wait_s, "default", "tenant_quota")
            assert lease.ended.is_set() and lease.end_reason == "released"
            got = waiter.wait_granted(5)
            assert got.session_id == "sync-2" and waiter.phase is Phase.HOLDING
            assert client.get_session("sync-2").phase is Phase.HOLDING
            waiter.release()
            assert waiter.ended.is_set() and client.get_session("sync-2").end_reason == "released"


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from scheduler.client import Client
    client = Client(sys.argv[1], token=sys.argv[2])
    session = client.session("doomed", "burstable")
    session.__enter__()
    print(session.lease_id, session.epoch, flush=True)
    time.sleep(600)
    """
)


def test_sigkilled_holder_lease_expires_and_slot_goes_to_next_waiter() -> None:
    ttl = 1.0
    with running_server(_one_slot_policy(floor=0, lease_ttl_s=ttl)) as server:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        child = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, server.target, ACME],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        try:
            assert child.stdout is not None
            line = child.stdout.readline().split()
            assert len(line) == 2, "the holder did not get a lease"
            with Client(server.target, token=ACME) as client:
                waiter = client.session("next", QoS.BURSTABLE)
                waiter.start()
                waiter.wait_until(lambda s: s.queue is not None, 5)
                # While the child lives, its SDK renews: the lease outlives the TTL.
                time.sleep(2 * ttl)
                assert waiter.phase is Phase.QUEUED
                assert client.get_session("doomed").lease is not None
                child.send_signal(signal.SIGKILL)
                child.wait(5)
                killed = time.monotonic()
                lease = waiter.wait_granted(5 * ttl)
                waited = time.monotonic() - killed
                assert waited < ttl + 1.5, waited
                dead = client.get_session("doomed")
                assert dead.phase is Phase.ENDED and dead.end_reason == "expired"
                assert lease.session_id == "next"
                waiter.release()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(5)
