"""Token budgets over real gRPC: RequestPermit and SettlePermit as unary rpcs and on the Channel,
the session and tenant checks, hostile estimates, the queue caps, a former leader's permit."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from tests.budget_fixtures import BUDGET, budget_policy_yaml, permit_request, settle_request
from tests.grpc_fixtures import BE, TOKENS, B, Client, ServerThread, next_event, running_server, until


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_server(budget_policy_yaml(max_pending_per_tenant=3, workers=3, slots_per_worker=2)) as s:
        yield s


def _reason(err: grpc.aio.AioRpcError) -> str:
    for k, v in err.trailing_metadata() or ():
        if k == wire.DETAILS:
            st = status_pb2.Status.FromString(v)
            for d in st.details:
                info = error_details_pb2.ErrorInfo()
                if d.Unpack(info):
                    return info.reason
    return ""


async def _session(c: Client, sid: str, qos: int = B) -> Any:
    """A live session (queued or holding: a permit asks only that)."""
    call = c.acquire(sid, qos)
    await next_event(call)
    return call


async def _refused(coro: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await coro
    return e.value


def test_a_permit_is_granted_settled_once_and_refunds_the_difference(server: ServerThread) -> None:
    async def main() -> None:
        async with Client(server.target, TOKENS["acme"]) as c:
            call = await _session(c, "s1")
            ev = await asyncio.wait_for(c.scheduler.RequestPermit(permit_request("s1"), metadata=c.md), 10)
            assert ev.WhichOneof("state") == "granted" and ev.budget == BUDGET and ev.permit_id
            done = await c.scheduler.SettlePermit(settle_request("s1", ev.permit_id, 30, 20), metadata=c.md)
            assert (done.charged.input_tokens, done.charged.output_tokens) == (30, 20)
            assert (done.refunded.input_tokens, done.refunded.output_tokens) == (70, 80)
            assert not done.orphan
            again = await _refused(
                c.scheduler.SettlePermit(settle_request("s1", ev.permit_id), metadata=c.md)
            )
            assert again.code() is grpc.StatusCode.FAILED_PRECONDITION and _reason(again) == "PERMIT_CLOSED"
            call.cancel()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("inp", "field"),
    [(-1.0, "estimate.input_tokens"), (math.nan, "estimate.input_tokens"),
     (math.inf, "estimate.input_tokens"), (1e12, "estimate.input_tokens"), (1e6, "estimate")],
)  # fmt: skip
def test_hostile_estimates_are_refused_naming_the_field(server: ServerThread, inp: float, field: str) -> None:
    async def main() -> None:
        async with Client(server.target, TOKENS["acme"]) as c:
            call = await _session(c, "hostile")
            err = await _refused(c.scheduler.RequestPermit(permit_request("hostile", inp), metadata=c.md))
            assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err.details()
            assert (err.details() or "").startswith(field + ":"), err.details()
            call.cancel()

    asyncio.run(main())


def test_refusals_by_reason(server: ServerThread) -> None:
    async def main() -> None:
        async with Client(server.target, TOKENS["acme"]) as c, Client(server.target, TOKENS["batch"]) as b:
            nosession = await _refused(c.scheduler.RequestPermit(permit_request("nobody"), metadata=c.md))
            assert nosession.code() is grpc.StatusCode.NOT_FOUND
            call = await _session(c, "r1")
            unknown = await _refused(
                c.scheduler.RequestPermit(permit_request("r1", budget="x"), metadata=c.md)
            )
            assert (
                unknown.code() is grpc.StatusCode.FAILED_PRECONDITION and _reason(unknown) == "UNKNOWN_BUDGET"
            )
            bcall = await _session(b, "r1", BE)
            noshare = await _refused(b.scheduler.RequestPermit(permit_request("r1"), metadata=b.md))
            assert (
                noshare.code() is grpc.StatusCode.PERMISSION_DENIED and _reason(noshare) == "NO_BUDGET_SHARE"
            )
            call.cancel()
            bcall.cancel()

    asyncio.run(main())


def test_another_tenant_or_session_cannot_settle_a_permit(server: ServerThread) -> None:
    async def main() -> None:
        async with Client(server.target, TOKENS["acme"]) as a, Client(server.target, TOKENS["globex"]) as g:
            acall, gcall, other = await _session(a, "x1"), await _session(g, "x1"), await _session(a, "x2")
            ev = await asyncio.wait_for(a.scheduler.RequestPermit(permit_request("x1"), metadata=a.md), 10)
            for client, sid in ((g, "x1"), (a, "x2")):  # the same session id of another tenant; a sibling
                err = await _refused(
                    client.scheduler.SettlePermit(settle_request(sid, ev.permit_id), metadata=client.md)
                )
                assert (
                    err.code() is grpc.StatusCode.FAILED_PRECONDITION and _reason(err) == "PERMIT_NOT_OWNER"
                )
            ok = await a.scheduler.SettlePermit(settle_request("x1", ev.permit_id), metadata=a.md)
            assert ok.charged.input_tokens == 50
            for call in (acall, gcall, other):
                call.cancel()

    asyncio.run(main())


def test_a_former_leaders_permit_is_charged_as_a_debt(server: ServerThread) -> None:
    async def main() -> None:
        async with Client(server.target, TOKENS["acme"]) as c:
            call = await _session(c, "o1")
            req = settle_request("o1", "0000feed.7", 400, 100, budget=BUDGET)
            done = await c.scheduler.SettlePermit(req, metadata=c.md)
            assert done.orphan and done.charged.input_tokens == 400 and done.refunded.input_tokens == -400
            call.cancel()

    asyncio.run(main())


def test_on_the_channel_a_waiting_permit_is_granted_on_its_ref_and_the_flood_is_capped(
    server: ServerThread,
) -> None:
    """A permit of 5,000 tokens waits (every bucket starts empty), answered `queued` then
    `granted` on its ref; the tenant's fourth waiting permit is refused (maxPendingPerTenant 3)."""

    async def main() -> None:
        async with Client(server.target, TOKENS["acme"]) as c:
            call = await _session(c, "ch1")
            stream = c.scheduler.Channel(metadata=c.md)
            cmds = [
                scheduler_pb2.ChannelCommand(ref=10 + i, request_permit=permit_request("ch1", 4000, 1000))
                for i in range(4)
            ]
            await stream.write(scheduler_pb2.ChannelRequest(commands=cmds))
            seen: dict[int, list[str]] = {}
            while len(seen.get(10, [])) < 2:
                resp = await asyncio.wait_for(stream.read(), 20)
                for ev in resp.events:
                    kind = ev.WhichOneof("kind")
                    state = ev.permit.WhichOneof("state") if kind == "permit" else kind
                    seen.setdefault(ev.ref, []).append(state)
                    if kind == "error":
                        assert (
                            ev.ref == 13
                            and ev.error.status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
                        )
                        assert int(ev.error.trailers[wire.RETRY_AFTER_MS]) >= 1000
            assert seen[10] == ["queued", "granted"], seen
            assert seen[13] == ["error"], seen
            await stream.done_writing()
            call.cancel()

    asyncio.run(main())


def test_a_waiting_permit_is_withdrawn(server: ServerThread) -> None:
    async def main() -> None:
        async with Client(server.target, TOKENS["globex"]) as c:
            call = await _session(c, "w1")
            stream = c.scheduler.Channel(metadata=c.md)
            cmd = scheduler_pb2.ChannelCommand(ref=1, request_permit=permit_request("w1", 20000, 4000))
            await stream.write(scheduler_pb2.ChannelRequest(commands=[cmd]))
            first = (await asyncio.wait_for(stream.read(), 10)).events[0]
            assert first.permit.WhichOneof("state") == "queued" and first.permit.queued.reason
            withdraw = scheduler_pb2.SettlePermitRequest(
                session_id="w1", permit_id=first.permit.permit_id, withdraw=True
            )
            await stream.write(
                scheduler_pb2.ChannelRequest(
                    commands=[scheduler_pb2.ChannelCommand(ref=2, settle_permit=withdraw)]
                )
            )
            # Both refs are answered: the waiting request's ends PERMIT_CLOSED (its wait is
            # over), the settle's says withdrawn; in either order, in one message or two.
            events: dict[int, Any] = {}
            while len(events) < 2:
                for ev in (await asyncio.wait_for(stream.read(), 10)).events:
                    events[ev.ref] = ev
            assert events[2].settled.withdrawn, events
            assert events[1].WhichOneof("kind") == "error", events
            assert "withdrawn by its session" in events[1].error.status.message, events
            await stream.done_writing()
            call.cancel()

    asyncio.run(main())


def test_describe_pool_and_status_show_each_budget(server: ServerThread) -> None:
    from scheduler.api.gen.slotsched.v1 import admin_pb2
    from scheduler.cli.status_table import render
    from tests.grpc_fixtures import ADMIN_TOKEN

    async def main() -> admin_pb2.DescribePoolResponse:
        async with Client(server.target, ADMIN_TOKEN) as c:
            return await c.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=c.md)

    pool = asyncio.run(main())
    (b,) = pool.budgets
    assert b.name == BUDGET and b.factor == 1.0 and b.limits_per_minute[3] == 60_000
    text = render(pool)
    assert "budget" in text and "total 60,000" in text and "100%" in text, text


def test_a_sessions_end_ends_its_waiting_permit_on_its_ref() -> None:
    """A permit waits on the Channel; its session is released: the permit's ref is answered
    PERMIT_CLOSED (its wait is over), not left to wait for a grant that will never come. A
    server of its own: its buckets start empty, so the permit surely waits."""

    async def main(target: str) -> None:
        async with Client(target, TOKENS["globex"]) as c:
            call = c.acquire("end1", B)
            lease = (await until(call, "granted")).granted.lease
            stream = c.scheduler.Channel(metadata=c.md)
            cmd = scheduler_pb2.ChannelCommand(ref=1, request_permit=permit_request("end1", 20000, 4000))
            await stream.write(scheduler_pb2.ChannelRequest(commands=[cmd]))
            first = (await asyncio.wait_for(stream.read(), 10)).events[0]
            assert first.ref == 1 and first.permit.WhichOneof("state") == "queued"
            release = scheduler_pb2.ReleaseRequest(
                session_id="end1", lease_id=lease.lease_id, epoch=lease.epoch
            )
            await stream.write(
                scheduler_pb2.ChannelRequest(commands=[scheduler_pb2.ChannelCommand(ref=2, release=release)])
            )
            answers: dict[int, Any] = {}
            while 1 not in answers:
                for ev in (await asyncio.wait_for(stream.read(), 10)).events:
                    answers[ev.ref] = ev
            ended = answers[1]
            assert ended.WhichOneof("kind") == "error", ended
            assert ended.error.status.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
            assert "session ended" in ended.error.status.message
            await stream.done_writing()
            call.cancel()

    with running_server(budget_policy_yaml(workers=1, slots_per_worker=2)) as s:
        asyncio.run(main(s.target))
