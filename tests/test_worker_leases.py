"""The worker verifies every Start against the scheduler's leases on its slots.

Why both a table and an end-to-end test: the decision (`leases.check_start`) is pure and its
cases are many, so they are a table; whether the worker really sees what the scheduler granted —
a lease the heartbeat has not reported yet, two tenants with the same session id, a snapshot of
another tenant — is only shown with a real scheduler, a real worker and real gRPC between them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from scheduler.api.gen.slotsched.v1 import admin_pb2, common_pb2, scheduler_pb2, worker_pb2, worker_pb2_grpc
from scheduler.core.types import SnapshotRef
from slots.worker.actor import ActorConfig
from slots.worker.agent import SchedulerRefused
from slots.worker.leases import (
    Accepted,
    Grant,
    LeaseCheckFailed,
    LeaseView,
    RefusalReason,
    StartClaim,
    check_start,
)
from slots.worker.main import RunningWorker, start_worker

pytest.register_assert_rewrite("tests.grpc_fixtures")  # imported before pytest loads it as a plugin
from tests.grpc_fixtures import ADMIN_TOKEN, WORKER_TOKEN, Client, policy_yaml, running_server, until  # noqa: E402

# ------------------------------------------------------------------------------- the decision

URI = "file:///snaps/acme/s1/0001.snap"
SHA = "ab" * 32
LEASE = Grant("w0/0#3", "s1", "acme", "w0", 0, 3, URI, SHA)
FRESH = Grant("w0/1#5", "s2", "acme", "w0", 1, 5)
VIEW = LeaseView.of([LEASE, FRESH], as_of=0.0)


def claim(**kw: Any) -> StartClaim:
    base: dict[str, Any] = {
        "session_id": "s1",
        "tenant": "acme",
        "worker_id": "w0",
        "slot": 0,
        "lease_id": "w0/0#3",
        "epoch": 3,
        "resume_from": SnapshotRef(URI, 10, SHA),
    }
    base.update(kw)
    return StartClaim(**base)


R = RefusalReason
CASES: list[tuple[str, StartClaim, RefusalReason | None]] = [
    ("exact match", claim(), None),
    ("no resume_from: start fresh", claim(resume_from=None), None),
    ("resume_from without sha256: the lease's is used", claim(resume_from=SnapshotRef(URI)), None),
    ("lease without snapshot, none asked", claim(session_id="s2", slot=1, lease_id="w0/1#5", epoch=5,
                                                  resume_from=None), None),
    ("unknown lease", claim(lease_id="w0/0#99"), R.UNKNOWN_LEASE),
    ("empty view", claim(), R.UNKNOWN_LEASE),  # checked against LeaseView() below
    ("another tenant", claim(tenant="globex"), R.TENANT_MISMATCH),
    ("another session", claim(session_id="s9"), R.SESSION_MISMATCH),
    ("another slot index", claim(slot=1), R.SLOT_MISMATCH),
    ("another worker", claim(worker_id="w1"), R.SLOT_MISMATCH),
    ("older epoch of the live lease", claim(epoch=2), R.STALE_EPOCH),
    ("a superseded lease of a slot live at a higher epoch", claim(lease_id="w0/0#2", epoch=2),
     R.STALE_EPOCH),
    ("a newer epoch than granted", claim(epoch=4), R.EPOCH_MISMATCH),
    ("foreign snapshot uri", claim(resume_from=SnapshotRef("file:///snaps/globex/s1/0001.snap", 10, SHA)),
     R.SNAPSHOT_MISMATCH),
    ("same uri, other sha256", claim(resume_from=SnapshotRef(URI, 10, "cd" * 32)), R.SNAPSHOT_MISMATCH),
    ("a snapshot for a lease that resumes from none", claim(session_id="s2", slot=1, lease_id="w0/1#5",
                                                            epoch=5), R.SNAPSHOT_MISMATCH),
]  # fmt: skip


@pytest.mark.parametrize(("name", "c", "reason"), CASES, ids=[c[0] for c in CASES])
def test_check_start(name: str, c: StartClaim, reason: RefusalReason | None) -> None:
    verdict = check_start(LeaseView() if name == "empty view" else VIEW, c)
    if reason is None:
        assert isinstance(verdict, Accepted), verdict
        assert verdict.grant.lease_id == c.lease_id
    else:
        assert isinstance(verdict, LeaseCheckFailed), verdict
        assert verdict.reason is reason
        assert c.lease_id in verdict.message
        expected = "failed_precondition" if reason is R.STALE_EPOCH else "permission_denied"
        assert verdict.code == expected


def test_accepted_resume_carries_the_lease_sha256() -> None:
    verdict = check_start(VIEW, claim(resume_from=SnapshotRef(URI, 10, "")))
    assert isinstance(verdict, Accepted)
    assert verdict.resume_from == SnapshotRef(URI, 10, SHA)
    fresh = check_start(VIEW, claim(resume_from=None))
    assert isinstance(fresh, Accepted) and fresh.resume_from is None


def test_accepted_resume_carries_the_pool_and_labels_the_scheduler_recorded() -> None:
    # A caller that strips (or rewrites) the snapshot's compatibility labels in its Start does
    # not get past the worker's resume check: the lease's record is what is checked.
    icelake = (("cpuModel", "icelake"),)
    lease = Grant("w0/0#3", "s1", "acme", "w0", 0, 3, URI, SHA, "cpu-a", icelake)
    view = LeaseView.of([lease], as_of=0.0)
    for pool, labels in [("", ()), ("cpu-b", (("cpuModel", "sapphire"),))]:
        verdict = check_start(view, claim(resume_from=SnapshotRef(URI, 10, SHA, pool=pool, labels=labels)))
        assert isinstance(verdict, Accepted) and verdict.resume_from is not None
        assert (verdict.resume_from.pool, verdict.resume_from.labels) == ("cpu-a", icelake)
    # A lease of before pools records neither: the caller's ref stands as it was.
    verdict = check_start(VIEW, claim(resume_from=SnapshotRef(URI, 10, SHA, pool="p", labels=icelake)))
    assert isinstance(verdict, Accepted) and verdict.resume_from is not None
    assert (verdict.resume_from.pool, verdict.resume_from.labels) == ("p", icelake)


def test_messages_name_what_did_not_match() -> None:
    v = check_start(VIEW, claim(tenant="globex"))
    assert isinstance(v, LeaseCheckFailed) and "tenant 'globex'" in v.message
    v = check_start(VIEW, claim(resume_from=SnapshotRef("file:///x")))
    assert isinstance(v, LeaseCheckFailed) and "resume_from 'file:///x'" in v.message and URI in v.message
    v = check_start(VIEW, claim(epoch=1))
    assert isinstance(v, LeaseCheckFailed) and "epoch 1" in v.message and "epoch 3" in v.message


def test_grant_from_lease_proto() -> None:
    pb = common_pb2.Lease(
        lease_id="w0/1#7", session_id="s", slot=common_pb2.Slot(worker_id="w0", index=1), epoch=7, tenant="t"
    )
    assert Grant.from_pb(pb) == Grant("w0/1#7", "s", "t", "w0", 1, 7)
    pb.resume_from.CopyFrom(common_pb2.SnapshotRef(uri="file:///a", sha256="ff"))
    assert Grant.from_pb(pb).resume_uri == "file:///a" and Grant.from_pb(pb).resume_sha256 == "ff"
    pb.resume_from.pool = "cpu-a"
    pb.resume_from.labels["cpuModel"] = "icelake"
    g = Grant.from_pb(pb)
    assert (g.resume_pool, g.resume_labels) == ("cpu-a", (("cpuModel", "icelake"),))


# ------------------------------------------------------------------------------- end to end

TOKENS = {"acme": "acme-lease-token", "globex": "globex-lease-token"}
TENANTS: list[dict[str, Any]] = [
    {"name": n, "token": TOKENS[n], "guaranteed": 0, "burstable": {"nominal": 1, "limit": 1}} for n in TOKENS
]
CONFIG = ActorConfig(bytes_per_turn=1024, turn_interval_s=0.02)
B = common_pb2.QOS_CLASS_BURSTABLE


def _start_req(lease: common_pb2.Lease, **kw: Any) -> worker_pb2.StartRequest:
    req = worker_pb2.StartRequest(
        session_id=lease.session_id, tenant=lease.tenant, lease_id=lease.lease_id, epoch=lease.epoch
    )
    req.slot.CopyFrom(lease.slot)
    if lease.HasField("resume_from"):
        req.resume_from.CopyFrom(lease.resume_from)
    for k, v in kw.items():
        if k == "resume_from":
            req.resume_from.CopyFrom(v)
        else:
            setattr(req, k, v)
    return req


async def _code(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def _refused(w: RunningWorker, reason: str) -> float:
    value = w.metrics.registry.get_sample_value("slotsched_worker_starts_refused_total", {"reason": reason})
    return value or 0.0


def _run(fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(fn())  # type: ignore[arg-type]


def test_worker_starts_only_what_the_scheduler_granted(tmp_path: Path) -> None:
    text = policy_yaml(TENANTS, workers=1, slots_per_worker=2, floor=0)
    # A long heartbeat interval: after registering, the worker hears of grants only on demand.
    with running_server(text, static_pool=False, heartbeat_interval_s=60) as server:

        async def go() -> None:
            w = await start_worker(server.target, "w0", 2, snapshots=str(tmp_path), token=WORKER_TOKEN,
                                   actor_config=CONFIG, drain_timeout_s=2)  # fmt: skip
            await asyncio.wait_for(w.agent.registered.wait(), 5)
            while w.agent.heartbeats < 1:
                await asyncio.sleep(0.01)
            channel = grpc.aio.insecure_channel(w.address)
            stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
            acme = Client(server.target, token=TOKENS["acme"])
            globex = Client(server.target, token=TOKENS["globex"])
            try:
                async with acme, globex:
                    # A lease granted after the last heartbeat: accepted thanks to the refresh.
                    a_call = acme.acquire("s1", B)
                    a1 = (await until(a_call, "granted")).granted.lease
                    beats = w.agent.heartbeats
                    await stub.Start(_start_req(a1))
                    assert w.agent.heartbeats == beats + 1
                    assert w.host.running("s1", "acme") is not None
                    # The same tenant-local session id in another tenant: its own actor.
                    g_call = globex.acquire("s1", B)
                    g1 = (await until(g_call, "granted")).granted.lease
                    await stub.Start(_start_req(g1))
                    assert w.host.running("s1", "acme") is not w.host.running("s1", "globex")

                    # Refusals, each with its code and counted by reason.
                    beats = w.agent.heartbeats
                    code, msg = await _code(stub.Start(_start_req(a1, tenant="globex")))
                    assert code is grpc.StatusCode.PERMISSION_DENIED and "tenant 'globex'" in msg, msg
                    assert w.agent.heartbeats == beats  # a listed lease needs no refresh
                    code, msg = await _code(stub.Start(_start_req(a1, lease_id="w0/0#999")))
                    assert code is grpc.StatusCode.PERMISSION_DENIED and "unknown" in msg, msg
                    assert w.agent.heartbeats == beats + 1  # asked the scheduler before refusing
                    code, msg = await _code(stub.Start(_start_req(a1, epoch=a1.epoch - 1)))
                    assert code is grpc.StatusCode.FAILED_PRECONDITION and "stale" in msg, msg

                    # Checkpoint and Stop reach only the actor of the tenant and lease that started it.
                    owner = {"session_id": "s1", "tenant": "acme", "lease_id": a1.lease_id, "epoch": a1.epoch}
                    code, _ = await _code(stub.Checkpoint(worker_pb2.CheckpointRequest(session_id="s1")))
                    assert code is grpc.StatusCode.INVALID_ARGUMENT
                    wrong = {**owner, "lease_id": g1.lease_id, "epoch": g1.epoch}
                    code, _ = await _code(stub.Checkpoint(worker_pb2.CheckpointRequest(**wrong)))
                    assert code is grpc.StatusCode.PERMISSION_DENIED
                    code, _ = await _code(stub.Stop(worker_pb2.StopRequest(**wrong)))
                    assert code is grpc.StatusCode.PERMISSION_DENIED
                    assert w.host.running("s1", "acme") is not None
                    while (w.host.running("s1", "acme") or _NO).turns < 3:
                        await asyncio.sleep(0.01)
                    g_ref = await stub.Checkpoint(
                        worker_pb2.CheckpointRequest(session_id="s1", tenant="globex", lease_id=g1.lease_id)
                    )
                    a_ref = await stub.Checkpoint(worker_pb2.CheckpointRequest(**owner))
                    assert (await stub.Stop(worker_pb2.StopRequest(**owner))).stopped
                    await acme.scheduler.Release(
                        scheduler_pb2.ReleaseRequest(session_id="s1", lease_id=a1.lease_id, epoch=a1.epoch),
                        metadata=acme.md,
                    )
                    a_call.cancel()

                    # Re-granted with acme's snapshot: globex's snapshot is refused, acme's restores.
                    a_call = acme.acquire("s1", B, resume_from=a_ref)
                    a2 = (await until(a_call, "granted")).granted.lease
                    assert a2.resume_from.uri == a_ref.uri
                    code, msg = await _code(stub.Start(_start_req(a2, resume_from=g_ref)))
                    assert code is grpc.StatusCode.PERMISSION_DENIED and g_ref.uri in msg, msg
                    reply = await stub.Start(_start_req(a2))
                    assert reply.state_sha256 == a_ref.sha256 and reply.turns > 0

                    for reason in ("tenant_mismatch", "unknown_lease", "stale_epoch", "snapshot_mismatch"):
                        assert _refused(w, reason) == 1, reason
                    assert w.metrics.starts_refused_total() == 4
                    await stub.Stop(
                        worker_pb2.StopRequest(session_id="s1", tenant="acme", lease_id=a2.lease_id)
                    )
                    await stub.Stop(
                        worker_pb2.StopRequest(session_id="s1", tenant="globex", lease_id=g1.lease_id)
                    )
                    a_call.cancel()
                    g_call.cancel()
            finally:
                await channel.close()
                await w.stop()

        _run(go)


def test_unverifiable_start_is_unavailable(tmp_path: Path) -> None:
    """No scheduler to ask: refuse (retryable) rather than run an actor nobody granted."""

    async def go() -> None:
        w = await start_worker("127.0.0.1:1", "w0", 1, snapshots=str(tmp_path), actor_config=CONFIG)
        channel = grpc.aio.insecure_channel(w.address)
        stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        req = worker_pb2.StartRequest(
            session_id="s1",
            tenant="acme",
            slot=common_pb2.Slot(worker_id="w0", index=0),
            lease_id="l",
            epoch=1,
        )
        try:
            code, msg = await _code(stub.Start(req))
            assert code is grpc.StatusCode.UNAVAILABLE and "not reachable" in msg, msg
            assert _refused(w, "unverified") == 1
            assert w.host.empty
        finally:
            await channel.close()
            await w.stop(grace=0.1)

    _run(go)


def test_no_verify_leases_runs_standalone(tmp_path: Path) -> None:
    """`--no-verify-leases`: the Worker service alone, only epoch fencing (and the old API) apply."""

    async def go() -> None:
        w = await start_worker(
            "127.0.0.1:1", "w0", 1, snapshots=str(tmp_path), actor_config=CONFIG, verify_leases=False
        )
        channel = grpc.aio.insecure_channel(w.address)
        stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        slot = common_pb2.Slot(worker_id="w0", index=0)
        try:
            await stub.Start(
                worker_pb2.StartRequest(session_id="s1", tenant="acme", slot=slot, lease_id="l", epoch=2)
            )
            code, _ = await _code(
                stub.Start(
                    worker_pb2.StartRequest(session_id="s2", tenant="acme", slot=slot, lease_id="m", epoch=1)
                )
            )
            assert code is grpc.StatusCode.FAILED_PRECONDITION
            await stub.Checkpoint(worker_pb2.CheckpointRequest(session_id="s1"))
            assert (await stub.Stop(worker_pb2.StopRequest(session_id="s1"))).stopped
            assert w.metrics.starts_refused_total() == 0
        finally:
            await channel.close()
            await w.stop(grace=0.1)

    _run(go)


class _No:
    turns = -1


_NO = _No()


def test_worker_whose_token_is_revoked_stops_its_actors_and_exits(tmp_path: Path) -> None:
    text = policy_yaml(TENANTS, workers=1, slots_per_worker=1, floor=0)
    with running_server(text, static_pool=False, heartbeat_interval_s=0.2) as server:

        async def go() -> None:
            w = await start_worker(server.target, "w0", 1, snapshots=str(tmp_path), token=WORKER_TOKEN,
                                   actor_config=CONFIG, drain_timeout_s=1)  # fmt: skip
            try:
                await asyncio.wait_for(w.agent.registered.wait(), 5)
                # The operator revokes the worker token: the next heartbeat is refused, and the
                # worker stops rather than keep actors whose leases the scheduler will re-grant.
                async with Client(server.target, token=ADMIN_TOKEN) as admin:
                    req = admin_pb2.ApplyPolicyRequest(yaml=policy_yaml(TENANTS, workers=1, worker_tokens=[]))
                    assert (await admin.admin.ApplyPolicy(req, metadata=admin.md)).applied
                with pytest.raises(SchedulerRefused) as refused:
                    await asyncio.wait_for(w.wait(), 5)
                assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
                assert "actors stopped" in str(refused.value) and "\n" not in str(refused.value)
                assert not w.host.accepting
            finally:
                await w.stop(0.5)

        asyncio.run(go())
