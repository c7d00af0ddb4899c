"""Every status code the server promises in the proto comments, over real gRPC on loopback.

Each test names the code it checks; rich details (BadRequest, QuotaFailure) and trailing metadata
are decoded the way a client would, from `grpc-status-details-bin`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2, status_pb2

from scheduler.api.gen.slotsched.v1 import admin_pb2, common_pb2, workers_pb2
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.server import errors
from tests.grpc_fixtures import (
    ADMIN_TOKEN,
    BE,
    TOKENS,
    WORKER_TOKEN,
    B,
    Client,
    G,
    ServerThread,
    next_event,
    policy_yaml,
    running_server,
    until,
)

Code = grpc.StatusCode


async def unary_error(aw: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await aw
    return ei.value


async def stream_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        while await asyncio.wait_for(call.read(), 10) is not grpc.aio.EOF:
            pass
    return ei.value


@pytest.fixture
def server() -> Iterator[ServerThread]:
    """A secure-mode server on the default test policy (capacity 2, floor 1)."""
    with running_server(policy_yaml()) as s:
        yield s


def rich(err: grpc.aio.AioRpcError) -> status_pb2.Status:
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    raise AssertionError(f"no rich status in {err}")


def metadata(err: grpc.aio.AioRpcError) -> dict[str, str]:
    return {k: v for k, v in err.trailing_metadata() or () if isinstance(v, str)}


def violations(err: grpc.aio.AioRpcError) -> list[str]:
    bad = error_details_pb2.BadRequest()
    assert rich(err).details[0].Unpack(bad)
    return [v.field for v in bad.field_violations]


@pytest.mark.parametrize(
    ("request_kw", "field"),
    [
        ({"session_id": "", "qos": B}, "session_id"),
        ({"session_id": "x" * 257, "qos": B}, "session_id"),
        ({"session_id": "s"}, "qos"),
        (
            {"session_id": "s", "qos": B, "resume_from": common_pb2.SnapshotRef(size_bytes=3)},
            "resume_from.uri",
        ),
        ({"session_id": "s", "qos": B, "wait_timeout": Duration(seconds=-1)}, "wait_timeout"),
    ],
)
def test_acquire_invalid_argument_names_the_field(
    server: ServerThread, request_kw: dict[str, Any], field: str
) -> None:
    async def go() -> None:
        async with Client(server.target, token=TOKENS["acme"]) as c:
            err = await stream_error(c.scheduler.Acquire(pb.AcquireRequest(**request_kw), metadata=c.md))
            assert err.code() == Code.INVALID_ARGUMENT
            assert field in err.details()
            assert violations(err) == [field]

    asyncio.run(go())


def test_unary_invalid_argument_names_the_field(server: ServerThread) -> None:
    async def go() -> None:
        async with (
            Client(server.target, token=TOKENS["acme"]) as c,
            Client(server.target, token=WORKER_TOKEN) as worker,
            Client(server.target, token=ADMIN_TOKEN) as admin,
        ):
            s = c.scheduler
            err = await unary_error(s.Release(pb.ReleaseRequest(), metadata=c.md))
            assert (err.code(), violations(err)) == (Code.INVALID_ARGUMENT, ["session_id"])
            err = await unary_error(s.Renew(pb.RenewRequest(session_id="s"), metadata=c.md))
            assert (err.code(), violations(err)) == (Code.INVALID_ARGUMENT, ["lease_id"])
            req = pb.YieldRequest(session_id="s", lease_id="l", snapshot=common_pb2.SnapshotRef())
            err = await unary_error(s.Yield(req, metadata=c.md))
            assert (err.code(), violations(err)) == (Code.INVALID_ARGUMENT, ["snapshot.uri"])
            err = await unary_error(
                worker.workers.Register(workers_pb2.RegisterRequest(worker_id="w-0"), metadata=worker.md)
            )
            assert (err.code(), violations(err)) == (Code.INVALID_ARGUMENT, ["address"])
            err = await unary_error(
                admin.admin.ListQueue(admin_pb2.ListQueueRequest(page_token="junk"), metadata=admin.md)
            )
            assert (err.code(), violations(err)) == (Code.INVALID_ARGUMENT, ["page_token"])
            err = await unary_error(
                admin.admin.ListLeases(admin_pb2.ListLeasesRequest(page_size=5000), metadata=admin.md)
            )
            assert (err.code(), violations(err)) == (Code.INVALID_ARGUMENT, ["page_size"])

    asyncio.run(go())


def test_apply_policy_invalid_argument_one_violation_per_problem(server: ServerThread) -> None:
    bad = (
        policy_yaml().replace("slotsPerWorker: 1", "slotsPerWorker: 0").replace("weight: 1", "weight: -1", 1)
    )

    async def go() -> None:
        async with Client(server.target, token=ADMIN_TOKEN) as c:
            req = admin_pb2.ApplyPolicyRequest(yaml=bad)
            err = await unary_error(c.admin.ApplyPolicy(req, metadata=c.md))
            assert err.code() == Code.INVALID_ARGUMENT
            fields = violations(err)
            assert "spec.pool.slotsPerWorker" in fields
            assert len(fields) >= 1
            err = await unary_error(
                c.admin.ApplyPolicy(admin_pb2.ApplyPolicyRequest(yaml="a: [b"), metadata=c.md)
            )
            assert err.code() == Code.INVALID_ARGUMENT and violations(err)

    asyncio.run(go())


def test_unauthenticated_without_credential(server: ServerThread) -> None:
    async def go() -> None:
        async with Client(server.target) as c:
            err = await stream_error(c.acquire("s", B))
            assert err.code() == Code.UNAUTHENTICATED
            err = await unary_error(c.admin.DescribePool(admin_pb2.DescribePoolRequest()))
            assert err.code() == Code.UNAUTHENTICATED
            basic = (("authorization", "Basic dXNlcjpwYXNz"),)
            err = await stream_error(
                c.scheduler.Acquire(pb.AcquireRequest(session_id="s", qos=B), metadata=basic)
            )
            assert err.code() == Code.UNAUTHENTICATED

    asyncio.run(go())


def test_permission_denied_for_unknown_token_and_zero_quota(server: ServerThread) -> None:
    async def go() -> None:
        async with Client(server.target, token="not-a-known-token") as c:
            err = await stream_error(c.acquire("s", B))
            assert err.code() == Code.PERMISSION_DENIED
        async with Client(server.target, token=TOKENS["globex"]) as c:
            err = await stream_error(c.acquire("s", BE))  # globex: bestEffort.limit 0
            assert err.code() == Code.PERMISSION_DENIED
            assert "quota" in err.details()
            err = await stream_error(c.acquire("s", G))  # globex: guaranteed 0
            assert err.code() == Code.PERMISSION_DENIED

    asyncio.run(go())


def test_not_found(server: ServerThread) -> None:
    async def go() -> None:
        async with (
            Client(server.target, token=TOKENS["acme"]) as c,
            Client(server.target, token=WORKER_TOKEN) as worker,
        ):
            s = c.scheduler
            err = await unary_error(s.Release(pb.ReleaseRequest(session_id="ghost"), metadata=c.md))
            assert err.code() == Code.NOT_FOUND
            req = pb.RenewRequest(session_id="ghost", lease_id="local-0/0#9", epoch=9)
            assert (await unary_error(s.Renew(req, metadata=c.md))).code() == Code.NOT_FOUND
            err = await unary_error(s.GetSession(pb.GetSessionRequest(session_id="ghost"), metadata=c.md))
            assert err.code() == Code.NOT_FOUND
            err = await unary_error(
                worker.workers.Heartbeat(workers_pb2.HeartbeatRequest(worker_id="w9"), metadata=worker.md)
            )
            assert err.code() == Code.NOT_FOUND

    asyncio.run(go())


def test_failed_precondition_for_stale_epoch(server: ServerThread) -> None:
    async def go() -> None:
        async with (
            Client(server.target, token=TOKENS["acme"]) as c,
            Client(server.target, token=ADMIN_TOKEN) as admin,
        ):
            call = c.acquire("s", B)
            old = (await next_event(call)).granted.lease
            req = pb.YieldRequest(session_id="s", lease_id=old.lease_id, epoch=old.epoch)
            await c.scheduler.Yield(req, metadata=c.md)  # a free slot: re-granted at once
            new = (await until(call, "granted")).granted.lease
            assert new.epoch != old.epoch or new.lease_id != old.lease_id
            req2 = pb.RenewRequest(session_id="s", lease_id=old.lease_id, epoch=old.epoch)
            err = await unary_error(c.scheduler.Renew(req2, metadata=c.md))
            assert err.code() == Code.FAILED_PRECONDITION
            assert "stale" in err.details()
            # A worker id taken with another shape is a precondition failure too (for an admin:
            # a worker credential may not name local-0 at all).
            reg = workers_pb2.RegisterRequest(worker_id="local-0", address="elsewhere:1", slots=1)
            err = await unary_error(admin.workers.Register(reg, metadata=admin.md))
            assert err.code() == Code.FAILED_PRECONDITION

    asyncio.run(go())


def test_failed_precondition_for_another_tenants_lease(server: ServerThread) -> None:
    async def go() -> None:
        async with (
            Client(server.target, token=TOKENS["acme"]) as acme,
            Client(server.target, token=TOKENS["globex"]) as globex,
        ):
            call = acme.acquire("shared-id", B)
            lease = (await next_event(call)).granted.lease
            req = pb.ReleaseRequest(session_id="shared-id", lease_id=lease.lease_id, epoch=lease.epoch)
            err = await unary_error(globex.scheduler.Release(req, metadata=globex.md))
            assert err.code() == Code.FAILED_PRECONDITION
            # Same session id, other tenant: an independent session (ids are per tenant).
            other = globex.acquire("shared-id", B)
            assert (await next_event(other)).WhichOneof("event") in ("granted", "queued")
            # acme's lease is untouched.
            await acme.scheduler.Renew(
                pb.RenewRequest(session_id="shared-id", lease_id=lease.lease_id, epoch=lease.epoch),
                metadata=acme.md,
            )
            call.cancel()
            other.cancel()

    asyncio.run(go())


def test_resource_exhausted_with_retry_after_and_quota_failure() -> None:
    text = policy_yaml(workers=1, floor=0, max_pending=1)
    with running_server(text) as srv:

        async def go() -> None:
            async with (
                Client(srv.target, token=TOKENS["acme"]) as acme,
                Client(srv.target, token=TOKENS["globex"]) as globex,
            ):
                holder = acme.acquire("holder", B)
                granted = await next_event(holder)
                assert granted.WhichOneof("event") == "granted"
                waiter = globex.acquire("waiter", B)
                assert (await next_event(waiter)).WhichOneof("event") == "queued"
                err = await stream_error(acme.acquire("third", B))
                assert err.code() == Code.RESOURCE_EXHAUSTED
                md = metadata(err)
                assert int(md["retry-after-ms"]) >= 1000
                assert "estimated-wait-ms" not in md  # no lease has ended: nothing to estimate from
                lease = granted.granted.lease
                await acme.scheduler.Release(
                    pb.ReleaseRequest(session_id="holder", lease_id=lease.lease_id, epoch=lease.epoch),
                    metadata=acme.md,
                )
                assert (await next_event(waiter)).WhichOneof("event") == "granted"
                again = acme.acquire("again", B)
                assert (await next_event(again)).WhichOneof("event") == "queued"
                err = await stream_error(acme.acquire("third", B))
                assert err.code() == Code.RESOURCE_EXHAUSTED
                md = metadata(err)
                assert int(md["estimated-wait-ms"]) > 0
                again.cancel()
                quota = error_details_pb2.QuotaFailure()
                assert rich(err).details[0].Unpack(quota)
                assert quota.violations[0].subject == "pool"
                assert "maxPending" in quota.violations[0].description
                holder.cancel()
                waiter.cancel()

        asyncio.run(go())


def _queue(srv: ServerThread) -> list[str]:
    return srv.call(lambda r: [str(v.session) for v in r.loop.core.queue()])


def test_deadline_exceeded_withdraws_the_queued_request() -> None:
    with running_server(policy_yaml(workers=1, floor=0)) as srv:

        async def go() -> None:
            async with (
                Client(srv.target, token=TOKENS["acme"]) as c,
                Client(srv.target, token=ADMIN_TOKEN) as admin,
            ):
                holder = c.acquire("holder", B)
                assert (await next_event(holder)).WhichOneof("event") == "granted"
                # The caller's gRPC deadline.
                req = pb.AcquireRequest(session_id="impatient", qos=B)
                call = c.scheduler.Acquire(req, metadata=c.md, timeout=0.5)
                assert (await next_event(call)).WhichOneof("event") == "queued"
                err = await stream_error(call)
                assert err.code() == Code.DEADLINE_EXCEEDED
                for _ in range(50):  # the server withdraws as the deadline passes
                    if not _queue(srv):
                        break
                    await asyncio.sleep(0.02)
                page = await admin.admin.ListQueue(admin_pb2.ListQueueRequest(), metadata=admin.md)
                assert list(page.entries) == []
                # wait_timeout: the stream says WITHDRAWN before the status.
                call = c.acquire("patient-ish", B, wait_timeout=Duration(nanos=300_000_000))
                assert (await next_event(call)).WhichOneof("event") == "queued"
                ended = await next_event(call, timeout=3)
                assert ended.ended.reason == pb.END_REASON_WITHDRAWN and ended.ended.session_over
                err = await stream_error(call)
                assert err.code() == Code.DEADLINE_EXCEEDED
                assert "wait_timeout" in err.details()
                page = await admin.admin.ListQueue(admin_pb2.ListQueueRequest(), metadata=admin.md)
                assert list(page.entries) == []
                holder.cancel()

        asyncio.run(go())


def test_unavailable_while_shutting_down() -> None:
    with running_server(policy_yaml()) as srv:

        async def go() -> None:
            async with Client(srv.target, token=TOKENS["acme"]) as c:
                open_stream = c.acquire("s", B)
                assert (await next_event(open_stream)).WhichOneof("event") == "granted"
                await asyncio.wrap_future(
                    asyncio.run_coroutine_threadsafe(srv.server.begin_shutdown(), srv.loop)  # type: ignore[arg-type]
                )
                err = await stream_error(open_stream)
                assert err.code() == Code.UNAVAILABLE
                err = await stream_error(c.acquire("late", B))
                assert err.code() == Code.UNAVAILABLE
                err = await unary_error(c.scheduler.Release(pb.ReleaseRequest(session_id="s"), metadata=c.md))
                assert err.code() == Code.UNAVAILABLE

        asyncio.run(go())


def test_a_release_sent_again_is_answered_released_not_not_found(server: ServerThread) -> None:
    """A Release whose first attempt was applied but whose answer was lost (a failover, a broken
    channel) is sent again by the SDK: it must not fail the session. A Release of a session that
    holds nothing and never released stays NOT_FOUND."""

    async def go() -> None:
        async with Client(server.target, token=TOKENS["acme"]) as acme:
            call = acme.acquire("twice", B)
            lease = (await next_event(call)).granted.lease
            req = pb.ReleaseRequest(session_id="twice", lease_id=lease.lease_id, epoch=lease.epoch)
            first = await acme.scheduler.Release(req, metadata=acme.md)
            again = await acme.scheduler.Release(req, metadata=acme.md)
            assert first.reason == again.reason == pb.END_REASON_RELEASED
            ghost = pb.ReleaseRequest(session_id="never-held", lease_id=lease.lease_id, epoch=lease.epoch)
            err = await unary_error(acme.scheduler.Release(ghost, metadata=acme.md))
            assert err.code() in (Code.NOT_FOUND, Code.FAILED_PRECONDITION)
            call.cancel()

    asyncio.run(go())


@pytest.mark.parametrize(
    "failure",
    [
        errors.channel_full(3),
        errors.channel_slow_reader(100),
        errors.rate_limited("acme", "Acquire", "spec.rateLimits.tenant", 50, 50, 0.02),
        errors.flow_queue_full("acme", 64, 0.5),
        errors.streams_over_bound("Channel streams", "tenant acme", "spec.limits.channelsPerTenant", 64),
    ],
    ids=["channel_full", "slow_reader", "rate_limited", "flow_queue_full", "streams_over_bound"],
)
def test_every_resource_exhausted_says_when_to_retry(failure: errors.RpcFailure) -> None:
    assert failure.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    retry = dict(failure.metadata).get(errors.RETRY_AFTER_KEY)
    assert retry is not None and int(retry) > 0, failure.metadata
    assert dict(failure.session_error().trailers)[errors.RETRY_AFTER_KEY] == retry  # the Channel's too
