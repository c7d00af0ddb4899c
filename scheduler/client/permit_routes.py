"""Where a session's permits go: to the leader of its budget's home pool (docs/design.md,
"Token budgets"; decision 0018).

Why apart from the session's route: under per-pool leadership (`serve --leadership pool`) a
budget is counted in one place, the unit of its **home pool** (the first pool naming it in
`spec.pools[].budgets`, else the default pool), which another replica than the session's pool's
may lead. The client has no policy: it learns a budget's home from the first NOT_LEADER naming
the budget (trailing `x-slotsched-budget`, with the home pool and its leader), and from then on
sends that budget's permits, requests and settles alike, on the route of the home pool
(`routes.py`), whose follower moves with that pool's leader. The session's own route is not
moved: its pool may be led where it is. With one leader for every pool nothing names a budget,
and a permit goes with its session, exactly as before.

A permit re-routed so is sent again only on such a refusal (nothing was applied: the replica
refused it before counting anything), within `failover_timeout_s`; any other failure is the
caller's, as without routing. Each request declares the session's class (`qos`): the home reads
it only where it does not hold the session's pool, and draws it on the tenant's own share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc
import grpc.aio
from google.protobuf.message import Message

from scheduler.api import wire
from scheduler.api.commands import Command
from scheduler.client.channel import ClientLink, ForwardedSettings
from scheduler.client.follow import leader_named, pool_named
from scheduler.client.retry import FAILOVER
from scheduler.client.transport import ChannelCall, LeaseCall, Metadata, SessionTransport


class PermitRoot(Protocol):
    """What the client (`AsyncClient`) keeps for every session's permits."""

    #: budget -> its home pool, as NOT_LEADER refusals named it.
    budget_homes: dict[str, str]

    def link_of(self, pool: str) -> ClientLink:
        """The route of `pool`'s calls (made on first use)."""
        ...

    def follow_pool(self, pool: str, leader: str | None) -> None:
        """`pool`'s route goes to `leader` (None: stays; a take-over under way)."""
        ...


def budget_named(err: grpc.aio.AioRpcError) -> str | None:
    """The budget a permit's NOT_LEADER names (its home pool: `pool_named`), if any."""
    for key, value in err.trailing_metadata() or ():
        if key == wire.BUDGET:
            text = value.decode() if isinstance(value, bytes) else str(value)
            return text.strip() or None
    return None


def _retry_after_s(err: grpc.aio.AioRpcError) -> float:
    for key, value in err.trailing_metadata() or ():
        if key == wire.RETRY_AFTER_MS:
            try:
                return max(0.0, int(value) / 1000.0)
            except ValueError:
                break
    return FAILOVER.delay(0)


class PermitLink(ForwardedSettings):
    """The `ClientLink` of one session's permits on one budget (module doc): the route of the
    budget's home pool once known, else the session's own link."""

    def __init__(self, session_link: ClientLink, budget: str, qos: int) -> None:
        self._session_link = session_link
        self.budget = budget
        self.qos = qos
        root: Any = getattr(session_link, "client", session_link)  # a pool's route, or the client
        self._root: PermitRoot | None = root if hasattr(root, "budget_homes") else None

    @property
    def _settings(self) -> ClientLink:
        return self.link

    @property
    def link(self) -> ClientLink:
        """Where this budget's permits go now."""
        root = self._root
        pool = root.budget_homes.get(self.budget) if root is not None else None
        return root.link_of(pool) if root is not None and pool else self._session_link

    def stub(self) -> Any:
        return self.link.stub()

    def open_channel(self) -> ChannelCall:
        return self.link.open_channel()

    def transport(self) -> SessionTransport:
        return _Rerouting(self)

    def rerouted(self, err: grpc.aio.AioRpcError) -> float | None:
        """`err` refused a permit of this budget NOT_LEADER naming its home: remember the home,
        move its route to the leader named, and return how long to wait before sending again
        (0: a leader named). None: not such a refusal (the caller's to meet)."""
        root = self._root
        if root is None or err.code() is not grpc.StatusCode.UNAVAILABLE or not self.follow_leader:
            return None
        pool = pool_named(err)
        if pool is None or budget_named(err) != self.budget:
            return None
        leader = leader_named(err)
        root.budget_homes[self.budget] = pool
        root.follow_pool(pool, leader)
        return 0.0 if leader else _retry_after_s(err)


class _Rerouting:
    """The transport of a `PermitLink`: the current link's, sent again on the home's route
    after a refusal naming it (module doc), each request declaring the session's class."""

    def __init__(self, link: PermitLink) -> None:
        self._link = link

    def attach(self, request: Any, metadata: Metadata) -> LeaseCall:  # pragma: no cover - never
        return self._link.link.transport().attach(request, metadata)

    def _declared(self, request: Message) -> Message:
        if getattr(request, "qos", None) == 0:
            request.qos = self._link.qos  # type: ignore[attr-defined]
        return request

    async def send(self, command: Command, request: Message, metadata: Metadata, timeout: float) -> Any:
        self._declared(request)
        return await self._go(lambda t: t.send(command, request, metadata, timeout), timeout)

    async def send_following(
        self, command: Command, request: Message, metadata: Metadata, tell: Callable[[Any], None],
        more: Callable[[Any], bool], timeout: float,
    ) -> Any:  # fmt: skip
        self._declared(request)
        return await self._go(
            lambda t: t.send_following(command, request, metadata, tell, more, timeout), timeout
        )

    async def _go(self, send: Callable[[SessionTransport], Awaitable[Any]], timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        end = loop.time() + min(self._link.failover_timeout_s, timeout)
        while True:
            try:
                return await send(self._link.link.transport())
            except grpc.aio.AioRpcError as e:
                pause = self._link.rerouted(e)
                if pause is None or loop.time() + pause >= end:
                    raise
            await asyncio.sleep(pause)


__all__ = ["PermitLink", "PermitRoot", "budget_named"]
