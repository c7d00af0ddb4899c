"""Redis Cluster: every key of one pool in one hash slot, and the scheduler on it end to end.

Three primaries with two replicas each (`redis-cli --cluster create`) on loopback; the scheduler
runs in-process with `--state redis+cluster://…` (appends WAIT for one replica, the default). The
pool's keys are hash-tagged (`{slotsched}:…`), so the fenced scripts that touch several of them
run on one node; the scheduler grants, releases, restarts and recovers its leases; and when the
primary that owns the slot dies, the cluster promotes a replica and the scheduler leads again
there, like after a scheduler failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterator

import pytest

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.grants import GrantKeyring
from scheduler.serve import RunningServer, StateOptions, start_server
from scheduler.state.redis_connect import StateConfigError
from scheduler.state.redis_store import RedisStore, ReplicasBehind
from tests.grpc_fixtures import TOKENS, Client, policy_yaml, write_policy
from tests.redis_topology import ClusterSet, free_port, wait_for
from tests.test_state_redis import pytestmark as needs_redis

pytestmark = needs_redis
ACME = TOKENS["acme"]


@contextlib.contextmanager
def redis_cluster() -> Iterator[tuple[ClusterSet, str]]:
    with tempfile.TemporaryDirectory(prefix="slotsched-cluster-") as d:
        # Two replicas each: after a failover the promoted primary still has one to confirm appends.
        c = ClusterSet(d, primaries=3, replicas=2)
        try:
            c.start()
            policy = write_policy(d, policy_yaml(workers=1, slots_per_worker=1, floor=0, lease_ttl_s=3))
            yield c, policy
        finally:
            c.close()


async def serve(policy: str, url: str, keys: GrantKeyring, port: int, name: str) -> RunningServer:
    state = StateOptions(state=url, replica_id=name, leader_ttl_s=2.0, snapshot_every=4)
    return await start_server(policy, f"127.0.0.1:{port}", None, state=state, grant_keys=keys)


async def acquire(c: Client, session: str) -> common_pb2.Lease:
    call = c.acquire(session, common_pb2.QOS_CLASS_BURSTABLE)
    first = await asyncio.wait_for(call.read(), 10)
    call.cancel()
    assert first.WhichOneof("event") == "granted", first
    lease: common_pb2.Lease = first.granted.lease
    return lease


async def lease_of(c: Client, session: str) -> tuple[str, int]:
    view = await c.scheduler.GetSession(
        scheduler_pb2.GetSessionRequest(session_id=session), metadata=c.md, timeout=5
    )
    return view.lease.lease_id, view.lease.epoch


def slot_owner(cluster: ClusterSet, slot: int) -> int:
    """The index of the primary serving `slot` now."""
    for i, n in enumerate(cluster.nodes):
        with contextlib.suppress(Exception):
            c = n.client()
            if c.info("replication")["role"] == "master" and c.cluster("countkeysinslot", slot) > 0:
                return i
    raise AssertionError(f"no primary holds keys of slot {slot}")


def test_the_scheduler_on_a_cluster_keeps_one_slot_survives_a_restart_and_a_primary_failure() -> None:
    with redis_cluster() as (cluster, policy):
        keys, port = GrantKeyring.generate(), free_port()

        async def body() -> None:
            a = await serve(policy, cluster.url(), keys, port, "a")
            try:
                assert a.replica is not None and a.replica.serving
                store = a.replica.store
                a.replica.snapshot_duty = 0.0  # a snapshot each --snapshot-every, however quick
                async with Client(a.target, token=ACME) as c:
                    for i in range(40):  # churn past --snapshot-every twice: the second trims
                        if i >= 3 and await store.trimmed():
                            break
                        lease = await acquire(c, f"s{i}")
                        await c.scheduler.Release(
                            scheduler_pb2.ReleaseRequest(
                                session_id=f"s{i}", lease_id=lease.lease_id, epoch=lease.epoch
                            ),
                            metadata=c.md,
                            timeout=5,
                        )
                    held = await acquire(c, "holder")
                    assert (held.lease_id, held.epoch) == await lease_of(c, "holder")
            finally:
                await a.stop(0)

            # Every key of the pool, on whichever node it is, hashes to the one slot of the tag.
            names = [store.k_leader, store.k_journal, store.k_snapshot, store.k_trimmed, store.k_alive]
            assert all(n.startswith("{slotsched}:") for n in names)
            probe = cluster.nodes[0].client()
            slot = probe.cluster("keyslot", "{slotsched}:leader")
            assert {probe.cluster("keyslot", n) for n in names} == {slot}
            found = [k for n in cluster.nodes for k in n.client().keys("*slotsched*")]
            # Each key is listed on its primary and its replica.
            assert {k.decode() for k in found} >= {store.k_journal, store.k_snapshot, store.k_trimmed}
            assert {probe.cluster("keyslot", k) for k in found} == {slot}

            # A restart (b after a): the state is recovered from the cluster.
            b = await serve(policy, cluster.url(), keys, port, "b")
            try:
                assert b.replica is not None and b.replica.serving
                async with Client(b.target, token=ACME) as c:
                    assert await lease_of(c, "holder") == (held.lease_id, held.epoch)
                    renew = scheduler_pb2.RenewRequest(
                        session_id="holder", lease_id=held.lease_id, epoch=held.epoch
                    )
                    assert (await c.scheduler.Renew(renew, metadata=c.md, timeout=5)).state == (
                        common_pb2.LEASE_STATE_ACTIVE
                    )

                    # WAIT in a cluster: on the node of the pool's slot, on the append's connection.
                    for want, ok in ((2, True), (3, False)):
                        w = RedisStore(
                            cluster.url(f"?replicas={want}&replica_timeout_ms=200"), f"w{want}", "r"
                        )
                        try:
                            assert await w.try_lead(5.0)
                            if ok:
                                await w.append([b"x"], w.token)
                            else:
                                with pytest.raises(ReplicasBehind, match="2 of 3 replicas"):
                                    await w.append([b"x"], w.token)
                        finally:
                            await w.close()

                    # The primary that owns the slot dies: its replica is promoted, b leads again.
                    cluster.nodes[slot_owner(cluster, slot)].kill()
                    replica = b.replica
                    await asyncio.to_thread(wait_for, "step-down", lambda: not replica.serving, 10)
                    await asyncio.to_thread(wait_for, "a new leader term", lambda: replica.serving, 25)
                    assert await lease_of(c, "holder") == (held.lease_id, held.epoch)
                    assert (await c.scheduler.Renew(renew, metadata=c.md, timeout=5)).state == (
                        common_pb2.LEASE_STATE_ACTIVE
                    )
                    await c.scheduler.Release(
                        scheduler_pb2.ReleaseRequest(
                            session_id="holder", lease_id=held.lease_id, epoch=held.epoch
                        ),
                        metadata=c.md,
                        timeout=5,
                    )
                    await acquire(c, "newcomer")
            finally:
                await b.stop(0)

        asyncio.run(body())


def test_cluster_mode_refuses_a_prefix_with_braces() -> None:
    with pytest.raises(StateConfigError, match="--state-prefix"):
        RedisStore("redis+cluster://127.0.0.1:7000", "a{b}", "r")
