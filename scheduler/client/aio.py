"""The asyncio SDK: `AsyncClient`, a connection to the Scheduler that hands out sessions.

A session (`AsyncSession`, in `session.py`) holds a slot through its whole life with one
`async with`: its stream, renewals, yields and re-attach are told there. The wire (channel options,
metadata) is in `channel.py`, how each status is met in `reactions.py`, the retry policies in
`retry.py`; the runtime's callback types in `callbacks.py`. The names importers used from this
module before it was split are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import grpc
import grpc.aio

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler.client.callbacks import OnGrant, OnYield, OnYieldCancelled
from scheduler.client.channel import (
    DEFAULT_CHANNEL_OPTIONS,
    DEFAULT_CONNECT_TIMEOUT_S,
    ClientLink,
    call_metadata,
    merged_options,
    parse_targets,
    tls_credentials,
)
from scheduler.client.errors import InvalidArgument
from scheduler.client.follow import Follower, FollowingStub
from scheduler.client.mux import SessionMux
from scheduler.client.options import ClientOptions
from scheduler.client.reactions import from_rpc_error
from scheduler.client.retry import RetryPolicy
from scheduler.client.routes import PoolRoute, route_key
from scheduler.client.session import AsyncSession
from scheduler.client.transport import ChannelCall, RpcTransport, SessionTransport
from scheduler.client.types import QoS, SessionInfo, SnapshotRef
from scheduler.client.wake import Wake

__all__ = [
    "DEFAULT_CHANNEL_OPTIONS",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "AsyncClient",
    "AsyncSession",
    "ClientOptions",
    "OnGrant",
    "OnYield",
    "OnYieldCancelled",
]


#: The longest session id the scheduler accepts (its wire guard's limit for an id).
MAX_SESSION_ID_BYTES = wire.MAX_STRING_BYTES


class AsyncClient:
    """A connection to the slotsched Scheduler service for asyncio code.

    Its settings are a `ClientOptions` (`options=`), or the same names as keyword arguments laid
    over it (`AsyncClient(target, token=..., multiplex=False)`); the blocking `Client` takes the
    same. `token` is sent as `authorization: Bearer <token>`; `tenant` as `x-slotsched-tenant` (the
    server's insecure dev mode only). `channel_options` are merged over `DEFAULT_CHANNEL_OPTIONS`.
    TLS: `tls_ca` (the CA that signed the server's certificate; system roots without it) and, for
    a server that requires client certificates (`slotsched serve --tls-ca`), `tls_cert` +
    `tls_key` (PEM paths or bytes); or a ready `grpc.ChannelCredentials` as `credentials`.
    The channel is opened on first use, in the running loop.
    `connect_timeout_s` bounds how long a session tries to reach the server at all (its first
    Acquire); `reattach_timeout_s` how long an attached session tries to re-attach. Between two
    tries a session sleeps `backoff_initial_s` doubling to `backoff_max_s`, unless the client
    hears from the server meanwhile: then every sleeping session tries at once (`wake.py`).

    Replicas: `target` may name several ("host1:50051,host2:50051", or a list). Calls go to the
    leader: a standby refuses with UNAVAILABLE NOT_LEADER naming the leader's address (trailing
    metadata `x-slotsched-leader`), and the client goes there (even if it is not one of the
    targets), else to the next target; a call keeps looking for the leader every 50-100 ms for
    up to `failover_timeout_s` before its UNAVAILABLE reaches the session (which then re-attaches
    as usual), so a failover is followed within milliseconds of the new leader serving. Renewals,
    releases and yields in flight are retried on the new leader; lease streams re-attach and keep
    their lease. `follow_leader=False` stays on the given target (e.g. behind a load balancer).
    A replica that stops answering counts as lost as a refused connection does (`channel.py`):
    a connection whose keepalive ping goes unanswered (a frozen process keeps its TCP connections
    open), a unary attempt or a channel with nothing answered for `SILENCE_S`, a channel whose
    replica refuses NOT_LEADER; with several targets the calls and sessions move to the leader.

    `multiplex` (default True): every session of this client travels on one `Scheduler.Channel`
    stream (`mux.py`), batched, instead of an Acquire stream and unary calls per session; the
    sessions behave the same. A server without Channel is served the per-session way.

    Per-pool leadership (`serve --leadership pool`: each pool led by one replica): the client
    keeps a route per pool (`routes.py`): a session naming a pool (or a selector) has its calls
    and its Channel stream go to that pool's leader, moved only by a refusal naming that pool;
    all routes share one gRPC channel per replica. `leader_of(pool)` says where a pool's calls
    go now. Sessions naming neither are the default route, the client itself.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        token: str | None = None,
        tenant: str | None = None,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        *,
        options: ClientOptions | None = None,
        **settings: Any,
    ) -> None:
        # The settings: `options` with the keyword arguments (`ClientOptions`' names) over it.
        o = self.options = ClientOptions.of(
            options, settings, token=token, tenant=tenant, channel_options=channel_options
        )
        targets = parse_targets(target)  # a bad target fails here, not at the first call
        self.target = ",".join(targets)
        self.rpc_timeout_s = o.rpc_timeout_s
        self.reattach_timeout_s = o.reattach_timeout_s
        self.connect_timeout_s = o.connect_timeout_s
        self.backoff_initial_s = o.backoff_initial_s
        self.backoff_max_s = o.backoff_max_s
        self.renew_interval_s = o.renew_interval_s
        self.follow_leader = o.follow_leader
        self.failover_timeout_s = o.failover_timeout_s
        # The waits between tries (retry.py): a session's attach, and its commands (calls.py
        # says how many tries each has).
        self.reattach = RetryPolicy(initial_s=o.backoff_initial_s, max_s=o.backoff_max_s)
        self.command_backoff = RetryPolicy(initial_s=o.backoff_initial_s)
        # Sessions asleep in re-attach backoff, woken when the server answers again (wake.py).
        self.wake = Wake()
        channel_opts = merged_options(o.channel_options)
        credentials = tls_credentials(o.tls_ca, o.tls_cert, o.tls_key, o.credentials)
        self.metadata: tuple[tuple[str, str], ...] = call_metadata(o.token, o.tenant)
        self._follower = Follower(
            targets,
            channel_opts,
            credentials,
            follow=o.follow_leader,
            failover_timeout_s=o.failover_timeout_s,
        )
        self._stub: scheduler_pb2_grpc.SchedulerStub | None = None
        self._direct: RpcTransport | None = None  # the per-session rpcs, tried once each (calls.py retries)
        #: The client's live sessions, released by `close()`.
        self.sessions: set[AsyncSession] = set()
        self._closed = False
        self._multiplex = multiplex = o.multiplex
        # The routes of sessions naming a pool or a selector (routes.py); "" is this client.
        self._routes: dict[str, PoolRoute] = {}
        #: budget -> its home pool, where its permits go (permit_routes.py), as refusals named it.
        self.budget_homes: dict[str, str] = {}
        # Every session on one Scheduler.Channel stream (mux.py); False: one Acquire per session.
        self._mux: SessionMux | None = SessionMux(self) if multiplex else None

    def stub(self) -> scheduler_pb2_grpc.SchedulerStub:
        """The Scheduler stub of the current leader (`FollowingStub`: every call goes to the
        replica that leads now, and follows a failover). Channels open on first use, in the
        running loop."""
        if self._closed:
            raise RuntimeError("AsyncClient is closed")
        if self._stub is None:
            stub: Any = FollowingStub(self._follower, scheduler_pb2_grpc.SchedulerStub)
            self._stub = stub
        return self._stub

    @property
    def leader(self) -> str:
        """The address calls go to now (the leader, as far as this client knows)."""
        return self._follower.current

    def leader_of(self, pool: str) -> str:
        """The address the calls of `pool`'s sessions go to now (that pool's leader, as far as
        this client knows; where the default route goes for a pool not heard of yet)."""
        return self._follower.routes.get(pool, self._follower).current

    @property
    def targets(self) -> list[str]:
        return list(self._follower.targets)

    @property
    def closed(self) -> bool:
        return self._closed

    def _link(self, key: str) -> ClientLink:
        """The link of route `key` (made on first use); "" is this client itself."""
        if not key:
            return self
        route = self._routes.get(key)
        if route is None:
            if self._closed:
                raise RuntimeError("AsyncClient is closed")
            follower = self._follower.route(key)
            route = self._routes[key] = PoolRoute(self, key, follower, multiplex=self._multiplex)
        return route

    def link_of(self, pool: str) -> ClientLink:
        """The route of `pool`'s calls (permit_routes.py: a budget's home pool)."""
        return self._link(pool)

    def follow_pool(self, pool: str, leader: str | None) -> None:
        """`pool`'s route goes to `leader` (a refusal named it; None: it stays)."""
        self._link(pool)
        self._follower.follow_pool(pool, leader)

    def open_channel(self) -> ChannelCall:
        """A Channel stream to the leader (`ClientLink.open_channel`): the stub's following call."""
        call: ChannelCall = self.stub().Channel(metadata=self.metadata)
        return call

    def transport(self) -> SessionTransport:
        """What sessions send Acquire, Renew, Yield and Release through (`transport.py`): the
        client's channel multiplexer, or the per-session rpcs (`multiplex=False`, or a server
        without Channel), to the leader. Neither sends a command again: a session's `calls.py`
        does, the one layer that retries (a Renew whose channel broke in a failover goes again,
        to the new leader, within failover_timeout_s)."""
        mux = self._mux
        if mux is not None and not mux.unsupported:
            return mux
        if self._closed:
            raise RuntimeError("AsyncClient is closed")
        if self._direct is None:
            self._direct = RpcTransport(
                FollowingStub(self._follower, scheduler_pb2_grpc.SchedulerStub, retry=False)
            )
        return self._direct

    def session(
        self,
        session_id: str,
        qos: QoS | str = QoS.BURSTABLE,
        on_yield: OnYield | None = None,
        on_grant: OnGrant | None = None,
        resume_from: SnapshotRef | None = None,
        wait_timeout_s: float | None = None,
        on_yield_cancelled: OnYieldCancelled | None = None,
        *,
        pool: str = "",
        selector: Mapping[str, str] | None = None,
        fallback: Sequence[str] = (),
    ) -> AsyncSession:
        """A session handle; `async with` it to acquire (see `AsyncSession`).

        Where it may run (docs/design.md "Pools"): `pool` names one, or `selector` matches pools
        by their labels (the policy's order decides among them), and `fallback` lists pools to
        be granted in, in order, when the first has no room; the session waits in the first. It
        never lands in a pool it did not name or match. With one pool in the policy, give none.

        Raises InvalidArgument at once for a session id the scheduler would refuse (empty, or
        longer than 256 bytes), or both a pool and a selector, rather than as the session's
        error after a round trip."""
        size = len(session_id.encode())
        if not 0 < size <= MAX_SESSION_ID_BYTES:
            raise InvalidArgument(
                f"session_id: 1 to {MAX_SESSION_ID_BYTES} bytes (got {size})",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        if pool and selector:
            raise InvalidArgument(
                f"selector: give a pool or a selector, not both (pool {pool!r}, selector {dict(selector)!r})",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        if isinstance(fallback, str):  # a lone name would be split into letters
            raise InvalidArgument(
                f"fallback: a list of pool names, not one string ({fallback!r})",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        sel = tuple(sorted((selector or {}).items()))
        return AsyncSession(
            self._link(route_key(pool, sel)),
            session_id,
            QoS.parse(qos),
            on_yield=on_yield,
            on_grant=on_grant,
            resume_from=resume_from,
            wait_timeout_s=wait_timeout_s,
            on_yield_cancelled=on_yield_cancelled,
            pool=pool,
            selector=sel,
            fallback=tuple(fallback),
        )

    async def get_session(self, session_id: str, *, pool: str = "") -> SessionInfo:
        """Read a session's state without attaching to it (GetSession). `pool`: the session's
        pool, whose leader is asked (per-pool leadership); without it, the default route's."""
        stub = self._link(pool).stub()
        try:
            msg = await stub.GetSession(
                scheduler_pb2.GetSessionRequest(session_id=session_id),
                metadata=self.metadata,
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from e
        return SessionInfo.from_proto(msg)

    async def close(self) -> None:
        """Release every live session of this client (best effort), then close the channel."""
        if self._closed:
            return
        for s in list(self.sessions):
            await s.aclose()
        self._closed = True
        if self._mux is not None:
            await self._mux.close()
        for route in self._routes.values():
            await route.close()
        await self._follower.close()
        self._stub = self._direct = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
