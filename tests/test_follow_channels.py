"""The SDK's per-address gRPC channels do not pile up across failovers.

A NOT_LEADER refusal names the leader's address, which need not be a configured target (on
Kubernetes a pod IP, new after every restart); the client connects there. Before, it kept a
channel for every address ever named, so a long-lived client gained one per failover. Now the
channel of an address that is neither a target nor the leader is closed once no call or stream is
in flight on it (and not before: a stream still open there keeps it).

Fake replicas (grpc.aio servers on loopback) share a board saying which one leads; the others
refuse as a standby does, naming it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio

from scheduler.api.gen.slotsched.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler.api.wire import LEADER
from scheduler.client import AsyncClient


class _Replica(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, board: dict[str, Any]) -> None:
        self.board = board
        self.address = ""

    async def _lead(self, context: Any) -> None:
        leader = self.board["leader"]
        if leader != self.address:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "not the leader", trailing_metadata=((LEADER, leader),)
            )

    async def GetSession(self, request: Any, context: Any) -> scheduler_pb2.SessionState:  # noqa: N802
        await self._lead(context)
        return scheduler_pb2.SessionState(
            session_id=request.session_id, state=scheduler_pb2.SESSION_PHASE_QUEUED, tenant="t"
        )

    async def Acquire(self, request: Any, context: Any) -> None:  # noqa: N802
        await self._lead(context)
        await context.write(scheduler_pb2.LeaseEvent(queued=scheduler_pb2.Queued(position=1)))
        await asyncio.Event().wait()  # open until the client cancels


async def _within(check: Any, timeout: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


def test_a_client_followed_through_many_leaders_keeps_targets_plus_one_channels() -> None:
    async def body() -> None:
        board: dict[str, Any] = {"leader": ""}
        servers, replicas = [], []
        for _ in range(7):
            replica = _Replica(board)
            server = grpc.aio.server()
            scheduler_pb2_grpc.add_SchedulerServicer_to_server(replica, server)
            replica.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
            await server.start()
            servers.append(server)
            replicas.append(replica)
        target = replicas[0].address  # the one configured address: a standby from now on
        try:
            async with AsyncClient(target, tenant="t", multiplex=False) as client:
                follower = client._follower
                for leader in replicas[1:5]:  # four failovers, each to an address never configured
                    board["leader"] = leader.address
                    await client.get_session("s")
                    assert client.leader == leader.address
                    await _within(lambda: len(follower._channels) <= 2)
                    assert set(follower._channels) == {target, leader.address}

                # A stream in flight on the old leader keeps its channel open until it ends.
                stream = client.stub().Acquire(scheduler_pb2.AcquireRequest(session_id="s"))
                first = await asyncio.wait_for(stream.read(), 5)
                assert first.WhichOneof("event") == "queued"
                old = client.leader
                board["leader"] = replicas[5].address
                await client.get_session("s")
                assert client.leader == replicas[5].address
                await asyncio.sleep(0.1)
                assert old in follower._channels  # not closed under the open stream
                assert await client.get_session("s") is not None  # the leader is still served
                stream.cancel()
                await _within(lambda: old not in follower._channels)
                assert set(follower._channels) == {target, replicas[5].address}

                # Back to the configured target as leader: its channel was kept all along.
                board["leader"] = target
                await client.get_session("s")
                await _within(lambda: set(follower._channels) == {target})
        finally:
            for server in servers:
                await server.stop(0)

    asyncio.run(body())
