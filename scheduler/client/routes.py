"""A client's routes: the sessions of one pool (or one selector) and where their calls go.

Why: under per-pool leadership (`serve --leadership pool`) each pool has its own leader, and a
`Scheduler.Channel` stream is bound to the pool of its first command. So a client keeps one route
per pool: its own follower (`Follower.route`: moved only by a NOT_LEADER naming its pool), its own
stubs and its own channel multiplexer (a Channel stream per pool), all over the client's channels,
one per replica. A session is given its route as its `ClientLink`; the settings, the wake-up and
the set of live sessions are the client's own.

The default route ("": sessions naming no pool and no selector) is the client itself, so a
single-pool client is exactly what it was before routes: no route object, nothing more per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from scheduler.api.gen.slotsched.v1 import scheduler_pb2_grpc
from scheduler.client.channel import ClientLink, ForwardedSettings
from scheduler.client.follow import FollowingStub
from scheduler.client.mux import SessionMux
from scheduler.client.transport import ChannelCall, RpcTransport, SessionTransport


class RouteOwner(ClientLink, Protocol):
    """What a route reads of the client that owns it (`AsyncClient`): its settings, and whether
    it is closed. A Protocol, so this module never imports `aio` (which imports it): the
    import-linter contract "the SDK's client is above its routes" keeps it so."""

    @property
    def closed(self) -> bool: ...


#: The prefix of a selector's route key (follow.py: such a route follows any pool it is told of,
#: the selector's first candidate being chosen by the server).
SELECTOR = "selector:"


def route_key(pool: str, selector: Sequence[tuple[str, str]]) -> str:
    """The route of a session: its pool; else its selector's sorted `k=v`; else "" (default)."""
    if pool:
        return pool
    if selector:
        return SELECTOR + ",".join(f"{k}={v}" for k, v in sorted(selector))
    return ""


class PoolRoute(ForwardedSettings):
    """The `ClientLink` of one route's sessions (module doc): the client's settings, read live,
    over this route's follower, stubs and multiplexer."""

    def __init__(self, client: RouteOwner, key: str, follower: Any, *, multiplex: bool) -> None:
        self.client = self._settings = client
        self.key = key
        self.follower = follower
        self._stub: Any = None
        self._direct: RpcTransport | None = None
        self.mux: SessionMux | None = SessionMux(self) if multiplex else None

    @property
    def leader(self) -> str:
        """Where this route's calls go now."""
        current: str = self.follower.current
        return current

    def _check_open(self) -> None:
        if self.client.closed:
            raise RuntimeError("AsyncClient is closed")

    def stub(self) -> scheduler_pb2_grpc.SchedulerStub:
        """The Scheduler stub of this route's leader (as `AsyncClient.stub`)."""
        self._check_open()
        if self._stub is None:
            self._stub = FollowingStub(self.follower, scheduler_pb2_grpc.SchedulerStub)
        stub: scheduler_pb2_grpc.SchedulerStub = self._stub
        return stub

    def open_channel(self) -> ChannelCall:
        """A Channel stream to the leader (`ClientLink.open_channel`): the stub's following call."""
        call: ChannelCall = self.stub().Channel(metadata=self.metadata)
        return call

    def transport(self) -> SessionTransport:
        """This route's multiplexer, or its per-session rpcs (as `AsyncClient.transport`)."""
        mux = self.mux
        if mux is not None and not mux.unsupported:
            return mux
        self._check_open()
        if self._direct is None:
            stub = FollowingStub(self.follower, scheduler_pb2_grpc.SchedulerStub, retry=False)
            self._direct = RpcTransport(stub)
        return self._direct

    async def close(self) -> None:
        """Close this route's Channel streams (the gRPC channels are the client's)."""
        if self.mux is not None:
            await self.mux.close()
        self._stub = self._direct = None
