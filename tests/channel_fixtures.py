"""A raw Scheduler.Channel client for tests: send commands, read events, over real gRPC.

Kept apart from the tests so the Channel tests and the Redis tests share it. Use inside asyncio.run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from google.rpc import status_pb2

from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.api.gen.slotsched.v1 import scheduler_pb2_grpc


def cmd(ref: int = 0, **kind: Any) -> pb.ChannelCommand:
    """A ChannelCommand: `cmd(1, acquire=pb.AcquireRequest(...))`."""
    return pb.ChannelCommand(ref=ref, **kind)


def lease_of(ev: pb.ChannelEvent) -> Any:
    return ev.event.granted.lease


def unary_status(err: grpc.aio.AioRpcError) -> status_pb2.Status:
    """The google.rpc.Status a per-session rpc ended with (its details, decoded as a client does)."""
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    return status_pb2.Status(code=err.code().value[0], message=err.details() or "")


class RawChannel:
    """One open Channel call on its own grpc channel."""

    def __init__(self, target: str, md: tuple[tuple[str, str], ...]) -> None:
        self.grpc_channel = grpc.aio.insecure_channel(target)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.grpc_channel)
        self.call = self.stub.Channel(metadata=md)
        self.buffer: list[pb.ChannelEvent] = []

    async def send(self, *commands: pb.ChannelCommand) -> None:
        await self.call.write(pb.ChannelRequest(commands=list(commands)))

    async def next(self, timeout: float = 5.0) -> pb.ChannelEvent:
        """The next event (of any session); fails the test if the channel ends or none comes."""
        while not self.buffer:
            resp = await asyncio.wait_for(self.call.read(), timeout)
            assert resp is not grpc.aio.EOF, (
                f"channel ended: {await self.call.code()} {await self.call.details()}"
            )
            self.buffer.extend(resp.events)
        return self.buffer.pop(0)

    async def until(self, pred: Any, timeout: float = 5.0) -> pb.ChannelEvent:
        """Read events until one satisfies `pred(ev)`."""
        while True:
            ev = await self.next(timeout)
            if pred(ev):
                return ev

    async def event_of(self, session_id: str, kind: str, timeout: float = 5.0) -> pb.ChannelEvent:
        """The next lease event `kind` (queued, granted, ended, ...) of `session_id`."""

        def match(ev: pb.ChannelEvent) -> bool:
            return (
                ev.session_id == session_id and ev.HasField("event") and ev.event.WhichOneof("event") == kind
            )

        return await self.until(match, timeout)

    async def answer(self, ref: int, timeout: float = 5.0) -> pb.ChannelEvent:
        return await self.until(lambda ev: ev.ref == ref, timeout)

    async def status(self, timeout: float = 10.0) -> tuple[grpc.StatusCode, str]:
        """Read to the end; the channel's status."""
        try:
            while await asyncio.wait_for(self.call.read(), timeout) is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or ""
        return await self.call.code(), await self.call.details()

    async def close(self) -> None:
        self.call.cancel()
        await self.grpc_channel.close(None)
