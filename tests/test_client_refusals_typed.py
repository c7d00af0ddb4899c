"""Issue 20 item 8: refusals that share a gRPC status are told apart by the server's ErrorInfo
reason, so the SDK's exception names say what happened: a bad token is `PermissionDenied` (not
`NoQuota`), a rate-limited call `RateLimited` (not `QueueFull`), no credential `Unauthenticated`;
`NoQuota` stays for a zero quota and `QueueFull` for a full queue.

The wire errors are the server's own (its builders in scheduler/server/errors.py, and a real
server), so a change of reason on either side fails here.
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from scheduler.client import (
    AsyncClient,
    NoQuota,
    NotFound,
    PermissionDenied,
    QoS,
    QueueFull,
    RateLimited,
    ResourceExhausted,
    SlotschedError,
    Unauthenticated,
    from_rpc_error,
)
from scheduler.core.types import Refused, RefuseReason
from scheduler.server import errors as server_errors
from tests.grpc_fixtures import TOKENS, policy_yaml, running_server


def _as_raised(failure: server_errors.RpcFailure) -> grpc.aio.AioRpcError:
    """The AioRpcError a client gets for `failure` (status, message and trailing metadata)."""
    md = grpc.aio.Metadata(*failure.trailing_metadata())
    return grpc.aio.AioRpcError(failure.code, grpc.aio.Metadata(), md, failure.message, None)


def _refused(reason: RefuseReason) -> server_errors.RpcFailure:
    return server_errors.from_refused(Refused("s", reason, "no", retry_after_s=1.5), "acme")


@pytest.mark.parametrize(
    ("failure", "cls", "reason"),
    [
        (_refused(RefuseReason.NO_QUOTA), NoQuota, "NO_QUOTA"),
        (_refused(RefuseReason.UNKNOWN_TENANT), PermissionDenied, "UNKNOWN_TENANT"),
        (server_errors.permission_denied("unknown token"), PermissionDenied, "CREDENTIAL_DENIED"),
        (server_errors.unauthenticated("missing credential"), Unauthenticated, None),
        (server_errors.rate_limited("acme", "GetSession", "k", 1.0, 2, 0.25), RateLimited, "RATE_LIMITED"),
        (_refused(RefuseReason.QUEUE_FULL), QueueFull, "QUEUE_FULL"),
        (_refused(RefuseReason.TENANT_QUEUE_FULL), QueueFull, "TENANT_QUEUE_FULL"),
    ],
)
def test_the_servers_refusals_map_to_their_own_class(
    failure: server_errors.RpcFailure, cls: type[SlotschedError], reason: str | None
) -> None:
    err = from_rpc_error(_as_raised(failure))
    assert type(err) is cls, (failure.reason, err)
    assert err.code is failure.code and failure.message in str(err)
    if reason is not None:
        assert isinstance(err, (PermissionDenied, ResourceExhausted)) and err.reason == reason
    if isinstance(err, ResourceExhausted):
        assert err.retry_after_s is not None and err.retry_after_s > 0


def test_the_class_tree_keeps_old_handlers_working() -> None:
    # A zero quota is a permission refusal: `except PermissionDenied` sees it too.
    assert issubclass(NoQuota, PermissionDenied)
    # Both kinds of RESOURCE_EXHAUSTED carry retry_after_s on one base; neither is the other.
    assert issubclass(QueueFull, ResourceExhausted) and issubclass(RateLimited, ResourceExhausted)
    assert not issubclass(RateLimited, QueueFull) and not issubclass(PermissionDenied, NoQuota)
    # Without an ErrorInfo (an older server), the status alone: the old, general classes.
    bare = grpc.aio.AioRpcError(
        grpc.StatusCode.PERMISSION_DENIED, grpc.aio.Metadata(), grpc.aio.Metadata(), "no", None
    )
    assert type(from_rpc_error(bare)) is PermissionDenied
    garbled = grpc.aio.Metadata(("grpc-status-details-bin", b"\xff\xff not a status"))
    exhausted = grpc.aio.AioRpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(), garbled, "full", None
    )
    assert type(from_rpc_error(exhausted)) is QueueFull


@pytest.mark.parametrize("multiplex", [True, False])
def test_a_real_servers_refusals_are_named_for_what_happened(multiplex: bool) -> None:
    """Against the real server, on either wire shape: each refusal raises its own class."""
    policy = policy_yaml(
        workers=1,
        slots_per_worker=1,
        floor=0,
        max_pending_per_tenant=1,
        rate_limits={"tenant": {"qps": 0.01, "burst": 8}},  # each tenant's Acquire + GetSession
    )
    with running_server(policy) as server:

        async def body() -> None:
            async with AsyncClient(server.target, token="not-a-token", multiplex=multiplex) as bad:
                with pytest.raises(PermissionDenied) as denied:
                    async with bad.session("bad-token", QoS.BURSTABLE):
                        pytest.fail("entered with a token the policy does not list")
                assert not isinstance(denied.value, NoQuota) and denied.value.reason == "CREDENTIAL_DENIED"
            async with AsyncClient(server.target, multiplex=multiplex) as nobody:
                with pytest.raises(Unauthenticated):
                    async with nobody.session("no-token", QoS.BURSTABLE):
                        pytest.fail("entered without a credential")
            async with AsyncClient(server.target, token=TOKENS["globex"], multiplex=multiplex) as globex:
                with pytest.raises(NoQuota) as no_quota:  # globex has no Guaranteed quota
                    async with globex.session("no-quota", QoS.GUARANTEED):
                        pytest.fail("entered a class with a zero quota")
                assert no_quota.value.reason == "NO_QUOTA"
                async with globex.session("holder", QoS.BURSTABLE):
                    waiter = globex.session("waiter", QoS.BURSTABLE)
                    waiter.start()
                    await waiter.wait_until(lambda s: s.queue is not None, 5)
                    with pytest.raises(QueueFull) as full:  # the tenant's queue cap is 1
                        async with globex.session("one-too-many", QoS.BURSTABLE):
                            pytest.fail("queued past the tenant cap")
                    assert not isinstance(full.value, RateLimited)
                    await waiter.release()
            async with AsyncClient(server.target, token=TOKENS["acme"], multiplex=multiplex) as acme:
                seen: list[type[SlotschedError]] = []
                for _ in range(12):  # past the burst of 8: refused by the rate limit
                    try:
                        await acme.get_session("nobody")
                    except (NotFound, RateLimited) as e:
                        seen.append(type(e))
                        if isinstance(e, RateLimited):
                            assert e.retry_after_s is not None and e.retry_after_s > 1
                            assert not isinstance(e, QueueFull) and e.reason == "RATE_LIMITED"
                            break
                assert seen[-1] is RateLimited and set(seen[:-1]) == {NotFound}, seen
                # A new session past the limit: its refusal, from entering it, says so too.
                with pytest.raises(RateLimited):
                    async with acme.session("limited", QoS.BURSTABLE):
                        pytest.fail("acquired past the rate limit")

        asyncio.run(body())
