"""Sessions asleep in re-attach backoff are woken when their client hears from the server again
(scheduler/client/wake.py), over both wire shapes.

Why: every session of a client sleeps its own doubling backoff after its stream broke; without the
wake a session hears of the server's return (and of a grant made meanwhile) only when its own sleep
ends, seconds after its neighbours re-attached. Real gRPC over loopback through a proxy that cuts
and then refuses connections; the backoff grows to seconds (0.05 s doubling to 5 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from scheduler.client import AsyncClient, AsyncSession, QoS
from scheduler.client.mux import rpc_error
from scheduler.client.wake import Wake
from tests.grpc_fixtures import TOKENS, policy_yaml, running_server
from tests.test_client_sdk import CuttableProxy

ACME = TOKENS["acme"]
MODES = pytest.mark.parametrize("multiplex", [True, False], ids=["channel", "per-session"])
# gRPC's own reconnect backoff kept short, so the channel is up again as soon as the proxy is and
# what is measured is the sessions' backoff.
QUICK_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 100),
]
_EOF = object()


def _policy() -> str:
    tenants = [{"name": "acme", "guaranteed": 0, "burstable": {"nominal": 8, "limit": 8}}]
    return policy_yaml(tenants, workers=1, slots_per_worker=8, floor=0, lease_ttl_s=60)


class RefusingProxy(CuttableProxy):
    """A CuttableProxy that can also refuse new connections (reset at once), as a dead server."""

    refusing = False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        await super()._handle(reader, writer)


class _Watched:
    """One Acquire call: notes when its first event arrives; `drop` breaks it UNAVAILABLE."""

    def __init__(self, inner: Any, gate: _Gate, sid: str) -> None:
        self.inner = inner
        self.gate = gate
        self.sid = sid
        self.dropped: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def cancel(self) -> bool:
        return bool(self.inner.cancel())

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._events()

    async def _events(self) -> AsyncIterator[Any]:
        if self.sid in self.gate.blocked:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, "blocked by the test")
        events = self.inner.__aiter__()
        first = True
        while True:
            nxt = asyncio.ensure_future(anext(events, _EOF))
            await asyncio.wait({nxt, self.dropped}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                nxt.cancel()
                self.inner.cancel()
                raise rpc_error(grpc.StatusCode.UNAVAILABLE, "dropped by the test")
            ev = nxt.result()
            if ev is _EOF:
                return
            if first:
                first = False
                self.gate.answered.setdefault(self.sid, []).append(asyncio.get_running_loop().time())
            yield ev


class _Gate:
    """The client's session transport, watched: when each Acquire got its first event (`answered`);
    a session's stream broken on its own (`drop`), its next attempts failing while `blocked`."""

    def __init__(self, client: AsyncClient) -> None:
        self.answered: dict[str, list[float]] = {}
        self.blocked: set[str] = set()
        self.calls: dict[str, _Watched] = {}
        inner = client.transport
        gate = self

        class Transport:
            async def send(self, *args: Any) -> Any:
                return await inner().send(*args)

            def attach(self, request: Any, metadata: Any) -> _Watched:
                call = gate.calls[request.session_id] = _Watched(
                    inner().attach(request, metadata), gate, request.session_id
                )
                return call

        transport = Transport()
        client.transport = lambda: transport  # type: ignore[method-assign]

    def drop(self, sid: str) -> None:
        self.blocked.add(sid)
        fut = self.calls[sid].dropped
        if not fut.done():
            fut.set_result(None)

    def after(self, sid: str, t: float) -> float:
        """When `sid` first heard from the server after `t`."""
        return min(x for x in self.answered.get(sid, []) if x > t)


async def _attached(client: AsyncClient, n: int) -> list[AsyncSession]:
    sessions = [client.session(f"s{i}", QoS.BURSTABLE) for i in range(n)]
    for s in sessions:
        await s.wait_granted(5)
    return sessions


async def _heard_after(gate: _Gate, sessions: list[AsyncSession], t: float, timeout: float) -> list[float]:
    async def all_heard() -> None:
        while not all(any(x > t for x in gate.answered.get(s.session_id, [])) for s in sessions):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(all_heard(), timeout)
    return [gate.after(s.session_id, t) for s in sessions]


async def _tried(sessions: list[AsyncSession], n: int, timeout: float = 30) -> None:
    """Until every session has started its `n`th re-attach (so it sleeps the next backoff): the
    outage's sleep says how long at least, this when, as a busy machine runs the retries late."""

    async def all_tried() -> None:
        while min(s.reattaches for s in sessions) < n:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(all_tried(), timeout)


def _client(proxy: Any, **kw: Any) -> AsyncClient:
    """A client through `proxy` whose backoff grows from 0.05 s to 5 s (so a sleep is long)."""
    return AsyncClient(
        f"127.0.0.1:{proxy.port}",
        token=ACME,
        channel_options=QUICK_RECONNECT,
        backoff_initial_s=0.05,
        backoff_max_s=5.0,
        reattach_timeout_s=60,
        **kw,
    )


@MODES
def test_the_first_session_back_wakes_those_that_broke_at_other_times(multiplex: bool) -> None:
    """Sessions whose streams broke at different times sleep out of step: the first to re-attach
    after the outage wakes the others, which re-attach at once instead of seconds later."""
    with running_server(_policy()) as server:

        async def body() -> None:
            proxy = await RefusingProxy(server.port).start()
            client = _client(proxy, multiplex=multiplex)
            try:
                async with client:
                    gate = _Gate(client)
                    sessions = await _attached(client, 4)
                    loop = asyncio.get_running_loop()
                    # s1..s3 lose their streams 0.35 s apart (out of step), then everything goes.
                    for s in reversed(sessions[1:]):
                        gate.drop(s.session_id)
                        await asyncio.sleep(0.35)
                    proxy.refusing = True
                    assert proxy.cut() >= 1
                    gate.blocked.clear()  # from now on the outage is the network's
                    await asyncio.sleep(2.5)
                    await _tried(sessions, 4)  # backoffs of seconds by now
                    restored = loop.time()
                    proxy.refusing = False
                    times = await _heard_after(gate, sessions, restored, 10)
                    # Out of step, the last would wait ~3 s more than the first (see the sleeps).
                    assert max(times) - min(times) < 1.0, [round(t - restored, 2) for t in times]
                    assert client.wake.wakes >= 1
                    for s in sessions:
                        assert s.lease is not None and not s.lost_lease.is_set()
            finally:
                await proxy.close()

        asyncio.run(body())


@MODES
def test_a_new_session_reaching_the_server_wakes_the_sessions_asleep_in_backoff(multiplex: bool) -> None:
    """All streams break together and stay down past a retry; the server is back between two of
    their retries. A session started then reaches it first, and the others follow at once."""
    with running_server(_policy()) as server:

        async def body() -> None:
            proxy = await RefusingProxy(server.port).start()
            client = _client(proxy, multiplex=multiplex)
            try:
                async with client:
                    gate = _Gate(client)
                    sessions = await _attached(client, 3)
                    loop = asyncio.get_running_loop()
                    proxy.refusing = True
                    assert proxy.cut() >= 1
                    # Retries at 0.05, 0.15, 0.35, 0.75, 1.55, 3.15 s; the next at 6.35 s.
                    await asyncio.sleep(3.4)
                    await _tried(sessions, 6)
                    restored = loop.time()
                    proxy.refusing = False
                    fresh = client.session("fresh", QoS.BURSTABLE)
                    await fresh.wait_granted(5)
                    times = await _heard_after(gate, sessions, restored, 10)
                    first = gate.after("fresh", restored)
                    assert max(times) - first < 1.0, [round(t - restored, 2) for t in times]
                    for s in sessions:
                        assert s.lease is not None and not s.lost_lease.is_set()
            finally:
                await proxy.close()

        asyncio.run(body())


@MODES
def test_a_renewal_answered_after_the_outage_wakes_the_sessions_asleep_in_backoff(multiplex: bool) -> None:
    """Renewals go on while the streams are down (per-session: on schedule; on a channel: retried,
    each opening a channel); the first answered one wakes the re-attaches."""
    with running_server(_policy()) as server:

        async def body() -> None:
            proxy = await RefusingProxy(server.port).start()
            client = _client(proxy, multiplex=multiplex, renew_interval_s=0.3)
            try:
                async with client:
                    gate = _Gate(client)
                    sessions = await _attached(client, 3)
                    loop = asyncio.get_running_loop()
                    proxy.refusing = True
                    assert proxy.cut() >= 1
                    await asyncio.sleep(3.4)  # past the retry at 3.15 s; the next at 6.35 s
                    await _tried(sessions, 6)
                    assert all(s.renew_error is not None for s in sessions)
                    restored = loop.time()
                    proxy.refusing = False
                    times = await _heard_after(gate, sessions, restored, 10)
                    assert max(times) - restored < 1.5, [round(t - restored, 2) for t in times]
                    for s in sessions:
                        assert s.lease is not None and not s.lost_lease.is_set()
            finally:
                await proxy.close()

        asyncio.run(body())


def test_the_first_answer_on_a_new_channel_wakes_the_sessions_asleep_in_backoff() -> None:
    """On a channel a command may be the first to reach the server after the outage (here a
    release, from a session asleep in backoff itself): its answer on the new channel wakes the
    others."""
    with running_server(_policy()) as server:

        async def body() -> None:
            proxy = await RefusingProxy(server.port).start()
            client = _client(proxy)
            try:
                async with client:
                    gate = _Gate(client)
                    leaving, *sessions = await _attached(client, 4)
                    loop = asyncio.get_running_loop()
                    proxy.refusing = True
                    assert proxy.cut() >= 1
                    await asyncio.sleep(3.4)  # past the retry at 3.15 s; the next at 6.35 s
                    await _tried([leaving, *sessions], 6)
                    restored = loop.time()
                    proxy.refusing = False
                    await leaving.release()  # its stream is not re-attached: only the Release goes
                    assert leaving.end_reason == "released"
                    times = await _heard_after(gate, sessions, restored, 10)
                    assert max(times) - restored < 1.5, [round(t - restored, 2) for t in times]
            finally:
                await proxy.close()

        asyncio.run(body())


def test_wake_cuts_every_sleep_short_and_only_the_sleeps_under_way() -> None:
    async def body() -> None:
        wake = Wake()
        wake.heard()  # nobody asleep: nothing happens, nothing is remembered
        assert await wake.sleep(0.01) is False
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        sleeps = [asyncio.create_task(wake.sleep(5.0)) for _ in range(3)]
        cancelled = asyncio.create_task(wake.sleep(5.0))
        await asyncio.sleep(0.05)
        cancelled.cancel()
        await asyncio.sleep(0)
        wake.heard()
        assert await asyncio.gather(*sleeps) == [True, True, True]
        assert loop.time() - t0 < 1.0 and wake.wakes == 3 and cancelled.cancelled()
        assert await wake.sleep(0.01) is False  # a later sleep is not cut short by an old wake

    asyncio.run(body())
