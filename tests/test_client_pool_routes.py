"""The SDK under per-pool leadership (`serve --leadership pool`), over a real redis-server and real
gRPC: one `AsyncClient` given both replicas of a three-pool policy keeps a route per pool.

* a session in each pool is granted although the pools are led by different replicas: each
  pool's calls (and its Channel stream) go to that pool's leader (`leader_of`), all over one gRPC
  channel per replica;
* the replica leading some pools stops: the sessions in those pools re-attach on the other
  replica with the same lease and keep renewing; the sessions in the other pools see nothing;
* a replica joins and takes its share: those pools' sessions follow it, leases kept;
* `close()` ends every route's Channel stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime

from scheduler.client import AsyncClient, AsyncSession
from scheduler.client.routes import PoolRoute, route_key
from tests.grpc_fixtures import TOKENS
from tests.test_pool_leadership import POOLS, cluster, leaders, pytestmark, spread, start, until

__all__ = ["pytestmark"]  # redis-server required (skipped without it, as test_pool_leadership)


def test_route_keys() -> None:
    assert route_key("gpu", ()) == "gpu"
    assert route_key("", (("kind", "cpu"), ("a", "1"))) == "selector:a=1,kind=cpu"
    assert route_key("", ()) == ""


def test_a_session_is_given_its_route_and_the_default_route_is_the_client() -> None:
    asyncio.run(_links())


async def _links() -> None:
    async with AsyncClient("127.0.0.1:1,127.0.0.1:2") as client:  # never dialled
        plain = client.session("s0")
        assert plain._tasks._client is client and client._routes == {}  # as before routes
        gpu = client.session("s1", pool="gpu")
        cpu = client.session("s2", selector={"kind": "cpu"})
        assert set(client._routes) == {"gpu", "selector:kind=cpu"}
        route = client._routes["gpu"]
        assert gpu._tasks._client is route and client.session("s3", pool="gpu")._tasks._client is route
        assert cpu._tasks._client is client._routes["selector:kind=cpu"]
        assert route.follower is client._follower.routes["gpu"] and route.mux is not client._mux
        assert client.leader_of("gpu") == client.leader_of("nowhere") == "127.0.0.1:1"
        client._follower.routes["gpu"].current = "127.0.0.1:2"  # as a NOT_LEADER naming gpu would
        assert client.leader_of("gpu") == route.leader == "127.0.0.1:2" and client.leader == "127.0.0.1:1"
        # Settings are the client's, read live.
        client.rpc_timeout_s = 4.5
        assert route.rpc_timeout_s == 4.5 and route.sessions is client.sessions and route.wake is client.wake
    assert client.closed


def _expires(s: AsyncSession) -> datetime:
    assert s.lease is not None and s.lease.expires_at is not None
    return s.lease.expires_at


def renewed_since(sessions: dict[str, AsyncSession]) -> Callable[[], bool]:
    """True once every session renewed (its lease's expiry moved on) after this call."""
    mark = {p: _expires(s) for p, s in sessions.items()}
    return lambda: all(s.lease is not None and _expires(s) > mark[p] for p, s in sessions.items())


def test_client_routes_each_pool_to_its_leader_and_follows_a_move() -> None:
    asyncio.run(_routes_and_move())


#: The sessions' lease TTL. A renewal moves a lease's expiry only once it is within a TTL of now
#: (then to half a TTL beyond: `Core._renew`), so `renewed_since` waits up to half of it; at the
#: fixtures' 30 s each such wait was 15 s. At 6 s the renewals (every 0.2 s) still keep a lease
#: through a stalled second or two of a busy machine, and a stopped replica's pools move in well
#: under a second (the survivor's hot standby holds them).
LEASE_TTL_S = 6.0


async def _routes_and_move() -> None:
    async with cluster(2, lease_ttl_s=LEASE_TTL_S) as (policy, url, servers, keys):
        owner = await until("the pools to spread over both replicas", spread(servers))
        targets = [s.target for s in servers]
        client = AsyncClient(",".join(targets), token=TOKENS["acme"], renew_interval_s=0.2)
        async with client, contextlib.AsyncExitStack() as stack:
            sessions: dict[str, AsyncSession] = {}
            for p in POOLS:
                s = client.session(f"s-{p}", pool=p)
                await asyncio.wait_for(stack.enter_async_context(s), 20)
                sessions[p] = s

            # Each granted in its own pool, each pool's calls going to its own leader.
            for p, s in sessions.items():
                assert s.lease is not None and s.pool == p, (p, s.lease)
                assert client.leader_of(p) == owner[p], (p, client.leader_of(p), owner)
            assert len(set(owner.values())) == 2  # so the routes really differ
            # One Channel stream per pool (its own route's multiplexer), one gRPC channel per
            # replica shared by every route.
            routes = client._routes
            assert set(routes) == set(POOLS)
            for p, route in routes.items():
                assert isinstance(route, PoolRoute) and route.mux is not None
                assert len(route.mux.conns) == 1, (p, route.mux.conns)
                assert route.leader == owner[p]
            root = client._follower
            assert sorted(root._channels) == sorted(targets), root._channels
            assert all(f._channels is root._channels for f in root.routes.values())

            # The leader of gpu stops: its pools move to the other replica.
            lead = owner["gpu"]
            other = next(t for t in targets if t != lead)
            moved = [p for p in POOLS if owner[p] == lead]
            kept = [p for p in POOLS if owner[p] == other]
            assert moved and kept
            before = {p: (s.lease_id, s.reattaches) for p, s in sessions.items()}
            leaving = next(s for s in servers if s.target == lead)
            await leaving.stop(0)
            servers.remove(leaving)
            alone = [other]
            await until("the survivor to lead", lambda: all(v == alone for v in leaders(servers).values()))
            # Every session renews again after the move (on the survivor: the other one is gone).
            await until("every session to renew on the survivor", renewed_since(sessions), timeout=20)
            for p in moved:
                s = sessions[p]
                assert s.lease_id == before[p][0], (p, s.lease_id, before[p])  # the same lease
                assert s.reattaches > before[p][1], p  # re-attached on the survivor
                assert not s.lost_lease.is_set() and s.error is None, (p, s.error)
                assert client.leader_of(p) == other
                info = await client.get_session(f"s-{p}", pool=p)
                assert info.lease is not None and info.lease.lease_id == before[p][0]
            for p in kept:
                s = sessions[p]
                assert (s.lease_id, s.reattaches) == before[p], p  # untouched: no re-attach
                assert s.error is None and s.renew_error is None, (p, s.error, s.renew_error)
                assert not s.lost_lease.is_set()
                assert client.leader_of(p) == other
            assert set(root._channels) <= set(targets), root._channels
            # The renewals keep going on the survivor.
            await until("another renewal", renewed_since(sessions))

            # A replica joins and takes its share: the pools handed to it move their sessions
            # there (their streams end NOT_LEADER naming the pool), their leases kept.
            servers.append(await start(policy, url, "r9", keys))
            owner = await until("the pools to spread again", spread(servers))
            joined = servers[-1].target
            handed = [p for p in POOLS if owner[p] == joined]
            assert handed
            await until("the client to follow", lambda: all(client.leader_of(p) == owner[p] for p in POOLS))
            await until("renewals after the join", renewed_since(sessions), timeout=20)
            for p, s in sessions.items():
                assert s.lease_id == before[p][0] and s.error is None and not s.lost_lease.is_set(), p
            # The joiner is no target: reached through the channel a NOT_LEADER named (one more).
            assert set(root._channels) == {*targets, joined}, root._channels
            conns = [c for r in routes.values() if r.mux is not None for c in r.mux.conns]
            assert len(conns) == len(POOLS)
        # close() closed every route's Channel stream.
        assert all(r.mux is not None and not r.mux.conns for r in routes.values())
        assert all(c.call.done() for c in conns), [c.call for c in conns]
