"""A channel ended by any status that is not a verdict on the client ends its sessions'
streams UNAVAILABLE, so each re-attaches (the server keeps them): the server ends a channel whose
reader fell behind RESOURCE_EXHAUSTED, grpc one that died under a write INTERNAL. A credential
refused, or a command the wire guard refused (INVALID_ARGUMENT), is passed on as it is. (Found
by review: every session of the client failed for good.)"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.client import mux
from scheduler.client.channel import REATTACH_CODES


class _Call:
    """A Channel call that ends with `code` once the first command is written."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code
        self.written = asyncio.Event()

    async def write(self, message: Any) -> None:
        self.written.set()

    async def read(self) -> Any:
        await self.written.wait()
        raise mux.rpc_error(self.code, f"channel ended {self.code.name}")

    def cancel(self) -> bool:
        return True


class _Client:
    metadata: tuple[tuple[str, str], ...] = ()

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code

    def open_channel(self) -> _Call:
        return _Call(self.code)


@pytest.mark.parametrize(
    ("ended", "seen"),
    [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE),
        # the guard refused a command: sending it again would fail again (it stays documented
        # that one malformed command ends the whole channel)
        (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT),
        (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE),
        (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE),
        (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED),
        (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED),
    ],
)
def test_a_channel_ended_by_the_server_makes_its_sessions_reattach(
    ended: grpc.StatusCode, seen: grpc.StatusCode
) -> None:
    async def body() -> None:
        m = mux.SessionMux(_Client(ended))  # type: ignore[arg-type]
        call = m.acquire(pb.AcquireRequest(session_id="s1"))
        renew = asyncio.create_task(m.command(5, renew=pb.RenewRequest(session_id="s2")))
        with pytest.raises(grpc.aio.AioRpcError) as stream_end:
            async for _ in call:
                pass
        with pytest.raises(grpc.aio.AioRpcError) as renew_end:
            await renew
        assert stream_end.value.code() is seen and renew_end.value.code() is seen
        assert (seen in REATTACH_CODES) is (seen is grpc.StatusCode.UNAVAILABLE)
        await m.close()

    asyncio.run(body())
