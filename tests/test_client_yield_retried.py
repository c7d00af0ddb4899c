"""A Yield retried after the leader applied it: the yield is done, not a callback error.

What a failover can do: the leader applies a session's Yield (the lease ends YIELDED, the session is
queued again, maybe re-granted) and dies before answering; the SDK sends the Yield again, to the new
leader, which refuses it FAILED_PRECONDITION (stale epoch). Before, that refusal landed in the
session's `callback_errors` although the state was right. Now the SDK reads the session back and,
the lease yielded, counts the yield as done (as it does for a Release retried after it applied).

Here the server stays up: the first Yield is applied on another connection while the client's are
cut (its stream detached, and kept so until the retry: nothing tells it of the yield) and answered
UNAVAILABLE, as a dying leader's; the SDK's own retry then meets the stale epoch.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.client import AsyncClient, Phase, QoS, SnapshotRef
from scheduler.client.mux import rpc_error
from tests.grpc_fixtures import TOKENS, Client, running_server
from tests.test_client_sdk import CuttableProxy, _one_slot_policy

ACME = TOKENS["acme"]
BATCH = TOKENS["batch"]


class _NoLeaderYet:
    """An Acquire answered UNAVAILABLE at once (no leader serves yet): the stream backs off."""

    def __aiter__(self) -> Any:
        return self._events()

    async def _events(self) -> Any:
        raise rpc_error(grpc.StatusCode.UNAVAILABLE, "no leader yet")
        yield  # an async generator

    def cancel(self) -> bool:
        return True


class _AnswerLost:
    """The client's session transport, whose first Yield is applied elsewhere and answered UNAVAILABLE;
    the stream cannot re-attach until the Yield is sent again."""

    def __init__(self, real: Any, apply: Any) -> None:
        self._real = real
        self._apply = apply
        self.yields = 0

    def attach(self, request: Any, metadata: Any) -> Any:
        if self.yields == 1:
            return _NoLeaderYet()
        return self._real().attach(request, metadata)

    async def send(self, command: Any, request: Any, metadata: Any, timeout: float) -> Any:
        if command.rpc == "Yield":
            self.yields += 1
            if self.yields == 1:
                await self._apply(request)
                raise rpc_error(grpc.StatusCode.UNAVAILABLE, "the leader died before answering")
        return await self._real().send(command, request, metadata, timeout)


@pytest.mark.parametrize("with_snapshot", [True, False], ids=["checkpoint", "no-on_yield"])
@pytest.mark.parametrize("multiplex", [True, False], ids=["channel", "per-session"])
def test_a_yield_retried_after_it_was_applied_is_done(
    multiplex: bool, with_snapshot: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = _one_slot_policy(yield_grace_s=20)
    ref = SnapshotRef(uri="file:///tmp/slotsched-test/ckpt-1")
    with running_server(policy) as server:

        async def body() -> None:
            proxy = await CuttableProxy(server.port).start()
            try:
                async with (
                    AsyncClient(
                        f"127.0.0.1:{proxy.port}", token=BATCH, backoff_initial_s=0.05, multiplex=multiplex
                    ) as client,
                    AsyncClient(server.target, token=BATCH) as direct,
                    AsyncClient(server.target, token=ACME) as acme,
                    Client(server.target, BATCH) as raw,
                ):

                    async def leader_applies(request: scheduler_pb2.YieldRequest) -> None:
                        proxy.cut()
                        await s.wait_until(lambda s: not s._attached, 5)
                        await raw.scheduler.Yield(request, metadata=raw.md, timeout=5)

                    stub = _AnswerLost(client.transport, leader_applies)
                    monkeypatch.setattr(client, "transport", lambda: stub)

                    async def on_yield(lease: Any) -> SnapshotRef:
                        return ref

                    s = client.session("y", QoS.BESTEFFORT, on_yield=on_yield if with_snapshot else None)
                    await s.wait_granted(5)
                    g = acme.session("g", QoS.GUARANTEED)  # preempts y: YieldRequested
                    g.start()
                    await g.wait_granted(10)  # the slot went on: y's yield was applied
                    await s.wait_until(lambda s: s.yields >= 1 or bool(s.callback_errors), 10)

                    assert stub.yields == 2  # retried, and the retry refused as stale
                    if with_snapshot:
                        assert s.callback_errors == []  # before: [StaleLease(... is stale ...)]
                        assert s.yields == 1 and s.lease is None and s.phase is Phase.QUEUED
                        assert not s.lost_lease.is_set()
                        assert s.resume_from == ref
                    else:
                        # Without a checkpoint, a yield applied and a revocation look alike from
                        # the client: the stale refusal is reported, not guessed away.
                        assert len(s.callback_errors) == 1 and "stale" in str(s.callback_errors[0])
                        await s.wait_until(lambda s: s.lease is None, 10)
                    info = await direct.get_session("y")
                    assert info.phase is Phase.QUEUED
                    await g.release()
                    await s.wait_granted(15)  # re-attached, and granted the slot again
                    if with_snapshot:
                        assert s.lease is not None and s.lease.resume_from == ref
                    await s.release()
            finally:
                await proxy.close()

        asyncio.run(body())


@pytest.mark.parametrize("multiplex", [True, False], ids=["channel", "per-session"])
def test_a_yield_retried_after_the_lease_was_revoked_still_brings_its_snapshot(
    multiplex: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first Yield never arrived, and the yield deadline passed meanwhile: the lease was
    revoked (not yielded) and the session re-queued from its previous snapshot. The retry quotes
    the revoked lease while the session still waits: a late snapshot, which the scheduler keeps
    as the one the session resumes from (docs/design.md, "Checkpoint-and-yield preemption")."""
    ref = SnapshotRef(uri="file:///tmp/slotsched-test/ckpt-late")
    with running_server(_one_slot_policy(yield_grace_s=0.5)) as server:

        async def body() -> None:
            proxy = await CuttableProxy(server.port).start()
            try:
                async with (
                    AsyncClient(
                        f"127.0.0.1:{proxy.port}", token=BATCH, backoff_initial_s=0.05, multiplex=multiplex
                    ) as client,
                    AsyncClient(server.target, token=BATCH) as direct,
                    AsyncClient(server.target, token=ACME) as acme,
                ):

                    async def lost_until_revoked(request: scheduler_pb2.YieldRequest) -> None:
                        proxy.cut()
                        await s.wait_until(lambda s: not s._attached, 5)
                        loop = asyncio.get_running_loop()
                        end = loop.time() + 10
                        while (await direct.get_session("y")).lease is not None:
                            assert loop.time() < end, "the lease was not revoked"
                            await asyncio.sleep(0.05)

                    stub = _AnswerLost(client.transport, lost_until_revoked)
                    monkeypatch.setattr(client, "transport", lambda: stub)

                    async def on_yield(lease: Any) -> SnapshotRef:
                        return ref

                    s = client.session("y", QoS.BESTEFFORT, on_yield=on_yield)
                    await s.wait_granted(5)
                    g = acme.session("g", QoS.GUARANTEED)
                    g.start()
                    loop = asyncio.get_running_loop()
                    end = loop.time() + 15
                    while (await direct.get_session("y")).last_snapshot != ref:
                        assert loop.time() < end and not s.callback_errors, s.callback_errors
                        await asyncio.sleep(0.05)
                    assert stub.yields == 2 and not s.callback_errors
                    await g.release()
            finally:
                await proxy.close()

        asyncio.run(body())
