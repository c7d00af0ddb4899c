"""Roles over real gRPC on loopback: which credential may call which service.

Priority is a budget bound to a credential, so a tenant's token must not reach the Admin service
(ApplyPolicy would let it grant itself Guaranteed quota) nor the Workers service (Drain and
Deregister revoke other tenants' leases). Operators hold admin tokens (`spec.access.admins`),
worker agents worker tokens (`spec.access.workers`), and each token is one identity.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from scheduler.api.gen.slotsched.v1 import admin_pb2, workers_pb2
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.policy.identities import role_for_token
from scheduler.policy.yaml_io import parse_policy

pytest.register_assert_rewrite("tests.grpc_fixtures")  # imported before pytest loads it as a plugin
from tests.grpc_fixtures import (  # noqa: E402
    ADMIN_TOKEN,
    TOKENS,
    WORKER_TOKEN,
    B,
    Client,
    ServerThread,
    next_event,
    policy_yaml,
    running_server,
)

Code = grpc.StatusCode


@pytest.fixture
def server() -> Iterator[ServerThread]:
    """Secure mode: tenants acme/globex/batch, one admin token, one worker token."""
    with running_server(policy_yaml()) as s:
        yield s


async def code_of(aw: Awaitable[Any]) -> tuple[Code, str]:
    """The status of a unary call: OK, or the code and details it failed with."""
    try:
        await aw
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return Code.OK, ""


async def acquire_code(c: Client) -> tuple[Code, str]:
    """The status an Acquire stream ends with at once (OK if its first event arrives)."""
    call = c.acquire("role-test", B)
    try:
        await next_event(call)
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    call.cancel()
    return Code.OK, ""


def register(worker_id: str) -> workers_pb2.RegisterRequest:
    return workers_pb2.RegisterRequest(worker_id=worker_id, address=f"10.0.0.9:{len(worker_id)}", slots=1)


def _run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_tenant_token_is_refused_by_admin_and_workers(server: ServerThread) -> None:
    async def go() -> None:
        async with Client(server.target, token=TOKENS["acme"]) as c:
            # Priority is not self-declared: a tenant cannot rewrite its quotas...
            grab = policy_yaml([{"name": "acme", "guaranteed": 2, "burstable": {"nominal": 2, "limit": 2}}])
            code, details = await code_of(
                c.admin.ApplyPolicy(admin_pb2.ApplyPolicyRequest(yaml=grab), metadata=c.md)
            )
            assert code == Code.PERMISSION_DENIED
            assert "admin role" in details and "spec.access.admins" in details
            assert "tenant 'acme'" in details  # says what the token is, so the fix is obvious
            for rpc, req in (
                (c.admin.DescribePool, admin_pb2.DescribePoolRequest()),
                (c.admin.GetPolicy, admin_pb2.GetPolicyRequest()),
                (c.admin.ListLeases, admin_pb2.ListLeasesRequest()),
                (c.admin.ListQueue, admin_pb2.ListQueueRequest()),
            ):
                assert (await code_of(rpc(req, metadata=c.md)))[0] == Code.PERMISSION_DENIED, rpc
            # ...nor add, drain or remove workers.
            code, details = await code_of(c.workers.Register(register("rogue"), metadata=c.md))
            assert code == Code.PERMISSION_DENIED
            assert "worker role" in details and "spec.access.workers" in details
            for rpc, req in (
                (c.workers.Heartbeat, workers_pb2.HeartbeatRequest(worker_id="local-0")),
                (c.workers.Drain, workers_pb2.DrainRequest(worker_id="local-0")),
                (c.workers.Deregister, workers_pb2.DeregisterRequest(worker_id="local-0")),
            ):
                assert (await code_of(rpc(req, metadata=c.md)))[0] == Code.PERMISSION_DENIED, rpc
            # and still Acquires as itself.
            assert (await acquire_code(c))[0] == Code.OK

    _run(go())
    assert server.call(lambda s: s.loop.core.policy.tenant("acme")).guaranteed == 1  # type: ignore[union-attr]
    assert "rogue" not in server.call(lambda s: set(s.registry.workers))
    assert "local-0" in server.call(lambda s: set(s.registry.workers))


def test_worker_token_runs_workers_and_nothing_else(server: ServerThread) -> None:
    async def go() -> None:
        async with Client(server.target, token=WORKER_TOKEN) as w:
            await w.workers.Register(register("w-1"), metadata=w.md)
            hb = await w.workers.Heartbeat(workers_pb2.HeartbeatRequest(worker_id="w-1"), metadata=w.md)
            assert not hb.draining
            code, details = await code_of(
                w.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=w.md)
            )
            assert code == Code.PERMISSION_DENIED
            assert "worker role" in details and "spec.access.admins" in details
            req = admin_pb2.ApplyPolicyRequest(yaml=policy_yaml())
            assert (await code_of(w.admin.ApplyPolicy(req, metadata=w.md)))[0] == Code.PERMISSION_DENIED
            code, details = await acquire_code(w)
            assert code == Code.PERMISSION_DENIED
            assert "names no tenant" in details
            release = w.scheduler.Release(pb.ReleaseRequest(session_id="s"), metadata=w.md)
            assert (await code_of(release))[0] == Code.PERMISSION_DENIED
            await w.workers.Deregister(workers_pb2.DeregisterRequest(worker_id="w-1"), metadata=w.md)

    _run(go())


def test_admin_token_runs_admin_and_workers_but_acquires_nothing(server: ServerThread) -> None:
    async def go() -> None:
        async with Client(server.target, token=ADMIN_TOKEN) as a:
            pool = await a.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=a.md)
            assert pool.floor == 1
            done = await a.admin.ApplyPolicy(
                admin_pb2.ApplyPolicyRequest(yaml=policy_yaml(floor=0)), metadata=a.md
            )
            assert done.applied
            pool = await a.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=a.md)
            assert pool.floor == 0
            # An operator may drain and remove a worker by hand.
            await a.workers.Register(register("w-op"), metadata=a.md)
            drained = await a.workers.Drain(workers_pb2.DrainRequest(worker_id="w-op"), metadata=a.md)
            assert drained.leases == 0
            await a.workers.Deregister(workers_pb2.DeregisterRequest(worker_id="w-op"), metadata=a.md)
            code, details = await acquire_code(a)
            assert code == Code.PERMISSION_DENIED
            assert "names no tenant" in details and "admin role" in details

    _run(go())


def test_no_credential_is_unauthenticated_and_unknown_is_denied(server: ServerThread) -> None:
    async def go() -> None:
        async with Client(server.target) as c:
            assert (await code_of(c.admin.DescribePool(admin_pb2.DescribePoolRequest())))[0] == (
                Code.UNAUTHENTICATED
            )
            assert (await code_of(c.workers.Register(register("w-x"))))[0] == Code.UNAUTHENTICATED
            assert (await acquire_code(c))[0] == Code.UNAUTHENTICATED
        async with Client(server.target, token="nobody-knows-me") as c:
            code, details = await code_of(
                c.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=c.md)
            )
            assert code == Code.PERMISSION_DENIED and "names no tenant or role" in details
            assert (await code_of(c.workers.Register(register("w-x"), metadata=c.md)))[0] == (
                Code.PERMISSION_DENIED
            )
            assert (await acquire_code(c))[0] == Code.PERMISSION_DENIED

    _run(go())


def test_apply_policy_that_drops_a_role_token_refuses_it_at_once(server: ServerThread) -> None:
    async def go() -> None:
        async with (
            Client(server.target, token=ADMIN_TOKEN) as old,
            Client(server.target, token="the-next-admin") as new,
            Client(server.target, token=WORKER_TOKEN) as w,
        ):
            # Both tokens are used (and cached) under the first policy.
            await old.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=old.md)
            await w.workers.Register(register("w-2"), metadata=w.md)
            # A policy with no admin at all would lock every operator out: refused, nothing applied.
            no_admins = policy_yaml(admin_tokens=[])
            for dry_run in (True, False):
                req = admin_pb2.ApplyPolicyRequest(yaml=no_admins, dry_run=dry_run)
                code, details = await code_of(old.admin.ApplyPolicy(req, metadata=old.md))
                assert code == Code.FAILED_PRECONDITION and "spec.access.admins" in details
            await old.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=old.md)
            # The admin rotates its own token out, and revokes the worker token (with a warning).
            rotated = policy_yaml(admin_tokens=["the-next-admin"], worker_tokens=[])
            done = await old.admin.ApplyPolicy(admin_pb2.ApplyPolicyRequest(yaml=rotated), metadata=old.md)
            assert done.applied and any(
                w.startswith("spec.access.workers: 1 worker token") for w in done.warnings
            )
            code, _ = await code_of(old.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=old.md))
            assert code == Code.PERMISSION_DENIED
            hb = w.workers.Heartbeat(workers_pb2.HeartbeatRequest(worker_id="w-2"), metadata=w.md)
            assert (await code_of(hb))[0] == Code.PERMISSION_DENIED
            await new.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=new.md)

    _run(go())


def test_insecure_dev_mode_lets_anyone_call_admin_and_workers() -> None:
    with running_server(None) as srv:

        async def go() -> None:
            async with Client(srv.target) as c:
                await c.admin.DescribePool(admin_pb2.DescribePoolRequest())
                await c.workers.Register(register("w-dev"))
                await c.workers.Heartbeat(workers_pb2.HeartbeatRequest(worker_id="w-dev"))

        _run(go())


def test_deploy_manifests_give_workers_a_worker_token() -> None:
    deploy = Path(__file__).resolve().parents[1] / "deploy" / "base"
    policy, _ = parse_policy((deploy / "policy" / "policy.yaml").read_text(encoding="utf-8"))
    # The placeholders the comments name carry the roles they are documented with.
    assert role_for_token(policy, "replace-me-worker") == "worker"
    assert role_for_token(policy, "replace-me-admin") == "admin"
    assert role_for_token(policy, "replace-me-oncall") is None
    with open(deploy / "worker.yaml", encoding="utf-8") as f:
        (dep,) = [d for d in yaml.safe_load_all(f) if d and d["kind"] == "Deployment"]
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    ref = env["SLOTSCHED_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == "slotsched-worker-token" and not ref.get("optional", False)
    # The worker token is bound to the Deployment's pod names (the worker id is the pod's name).
    (entry,) = [w for w in policy.access.workers if w.worker_id_prefix is not None]  # not KEDA's
    assert entry.allows(f"{dep['metadata']['name']}-7d4b9c-x2k8p") and not entry.allows("local-0")
