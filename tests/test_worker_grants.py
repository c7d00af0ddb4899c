"""Signed grants: the reference worker acts only for the holder of the scheduler's grant.

Why both levels: the token format, the binding of every field and key rotation are pure
(scheduler/grants.py), so a table covers them; whether a worker really refuses another tenant's
Stop and Checkpoint, hides other tenants' actors from Status, and takes the grants the scheduler
hands out on Granted and Renew is only shown with a real scheduler, real workers and gRPC.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from scheduler.api.gen.slotsched.v1 import scheduler_pb2, worker_pb2, worker_pb2_grpc
from scheduler.client import AsyncClient, QoS
from scheduler.client.worker_runtime import ActorRuntime, WorkerClients, actor_session
from scheduler.grants import (
    GRANT_GRACE_S,
    GrantClaim,
    GrantKeyError,
    GrantKeyring,
    GrantRefused,
    GrantVerifier,
    core_lease_id,
)
from scheduler.policy.identities import hash_token
from slots.worker.actor import ActorConfig
from slots.worker.main import RunningWorker, start_worker

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
)

CONFIG = ActorConfig(bytes_per_turn=512, turn_interval_s=0.02)
RT_ACME, RT_GLOBEX, RT_SHARED, RT_ADMIN = "rt-acme", "rt-globex", "rt-shared", "rt-admin"
CLAIM = GrantClaim("acme", "s1", "w0/0#3", 3, "w0", 0)
NOW = 1_700_000_000.0
PD, FP = "permission_denied", "failed_precondition"
DENIED, STALE = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.FAILED_PRECONDITION


def _ring(*kids: str, seeds: dict[str, bytes]) -> GrantKeyring:
    return GrantKeyring([(k, seeds[k]) for k in kids])


# ------------------------------------------------------------------------------- the token


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({}, None),
        ({"tenant": "globex"}, PD),
        ({"session_id": "s2"}, PD),
        ({"lease_id": "w0/0#4"}, PD),
        ({"epoch": 2}, PD),
        ({"worker_id": "w1"}, PD),
        ({"slot": 1}, PD),
    ],
)
def test_a_grant_binds_every_field(change: dict[str, Any], code: str | None) -> None:
    ring = GrantKeyring.generate("k1")
    token = ring.sign(CLAIM, NOW)
    assert len(token) <= 64
    try:
        ring.verifier(CLAIM.worker_id).verify(token, replace(CLAIM, **change), NOW)
    except GrantRefused as e:
        assert e.code == code, e.message
    else:
        assert code is None


def test_grant_refusals_name_the_problem() -> None:
    ring = GrantKeyring.generate("k1")
    v = ring.verifier(CLAIM.worker_id)
    token = ring.sign(CLAIM, NOW)
    cases = {
        "": (PD, "required"),
        "garbage": (PD, "malformed"),
        token.replace("g2.", "g3.", 1): (PD, "malformed"),
        token[:-4] + ("AAAA" if token[-4:] != "AAAA" else "BBBB"): (PD, "not valid"),  # a flipped MAC
        "x" * 500: (PD, "longer than"),
        GrantKeyring.generate("k1").sign(CLAIM, NOW): (PD, "not valid"),  # forged: same kid, other key
        GrantKeyring.generate("k9").sign(CLAIM, NOW): (PD, "has not given this worker"),
        GrantKeyring.generate("k9").sign_v1(CLAIM, NOW): (PD, "does not trust"),
    }
    for bad, (code, words) in cases.items():
        with pytest.raises(GrantRefused) as e:
            v.verify(bad, CLAIM, NOW)
        assert e.value.code == code and words in e.value.message, (bad[:20], e.value.message)
    # Valid until the lease's expiry plus the grace, then FAILED_PRECONDITION.
    v.verify(token, CLAIM, NOW + GRANT_GRACE_S)
    with pytest.raises(GrantRefused) as e:
        v.verify(token, CLAIM, NOW + GRANT_GRACE_S + 2)
    assert e.value.code == FP and "expired" in e.value.message


def test_lease_ids_carry_a_tag_only_the_keys_verify() -> None:
    ring = GrantKeyring.generate()
    wire = ring.wire_lease_id("pod.example/0#3")  # dots in a worker id are fine
    assert wire.startswith("pod.example/0#3.") and core_lease_id(wire) == "pod.example/0#3"
    assert core_lease_id("pod.example/0#3") == "pod.example/0#3"
    assert ring.core_of(wire) == "pod.example/0#3"
    for bad in (
        "pod.example/0#3",
        wire[:-1] + ("A" if wire[-1] != "A" else "B"),
        "pod.example/0#4" + wire[-17:],
    ):
        assert ring.core_of(bad) is None, bad
    assert GrantKeyring.generate().core_of(wire) is None


def test_key_rotation_old_grants_verify_while_both_keys_are_listed() -> None:
    seeds = {"old": os.urandom(32), "new": os.urandom(32)}
    old, both, new = _ring("old", seeds=seeds), _ring("new", "old", seeds=seeds), _ring("new", seeds=seeds)
    token, wire = old.sign(CLAIM, NOW), old.wire_lease_id(CLAIM.lease_id)
    w = CLAIM.worker_id
    both.verifier(w).verify(token, CLAIM, NOW)
    assert both.core_of(wire) == CLAIM.lease_id
    assert both.sign(CLAIM, NOW).split(".")[1] == "new"  # the first line signs
    # What the worker is handed: every key id's key, the signing one first, the old one unchanged.
    assert [kid for kid, _ in both.worker_keys(w)] == ["new", "old"]
    assert dict(both.worker_keys(w))["old"] == dict(old.worker_keys(w))["old"]
    with pytest.raises(GrantRefused) as e:
        new.verifier(w).verify(token, CLAIM, NOW)
    assert e.value.code == PD and e.value.unknown_key
    assert new.core_of(wire) is None
    # g1 workers' file: public keys only, parsed back to a verifier of the old format.
    GrantVerifier.parse(both.public_text()).verify(old.sign_v1(CLAIM, NOW), CLAIM, NOW)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "no key"),
        ("k1", "expected KID:BASE64KEY"),
        ("bad kid:AAAA", "expected KID:BASE64KEY"),
        ("k1:AAAA", "32 bytes"),
        ("k1:%%%%", "not base64"),
        (f"k1:{'A' * 43}=\nk1:{'A' * 43}=", "listed twice"),
    ],
)
def test_bad_key_files_are_refused_with_the_entry_named(text: str, words: str) -> None:
    with pytest.raises(GrantKeyError, match=words):
        GrantKeyring.parse(text, "keys.txt")


def test_key_file_from_flag_env_or_generated(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# rotated 2025\nb:{'B' * 43}=\na:{'A' * 43}=\n")
    assert GrantKeyring.from_config(str(path), {}).kids == ("b", "a")
    assert GrantKeyring.from_config(None, {"SLOTSCHED_GRANT_KEYS": f"a:{'A' * 43}="}).kids == ("a",)
    dev = GrantKeyring.from_config(None, {})
    assert dev.ephemeral and dev.kids == ("dev",)


# ------------------------------------------------------------------------------- end to end


async def _code(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def _md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _start(g: scheduler_pb2.Granted, grant: str | None = None) -> worker_pb2.StartRequest:
    lease = g.lease
    return worker_pb2.StartRequest(
        session_id=lease.session_id, tenant=lease.tenant, slot=lease.slot, lease_id=lease.lease_id,
        epoch=lease.epoch, grant=g.grant if grant is None else grant,
    )  # fmt: skip


def _owner(g: scheduler_pb2.Granted, grant: str | None = None) -> dict[str, Any]:
    lease = g.lease
    return {
        "session_id": lease.session_id,
        "tenant": lease.tenant,
        "lease_id": lease.lease_id,
        "epoch": lease.epoch,
        "grant": g.grant if grant is None else grant,
    }


async def _workers(target: str, tmp: Path, grants: GrantVerifier) -> list[RunningWorker]:
    ws = [
        await start_worker(
            target,
            f"w{i}",
            1,
            snapshots=str(tmp),
            token=WORKER_TOKEN,
            actor_config=CONFIG,
            drain_timeout_s=1,
            accept_token_hashes=[
                f"acme={hash_token(RT_ACME)}",
                f"globex={hash_token(RT_GLOBEX)}",
                hash_token(RT_SHARED),
            ],
            admin_token_hashes=[hash_token(RT_ADMIN)],
            grants=grants,
        )  # fmt: skip
        for i in range(2)
    ]
    for w in ws:
        await asyncio.wait_for(w.agent.registered.wait(), 5)
    return ws


def _run(fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(fn())  # type: ignore[arg-type]


def test_worker_refuses_every_call_without_the_actors_own_grant(tmp_path: Path) -> None:
    keys = GrantKeyring.generate("k1")
    text = policy_yaml(DEFAULT_TENANTS, workers=2, slots_per_worker=1, floor=0)
    with running_server(text, static_pool=False, heartbeat_interval_s=0.2, grant_keys=keys) as server:

        async def go() -> None:
            ws = await _workers(server.target, tmp_path, keys.verifier())
            by_id = {w.worker_id: w for w in ws}
            channels = {w.worker_id: grpc.aio.insecure_channel(w.address) for w in ws}
            stubs: dict[str, Any] = {k: worker_pb2_grpc.WorkerStub(c) for k, c in channels.items()}  # type: ignore[no-untyped-call]
            acme, globex = (
                Client(server.target, token=TOKENS["acme"]),
                Client(server.target, token=TOKENS["globex"]),
            )
            try:
                async with acme, globex:
                    a_call, g_call = acme.acquire("s1", B), globex.acquire("s1", B)
                    ga = (await until(a_call, "granted")).granted
                    gg = (await until(g_call, "granted")).granted
                    wa, wg = ga.lease.slot.worker_id, gg.lease.slot.worker_id
                    assert wa != wg and ga.grant and gg.grant
                    # Tenants see tagged lease ids; the tag is what makes them unguessable.
                    assert ga.lease.lease_id != core_lease_id(ga.lease.lease_id)

                    code, msg = await _code(stubs[wa].Start(_start(ga, grant=""), metadata=_md(RT_ACME)))
                    assert code is grpc.StatusCode.PERMISSION_DENIED and "grant: required" in msg, msg
                    code, msg = await _code(
                        stubs[wa].Start(_start(ga, grant=gg.grant), metadata=_md(RT_SHARED))
                    )
                    assert code is grpc.StatusCode.PERMISSION_DENIED, msg
                    await stubs[wa].Start(_start(ga), metadata=_md(RT_ACME))
                    await stubs[wg].Start(_start(gg), metadata=_md(RT_GLOBEX))
                    assert by_id[wa].host.running("s1", "acme") and by_id[wg].host.running("s1", "globex")

                    # Status: a tenant sees its own actors only; grants and the admin token show more.
                    async def shown(worker: str, token: str, grants: tuple[str, ...] = ()) -> list[str]:
                        st = await stubs[worker].Status(
                            worker_pb2.StatusRequest(grants=grants), metadata=_md(token)
                        )
                        assert all(s.other == (not s.session_id) for s in st.slots)
                        return [s.tenant for s in st.slots if s.session_id]

                    assert await shown(wg, RT_ACME) == [] and await shown(wa, RT_ACME) == ["acme"]
                    assert await shown(wg, RT_ACME, (ga.grant,)) == []  # a grant shows only its own actor
                    assert await shown(wg, RT_SHARED) == []
                    assert await shown(wg, RT_SHARED, (gg.grant, "junk")) == ["globex"]
                    assert await shown(wg, RT_ADMIN) == ["globex"]

                    # Cross-tenant Stop and Checkpoint of globex's actor: all refused.
                    g_owner = _owner(gg)
                    forged = GrantKeyring.generate("k1")
                    claim = GrantClaim(
                        "globex", "s1", core_lease_id(gg.lease.lease_id), gg.lease.epoch, wg, 0
                    )
                    expired = keys.sign(claim, time.time() - GRANT_GRACE_S - 30)
                    refusals = [
                        (wg, RT_ACME, {**g_owner, "grant": ga.grant}, DENIED, "acme"),
                        (wg, RT_SHARED, {**g_owner, "grant": ga.grant}, DENIED, "not valid"),
                        (wg, RT_SHARED, {**g_owner, "grant": "garbage"}, DENIED, "malformed"),
                        (wg, RT_SHARED, {**g_owner, "grant": forged.sign(claim, time.time())},
                         DENIED, "not valid"),
                        # globex's own, valid grant, shown to the other worker: not for that worker.
                        (wa, RT_SHARED, g_owner, DENIED, "not valid"),
                        (wg, RT_SHARED, {**g_owner, "grant": expired}, STALE, "expired"),
                        (wg, RT_SHARED, {**g_owner, "tenant": "acme"}, DENIED, "not valid"),
                    ]  # fmt: skip
                    for worker, token, req, want, words in refusals:
                        stub = stubs[worker]
                        for rpc, msg_type in ((stub.Stop, worker_pb2.StopRequest),
                                              (stub.Checkpoint, worker_pb2.CheckpointRequest)):  # fmt: skip
                            code, msg = await _code(rpc(msg_type(**req), metadata=_md(token)))
                            assert (code, words in msg) == (want, True), (
                                worker,
                                token,
                                req["grant"][:12],
                                msg,
                            )
                    assert by_id[wg].host.running("s1", "globex") is not None  # untouched
                    ref = await stubs[wg].Checkpoint(
                        worker_pb2.CheckpointRequest(**g_owner), metadata=_md(RT_SHARED)
                    )
                    assert ref.uri  # the holder of the grant may, whatever its token

                    # A grant of a previous epoch: FAILED_PRECONDITION, the new actor untouched.
                    a_owner = _owner(ga)
                    assert (
                        await stubs[wa].Stop(worker_pb2.StopRequest(**a_owner), metadata=_md(RT_ACME))
                    ).stopped
                    await acme.scheduler.Release(
                        scheduler_pb2.ReleaseRequest(
                            session_id="s1", lease_id=ga.lease.lease_id, epoch=ga.lease.epoch
                        ),
                        metadata=acme.md,
                    )
                    a_call.cancel()
                    a_call = acme.acquire("s1", B)
                    ga2 = (await until(a_call, "granted")).granted
                    assert (ga2.lease.slot.worker_id, ga2.lease.epoch) == (wa, ga.lease.epoch + 1)
                    await stubs[wa].Start(_start(ga2), metadata=_md(RT_ACME))
                    for rpc, msg_type in ((stubs[wa].Stop, worker_pb2.StopRequest),
                                          (stubs[wa].Checkpoint, worker_pb2.CheckpointRequest)):  # fmt: skip
                        code, msg = await _code(rpc(msg_type(**a_owner), metadata=_md(RT_ACME)))
                        assert code is grpc.StatusCode.FAILED_PRECONDITION and "stale" in msg, msg
                    run = by_id[wa].host.running("s1", "acme")
                    assert run is not None

                    # The wire accepts only tagged lease ids the scheduler issued; Renew re-signs.
                    lease = ga2.lease
                    for bad in (core_lease_id(lease.lease_id), lease.lease_id[:-2] + "zz"):
                        req = scheduler_pb2.RenewRequest(session_id="s1", lease_id=bad, epoch=lease.epoch)
                        code, _ = await _code(acme.scheduler.Renew(req, metadata=acme.md))
                        assert code is grpc.StatusCode.NOT_FOUND, bad
                    renewed = await acme.scheduler.Renew(
                        scheduler_pb2.RenewRequest(
                            session_id="s1", lease_id=lease.lease_id, epoch=lease.epoch
                        ),
                        metadata=acme.md,
                    )
                    ok = _owner(ga2, grant=renewed.grant)
                    assert (await stubs[wa].Stop(worker_pb2.StopRequest(**ok), metadata=_md(RT_ACME))).stopped
                    a_call.cancel()
                    g_call.cancel()
            finally:
                for c in channels.values():
                    await c.close()
                for w in ws:
                    await w.stop()

        _run(go)


def test_sdk_passes_grants_through_and_status_shows_the_callers_actors(tmp_path: Path) -> None:
    keys = GrantKeyring.generate("k1")
    text = policy_yaml(DEFAULT_TENANTS, workers=2, slots_per_worker=1, floor=0)
    with running_server(text, static_pool=False, heartbeat_interval_s=0.2, grant_keys=keys) as server:

        async def go() -> None:
            ws = await _workers(server.target, tmp_path, keys.verifier())
            workers = WorkerClients(token=RT_SHARED)  # an unbound token: sees only what it started
            rt = ActorRuntime(workers)
            acme = AsyncClient(server.target, token=TOKENS["acme"], renew_interval_s=0.3)
            try:
                async with actor_session(acme, "s1", QoS.BURSTABLE, rt) as s:
                    first = s.lease
                    assert first is not None and first.grant and first.grant not in repr(first)
                    client = workers(s.worker_address)
                    status = await client.status()
                    assert [x.session_id for x in status.slots if not x.other] == ["s1"]
                    assert (await client.status(grants=[])).slots[0].other
                    # Renewals bring fresh grants (a later expiry), used by the Stop at the end.
                    deadline = time.monotonic() + 5
                    while s.lease is not None and s.lease.grant == first.grant:
                        assert time.monotonic() < deadline, "no fresh grant from Renew"
                        await asyncio.sleep(0.1)
                    host = next(w.host for w in ws if w.worker_id == s.slot.worker_id)
                    assert host.running("s1", "acme") is not None
                assert host.running("s1", "acme") is None  # stopped with the renewed grant
                assert sum(w.metrics.work_lost_total() for w in ws) == 0.0
            finally:
                await acme.close()
                await workers.close()
                for w in ws:
                    await w.stop()

        _run(go)


def test_a_comment_in_a_key_file_may_hold_commas() -> None:
    import base64

    line = f"k1:{base64.b64encode(os.urandom(32)).decode()}"
    ring = GrantKeyring.parse(f"# rotated 2026-12-01, by ops, ticket 42\n{line}  # current, signs\n")
    assert ring.kids == ("k1",)


def test_the_deploys_placeholder_grant_key_is_called_out_at_start(caplog: pytest.LogCaptureFixture) -> None:
    # The placeholder is published in the repository: a scheduler signing with it must say so.
    placeholder = Path(__file__).resolve().parents[1] / "deploy" / "base" / "secrets" / "grant-keys"
    keys = GrantKeyring.load(str(placeholder))
    with caplog.at_level("WARNING"), running_server(None, grant_keys=keys):
        pass
    assert any("published placeholder" in r.getMessage() for r in caplog.records)
    with caplog.at_level("WARNING"), running_server(None, grant_keys=GrantKeyring.generate("k1")):
        pass
    assert sum("published placeholder" in r.getMessage() for r in caplog.records) == 1
