"""Pool selection on the wire, refused and placed (issue 24): real gRPC over loopback to the
three-pool platform of `pools_policy_yaml` (one static worker a pool: cpu-a 2 slots, cpu-b 1,
gpu 1), raw stubs on the per-session Acquire. A table of refusals, each with its status, the
BadRequest field or ErrorInfo reason and the words naming what was wrong; placement that never
lands where the request did not ask; the other tenant; garbage bytes."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import grpc
import grpc.aio
import pytest
from google.rpc import error_details_pb2, status_pb2

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from tests.grpc_fixtures import TOKENS, Client, pools_policy_yaml, running_server, until
from tests.test_hostile_input import raw_call

B = common_pb2.QOS_CLASS_BURSTABLE
ICELAKE = common_pb2.SnapshotRef(uri="file:///snaps/acme/r1/1", pool="cpu-a", labels={"cpuModel": "icelake"})


@pytest.fixture(scope="module")
def target() -> Any:
    with running_server(pools_policy_yaml()) as server:
        yield server.target


def details(err: grpc.aio.AioRpcError) -> tuple[list[str], str]:
    """(BadRequest fields, ErrorInfo reason) of a refusal."""
    fields: list[str] = []
    reason = ""
    for key, value in err.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for any_ in status.details:
            if any_.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                any_.Unpack(bad)
                fields += [v.field for v in bad.field_violations]
            elif any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                any_.Unpack(info)
                reason = info.reason
    return fields, reason


async def refusal(target: str, token: str, **request: Any) -> tuple[grpc.StatusCode, list[str], str, str]:
    async with Client(target, token) as c:
        call = c.acquire(f"r-{os.urandom(4).hex()}", request.pop("qos", B), **request)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await until(call, "granted")
        err = refused.value
        fields, reason = details(err)
        return err.code(), fields, reason, err.details() or ""


S = grpc.StatusCode
# (case, token, request, status, BadRequest field or ErrorInfo reason, words in the message)
REFUSALS: list[tuple[str, str, dict[str, Any], grpc.StatusCode, str, str]] = [
    ("unknown pool", "acme", {"pool": "nowhere"}, S.INVALID_ARGUMENT, "pool", "nowhere"),
    ("unknown fallback", "acme", {"pool": "gpu", "fallback_pools": ["cpu-a", "tpu"]}, S.INVALID_ARGUMENT,
     "fallback_pools", "tpu"),
    ("empty fallback entry", "acme", {"pool": "gpu", "fallback_pools": ["cpu-a", ""]}, S.INVALID_ARGUMENT,
     "fallback_pools", "entry 1"),
    ("fallback listed twice", "acme", {"pool": "gpu", "fallback_pools": ["cpu-a", "cpu-a"]},
     S.INVALID_ARGUMENT, "fallback_pools", "twice"),
    ("65 fallback entries", "acme", {"pool": "gpu", "fallback_pools": [f"p{i}" for i in range(65)]},
     S.INVALID_ARGUMENT, "fallback_pools", "64"),
    ("no pool named of several", "acme", {}, S.INVALID_ARGUMENT, "pool", "pool"),
    ("a pool and a selector", "acme", {"pool": "gpu", "selector": {"kind": "gpu"}}, S.INVALID_ARGUMENT,
     "selector", "not both"),
    ("a selector with an empty key", "acme", {"selector": {"": "x"}}, S.INVALID_ARGUMENT,
     "selector", "empty"),
    ("a selector matching nothing", "acme", {"selector": {"kind": "tpu"}}, S.FAILED_PRECONDITION,
     "NO_ELIGIBLE_POOL", "kind=tpu"),
    ("no quota in the pool", "globex", {"pool": "gpu"}, S.PERMISSION_DENIED, "NO_QUOTA", "gpu"),
    ("no Burstable quota anywhere", "batch", {"pool": "cpu-a"}, S.PERMISSION_DENIED, "NO_QUOTA", "cpu-a"),
    # A snapshot of cpuModel=icelake resumes only where that holds: cpu-b has sapphire.
    ("a snapshot named onto an incompatible pool", "acme", {"pool": "cpu-b", "resume_from": ICELAKE},
     S.FAILED_PRECONDITION, "NO_ELIGIBLE_POOL", "icelake"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "token", "request_", "status", "detail", "words"), REFUSALS,
                         ids=[r[0] for r in REFUSALS])  # fmt: skip
def test_refusals_name_what_was_wrong(
    target: str,
    case: str,
    token: str,
    request_: dict[str, Any],
    status: grpc.StatusCode,
    detail: str,
    words: str,
) -> None:
    code, fields, reason, message = asyncio.run(refusal(target, TOKENS[token], **request_))
    assert code is status, (case, message)
    if status is S.INVALID_ARGUMENT:
        assert fields == [detail], (case, fields, message)
    else:
        assert reason == detail, (case, reason, message)
    assert words in message, (case, message)


def test_placement_never_lands_where_it_was_not_asked(target: str) -> None:
    async def go() -> None:
        async with Client(target, TOKENS["acme"]) as c:
            gpu = c.acquire("p-gpu", B, pool="gpu")
            assert (await until(gpu, "granted")).granted.lease.pool == "gpu"
            # gpu is full and cpu-a idle: a selector of kind=gpu still waits in gpu.
            wait = c.acquire("p-wait", B, selector={"kind": "gpu"})
            queued = (await until(wait, "queued")).queued
            assert (queued.pool, queued.reason) == ("gpu", "tenant_quota")
            got = await c.scheduler.GetSession(
                scheduler_pb2.GetSessionRequest(session_id="p-wait"), metadata=c.md
            )
            assert (got.pool, got.wait_reason) == ("gpu", "tenant_quota")
            # With a fallback it is granted in the fallback with room, in order.
            fb = c.acquire("p-fb", B, pool="gpu", fallback_pools=["cpu-b", "cpu-a"])
            assert (await until(fb, "granted")).granted.lease.pool == "cpu-b"
            # A snapshot of icelake with a selector both CPU pools match goes to cpu-a only.
            rs = c.acquire("p-resume", B, selector={"kind": "cpu"}, resume_from=ICELAKE)
            assert (await until(rs, "granted")).granted.lease.pool == "cpu-a"
            # The other tenant sees none of it.
            async with Client(target, TOKENS["globex"]) as g:
                with pytest.raises(grpc.aio.AioRpcError) as other:
                    await g.scheduler.GetSession(
                        scheduler_pb2.GetSessionRequest(session_id="p-gpu"), metadata=g.md
                    )
                assert other.value.code() is S.NOT_FOUND
            for call in (gpu, wait, fb, rs):
                call.cancel()

    asyncio.run(go())


def test_garbage_bytes_are_refused_and_the_server_serves_on(target: str) -> None:
    async def go() -> None:
        md = (("authorization", f"Bearer {TOKENS['acme']}"),)
        async with grpc.aio.insecure_channel(target) as channel:
            for body in (os.urandom(64), b"\x3a\xff\xff\xff\xff\x0f" + os.urandom(16), b"\x2a\x05gp"):
                code, _ = await raw_call(channel, "/slotsched.v1.Scheduler/Acquire", True, body, md)
                assert code is S.INVALID_ARGUMENT, body
        async with Client(target, TOKENS["acme"]) as c:
            ok = c.acquire("after-garbage", B, pool="cpu-a")
            assert (await until(ok, "granted")).granted.lease.pool == "cpu-a"
            ok.cancel()

    asyncio.run(go())
