"""Per-worker grant keys across failovers and a key rotation, over real Redis, replicas, a worker
and gRPC (the pure properties: tests/test_grant_keys.py).

Four replicas lead one after the other, each given its own copy of a key file, as the replicas
of one deployment are: a [k1], b [k1] (a failover: same key material), c [k2, k1] (k2 now signs),
d [k2] (k1 removed). The worker heartbeats rarely (60 s), so what it accepts it accepts with the
keys it holds: after a's crash it takes b's fresh grants with the key a handed it; k2's first
grant makes it heartbeat once (to c) and learn k2; after d leads, its next heartbeat drops k1.
"""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from scheduler.api.gen.slotsched.v1 import scheduler_pb2, worker_pb2, worker_pb2_grpc
from scheduler.grants import GrantKeyring, GrantVerifier
from scheduler.serve import RunningServer, StateOptions, start_server
from slots.worker.actor import ActorConfig
from slots.worker.main import start_worker
from tests.grpc_fixtures import TOKENS, WORKER_TOKEN, B, Client, policy_yaml, until, write_policy
from tests.test_hot_standby import crash, replica_of
from tests.test_state_redis import REDIS_BIN, RedisProc, free_port

pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_BIN) and not os.environ.get("CI"), reason="redis-server not installed"
)

CONFIG = ActorConfig(bytes_per_turn=256, turn_interval_s=0.05)
SECRETS = {kid: base64.b64encode(os.urandom(32)).decode() for kid in ("k1", "k2")}
KEY_FILES = {"a": ["k1"], "b": ["k1"], "c": ["k2", "k1"], "d": ["k2"]}


#: Each failover here waits for the crashed leader's lease to lapse, so the TTL is the test's
#: pace; at 1 s (a Redis call bounded by a third of it) a loop stalled on a busy machine lost the
#: lease to the standby before any crash, and the first Acquire was refused (ERR NOTLEADER).
LEADER_TTL_S = 3.0


async def _until(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def test_a_failover_keeps_every_grant_and_a_rotation_reaches_the_worker(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="slotsched-grant-failover-") as d:
        r = RedisProc(d).start()
        policy = write_policy(d, policy_yaml(workers=1, slots_per_worker=1, floor=0, lease_ttl_s=120))
        listens = {name: f"127.0.0.1:{free_port()}" for name in KEY_FILES}
        paths = {}
        for name, kids in KEY_FILES.items():
            paths[name] = tmp_path / f"keys-{name}"
            paths[name].write_text("".join(f"{k}:{SECRETS[k]}\n" for k in kids))

        async def replica(name: str) -> RunningServer:
            state = StateOptions(state=r.url, replica_id=name, leader_ttl_s=LEADER_TTL_S)
            return await start_server(
                policy, listens[name], None, False, state=state, heartbeat_interval_s=60,
                grant_keys=GrantKeyring.load(str(paths[name])),  # each replica reads its own file
            )  # fmt: skip

        async def body() -> None:
            servers = {"a": await replica("a"), "b": await replica("b")}
            await _until(lambda: replica_of(servers["a"]).serving, "a leads")
            w = await start_worker(
                ",".join(listens.values()), "w0", 1, snapshots=str(tmp_path / "snapshots"),
                token=WORKER_TOKEN, actor_config=CONFIG, grants=GrantVerifier(), drain_timeout_s=1,
            )  # fmt: skip
            channel = grpc.aio.insecure_channel(w.address)
            stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]

            def verifier() -> GrantVerifier:
                assert w.service.grants is not None
                return w.service.grants

            async def checkpoint(grant: str) -> grpc.StatusCode:
                req = worker_pb2.CheckpointRequest(
                    session_id="s1", tenant="acme", lease_id=lease.lease_id, epoch=lease.epoch, grant=grant
                )
                try:
                    await stub.Checkpoint(req, timeout=10)
                except grpc.aio.AioRpcError as e:
                    assert "'k1'" in (e.details() or ""), e.details()
                    return e.code()
                return grpc.StatusCode.OK

            async def renew(leader: str) -> str:
                async with Client(servers[leader].target, token=TOKENS["acme"]) as c:
                    req = scheduler_pb2.RenewRequest(
                        session_id="s1", lease_id=lease.lease_id, epoch=lease.epoch
                    )
                    return str((await c.scheduler.Renew(req, metadata=c.md, timeout=10)).grant)

            async def fail_over(old: str, new: str) -> None:
                await crash(servers[old])
                await _until(lambda: replica_of(servers[new]).last_takeover is not None, f"{new} leads")

            try:
                await asyncio.wait_for(w.agent.registered.wait(), 10)
                assert verifier().kids == ("k1",)  # handed over at registration
                async with Client(servers["a"].target, token=TOKENS["acme"]) as acme:
                    call = acme.acquire("s1", B)
                    granted = (await until(call, "granted")).granted
                    lease = granted.lease
                    from_a = granted.grant
                    start = worker_pb2.StartRequest(
                        session_id="s1", tenant="acme", slot=lease.slot, lease_id=lease.lease_id,
                        epoch=lease.epoch, grant=from_a,
                    )  # fmt: skip
                    await stub.Start(start, timeout=10)
                    call.cancel()
                heartbeats = w.agent.heartbeats

                # a -> b, the same key material: b's fresh grant passes with the key a handed out.
                await fail_over("a", "b")
                from_b = await renew("b")
                assert from_b != from_a and from_b.startswith("g2.k1.")
                assert [await checkpoint(g) for g in (from_a, from_b)] == [grpc.StatusCode.OK] * 2
                assert w.agent.heartbeats == heartbeats  # no key came from b

                # b -> c, k2 signs: its first grant costs one heartbeat, which brings k2.
                servers["c"] = await replica("c")
                await fail_over("b", "c")
                from_c = await renew("c")
                assert from_c.startswith("g2.k2.")
                assert [await checkpoint(g) for g in (from_c, from_a)] == [grpc.StatusCode.OK] * 2
                assert w.agent.heartbeats == heartbeats + 1 and verifier().kids == ("k2", "k1")

                # c -> d, k1 removed: once the worker heard from d, a's grant is refused.
                servers["d"] = await replica("d")
                await fail_over("c", "d")
                assert await w.agent.refresh(time.monotonic()) is not None
                assert verifier().kids == ("k2",)
                denied = grpc.StatusCode.PERMISSION_DENIED
                assert [await checkpoint(g) for g in (from_a, from_b, from_c)] == [
                    denied,
                    denied,
                    grpc.StatusCode.OK,
                ]
                stop = worker_pb2.StopRequest(
                    session_id="s1", tenant="acme", lease_id=lease.lease_id, epoch=lease.epoch, grant=from_c
                )
                assert (await stub.Stop(stop, timeout=10)).stopped
            finally:
                await channel.close()
                await w.stop()
                for s in servers.values():
                    await s.stop(0)

        try:
            asyncio.run(body())
        finally:
            r.kill()
