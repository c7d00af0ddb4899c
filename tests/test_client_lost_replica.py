"""Issue 20 item 11, the parts one process shows: the SDK's keepalive pings are accepted by the
server on an idle channel (no GOAWAY too_many_pings), a frozen server is left after the ping
timeout, a replica that answers pings but nothing else is left after `SILENCE_S`, one that
refuses commands NOT_LEADER on an open channel is left for the leader it names, and a standby
whose leader just failed is asked again rather than that leader.

The frozen leader with a standby on Redis is tests/test_client_frozen_leader.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.client import AsyncClient, Phase, QoS, Unavailable
from scheduler.client import channel as sdk_channel
from scheduler.client.follow import Follower
from scheduler.server import errors as server_errors
from tests.grpc_fixtures import TOKENS, policy_yaml, running_server, write_policy

ROOT = Path(__file__).resolve().parents[1]
ACME = TOKENS["acme"]


def test_an_idle_channels_keepalive_pings_are_accepted() -> None:
    """Between renewals a Channel carries no data for seconds while the SDK pings every
    KEEPALIVE_TIME_MS: a server on gRPC's defaults would count those as abuse and end the
    connection (GOAWAY too_many_pings) after three, breaking every session on it."""
    with running_server(policy_yaml(workers=1, slots_per_worker=1, floor=0, lease_ttl_s=60)) as server:

        async def body() -> None:
            async with AsyncClient(server.target, token=ACME) as client:
                holder = client.session("holder", QoS.BURSTABLE)
                await holder.wait_granted(5)  # renews every 20 s: nothing to send for a while
                waiter = client.session("waiter", QoS.BURSTABLE)
                waiter.start()
                await waiter.wait_until(lambda s: s.phase is Phase.QUEUED, 5)
                pings = 6 * sdk_channel.KEEPALIVE_TIME_MS / 1000
                await asyncio.sleep(pings)
                assert (holder.reattaches, waiter.reattaches) == (0, 0)
                assert holder.renew_error is None and holder.phase is Phase.HOLDING
                await waiter.release()

        asyncio.run(body())


class _Mute:
    """A Scheduler whose Channel and GetSession take requests and never answer (its gRPC core
    still answers pings: only the silence bound tells it from a slow server). With `leader`, its
    Channel answers every command NOT_LEADER naming it instead, as a leader that stepped down
    under its open channels does."""

    def __init__(self, leader: str | None = None) -> None:
        self.calls = 0
        self.leader = leader

    async def channel(self, requests: AsyncIterator[pb.ChannelRequest], context: Any) -> AsyncIterator[Any]:
        self.calls += 1
        async for req in requests:
            if self.leader is None:
                continue
            refusal = server_errors.not_leader(self.leader).session_error()
            events = [
                pb.ChannelEvent(ref=c.ref, session_id=c.acquire.session_id, error=refusal)
                for c in req.commands
            ]
            yield pb.ChannelResponse(events=events)
        await asyncio.sleep(3600)
        yield pb.ChannelResponse()  # never reached

    async def get_session(self, request: pb.GetSessionRequest, context: Any) -> pb.SessionState:
        self.calls += 1
        await asyncio.sleep(3600)
        return pb.SessionState()


async def _mute_server(leader: str | None = None) -> tuple[grpc.aio.Server, str, _Mute]:
    mute = _Mute(leader)
    server = grpc.aio.server()
    handlers = {
        "Channel": grpc.stream_stream_rpc_method_handler(
            mute.channel,
            request_deserializer=pb.ChannelRequest.FromString,
            response_serializer=pb.ChannelResponse.SerializeToString,
        ),
        "GetSession": grpc.unary_unary_rpc_method_handler(
            mute.get_session,
            request_deserializer=pb.GetSessionRequest.FromString,
            response_serializer=pb.SessionState.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("slotsched.v1.Scheduler", handlers),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}", mute


def test_a_replica_that_answers_nothing_is_left_for_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pings answered, calls never: the Channel's acquire and a GetSession move on to the second
    target after SILENCE_S, not after connect_timeout_s / rpc_timeout_s."""
    monkeypatch.setattr(sdk_channel, "SILENCE_S", 1.0)
    with running_server(policy_yaml()) as real:

        async def body() -> None:
            mute_server, mute_target, mute = await _mute_server()
            try:
                async with AsyncClient(
                    [mute_target, real.target], token=ACME, connect_timeout_s=60, rpc_timeout_s=60
                ) as client:
                    t0 = time.monotonic()
                    s = client.session("s", QoS.BURSTABLE)
                    await s.wait_granted(60)
                    took_acquire = time.monotonic() - t0
                    assert client.leader == real.target and mute.calls >= 1
                    client._follower.current = mute_target  # as if the mute one led again
                    client._follower._suspect.clear()
                    t0 = time.monotonic()
                    info = await client.get_session("s")
                    took_get = time.monotonic() - t0
                    assert info.phase is Phase.HOLDING and client.leader == real.target
                    await s.release()
                # Left after the 1 s bound, far before the 60 s timeouts (generously: a busy
                # machine stretches the wall clock; the 1 s bound itself is the SDK's timer).
                assert took_acquire < 20.0 and took_get < 20.0, (took_acquire, took_get)
            finally:
                await mute_server.stop(None)

        asyncio.run(body())


def test_a_channel_refused_not_leader_is_left_for_the_leader_it_names() -> None:
    """Without leaving, every re-attach would go on the same open channel, refused the same, until
    connect_timeout_s: the replica stepped down, its channel did not end."""
    with running_server(policy_yaml()) as real:

        async def body() -> None:
            old_server, old_target, old = await _mute_server(leader=real.target)
            try:
                async with AsyncClient([old_target, real.target], token=ACME, connect_timeout_s=60) as client:
                    t0 = time.monotonic()
                    s = client.session("s", QoS.BURSTABLE)
                    await s.wait_granted(60)
                    # At once, not after connect_timeout_s (generous: a busy machine).
                    assert time.monotonic() - t0 < 20.0 and old.calls == 1
                    assert client.leader == real.target
                    await s.release()
            finally:
                await old_server.stop(None)

        asyncio.run(body())


class _Lost(grpc.aio.AioRpcError):
    def __init__(self, details: str) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def test_a_standby_whose_leader_just_failed_is_asked_again_not_that_leader() -> None:
    """A frozen leader would hold a new connection for 20 s (gRPC's connect timeout): while it is
    suspect, a standby that names no other leader is retried (its take-over is under way)."""
    f = Follower(["a", "b"], [], None)
    assert f.failed("a", _Lost("ping timeout")) is not None and f.current == "b"
    wait = f.failed("b", _Lost("not the leader: this replica is a standby"))
    assert f.current == "b" and wait is not None and wait > 0


def test_a_frozen_server_fails_the_sessions_call_after_the_ping_timeout(tmp_path: Path) -> None:
    """One target, SIGSTOPped: the Channel breaks once a ping goes unanswered (not when the
    process wakes), so the session re-attaches, and fails `Unavailable` on its own bounds."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    policy = write_policy(tmp_path, policy_yaml(workers=1, slots_per_worker=1, floor=0, lease_ttl_s=60))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLOTSCHED_AUTOSCALER": "off"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "serve", "--policy", policy, "--listen", f"127.0.0.1:{port}",
         "--metrics-listen", ""],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    target = f"127.0.0.1:{port}"

    async def body() -> None:
        async with AsyncClient(target, token=ACME, reattach_timeout_s=2.0) as client:
            s = client.session("s", QoS.BURSTABLE)
            deadline = time.monotonic() + 20
            while True:  # the server starts up meanwhile
                try:
                    await s.wait_granted(20)
                    break
                except Unavailable:
                    assert time.monotonic() < deadline
                    s = client.session("s", QoS.BURSTABLE)
            proc.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            await s.wait_until(lambda s: s.reattaches >= 1 or s.ended.is_set(), 15)
            broke = time.monotonic() - t0
            # At most one keepalive interval of quiet, then the ping's timeout (within 2x).
            bound = (sdk_channel.KEEPALIVE_TIME_MS + sdk_channel.KEEPALIVE_TIMEOUT_MS) / 1000
            assert broke < 2 * bound, broke
            proc.send_signal(signal.SIGCONT)

    try:
        asyncio.run(body())
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(10)
