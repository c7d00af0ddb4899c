"""The SDK under per-pool leadership (`serve --leadership pool`), over a real redis-server and real
gRPC: one `AsyncClient` given both replicas of a three-pool policy keeps a route per pool.

* a session in each pool is granted although the pools are led by different replicas: each
  pool's calls (and its Channel stream) go to that pool's leader (`leader_of`), all over one gRPC
  channel per replica;
* the replica leading some pools stops: the sessions in those pools re-attach on the other
  replica with the same lease and keep renewing; the sessions in the other pools see nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

from scheduler.client import AsyncClient, AsyncSession
from scheduler.client.routes import PoolRoute, route_key
from tests.grpc_fixtures import TOKENS
from tests.test_pool_leadership import POOLS, cluster, leaders, pytestmark, spread, until

__all__ = ["pytestmark"]  # redis-server required (skipped without it, as test_pool_leadership)


def test_route_keys() -> None:
    assert route_key("gpu", ()) == "gpu"
    assert route_key("", (("kind", "cpu"), ("a", "1"))) == "selector:a=1,kind=cpu"
    assert route_key("", ()) == ""


def _expires(s: AsyncSession) -> datetime:
    assert s.lease is not None and s.lease.expires_at is not None
    return s.lease.expires_at


def test_client_routes_each_pool_to_its_leader_and_follows_a_move() -> None:
    asyncio.run(_routes_and_move())


async def _routes_and_move() -> None:
    async with cluster(2) as (_policy, _url, servers, _keys):
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
            since = {p: _expires(s) for p, s in sessions.items()}

            # Every session renews again after the move (on the survivor: the other one is gone).
            def renewed() -> bool:
                return all(s.lease is not None and _expires(s) > since[p] for p, s in sessions.items())

            await until("every session to renew on the survivor", renewed, timeout=20)
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
            mark = {p: _expires(s) for p, s in sessions.items()}
            await until("another renewal", lambda: all(_expires(s) > mark[p] for p, s in sessions.items()))
