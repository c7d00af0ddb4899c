"""`Follower.route` (scheduler/client/follow.py): per-pool routes of one client share its
channels, each follows its own pool's leader, and a NOT_LEADER naming a pool moves that pool's
route only. Real grpc.aio channels (opened, never called: nothing listens)."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import scheduler_pb2_grpc
from scheduler.client.follow import Follower, pool_named

A, B, C = "127.0.0.1:1", "127.0.0.1:2", "10.9.9.9:3"


def _not_leader(pool: str, leader: str) -> grpc.aio.AioRpcError:
    trailers = grpc.aio.Metadata((wire.LEADER, leader), (wire.POOL, pool))
    details = f"not the leader of pool {pool!r}: its leader is at {leader}"
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), trailers, details)


def test_routes_share_channels_and_a_refusal_moves_only_its_pools_route() -> None:
    async def main() -> None:
        root = Follower([A, B], [], None)
        cpu, gpu = root.route("cpu"), root.route("gpu")
        assert root.route("cpu") is cpu and root.route("") is root
        stub = scheduler_pb2_grpc.SchedulerStub
        assert cpu.stub(stub) is gpu.stub(stub) is root.stub(stub)  # one channel for A
        assert len(root._channels) == 1
        err = _not_leader("gpu", C)
        assert pool_named(err) == "gpu"
        # The cpu route was told about gpu's leader: gpu's route moves, cpu's stays.
        assert cpu.failed(A, err) is None
        assert (cpu.current, gpu.current, root.current) == (A, C, A)
        # gpu's route going to C opens one more channel, shared by every route going there.
        gpu.stub(stub)
        assert set(root._channels) == {A, C}
        # C is no target, but gpu's route leads there: the channel stays while it does.
        root._prune()
        assert C in root._channels
        # gpu's own refusal naming B: it moves itself (at once), nobody else.
        assert gpu.failed(C, _not_leader("gpu", B)) == 0.0
        assert (cpu.current, gpu.current, root.current) == (A, B, A)
        root._prune()
        assert C not in root._channels  # no route leads there now, nothing in flight
        await root.close()

    asyncio.run(main())
