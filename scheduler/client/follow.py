"""Following the leader: the channels of one client, one per scheduler replica, and stubs whose
calls go to the replica that leads now.

Why in the SDK's connection layer: with the Redis state store only the leader serves; a standby
refuses with UNAVAILABLE, reason NOT_LEADER, naming the leader in the trailing metadata
`x-slotsched-leader` (scheduler/server/errors.py). `FollowingStub` turns that, and a dead
replica's connection errors, into a retry on the leader, so the session code (stream, renewals,
yields, the channel multiplexer) keeps calling `client.stub()` and never learns about replicas.

A leader a NOT_LEADER names may be no configured target (a pod IP that changes with every
restart): the channel of an address neither a target nor the leader is closed once idle.

Per-pool leadership (`serve --leadership pool`): each pool has its own leader, and a refusal names
the pool too (trailing `x-slotsched-pool`). A client routes its sessions by pool (`route`): each
route has its own leader, all share the client's channels, and a refusal naming a pool moves only
that pool's route.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from typing import Any

import grpc
import grpc.aio

from scheduler.api import wire
from scheduler.client import channel as sdk_channel  # SILENCE_S read when used (tests lower it)
from scheduler.client.channel import open_channel, parse_targets
from scheduler.client.retry import FAILOVER

#: Trailing metadata a standby's NOT_LEADER refusal names the leader's HOST:PORT in (the
#: wire's name, kept here under the name importers know).
LEADER_KEY = wire.LEADER
#: How long a call keeps looking for the leader across targets before its UNAVAILABLE is
#: reported to the caller: a failover (lease TTL + take-over) fits well inside.
DEFAULT_FAILOVER_TIMEOUT_S = 5.0
#: A leader that failed a call (not a NOT_LEADER refusal) is not followed when a standby names
#: it, for this long: its lease may still be running out in Redis (the TTL, 1 s by default).
SUSPECT_S = 2.0


def connection_lost(err: grpc.aio.AioRpcError) -> bool:
    """UNAVAILABLE (a standby, a dead or stopping replica), or the INTERNAL grpc's core reports
    for a stream whose connection died under a write ("Internal error from Core"): either way
    the call never reached a leader that answered it, so it is tried again elsewhere."""
    code = err.code()
    if code is grpc.StatusCode.UNAVAILABLE:
        return True
    return code is grpc.StatusCode.INTERNAL and "Internal error from Core" in (err.details() or "")


def as_unavailable(err: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    """A lost connection reported as INTERNAL (see `connection_lost`) as the UNAVAILABLE it is,
    so callers (and `errors.from_rpc_error`) see one status for it; anything else unchanged."""
    if err.code() is not grpc.StatusCode.INTERNAL or not connection_lost(err):
        return err
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        err.initial_metadata(),
        err.trailing_metadata(),
        f"connection lost: {err.details()}",
        err.debug_error_string(),
    )


def _trailer(err: grpc.aio.AioRpcError, name: str) -> str | None:
    for key, value in err.trailing_metadata() or ():
        if key == name:
            text = value.decode() if isinstance(value, bytes) else str(value)
            return text.strip() or None
    return None


def leader_named(err: grpc.aio.AioRpcError) -> str | None:
    """The leader's address a NOT_LEADER refusal names, if any."""
    return _trailer(err, LEADER_KEY)


def pool_named(err: grpc.aio.AioRpcError) -> str | None:
    """The pool a per-pool NOT_LEADER refusal is about (its leader: `leader_named`), if any."""
    return _trailer(err, wire.POOL)


class Follower:
    """The channels of one client, one per address, and which address is the leader now.

    A call answered UNAVAILABLE moves the client on: to the leader a NOT_LEADER refusal names
    (connecting to it even if it is not one of the targets), else to the next target. A target's
    channel is kept, so going back and forth costs no handshake; the channel of any other address
    (a leader named once) is closed as soon as that address is not the leader and no call opened
    through `track` is in flight on it: at most one channel per target, plus the leader's.

    `route(key)` is a follower for one pool's (or selector's) sessions sharing these channels: its
    own `current`, the same channels, stubs, calls in flight and suspects; a channel is closed
    only when no route's leader is its address. The root (key "") is the default route.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        options: list[tuple[str, Any]],
        credentials: grpc.ChannelCredentials | None,
        *,
        follow: bool = True,
        failover_timeout_s: float = DEFAULT_FAILOVER_TIMEOUT_S,
    ) -> None:
        self.targets = parse_targets(target)
        self.current = self.targets[0]
        self.follow = follow
        self.failover_timeout_s = failover_timeout_s
        self._options = options
        self._credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, type], Any] = {}
        self._suspect: dict[str, float] = {}  # address -> until when a leader named there is ignored
        self._in_flight: dict[str, int] = {}  # address -> calls on its channel not done yet
        self._closing: set[asyncio.Task[None]] = set()
        self.switches = 0
        self.key = ""
        self.routes: dict[str, Follower] = {"": self}  # shared by every route of the client

    def route(self, key: str) -> Follower:
        """The follower of route `key` (module doc), made on first use, starting where the
        default route goes now; "" is the default route itself."""
        found = self.routes.get(key)
        if found is not None:
            return found
        child = object.__new__(Follower)
        child.__dict__.update(self.routes[""].__dict__)  # the same dicts: channels, stubs, ...
        child.key, child.switches = key, 0
        self.routes[key] = child
        return child

    def stub(self, stub_cls: type, address: str | None = None) -> Any:
        address = address or self.current
        stub = self._stubs.get((address, stub_cls))
        if stub is None:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = open_channel(address, self._options, self._credentials)
            stub = self._stubs[(address, stub_cls)] = stub_cls(channel)
        return stub

    def track(self, address: str, call: Any) -> Any:
        """`call` uses `address`'s channel until it is done: that channel is not closed under it."""
        add_done_callback = getattr(call, "add_done_callback", None)
        if add_done_callback is not None:
            self._in_flight[address] = self._in_flight.get(address, 0) + 1
            add_done_callback(lambda _call: self._call_done(address))
        return call

    def _call_done(self, address: str) -> None:
        left = self._in_flight.get(address, 0) - 1
        if left > 0:
            self._in_flight[address] = left
            return
        self._in_flight.pop(address, None)
        self._prune()

    def _prune(self) -> None:
        """Close the channels of addresses that are neither targets nor the leader, once unused
        (a leader named once, since replaced), and forget suspicions that have run out."""
        for address in [a for a in self._channels if self._unused(a)]:
            channel = self._channels.pop(address)
            for key in [k for k in self._stubs if k[0] == address]:
                del self._stubs[key]
            try:
                task = asyncio.get_running_loop().create_task(channel.close())
            except RuntimeError:  # no loop running (closing time): the channel goes with it
                continue
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        now = time.monotonic()
        for address in [a for a, until in self._suspect.items() if until <= now]:
            del self._suspect[address]

    def _unused(self, address: str) -> bool:
        if address in self.targets or self._in_flight.get(address):
            return False
        return all(r.current != address for r in self.routes.values())

    def failed(self, address: str, err: grpc.aio.AioRpcError) -> float | None:
        """`address` answered `err`: move on if the connection was lost (`connection_lost`).
        Returns how long to wait
        before trying again (0: a leader was named), or None when a retry here is pointless (not
        UNAVAILABLE; or one target, down or shutting down, and no standby pointing elsewhere:
        the caller's own backoff and timeouts apply)."""
        if not self.follow or not connection_lost(err):
            return None
        pool = pool_named(err)
        routed = bool(self.key) and not self.key.startswith("selector:")
        if pool is not None and pool != self.key and (routed or _trailer(err, wire.BUDGET)):
            # About another pool's leader (or a budget's home: permit_routes.py): that route moves.
            self.follow_pool(pool, leader_named(err))
            return None
        now = time.monotonic()
        named = leader_named(err)
        standby = named is not None or "not the leader" in (err.details() or "")
        if named is not None and self._suspect.get(named, 0.0) > now:
            # A standby names the leader whose lease has not lapsed yet, but it just failed us:
            # dead, most likely. Ask the targets until one of them leads.
            named = None
        if not standby:
            self._suspect[address] = now + SUSPECT_S
        if address != self.current:
            return 0.0  # another call moved on already: follow it
        if named is not None and named != address:
            self._move(named)
            return 0.0
        nxt = self._next(address, now, stay=standby)
        if nxt != address:
            self._move(nxt)
        return _pause() if standby or nxt != address else None

    def follow_pool(self, pool: str, leader: str | None) -> None:
        """The route of `pool` goes to `leader` (None: it stays where it is)."""
        if leader is not None and leader != (other := self.route(pool)).current:
            other._move(leader)

    def _move(self, address: str) -> None:
        self.current = address
        self.switches += 1
        self._prune()

    def _next(self, address: str, now: float, stay: bool = False) -> str:
        """The target after `address` that has not just failed (else the one after it; `address`
        itself when it is the only target, or if `stay`: a standby whose leader just failed us
        takes over soon, while a frozen leader would hold a new connection for 20 s)."""
        n = len(self.targets)
        i = self.targets.index(address) if address in self.targets else -1
        others = [self.targets[(i + k) % n] for k in range(1, n + 1) if self.targets[(i + k) % n] != address]
        for cand in others:
            if self._suspect.get(cand, 0.0) <= now:
                return cand
        return others[0] if others and not stay else address

    async def close(self) -> None:
        """Close every channel of the client (all routes share them)."""
        channels = dict(self._channels)
        self._channels.clear()
        self._stubs.clear()
        for channel in channels.values():
            await channel.close()
        for task in list(self._closing):
            with contextlib.suppress(BaseException):
                await task


def _pause() -> float:
    """Between two tries while no replica names a leader (a take-over under way): 50-100 ms."""
    return FAILOVER.delay(0)


class FollowingStub:
    """A stub whose calls go to the current leader (`Follower.current`).

    * unary calls answered UNAVAILABLE are retried on the leader named in NOT_LEADER (at once),
      else on the next target (after 50-100 ms), within the call's timeout and the follower's
      `failover_timeout_s`; then the last error is raised. With several targets an attempt not
      answered within `SILENCE_S` counts as UNAVAILABLE (a hung replica), unless `patient` (its
      answer comes when a wait is over: a permit's). With `retry=False` a unary call is tried
      once: its failure moves the client on and is raised (a session's commands: `calls.py`);
    * a server stream that fails UNAVAILABLE before its first message is opened again the same
      way (its request is idempotent: Acquire re-attaches); after a message, the error reaches
      the caller, which re-attaches (the client moved on already);
    * a bidi stream (Scheduler.Channel) that fails UNAVAILABLE before its first response is
      opened again the same way, and what was written on it so far is written again (or what the
      caller's `resend` hook returns: the channel multiplexer re-sends its acquires and fails its
      commands, which `calls.py` sends again); after a response, the error reaches the caller
      (the client moved on already);
    * client streams move the client on when they fail UNAVAILABLE.
    """

    def __init__(self, follower: Follower, stub_cls: type, *, retry: bool = True) -> None:
        self._follower = follower
        self._stub_cls = stub_cls
        self._retry = retry

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._follower.stub(self._stub_cls), name)
        if isinstance(method, grpc.aio.UnaryUnaryMultiCallable):
            wrapped: Any = _UnaryCall(self._follower, self._stub_cls, name, retry=self._retry)
        elif isinstance(method, grpc.aio.UnaryStreamMultiCallable):
            wrapped = _ServerStreamCall(self._follower, self._stub_cls, name)
        elif isinstance(method, grpc.aio.StreamStreamMultiCallable):
            wrapped = _BidiCall(self._follower, self._stub_cls, name)
        elif callable(method):
            wrapped = _ObservedCall(self._follower, self._stub_cls, name)
        else:
            return method
        setattr(self, name, wrapped)  # built once per method name
        return wrapped


class _Method:
    def __init__(self, follower: Follower, stub_cls: type, name: str, *, retry: bool = True) -> None:
        self.follower = follower
        self.stub_cls = stub_cls
        self.name = name
        self.retry = retry

    def target(self) -> tuple[str, Any]:
        """The leader's address, and a function opening this method's call there (counted in
        flight on that address's channel until it is done: `Follower.track`)."""
        follower = self.follower
        address = follower.current
        method = getattr(follower.stub(self.stub_cls, address), self.name)

        def open_call(*args: Any, **kw: Any) -> Any:
            return follower.track(address, method(*args, **kw))

        return address, open_call


class _UnaryCall(_Method):
    async def __call__(
        self, request: Any, *, timeout: float | None = None, patient: bool = False, **kw: Any
    ) -> Any:  # noqa: E501
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = start + self.follower.failover_timeout_s
        if timeout is not None:
            end = min(end, start + timeout)
        while True:
            address, method = self.target()
            left = None if timeout is None else max(0.001, start + timeout - loop.time())
            # With another replica to ask, an attempt is cut at SILENCE_S: one that answers
            # nothing that long (frozen, hung) is left as a lost connection, not waited out.
            several = self.follower.follow and len(self.follower.targets) > 1 and not patient
            bound = sdk_channel.SILENCE_S if several else None
            cut = bound is not None and (left is None or bound < left)
            try:
                return await method(request, timeout=bound if cut else left, **kw)
            except grpc.aio.AioRpcError as e:
                if cut and e.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                    why = f"no answer from {address} within {bound:g}s"
                    e = grpc.aio.AioRpcError(
                        grpc.StatusCode.UNAVAILABLE, e.initial_metadata(), e.trailing_metadata(), why
                    )
                wait = self.follower.failed(address, e)
                if wait is None or not self.retry or loop.time() + wait >= end:
                    u = as_unavailable(e)
                    if u is e:
                        raise
                    raise u from e
                await asyncio.sleep(wait)


class _ServerStreamCall(_Method):
    def __call__(self, request: Any, **kw: Any) -> _FollowingStream:
        return _FollowingStream(self, request, kw)


class _FollowingStream:
    """A server-streaming call that finds the leader before its first message (see FollowingStub)."""

    def __init__(self, method: _ServerStreamCall, request: Any, kw: dict[str, Any]) -> None:
        self._method = method
        self._request = request
        self._kw = kw
        self._address, open_call = method.target()
        self._call: Any = open_call(request, **kw)
        self._received = False
        self._cancelled = False
        self._reader: AsyncIterator[Any] | None = None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._events()

    async def _events(self) -> AsyncIterator[Any]:
        follower = self._method.follower
        loop = asyncio.get_running_loop()
        end = loop.time() + follower.failover_timeout_s
        while True:
            try:
                async for message in self._call:
                    self._received = True
                    yield message
                return
            except grpc.aio.AioRpcError as e:
                wait = follower.failed(self._address, e)
                if self._received or self._cancelled or wait is None or loop.time() + wait >= end:
                    u = as_unavailable(e)
                    if u is e:
                        raise
                    raise u from e
            await asyncio.sleep(wait)
            if self._cancelled:
                return
            self._address, open_call = self._method.target()
            self._call = open_call(self._request, **self._kw)

    async def read(self) -> Any:
        # One iterator for reads too, so a read also finds the leader.
        if self._reader is None:
            self._reader = self._events()
        try:
            return await anext(self._reader)
        except StopAsyncIteration:
            return grpc.aio.EOF

    def cancel(self) -> bool:
        self._cancelled = True
        return bool(self._call.cancel())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)  # code(), details(), trailing_metadata(), done() ...


class _ObservedCall(_Method):
    """Client-streaming: not retried (its requests are the caller's), only observed."""

    def __call__(self, *args: Any, **kw: Any) -> _Observed:
        address, method = self.target()
        return _Observed(self.follower, address, method(*args, **kw))


class _Observed:
    def __init__(self, follower: Follower, address: str, call: Any) -> None:
        self._follower = follower
        self._address = address
        self._call = call

    def _seen(self, e: grpc.aio.AioRpcError) -> None:
        self._follower.failed(self._address, e)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Any]:
        try:
            async for message in self._call:
                yield message
        except grpc.aio.AioRpcError as e:
            self._seen(e)
            raise

    async def read(self) -> Any:
        try:
            return await self._call.read()
        except grpc.aio.AioRpcError as e:
            self._seen(e)
            raise

    async def write(self, message: Any) -> None:
        try:
            await self._call.write(message)
        except grpc.aio.AioRpcError as e:
            self._seen(e)
            raise

    async def done_writing(self) -> None:
        try:
            await self._call.done_writing()
        except grpc.aio.AioRpcError as e:
            self._seen(e)
            raise

    def __await__(self) -> Generator[Any, None, Any]:
        return self._result().__await__()

    async def _result(self) -> Any:
        try:
            return await self._call
        except grpc.aio.AioRpcError as e:
            self._seen(e)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


class _BidiCall(_Method):
    def __call__(self, *args: Any, **kw: Any) -> _FollowingBidi:
        return _FollowingBidi(self, args, kw)


# What a write on a call that ended raises (grpc.aio: InvalidStateError once it is done).
_WRITE_ENDED = (grpc.aio.AioRpcError, grpc.aio.UsageError, RuntimeError, asyncio.InvalidStateError)


class _FollowingBidi:
    """A bidi stream that finds the leader before its first response (see FollowingStub).

    Until a response comes, every message written is kept; a read that fails UNAVAILABLE opens
    the stream at the next address and writes them again, in order (a lock keeps a concurrent
    write behind the replay). A write that fails meanwhile is left to that replay. A caller that
    knows better what to send again sets `resend` (called under the lock, without arguments,
    returning the messages to write on the new stream instead of the kept ones)."""

    def __init__(self, method: _BidiCall, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
        self._method = method
        self._args = args
        self._kw = kw
        self._log: list[Any] | None = []  # None once a response came: no more retries
        self._done_writing = False
        self._cancelled = False
        self._lock = asyncio.Lock()
        self.resend: Callable[[], list[Any]] | None = None
        self._address, open_call = method.target()
        self._call: Any = open_call(*args, **kw)
        self._end = asyncio.get_running_loop().time() + method.follower.failover_timeout_s

    async def write(self, message: Any) -> None:
        async with self._lock:
            if self._log is not None:
                self._log.append(message)
            try:
                await self._call.write(message)
            except _WRITE_ENDED as e:
                if self._log is None or self._cancelled:
                    if isinstance(e, asyncio.InvalidStateError):
                        raise RuntimeError(f"the call ended: {e}") from e  # what callers catch
                    raise
                # The read that sees this failure reopens the stream and writes it again.

    async def done_writing(self) -> None:
        async with self._lock:
            self._done_writing = True
            with contextlib.suppress(*_WRITE_ENDED):
                await self._call.done_writing()

    async def read(self) -> Any:
        follower = self._method.follower
        loop = asyncio.get_running_loop()
        while True:
            call = self._call
            try:
                message = await call.read()
            except grpc.aio.AioRpcError as e:
                if call is not self._call:
                    continue  # reopened meanwhile
                wait = follower.failed(self._address, e)
                late = wait is None or loop.time() + wait >= self._end
                if self._log is None or self._cancelled or late:
                    u = as_unavailable(e)
                    if u is e:
                        raise
                    raise u from e
                await asyncio.sleep(wait or 0.0)
                if self._cancelled:
                    raise
                await self._reopen()
                continue
            if message is not grpc.aio.EOF:
                self._log = None
            return message

    async def _reopen(self) -> None:
        async with self._lock:
            self._call.cancel()
            self._address, open_call = self._method.target()
            self._call = open_call(*self._args, **self._kw)
            again = (self._log or []) if self.resend is None else self.resend()
            for message in again:
                with contextlib.suppress(*_WRITE_ENDED):  # the next read says what went wrong
                    await self._call.write(message)
            if self._done_writing:
                with contextlib.suppress(*_WRITE_ENDED):
                    await self._call.done_writing()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Any]:
        while True:
            message = await self.read()
            if message is grpc.aio.EOF:
                return
            yield message

    def cancel(self) -> bool:
        self._cancelled = True
        return bool(self._call.cancel())

    def abandon(self, err: grpc.aio.AioRpcError) -> None:
        """The caller found this replica lost or not leading (`err`: mux.py's silence bound, a
        NOT_LEADER answer): the follower moves on as after a failed read, and the call ends."""
        self._method.follower.failed(self._address, err)
        self.cancel()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)  # code(), details(), trailing_metadata(), done() ...
