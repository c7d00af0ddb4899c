"""A minimal asyncio RESP2 client: ONE persistent connection to one known Redis, strictly ordered
requests and replies (a batch of commands may be pipelined in one write).

Why: the journal append is on every Acquire/Release reply's path (replica.py waits for it), and
through redis-py it cost ~2.5x a bare round trip on loopback (its command packing, connection
pool and response machinery). RedisStore uses this for that one hot call only, against plain
`redis://` (one known primary); everything else stays on redis-py.

Failures are redis-py's exception types, so the replica treats them as it treats redis-py's: an
error reply is a `ResponseError` (returned in place by `pipeline`, raised by `execute`); a
timeout is a `TimeoutError`, anything else on the wire a `ConnectionError` (both RedisErrors).
After a timeout, a broken connection or a cancelled call the connection is dropped (its replies
could no longer be matched to requests) and the next call connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis.exceptions import AuthenticationError, ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["Incomplete", "RespConnection", "encode", "parse"]

Arg = bytes | str | int


class _Incomplete:
    """The buffer does not yet hold a whole reply."""


Incomplete = _Incomplete()


def encode(*args: Arg) -> bytes:
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


def _expire(writer: asyncio.StreamWriter | None, expired: list[bool]) -> None:
    expired.append(True)
    if writer is not None:
        writer.transport.abort()


def _int(line: bytes) -> int:
    try:
        return int(line)
    except ValueError:
        raise ConnectionError(f"RESP: not a number: {line[:40]!r}") from None


class RespConnection:
    """One connection to `host:port`, opened on first use (AUTH, SELECT), reopened after a failure.
    Connecting and each exchange are bounded by `timeout_s` (redis-py's socket_connect_timeout
    and socket_timeout)."""

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
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._buf = bytearray()

    async def execute(self, *args: Arg) -> Any:
        """One command's reply; raises ResponseError for an error reply."""
        (reply,) = await self.pipeline([args])
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    async def pipeline(self, commands: list[tuple[Arg, ...]]) -> list[Any]:
        """The replies to `commands`, sent in one write, in order; error replies in place."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests): the old one's objects are dead
            self.drop()
            self._loop, self._lock = loop, asyncio.Lock()
        assert self._lock is not None
        async with self._lock:
            expired: list[bool] = []
            try:
                if self._writer is None:
                    async with asyncio.timeout(self.timeout_s):
                        await self._connect()
                # A bare timer, not asyncio.timeout (~20 us a call on the hot path): on expiry it
                # aborts the socket, which ends the read.
                timer = loop.call_later(self.timeout_s, _expire, self._writer, expired)
                try:
                    return await self._exchange(b"".join(encode(*c) for c in commands), len(commands))
                finally:
                    timer.cancel()
            except BaseException as e:
                self.drop()  # a reply may still be on its way: nothing read later would match
                if expired or isinstance(e, TimeoutError):  # ours, or asyncio.timeout's (the builtin)
                    where = f"redis {self.host}:{self.port}"
                    raise RedisTimeoutError(f"{where}: no reply in {self.timeout_s} s") from e
                if isinstance(e, OSError | asyncio.IncompleteReadError):
                    raise ConnectionError(f"redis {self.host}:{self.port}: {e}") from e
                raise

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._buf.clear()
        hello: list[tuple[Arg, ...]] = []
        if self.password is not None:
            hello.append(("AUTH", self.username, self.password) if self.username else ("AUTH", self.password))
        if self.db:
            hello.append(("SELECT", self.db))
        if hello:
            for reply in await self._exchange(b"".join(encode(*c) for c in hello), len(hello)):
                if isinstance(reply, ResponseError):
                    self.drop()
                    auth = "AUTH" in str(reply) or "WRONGPASS" in str(reply)
                    kind = AuthenticationError if auth else ConnectionError
                    raise kind(f"redis {self.host}:{self.port}: {reply}")

    async def _exchange(self, data: bytes, n: int) -> list[Any]:
        assert self._reader is not None and self._writer is not None
        self._writer.write(data)
        await self._writer.drain()
        replies: list[Any] = []
        pos = 0
        while len(replies) < n:
            reply, nxt = parse(self._buf, pos)
            if reply is Incomplete:
                chunk = await self._reader.read(65536)
                if not chunk:
                    raise ConnectionError(f"redis {self.host}:{self.port}: connection closed")
                self._buf += chunk
                continue
            replies.append(reply)
            pos = nxt
        del self._buf[:pos]
        return replies

    def drop(self) -> None:
        """Forget the connection (closing its socket); the next call opens a new one."""
        if self._writer is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: so is the transport
                self._writer.close()
        self._reader = self._writer = None
        self._buf.clear()

    async def close(self) -> None:
        writer = self._writer
        self.drop()
        if writer is not None:
            with contextlib.suppress(OSError, RuntimeError):  # already broken, or its loop is gone
                await writer.wait_closed()
