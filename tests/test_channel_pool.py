"""A client with more sessions than one Channel may carry: the SDK opens another channel (a small
pool) instead of failing the session, keeps each session on the channel it was placed on, and
closes a channel other than the first once none of its sessions is left.

The server's cap (`session_channel.MAX_SESSIONS`, 10,000) is lowered to 3 in the in-process server,
so 7 sessions need 3 channels. Before: the 4th session failed RESOURCE_EXHAUSTED ("this channel
already carries 3 sessions")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scheduler.client import AsyncClient, Phase, QoS
from scheduler.client.mux import SessionMux
from scheduler.server import session_channel
from scheduler.server.session_channel import ChannelStream
from tests.grpc_fixtures import TOKENS, ServerThread, policy_yaml, running_server

ACME = TOKENS["acme"]


def _channels_of(server: ServerThread) -> dict[str, int]:
    """session id -> the id of the server-side channel it is attached to."""

    def read(r: Any) -> dict[str, int]:
        out = {}
        for key, s in r.loop._streams.items():
            assert isinstance(s, ChannelStream)
            out[key.partition("/")[2]] = id(s.channel)
        return out

    return server.call(read)


def test_sessions_past_a_channels_cap_go_on_another_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_channel, "MAX_SESSIONS", 3)
    with running_server(policy_yaml(slots_per_worker=2, floor=0)) as server:

        async def body() -> None:
            async with AsyncClient(server.target, token=ACME) as client:
                mux = client._mux
                assert isinstance(mux, SessionMux)
                sessions = [client.session(f"s{i}", QoS.BURSTABLE) for i in range(7)]
                for s in sessions:
                    s.start()
                for s in sessions:  # acme may hold 2: the others wait in the queue, attached
                    await s.wait_until(lambda s: s.phase in (Phase.HOLDING, Phase.QUEUED), 5)
                assert all(s.error is None and s._attached for s in sessions)
                on = _channels_of(server)
                assert len(on) == 7
                per_channel = sorted(list(on.values()).count(c) for c in set(on.values()))
                assert per_channel == [1, 3, 3]
                assert len(mux.conns) == 3
                mine = {sid: i for i, c in enumerate(mux.conns) for sid in c.sessions}
                assert len(mine) == 7  # the client knows where each one is, as the server does
                for a in mine:
                    for b in mine:
                        assert (mine[a] == mine[b]) == (on[a] == on[b])

                # The channel whose sessions all ended is closed; the first one never is.
                last = [s for s in sessions if mine[s.session_id] == 2]
                for s in last:
                    await s.release()
                assert len(mux.conns) == 2
                # A session of the first channel left: it has room again, and is used first.
                first = next(s for s in sessions if mine[s.session_id] == 0)
                await first.release()
                extra = client.session("extra", QoS.BURSTABLE)
                extra.start()
                await extra.wait_until(lambda s: s.phase in (Phase.HOLDING, Phase.QUEUED), 5)
                assert "extra" in mux.conns[0].sessions and extra.error is None
                # Renewals and releases of sessions on the second channel still work.
                for s in [*sessions, extra]:
                    if s.phase is not Phase.ENDED:
                        await s.release()
                        assert s.end_reason in ("released", "withdrawn") and s.error is None
                assert len(mux.conns) == 1

        asyncio.run(body())


def test_a_session_that_leaves_through_an_error_frees_room_on_its_channel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session of a full channel ends with a per-session error (here: another client took the
    session over, ABORTED): that channel has room again, so the next session goes there rather
    than to a new channel. Found by review: the flag stayed set."""
    monkeypatch.setattr(session_channel, "MAX_SESSIONS", 3)
    with running_server(policy_yaml(slots_per_worker=2, floor=0)) as server:

        async def body() -> None:
            async with (
                AsyncClient(server.target, token=ACME) as client,
                AsyncClient(server.target, token=ACME, multiplex=False) as other,
            ):
                mux = client._mux
                assert isinstance(mux, SessionMux)
                sessions = [client.session(f"s{i}", QoS.BURSTABLE) for i in range(4)]
                for s in sessions:
                    s.start()
                    await s.wait_until(lambda s: s.phase in (Phase.HOLDING, Phase.QUEUED), 5)
                assert len(mux.conns) == 2 and mux.conns[0].full
                taken = next(s for s in sessions if s.session_id in mux.conns[0].sessions)
                thief = other.session(taken.session_id, QoS.BURSTABLE)
                thief.start()  # the same session attached elsewhere: ours ends ABORTED
                await taken.wait_until(lambda s: s.phase is Phase.ENDED or s.error is not None, 10)
                assert taken.session_id not in mux.conns[0].sessions
                assert not mux.conns[0].full
                extra = client.session("extra", QoS.BURSTABLE)
                extra.start()
                await extra.wait_until(lambda s: s.phase in (Phase.HOLDING, Phase.QUEUED), 5)
                assert "extra" in mux.conns[0].sessions
                await thief.release()
                for s in [*sessions, extra]:
                    if s.phase is not Phase.ENDED and s is not taken:
                        await s.release()

        asyncio.run(body())
