"""A worker in a pool (issue 24): it learns its pool and the pool's compatibility labels at
registration and stamps them into every snapshot it takes, so a session resuming from it goes
only where those labels hold; a misrouted resume is refused by the worker itself, naming both;
a worker credential may not join a pool its entry does not list. Real scheduler, real workers,
real gRPC; the lease holder is the SDK's `actor_session`."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from scheduler.client import AsyncClient, QoS, SnapshotRef
from scheduler.client.worker_runtime import ActorRuntime, WorkerCallError, WorkerClients, actor_session
from scheduler.grants import GrantKeyring
from scheduler.serve import start_server
from slots.worker.actor import ActorConfig
from slots.worker.agent import SchedulerRefused
from slots.worker.main import start_worker
from slots.worker.service import ref_from_pb, ref_to_pb
from snapshots.ref import SnapshotRef as StoreRef
from tests.grpc_fixtures import TOKENS, WORKER_B_TOKEN, WORKER_TOKEN, pools_policy_yaml, write_policy

CONFIG = ActorConfig(bytes_per_turn=256, turn_interval_s=0.02)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_workers_converters_keep_pool_and_labels() -> None:
    ref = StoreRef("file:///s/1", 10, "ab" * 32, 12.5, "cpu-a", (("cpuModel", "icelake"),))
    assert ref_from_pb(ref_to_pb(ref)) == ref
    old = StoreRef("file:///s/2", 1, "", 0.0)
    assert ref_from_pb(ref_to_pb(old)) == old  # a ref of before pools reads back as it was


def test_a_snapshot_records_the_pool_and_resumes_only_where_its_labels_hold(tmp_path: Path) -> None:
    policy = write_policy(tmp_path, pools_policy_yaml(workers_per_pool=0))
    listen = f"127.0.0.1:{_free_port()}"
    keys = GrantKeyring.generate("k1")

    async def worker(wid: str, pool: str, token: str) -> Any:
        return await start_worker(
            listen, wid, 2, snapshots=str(tmp_path / "snapshots"), token=token, pool=pool,
            actor_config=CONFIG, grants=keys.verifier(), drain_timeout_s=1,
        )  # fmt: skip

    async def go() -> None:
        server = await start_server(policy, listen, None, False, heartbeat_interval_s=0.2, grant_keys=keys)
        a = await worker("w1", "cpu-a", WORKER_TOKEN)
        b = await worker("b1", "cpu-b", WORKER_B_TOKEN)
        workers = WorkerClients()
        rt = ActorRuntime(workers, start_attempts=1)
        try:
            await asyncio.wait_for(a.agent.registered.wait(), 5)
            await asyncio.wait_for(b.agent.registered.wait(), 5)
            assert (a.service.pool, a.service.pool_labels) == ("cpu-a", (("cpuModel", "icelake"),))
            assert (b.service.pool, b.service.pool_labels) == ("cpu-b", (("cpuModel", "sapphire"),))
            assert dict(a.service.pool_all_labels) == {"kind": "cpu", "cpuModel": "icelake"}
            # The worker checks a snapshot's labels as placement does: each must be its pool's,
            # a key its pool's compatibility does not name included.
            gpu_snap = StoreRef("file:///s/g", 1, "", 0.0, "gpu", (("gpu", "a100"),))
            assert a.service.incompatible(gpu_snap) is not None
            own = StoreRef("file:///s/a", 1, "", 0.0, "cpu-a", (("cpuModel", "icelake"),))
            assert a.service.incompatible(own) is None
            assert b.service.incompatible(own) is not None
            async with AsyncClient(listen, token=TOKENS["acme"]) as client:
                async with actor_session(client, "s1", QoS.BURSTABLE, rt, pool="cpu-a") as s:
                    lease = s.lease
                    assert lease is not None and lease.pool == "cpu-a" and lease.slot.worker_id == "w1"
                    await asyncio.sleep(0.1)  # a few turns
                    snap = await workers(lease.worker_address).checkpoint(
                        "s1", tenant="acme", lease_id=lease.lease_id, epoch=lease.epoch, grant=lease.grant
                    )
                assert snap.pool == "cpu-a" and dict(snap.labels) == {"cpuModel": "icelake"}
                # Resuming from it with a selector both CPU pools match: only cpu-a is eligible.
                async with actor_session(
                    client, "s2", QoS.BURSTABLE, rt, selector={"kind": "cpu"}, resume_from=snap
                ) as s2:
                    assert s2.lease is not None and s2.lease.pool == "cpu-a"
                # A resume misrouted to the cpu-b worker (by hand, past the scheduler) is refused
                # by the worker: its lease there resumes from no snapshot.
                async with client.session("s3", QoS.BURSTABLE, pool="cpu-b") as s3:
                    assert s3.lease is not None and s3.lease.slot.worker_id == "b1"
                    moved = replace(s3.lease, resume_from=snap)
                    with pytest.raises(WorkerCallError, match="resumes from no snapshot") as refused:
                        await workers(s3.lease.worker_address).start(moved, "acme")
                    assert refused.value.code is not None and refused.value.code.name == "PERMISSION_DENIED"
                # The lease records the snapshot's labels: what the worker checks a Start against,
                # whatever labels the caller's Start carries (test_worker_leases.py).
                async with actor_session(
                    client, "s4", QoS.BURSTABLE, rt, pool="cpu-a", resume_from=snap
                ) as s4:
                    assert s4.lease is not None and s4.lease.resume_from is not None
                    assert dict(s4.lease.resume_from.labels) == {"cpuModel": "icelake"}
            # A worker credential may not join a pool its entry does not list.
            bad = await worker("w9", "cpu-b", WORKER_TOKEN)
            try:
                with pytest.raises(SchedulerRefused, match="cpu-b") as denied:
                    await asyncio.wait_for(bad._agent_task, 5)
                assert "spec.access.workers[0].pools" in str(denied.value)  # names the entry
                assert not bad.agent.registered.is_set()
            finally:
                await bad.stop()
        finally:
            await workers.close()
            for w in (a, b):
                await w.stop()
            await server.stop(0)

    asyncio.run(go())


def test_a_hand_made_ref_without_labels_still_round_trips_in_the_sdk() -> None:
    ref = SnapshotRef("file:///s/9")
    assert ref.pool == "" and dict(ref.labels) == {}
