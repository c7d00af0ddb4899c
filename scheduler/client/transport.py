"""`SessionTransport`: the few calls a session makes, whatever carries them.

Why: a session's commands travel either on the client's multiplexed `Scheduler.Channel` stream
(`mux.SessionMux`) or as per-session rpcs (`RpcTransport`), and the session's parts (`attach`,
`calls`) must not know which. They used to call a Scheduler stub's methods, and the multiplexer
impersonated that stub (a `MuxStub` answering `Acquire`, `Renew`, ... by `__getattr__`). Now both
shapes implement this interface: attach a session (its lease events), send one command (by its
row in `scheduler/api/commands.py`). Neither sends a command again: `calls.py` does.

Failures are raised as `grpc.aio.AioRpcError` on both (the Channel's per-session error carries
the same status, details and trailers as the rpc's), which `reactions.py` reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc.aio
from google.protobuf.message import Message

from scheduler.api.commands import Command
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb

Metadata = tuple[tuple[str, str], ...]


class LeaseCall(Protocol):
    """One session attached: its lease events in order, ending (or failing) as the per-session
    Acquire stream would; `cancel()` stops listening (the server keeps the session)."""

    def __aiter__(self) -> AsyncIterator[pb.LeaseEvent]: ...

    def cancel(self) -> bool: ...


class Sink(Protocol):
    """Where a channel's session call (`mux.MuxCall`) hands its events once one is set: each
    event as it is read, then the end (None: closed OK after the session's end; else the
    AioRpcError the iterator would raise), with no task iterating the call."""

    def event(self, ev: pb.LeaseEvent) -> None: ...

    def closed(self, err: BaseException | None) -> None: ...


class ChannelCall(Protocol):
    """One open `Scheduler.Channel` stream, as the multiplexer (`mux.py`) uses it. It is the
    client's following call (`follow.py`): until its first answer it re-opens at the leader,
    writing again what `resend` returns (set by the multiplexer: its unanswered acquires), and
    `abandon(err)` moves the client's follower off a replica found lost or not leading."""

    resend: Callable[[], list[pb.ChannelRequest]] | None

    async def write(self, request: pb.ChannelRequest) -> None: ...

    async def read(self) -> Any:
        """The next `ChannelResponse`, or `grpc.aio.EOF`."""
        ...

    def cancel(self) -> bool: ...

    def abandon(self, err: grpc.aio.AioRpcError) -> None: ...


class SessionTransport(Protocol):
    """What a session's calls go through (module doc)."""

    def attach(self, request: pb.AcquireRequest, metadata: Metadata) -> LeaseCall:
        """Acquire (or re-attach) the session `request` names."""
        ...

    async def send(self, command: Command, request: Message, metadata: Metadata, timeout: float) -> Any:
        """Send one unary command; its answer (`RenewResponse`, ...)."""
        ...

    async def send_following(
        self, command: Command, request: Message, metadata: Metadata, tell: Callable[[Any], None],
        more: Callable[[Any], bool], timeout: float,
    ) -> Any:  # fmt: skip
        """Send a command answered more than once (`Command.follows`: a permit, queued then
        granted): its first answer returned, later ones (or an AioRpcError) given to `tell`
        while `more(answer)` says more follow. `timeout` bounds the first answer."""
        ...


class RpcTransport:
    """The per-session rpcs: Acquire its server stream, each command its unary rpc (the row's
    `rpc`), on a stub whose calls go to the leader (`follow.FollowingStub`, tried once)."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub

    def attach(self, request: pb.AcquireRequest, metadata: Metadata) -> LeaseCall:
        call: LeaseCall = self._stub.Acquire(request, metadata=metadata)
        return call

    async def send(self, command: Command, request: Message, metadata: Metadata, timeout: float) -> Any:
        return await getattr(self._stub, command.rpc)(request, metadata=metadata, timeout=timeout)

    async def send_following(
        self, command: Command, request: Message, metadata: Metadata, tell: Callable[[Any], None],
        more: Callable[[Any], bool], timeout: float,
    ) -> Any:  # fmt: skip
        """The rpc answers once the wait is over (its last answer): nothing to `tell`; the
        timeout is the whole wait's (the server withdraws a permit at the call's deadline), so
        the call is `patient`: a long silence is the wait, not a hung replica (follow.py)."""
        rpc = getattr(self._stub, command.rpc)
        return await rpc(request, metadata=metadata, timeout=timeout, patient=True)


__all__ = ["ChannelCall", "LeaseCall", "Metadata", "RpcTransport", "SessionTransport", "Sink"]
