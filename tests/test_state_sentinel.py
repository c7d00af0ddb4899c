"""Redis Sentinel: the Redis primary dies under a serving scheduler, as a scheduler might.

One primary, two replicas and three sentinels (quorum 2, down-after 500 ms) on loopback; the
scheduler runs in-process with `--state redis+sentinel://…` (journal appends WAIT for the
replica, the Sentinel default). SIGKILL the primary: the scheduler steps down, the sentinels
promote the replica, the scheduler finds it through them, wins a new term there and recovers;
the session keeps its lease (same id and epoch) and renews it, and a new Acquire is granted.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterator

import grpc
import pytest

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.client import AsyncClient, Phase, QoS
from scheduler.grants import GrantKeyring
from scheduler.serve import RunningServer, StateOptions, start_server
from scheduler.state.redis_store import RedisStore, ReplicasBehind
from tests.grpc_fixtures import TOKENS, Client, policy_yaml, write_policy
from tests.redis_topology import SentinelSet, wait_for
from tests.test_state_redis import pytestmark as needs_redis

pytestmark = needs_redis
ACME = TOKENS["acme"]


@contextlib.contextmanager
def sentinel_set(replicas: int = 1, sentinels: int = 3) -> Iterator[tuple[SentinelSet, str]]:
    with tempfile.TemporaryDirectory(prefix="slotsched-sentinel-") as d:
        s = SentinelSet(d, replicas=replicas, sentinels=sentinels)
        try:
            s.start()
            policy = write_policy(d, policy_yaml(workers=2, slots_per_worker=1, floor=0, lease_ttl_s=3))
            yield s, policy
        finally:
            s.close()


async def serve(policy: str, url: str, keys: GrantKeyring) -> RunningServer:
    state = StateOptions(state=url, replica_id="a", leader_ttl_s=2.0)
    return await start_server(policy, "127.0.0.1:0", None, state=state, grant_keys=keys)


def test_the_redis_primary_dies_and_the_scheduler_recovers_on_the_promoted_replica() -> None:
    # Two replicas: after the failover one is left to confirm appends (replicas=1).
    with sentinel_set(replicas=2) as (s, policy):
        old = s.primary.port

        async def body() -> None:
            running = await serve(policy, s.url(), GrantKeyring.generate())
            assert running.replica is not None
            replica = running.replica
            try:
                assert replica.serving
                async with AsyncClient(running.target, token=ACME, reattach_timeout_s=30) as client:
                    holder = client.session("holder", QoS.BURSTABLE)
                    holder.start()
                    held = await holder.wait_granted(5)
                    before = (holder.lease_id, holder.epoch)

                    s.primary.kill()
                    # The scheduler fails like a scheduler would: it steps down at its next call.
                    await asyncio.to_thread(wait_for, "step-down", lambda: not replica.serving, 10)
                    # ... the sentinels promote the replica, and the scheduler leads again there.
                    await asyncio.to_thread(wait_for, "a new leader term", lambda: replica.serving, 20)
                    assert s.current_primary_port() != old
                    await holder.wait_until(lambda x: x.reattaches >= 1 and x.phase is Phase.HOLDING, 15)
                    assert (holder.lease_id, holder.epoch) == before and not holder.lost_lease.is_set()

                    async with Client(running.target, token=ACME) as c:
                        renew = scheduler_pb2.RenewRequest(
                            session_id="holder", lease_id=before[0], epoch=before[1]
                        )
                        got = await c.scheduler.Renew(renew, metadata=c.md, timeout=5)
                        assert got.state == common_pb2.LEASE_STATE_ACTIVE
                        call = c.acquire("newcomer", common_pb2.QOS_CLASS_BURSTABLE)
                        first = await asyncio.wait_for(call.read(), 10)
                        assert first.WhichOneof("event") == "granted", first
                        assert first.granted.lease.lease_id != before[0]
                        # The other slot: the holder's is still its own (no double grant).
                        got_slot = (first.granted.lease.slot.worker_id, first.granted.lease.slot.index)
                        assert got_slot != (held.slot.worker_id, held.slot.index)
                        call.cancel()
                    # The journal on the promoted primary holds the lease (and nothing was lost).
                    promoted = s.node_on(s.current_primary_port()).client()
                    assert promoted.xlen("slotsched:journal") > 0
                    await holder.release()
            finally:
                await running.stop(0)

        asyncio.run(body())


def test_an_append_no_replica_confirms_fails_and_is_never_acknowledged() -> None:
    """With `replicas=1`, a write only the primary holds is a failed write: the caller is never
    told about it (a failover could lose it), and the scheduler steps down."""
    with sentinel_set(sentinels=1) as (s, policy):

        async def body() -> None:
            store = RedisStore(s.url("?replica_timeout_ms=200"), "t", "a")
            try:
                assert await store.try_lead(5.0)
                await store.append([b"one"], store.token)  # the replica confirms
                s.replicas[0].kill()
                with pytest.raises(ReplicasBehind, match="0 of 1 replicas"):
                    await store.append([b"two"], store.token)
            finally:
                await store.close()

            running = await serve(policy, s.url("?replica_timeout_ms=200"), GrantKeyring.generate())
            try:
                # No replica: nothing is acknowledged, so the scheduler never serves.
                assert running.replica is not None and not running.replica.serving
                async with Client(running.target, token=ACME) as c:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await c.scheduler.Acquire(
                            scheduler_pb2.AcquireRequest(session_id="x", qos=common_pb2.QOS_CLASS_BURSTABLE),
                            metadata=c.md,
                            timeout=5,
                        ).read()
                    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            finally:
                await running.stop(0)

        asyncio.run(body())
