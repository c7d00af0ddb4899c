"""A minimal asyncio RESP2 client: ONE persistent connection to one known Redis, strictly ordered
requests and replies (a batch of commands may be pipelined in one write).

Why: the journal append is on every Acquire/Release reply's path (replica.py waits for it), and
through redis-py it cost ~2.5x a bare round trip on loopback (its command packing, connection
pool and response machinery). RedisStore uses this, against plain `redis://` (one known primary),
for its three frequent calls, each on a connection of its own: the journal append, a standby's
tail, and the leader lease's renewal (every TTL/4 for each pool led); the rest stays on redis-py.

Two ways to call: `send(commands, done)` writes at once and calls `done` from the protocol's
`data_received`, in the loop pass the reply arrives in (the replica's group commit uses it: no
task, and its waiters are told without a further pass), and `await pipeline(commands)` on top.
Requests are pipelined; replies are matched to them in order.

Failures are redis-py's exception types, so the replica treats them as it treats redis-py's: an
error reply is a `ResponseError` (given in place by `send`/`pipeline`, raised by `execute`); a
timeout is a `TimeoutError`, anything else on the wire a `ConnectionError` (both RedisErrors).
After a timeout or a broken connection the connection is dropped (a reply may still be on its
way and could no longer be matched), every request waiting on it fails, and the next call
connects again. A cancelled `pipeline` caller leaves its request to be answered and discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from redis.exceptions import AuthenticationError, ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["Done", "Incomplete", "RespConnection", "pack_command", "parse"]

log = logging.getLogger("slotsched.state")

Arg = bytes | str | int


class _Incomplete:
    """The buffer does not yet hold a whole reply."""


Incomplete = _Incomplete()


def pack_command(*args: Arg) -> bytes:
    """One command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def parse(buf: bytes | bytearray, pos: int = 0) -> tuple[Any, int]:
    """The reply starting at `buf[pos]` and the position after it, or (Incomplete, pos) when the
    buffer ends first. Simple strings and bulks are bytes, integers int, nil bulk/array None,
    arrays lists, error replies ResponseError instances (not raised: a pipeline's other replies
    still count). Raises ConnectionError on bytes that are not RESP."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return Incomplete, pos
    kind, line, nxt = buf[pos : pos + 1], bytes(buf[pos + 1 : end]), end + 2
    if kind == b"+":
        return line, nxt
    if kind == b"-":
        return ResponseError(line.decode(errors="replace")), nxt
    if kind == b":":
        return _int(line), nxt
    if kind == b"$":
        n = _int(line)
        if n < 0:
            return None, nxt
        if len(buf) < nxt + n + 2:
            return Incomplete, pos
        if buf[nxt + n : nxt + n + 2] != b"\r\n":
            raise ConnectionError("RESP: a bulk string not ended by CRLF")
        return bytes(buf[nxt : nxt + n]), nxt + n + 2
    if kind == b"*":
        n = _int(line)
        if n < 0:
            return None, nxt
        items: list[Any] = []
        for _ in range(n):
            item, nxt = parse(buf, nxt)
            if item is Incomplete:
                return Incomplete, pos
            items.append(item)
        return items, nxt
    raise ConnectionError(f"RESP: unknown reply type {kind!r}")


def _int(line: bytes) -> int:
    try:
        return int(line)
    except ValueError:
        raise ConnectionError(f"RESP: not a number: {line[:40]!r}") from None


Done = Callable[[list[Any] | BaseException], None]


class _Pending:
    """One `send`: how many replies it waits for, those read so far, whom to tell, its timer."""

    __slots__ = ("n", "replies", "done", "timer")

    def __init__(self, n: int, done: Done, timer: asyncio.TimerHandle) -> None:
        self.n = n
        self.replies: list[Any] = []
        self.done = done
        self.timer = timer


class _Protocol(asyncio.Protocol):
    """Hands the bytes of one connection to its RespConnection (a plain protocol, not a
    StreamReader: a reply is parsed, and its waiter told, in the same loop pass it arrives in)."""

    def __init__(self, conn: RespConnection) -> None:
        self.conn = conn
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.conn._received(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._lost(self, exc)


class RespConnection:
    """One connection to `host:port`, opened on first use (AUTH, SELECT), reopened after a failure.
    Connecting and each exchange are bounded by `timeout_s` (redis-py's socket_connect_timeout
    and socket_timeout). Requests are pipelined: replies are matched to them in order."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.host, self.port, self.db = host, port, db
        self.username, self.password = username, password
        self.timeout_s = timeout_s
        self._proto: _Protocol | None = None  # the open connection
        self._open = False  # ... and AUTH and SELECT done on it
        self._pending: deque[_Pending] = deque()
        self._buf = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None  # one connect at a time

    @property
    def ready(self) -> bool:
        """Open (and authenticated) on the running loop: `send` may be called."""
        p = self._proto
        if not self._open or p is None or p.transport is None or p.transport.is_closing():
            return False
        try:
            return self._loop is asyncio.get_running_loop()  # another loop's transport is dead
        except RuntimeError:
            return False

    def send(self, commands: list[tuple[Arg, ...]], done: Done) -> None:
        """Write `commands` now (one write); `done` is called from the event loop with their
        replies in order (error replies in place) or with the failure (a RedisError) once the
        connection breaks or `timeout_s` passes without them. Only while `ready`."""
        proto = self._proto
        assert proto is not None and proto.transport is not None, "send() needs a ready connection"
        loop = self._loop
        assert loop is not None
        timer = loop.call_later(self.timeout_s, self._expire, proto)
        self._pending.append(_Pending(len(commands), done, timer))
        proto.transport.write(b"".join([pack_command(*c) for c in commands]))

    async def execute(self, *args: Arg) -> Any:
        """One command's reply; raises ResponseError for an error reply."""
        (reply,) = await self.pipeline([args])
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    async def pipeline(self, commands: list[tuple[Arg, ...]]) -> list[Any]:
        """The replies to `commands`, sent in one write, in order; error replies in place."""
        await self.connect()
        return await self._exchange(commands)

    async def connect(self) -> None:
        """Open the connection (AUTH, SELECT) unless it is `ready`."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests): the old one's objects are dead
            self.drop()
            self._loop, self._lock = loop, asyncio.Lock()
        if self.ready:
            return
        assert self._lock is not None
        async with self._lock:
            if self.ready:
                return
            self.drop()
            try:
                async with asyncio.timeout(self.timeout_s):
                    _, proto = await loop.create_connection(lambda: _Protocol(self), self.host, self.port)
            except TimeoutError as e:
                where = f"redis {self.host}:{self.port}"
                raise RedisTimeoutError(f"{where}: no connection in {self.timeout_s} s") from e
            except OSError as e:
                raise ConnectionError(f"redis {self.host}:{self.port}: {e}") from e
            self._proto = proto
            hello: list[tuple[Arg, ...]] = []
            if self.password is not None:
                user: tuple[Arg, ...] = (self.username,) if self.username else ()
                hello.append(("AUTH", *user, self.password))
            if self.db:
                hello.append(("SELECT", self.db))
            if hello:
                for reply in await self._exchange(hello):
                    if isinstance(reply, ResponseError):
                        self.drop()
                        auth = "AUTH" in str(reply) or "WRONGPASS" in str(reply)
                        kind = AuthenticationError if auth else ConnectionError
                        raise kind(f"redis {self.host}:{self.port}: {reply}")
            self._open = True

    async def _exchange(self, commands: list[tuple[Arg, ...]]) -> list[Any]:
        assert self._loop is not None
        fut: asyncio.Future[list[Any]] = self._loop.create_future()
        self.send(commands, partial(_resolve, fut))
        return await fut  # cancelling the caller is safe: the replies are still read, in order

    # ---------------------------------------------------------------- the protocol's side

    def _received(self, proto: _Protocol, data: bytes) -> None:
        if proto is not self._proto:
            return  # a connection already dropped
        buf = self._buf
        buf += data
        pos = 0
        pending = self._pending
        try:
            while pending:
                reply, nxt = parse(buf, pos)
                if reply is Incomplete:
                    break
                pos = nxt
                head = pending[0]
                head.replies.append(reply)
                if len(head.replies) == head.n:
                    pending.popleft()
                    head.timer.cancel()
                    _tell(head.done, head.replies)
                    if proto is not self._proto:
                        return  # the callback dropped the connection (and failed the rest)
            else:
                if len(buf) > pos:
                    raise ConnectionError("RESP: a reply nobody asked for")
        except ConnectionError as e:
            self._fail(ConnectionError(f"redis {self.host}:{self.port}: {e}"))
            return
        del buf[:pos]

    def _lost(self, proto: _Protocol, exc: Exception | None) -> None:
        if proto is self._proto:
            why = exc or "connection closed"
            self._fail(ConnectionError(f"redis {self.host}:{self.port}: {why}"))

    def _expire(self, proto: _Protocol) -> None:
        if proto is self._proto:
            self._fail(RedisTimeoutError(f"redis {self.host}:{self.port}: no reply in {self.timeout_s} s"))

    def _fail(self, failure: BaseException) -> None:
        """Drop the connection (a reply may still be on its way: nothing read later would match)
        and fail every request still waiting, in order."""
        pending, self._pending = self._pending, deque()
        self.drop()
        for p in pending:
            p.timer.cancel()
            _tell(p.done, failure)

    def drop(self) -> None:
        """Forget the connection (closing its socket); the next call opens a new one. Requests
        still waiting on it fail."""
        proto, self._proto = self._proto, None
        self._open = False
        self._buf.clear()
        if proto is not None and proto.transport is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: so is the transport
                proto.transport.abort()
        if self._pending:
            self._fail(ConnectionError(f"redis {self.host}:{self.port}: connection dropped"))

    async def close(self) -> None:
        self.drop()
        await asyncio.sleep(0)  # the transport's close callbacks run


def _tell(done: Done, outcome: list[Any] | BaseException) -> None:
    try:
        done(outcome)
    except Exception:  # one caller's bug must not break the connection every other one shares
        log.exception("a RESP reply callback failed")


def _resolve(fut: asyncio.Future[list[Any]], outcome: list[Any] | BaseException) -> None:
    if fut.done():
        return  # its caller was cancelled
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)
