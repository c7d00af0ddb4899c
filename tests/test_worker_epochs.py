"""Epochs as the worker's fencing tokens: never backwards across a scheduler restart, and never a
second actor for a lease that ended.

Why both levels: the core's counter, its journal record and its snapshot are pure and cheap to
pin down; that a surviving worker takes grants from a scheduler restarted in memory, and refuses
to restart an ended lease whose grant still verifies, only shows with real gRPC.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from scheduler.api.gen.slotsched.v1 import scheduler_pb2, worker_pb2, worker_pb2_grpc
from scheduler.client import AsyncClient, QoS
from scheduler.client.worker_runtime import ActorRuntime, WorkerClients, actor_session
from scheduler.core.engine import Core
from scheduler.core.types import (
    Acquire,
    Granted,
    Rejected,
    Release,
    SessionId,
    TenantName,
    WorkerAdded,
    WorkerId,
    WorkerRemoved,
)
from scheduler.core.types import QoS as CoreQoS
from scheduler.grants import GrantKeyring, core_lease_id
from scheduler.policy.identities import hash_token
from scheduler.policy.model import Policy, PoolSpec, TenantSpec
from scheduler.serve import start_server
from scheduler.state import codec, state_read, state_write
from slots.worker.actor import ActorConfig
from slots.worker.host import ActorHost, FailedPrecondition
from slots.worker.main import start_worker
from snapshots.local import LocalSnapshotStore

pytest.register_assert_rewrite("tests.grpc_fixtures")
from tests.grpc_fixtures import (  # noqa: E402
    DEFAULT_TENANTS,
    TOKENS,
    WORKER_TOKEN,
    B,
    Client,
    policy_yaml,
    running_server,
    until,
    write_policy,
)

CONFIG = ActorConfig(bytes_per_turn=256, turn_interval_s=0.02)
RUNTIME = "runtime-secret"
POLICY = Policy(pool=PoolSpec(slots_per_worker=2, workers=0, floor=0), tenants=(TenantSpec("t"),))


def _run(fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(fn())  # type: ignore[arg-type]


def _grant(core: Core, session: str, now: float) -> Any:
    out = core.handle(Acquire(SessionId(session), TenantName("t"), CoreQoS.BEST_EFFORT), now)
    (lease,) = [d.lease for d in out if isinstance(d, Granted)]
    return lease


# ------------------------------------------------------------------------------- the core


def test_a_worker_reporting_its_epochs_is_granted_above_them() -> None:
    core = Core(POLICY)
    core.handle(WorkerAdded(WorkerId("w"), 2, "w:1", ((0, 3),)), 0.0)
    first, second = _grant(core, "a", 1.0), _grant(core, "b", 1.0)
    assert {(x.slot.index, x.epoch) for x in (first, second)} == {(0, 4), (1, 1)}
    assert next(x for x in (first, second) if x.slot.index == 0).lease_id == "w/0#4"
    # Never lowered: removed and added again reporting less, the counter keeps what it had.
    for x, s in ((first, "a"), (second, "b")):
        core.handle(Release(SessionId(s), x.lease_id, x.epoch), 2.0)
    core.handle(WorkerRemoved(WorkerId("w")), 2.0)
    core.handle(WorkerAdded(WorkerId("w"), 1, "w:1", ((0, 2),)), 3.0)
    assert _grant(core, "c", 4.0).epoch == 5
    # A slot the worker does not have: the registration is refused, nothing raised.
    out = core.handle(WorkerAdded(WorkerId("x"), 1, "x:1", ((1, 9),)), 5.0)
    assert any(isinstance(d, Rejected) and "no slot 1" in d.message for d in out), out


def test_reported_epochs_survive_the_journal_and_old_records_read_as_none() -> None:
    e = WorkerAdded(WorkerId("w"), 2, "w:1", ((0, 3), (1, 7)))
    back, at, _ = codec.decode(codec.encode(e, 1.5, None))
    assert (back, at) == (e, 1.5)
    old = json.loads(codec.encode(WorkerAdded(WorkerId("w"), 2, "w:1"), 1.5, None))
    assert "epochs" not in old
    assert codec.decode(json.dumps(old).encode())[0] == WorkerAdded(WorkerId("w"), 2, "w:1")


def test_epochs_of_ended_leases_survive_a_state_snapshot() -> None:
    """The Redis path: a restored core counts on from the slot's last epoch, even with no lease
    left on the slot to carry it."""
    core = Core(POLICY)
    core.handle(WorkerAdded(WorkerId("w"), 1, "w:1"), 0.0)
    for i in range(3):
        lease = _grant(core, f"s{i}", float(i))
        core.handle(Release(SessionId(f"s{i}"), lease.lease_id, lease.epoch), float(i))
    assert not list(core.leases())
    doc = json.loads(json.dumps(state_write.core_doc(core.export_records())))
    rebuilt = Core.from_records(core.policy, state_read.core_records(doc))
    assert _grant(rebuilt, "after", 9.0).epoch == 4


# ------------------------------------------------------------------------------- a restart


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_surviving_worker_takes_grants_after_an_in_memory_restart(tmp_path: Path) -> None:
    """Issue 20 #12: the restarted scheduler counted from 1 again and the worker refused "epoch 1
    is older than slot w0/0's 3", so `actor_session` ended GrantFailed."""
    policy = write_policy(tmp_path, policy_yaml(DEFAULT_TENANTS, workers=1, slots_per_worker=1, floor=0))
    listen = f"127.0.0.1:{_free_port()}"
    keys = GrantKeyring.generate("k1")  # one key across the restart: the worker trusts both

    async def serve() -> Any:
        return await start_server(
            policy, listen, None, False, heartbeat_interval_s=0.2, grant_keys=keys
        )  # fmt: skip

    async def go() -> None:
        server = await serve()
        w = await start_worker(
            listen, "w0", 1, snapshots=str(tmp_path / "snapshots"), token=WORKER_TOKEN,
            actor_config=CONFIG, grants=keys.verifier(), drain_timeout_s=1,
        )  # fmt: skip
        workers = WorkerClients()
        rt = ActorRuntime(workers, start_attempts=1)
        try:
            await asyncio.wait_for(w.agent.registered.wait(), 5)
            async with AsyncClient(listen, token=TOKENS["acme"]) as client:
                for i in range(3):
                    async with actor_session(client, f"before-{i}", QoS.BURSTABLE, rt, wait_timeout_s=5):
                        pass
            assert w.host.highest_epoch == [3]
            await server.stop(0)
            server = await serve()  # same address, empty state
            client = AsyncClient(listen, token=TOKENS["acme"])
            async with client, actor_session(client, "after", QoS.BURSTABLE, rt, wait_timeout_s=10) as s:
                assert s.lease is not None and s.lease.epoch == 4
                assert core_lease_id(s.lease.lease_id) == "w0/0#4"
                assert w.host.running("after", "acme") is not None
        finally:
            await workers.close()
            await w.stop()
            await server.stop(0)

    _run(go)


# ------------------------------------------------------------------------------- an ended lease


def test_the_host_starts_nothing_for_a_lease_whose_actor_ended(tmp_path: Path) -> None:
    async def go() -> None:
        host = ActorHost("w", 2, LocalSnapshotStore(tmp_path), CONFIG)
        await host.start("s", "t", 0, "w/0#1", 1)
        assert await host.stop("s", "t", "w/0#1", 1)
        with pytest.raises(FailedPrecondition, match="has ended on slot w/0"):
            await host.start("s", "t", 0, "w/0#1", 1)
        # Fenced by a heartbeat that no longer lists it: ended too.
        await host.start("u", "t", 1, "w/1#4", 4)
        host.fence((), float("inf"))
        with pytest.raises(FailedPrecondition, match="has ended"):
            await host.start("u", "t", 1, "w/1#4", 4)
        assert host.empty
        await host.start("s", "t", 0, "w/0#2", 2)  # the slot's next grant runs
        assert host.running("s", "t") is not None
        await host.aclose()

    _run(go)


@pytest.mark.parametrize("end", ["release", "yield"])
def test_a_stopped_and_ended_lease_cannot_start_its_actor_again(tmp_path: Path, end: str) -> None:
    """Issue 20 #13: Start, Checkpoint, Stop, Release (or Yield), then Start with the same grant
    answered OK at once, the worker's view still listing the lease until its next heartbeat."""
    keys = GrantKeyring.generate("k1")
    text = policy_yaml(DEFAULT_TENANTS, workers=1, slots_per_worker=1, floor=0)
    # A long heartbeat interval: nothing refreshes the worker's view between the calls.
    with running_server(text, static_pool=False, heartbeat_interval_s=60, grant_keys=keys) as server:

        async def go() -> None:
            w = await start_worker(
                server.target, "w0", 1, snapshots=str(tmp_path), token=WORKER_TOKEN, actor_config=CONFIG,
                grants=keys.verifier(), accept_token_hashes=[hash_token(RUNTIME)], drain_timeout_s=1,
            )  # fmt: skip
            md = (("authorization", f"Bearer {RUNTIME}"),)
            channel = grpc.aio.insecure_channel(w.address)
            stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
            try:
                await asyncio.wait_for(w.agent.registered.wait(), 5)
                async with Client(server.target, token=TOKENS["acme"]) as acme:
                    call = acme.acquire("s1", B)
                    g = (await until(call, "granted")).granted
                    lease = g.lease
                    start = worker_pb2.StartRequest(
                        session_id="s1", tenant="acme", slot=lease.slot, lease_id=lease.lease_id,
                        epoch=lease.epoch, grant=g.grant,
                    )  # fmt: skip
                    owner: dict[str, Any] = {"session_id": "s1", "tenant": "acme", "lease_id": lease.lease_id,
                             "epoch": lease.epoch, "grant": g.grant}  # fmt: skip
                    await stub.Start(start, metadata=md)
                    ref = await stub.Checkpoint(worker_pb2.CheckpointRequest(**owner), metadata=md)
                    assert (await stub.Stop(worker_pb2.StopRequest(**owner), metadata=md)).stopped
                    ids: dict[str, Any] = {
                        "session_id": "s1",
                        "lease_id": lease.lease_id,
                        "epoch": lease.epoch,
                    }
                    if end == "release":
                        await acme.scheduler.Release(scheduler_pb2.ReleaseRequest(**ids), metadata=acme.md)
                    else:
                        await acme.scheduler.Yield(
                            scheduler_pb2.YieldRequest(**ids, snapshot=ref), metadata=acme.md
                        )
                    assert core_lease_id(lease.lease_id) in w.agent.view.grants  # still listed
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await stub.Start(start, metadata=md)
                    assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
                    assert "has ended" in (e.value.details() or "")
                    assert w.host.empty
                    call.cancel()
            finally:
                await channel.close()
                await w.stop()

        _run(go)
