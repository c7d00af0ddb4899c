"""One lean RESP connection (resp.py) shared by the stores of every pool a replica holds, for the
call each pool makes on a timer: the leader lease's renewal. Calls made in one turn of the event
loop go out as ONE write and come back as one read.

Why: an idle replica's CPU was mostly these renewals, one round trip each (every TTL/4 for each
pool led: 114 a second at 30 pools, bench/scaleout.py), and a round trip costs the same whether it
carries one script or thirty. The replicas put their renewals on one grid (replica.py
`_next_renewal`), so the renewals of every pool led fall due in the same turn and share one.

What a caller sees is what a call of its own would give: its own reply (an error reply in place),
or the failure of the exchange it went out in (a timeout, a broken connection: every call of that
write fails alike, as each would have on its own). A cancelled caller's command is still sent if
its turn's write has not gone yet, and its reply is discarded.

`SharedLines` is the registry: one line per Redis endpoint and credentials, made by the store
backend once per `--state` URL (config.py), so the stores of one process share it and nothing is
global to the module; a line is closed when the last store holding it closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError

from scheduler.state.resp import Arg, RespConnection

__all__ = ["SharedLine", "SharedLines"]

Command = tuple[Arg, ...]


class SharedLine:
    """Commands from any caller, coalesced per event-loop turn onto one `RespConnection`."""

    def __init__(self, conn: RespConnection, forget: Callable[[SharedLine], None] | None = None) -> None:
        self.conn = conn
        self.users = 0  # stores holding it (SharedLines.line): closed when the last lets go
        self.closed = False  # the last store let go: nothing more is sent, nor connected
        self._forget = forget
        self.writes = 0  # exchanges sent (each carries one turn's commands): a test's measure
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: list[tuple[Command, asyncio.Future[Any]]] = []
        self._armed = False
        self._connecting: set[asyncio.Task[None]] = set()

    def call(self, command: Command) -> asyncio.Future[Any]:
        """The reply to `command` (an error reply as a `ResponseError` value, not raised); it goes
        out with every other command asked for in this turn of the loop."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests): the old one's waiters are dead
            self._loop, self._queue, self._armed = loop, [], False
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.append((command, fut))
        if not self._armed:
            self._armed = True
            loop.call_soon(self._flush)
        return fut

    async def release(self) -> None:
        """One store lets go; the last one closes the connection."""
        self.users -= 1
        if self.users <= 0:
            self.closed = True
            if self._forget is not None:
                self._forget(self)
            await self.conn.close()

    def _flush(self) -> None:
        self._armed = False
        batch, self._queue = self._queue, []
        if not batch:
            return
        if self.closed:
            _settle(batch, self._closed())
            return
        if self.conn.ready:
            self._send(batch)
            return
        assert self._loop is not None
        task = self._loop.create_task(self._connect_then_send(batch))
        self._connecting.add(task)  # held until done: a task only the loop references may vanish
        task.add_done_callback(self._connecting.discard)

    async def _connect_then_send(self, batch: list[tuple[Command, asyncio.Future[Any]]]) -> None:
        try:
            await self.conn.connect()
        except BaseException as e:  # noqa: BLE001 - every caller of the batch is told, then it ends
            _settle(batch, e)
            if not isinstance(e, Exception):
                raise
            return
        if self.closed:  # the last store let go while this connected: close what it opened
            self.conn.drop()
            _settle(batch, self._closed())
            return
        self._send(batch)

    def _closed(self) -> ConnectionError:
        return ConnectionError(f"redis {self.conn.host}:{self.conn.port}: line closed")

    def _send(self, batch: list[tuple[Command, asyncio.Future[Any]]]) -> None:
        self.writes += 1
        self.conn.send([c for c, _ in batch], lambda outcome: _settle(batch, outcome))


def _settle(batch: list[tuple[Command, asyncio.Future[Any]]], outcome: list[Any] | BaseException) -> None:
    for i, (_, fut) in enumerate(batch):
        if fut.done():
            continue  # its caller was cancelled
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome[i])


class SharedLines:
    """One `SharedLine` per endpoint and credentials (and call timeout), made on first ask."""

    def __init__(self) -> None:
        self._lines: dict[tuple[Any, ...], SharedLine] = {}

    def line(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
    ) -> SharedLine:
        key = (host, port, db, username, password, timeout_s)
        got = self._lines.get(key)
        if got is None:
            conn = RespConnection(
                host, port, timeout_s=timeout_s, db=db, username=username, password=password
            )
            got = self._lines[key] = SharedLine(conn, lambda line: self._drop(key, line))
        got.users += 1
        return got

    def _drop(self, key: tuple[Any, ...], line: SharedLine) -> None:
        if self._lines.get(key) is line:
            del self._lines[key]
