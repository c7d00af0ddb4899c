"""Token budgets under per-pool leadership (issue 42, item 7; decision 0018) over a real
redis-server and real gRPC, with in-process replicas of `pools_budget_policy_yaml` (budget `llm`
named by cpu-b and gpu: its home is cpu-b):

* a budget that pools on different replicas share is counted in one place, its home's unit:
  sessions of cpu-a and gpu, led by two other replicas, get permits named by the home's desk,
  and the second waits behind the first;
* a permit sent to a replica not leading the home is UNAVAILABLE NOT_LEADER naming the home
  pool, its leader and the budget; the SDK follows it for the budget's permits only (the
  sessions' own routes stay where their pools are led);
* another tenant cannot settle (or withdraw) a permit, even quoting its id and session id;
* the home pool's failover: the new leader counts the budget afresh (its bucket starts empty, a
  new incarnation), and a permit of the old leader, settled there, is charged as a debt; a
  permit on a Channel bound to another pool led on the home's replica is served there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from scheduler.client import AsyncClient, Permit
from scheduler.client.errors import PermitRefused
from scheduler.client.follow import LEADER_KEY
from scheduler.grants import GrantKeyring
from scheduler.serve import RunningServer
from scheduler.server.permits import PermitDesk
from tests.budget_fixtures import BUDGET, HOME, permit_request, pools_budget_policy_yaml, settle_request
from tests.grpc_fixtures import ADMIN_TOKEN, TOKENS, write_policy
from tests.test_pool_leadership import spread, start, trailers, until
from tests.test_state_redis import REDIS_BIN, RedisProc

pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_BIN) and not os.environ.get("CI"), reason="redis-server not installed"
)

ACME_MD = (("authorization", f"Bearer {TOKENS['acme']}"),)
GLOBEX_MD = (("authorization", f"Bearer {TOKENS['globex']}"),)
ADMIN_MD = (("authorization", f"Bearer {ADMIN_TOKEN}"),)


@contextlib.asynccontextmanager
async def cluster(n: int) -> AsyncIterator[list[RunningServer]]:
    with tempfile.TemporaryDirectory(prefix="slotsched-budget-pools-") as d:
        r = RedisProc(d).start()
        policy = write_policy(d, pools_budget_policy_yaml(workers_per_pool=1, lease_ttl_s=30))
        keys = GrantKeyring.generate()
        servers: list[RunningServer] = []
        try:
            for i in range(n):
                servers.append(await start(policy, r.url, f"r{i}", keys))
            yield servers
        finally:
            for s in servers:
                await s.stop(0)
            r.kill()


def home_desk(server: RunningServer) -> PermitDesk:
    assert server.pools is not None
    return server.pools.units[HOME].loop.permits


async def queued(permit: Permit) -> asyncio.Task[Any]:
    """The permit asked for in a task, once it is known to wait."""
    task = asyncio.create_task(permit.request())
    await until("the permit to be queued", lambda: permit.queue is not None or task.done())
    assert not task.done() or task.exception() is None
    return task


async def not_leader(target: str, call: Any) -> dict[str, str]:
    """The trailers of `call`'s NOT_LEADER once the replica names the leader (it names none
    until it has seen the leader's address: retry-after 200 ms)."""
    for _ in range(100):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async with grpc.aio.insecure_channel(target) as ch:
                await call(scheduler_pb2_grpc.SchedulerStub(ch))
        assert e.value.code() is grpc.StatusCode.UNAVAILABLE, e.value
        md = trailers(e.value)
        if LEADER_KEY in md:
            return md
        await asyncio.sleep(int(md.get(wire.RETRY_AFTER_MS, "200")) / 1000)
    raise AssertionError("no leader named")


async def described(target: str, pool: str) -> Any:
    async with grpc.aio.insecure_channel(target) as ch:
        resp = await admin_pb2_grpc.AdminStub(ch).DescribePool(
            admin_pb2.DescribePoolRequest(pool=pool), metadata=ADMIN_MD, timeout=10
        )
    return list(resp.budgets)


@pytest.mark.parametrize("multiplex", [True, False], ids=["channel", "per-session"])
def test_a_budget_shared_by_pools_on_three_replicas_is_counted_at_its_home(multiplex: bool) -> None:
    asyncio.run(asyncio.wait_for(_counted_at_home(multiplex), 240))


async def _counted_at_home(multiplex: bool) -> None:
    async with cluster(3) as servers:
        owner = await until("each replica to lead one pool", spread(servers))
        by_target = {s.target: s for s in servers}
        home = by_target[owner[HOME]]
        assert len({owner["cpu-a"], owner["gpu"], owner[HOME]}) == 3

        # A permit sent to a replica not leading the home: NOT_LEADER naming it (and the budget).
        elsewhere = owner["cpu-a"]
        md = await not_leader(elsewhere, lambda st: st.RequestPermit(permit_request("x"), metadata=ACME_MD))
        assert (md[wire.POOL], md[LEADER_KEY], md[wire.BUDGET]) == (HOME, owner[HOME], BUDGET)

        targets = [s.target for s in servers]
        async with AsyncClient(targets, token=TOKENS["acme"], multiplex=multiplex) as client:
            sa, sb = client.session("a", pool="cpu-a"), client.session("b", pool="gpu")
            async with sa, sb:
                if multiplex:
                    # A third of a minute of the budget, within acme's nominal share: it waits
                    # (the home's buckets started empty); the second comes after it, in one count.
                    big = sa.permit(BUDGET, (10_000, 10_000))
                    small = sb.permit(BUDGET, (100, 100))
                    big_task = await queued(big)
                    small_task = await queued(small)
                    assert small.queue is not None and small.queue.position >= 1
                    first = big
                else:
                    # A per-session RequestPermit answers once granted (a wait is not seen on
                    # the wire): two small ones, granted within a second of refill.
                    first = await sa.permit(BUDGET, (100, 100)).request()
                    small = sb.permit(BUDGET, (100, 100))
                    small_task = asyncio.create_task(small.request())
                desk = home_desk(home)
                assert first.permit_id is not None and desk.issued_here(first.permit_id)
                for s in servers:
                    if s is not home:  # counted nowhere else
                        assert s.pools is not None
                        assert not any(u.loop.permits.budgets.by_owner for u in s.pools.units.values())
                if multiplex:
                    await big.withdraw()  # the first leaves: the second is granted
                    with pytest.raises(PermitRefused, match="withdrawn"):  # its wait ends too
                        await big_task
                else:
                    await first.settle((100, 100))
                await small_task
                assert small.permit_id is not None and desk.issued_here(small.permit_id)
                assert small.expires_at is not None
                # Status shows the budget under its home pool, from its leader, and nowhere else.
                assert [b.name for b in await described(owner[HOME], HOME)] == [BUDGET]
                assert [b.name for b in await described(owner["cpu-a"], "cpu-a")] == []
                # The SDK learned the home, and moved only the budget's route there.
                assert client.budget_homes == {BUDGET: HOME}
                assert client.leader_of(HOME) == owner[HOME]
                assert (client.leader_of("cpu-a"), client.leader_of("gpu")) == (owner["cpu-a"], owner["gpu"])

                # Another tenant quoting the permit's id and session id cannot touch it.
                async with grpc.aio.insecure_channel(owner[HOME]) as ch:
                    stub = scheduler_pb2_grpc.SchedulerStub(ch)
                    settle = settle_request("b", small.permit_id, budget=BUDGET)
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await stub.SettlePermit(settle, metadata=GLOBEX_MD)
                    assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
                    assert b"PERMIT_NOT_OWNER" in dict(e.value.trailing_metadata())[wire.DETAILS]
                    settle = scheduler_pb2.SettlePermitRequest(
                        session_id="b", permit_id=small.permit_id, budget=BUDGET, withdraw=True
                    )
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await stub.SettlePermit(settle, metadata=GLOBEX_MD)
                    assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
                settled = await small.settle((50, 50))  # still open: its owner settles it
                assert not settled.orphan and settled.charged.input_tokens == 50


def test_the_home_pools_new_leader_counts_afresh_and_charges_old_permits_as_debts() -> None:
    asyncio.run(asyncio.wait_for(_home_failover(), 240))


async def _home_failover() -> None:
    async with cluster(2) as servers:
        owner = await until("the pools to spread over both replicas", spread(servers))
        by_target = {s.target: s for s in servers}
        home = by_target[owner[HOME]]
        survivor = next(s for s in servers if s is not home)
        pool = next(p for p in ("cpu-a", "gpu") if owner[p] == survivor.target)  # survives the stop
        old = home_desk(home).incarnation
        async with AsyncClient([s.target for s in servers], token=TOKENS["acme"]) as client:
            session = client.session("s", pool=pool)
            async with session:
                granted = await session.permit(BUDGET, (100, 100)).request()
                assert granted.permit_id is not None and granted.permit_id.startswith(old + ".")

                await home.stop(0)  # the home replica leaves: its pools move to the survivor
                servers.remove(home)
                assert survivor.pools is not None
                await until("the survivor to lead the home pool", lambda: survivor.pools.units[HOME].leads)
                desk = home_desk(survivor)
                assert desk.incarnation != old
                # A new count starts empty: far below the minute a bucket may hold (it would
                # take half a minute of refill to reach half of it).
                (view,) = desk.views()
                for have, limit in zip(view.shared_available, view.configured_per_minute, strict=True):
                    assert have <= 0.5 * limit

                settled = await granted.settle((70, 30))  # sent to the new home: a debt
                assert settled.orphan and settled.charged.input_tokens == 70
                after = await session.permit(BUDGET, (100, 100)).request()
                assert after.permit_id is not None and after.permit_id.startswith(desk.incarnation + ".")
                await after.settle((10, 10))
                # The home and the session's pool now led by one replica: a permit sent on the
                # session's own Channel (bound to its pool's unit) is served by the home's unit
                # there, with no NOT_LEADER to follow.
                client.budget_homes.clear()
                again = await session.permit(BUDGET, (100, 100)).request()
                assert again.permit_id is not None and desk.issued_here(again.permit_id)
                assert client.budget_homes == {}
                await again.settle((10, 10))
