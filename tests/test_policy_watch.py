"""`serve --policy-source kubernetes://NS/NAME`: the scheduler reads a SchedulingPolicy object,
applies each new generation live (DescribePool shows it), refuses invalid ones (the old policy
stays; status Valid=False with the validator's message) and relists after a 410 Gone. The real
kubernetes client against tests/fake_kube.py."""

from __future__ import annotations

import asyncio
import copy
import os
from typing import Any

import grpc
import pytest
import yaml

from scheduler.api.gen.slotsched.v1 import admin_pb2, admin_pb2_grpc
from scheduler.kube.policy_watch import PolicyRef, parse_policy_source, policy_document
from scheduler.policy.crd import GROUP, PLURAL, VERSION
from scheduler.serve import RunningServer, start_server
from tests.fake_kube import FakeObjectApi, serving
from tests.grpc_fixtures import ADMIN_TOKEN, policy_yaml

NS, NAME = "slotsched", "cluster"
MD = (("authorization", f"Bearer {ADMIN_TOKEN}"),)


def policy_object(guaranteed: int = 1, **kw: Any) -> dict[str, Any]:
    tenants = [{"name": "acme", "guaranteed": guaranteed, "burstable": {"nominal": 1, "limit": 2}}]
    doc: dict[str, Any] = yaml.safe_load(policy_yaml(tenants, name=NAME, workers=4, floor=2, **kw))
    return doc


async def quotas(running: RunningServer) -> dict[str, int]:
    async with grpc.aio.insecure_channel(running.target) as ch:
        pool = await admin_pb2_grpc.AdminStub(ch).DescribePool(admin_pb2.DescribePoolRequest(), metadata=MD)
    return {t.tenant: t.guaranteed_quota for t in pool.tenants}


def lists(fake: FakeObjectApi) -> int:
    return sum(1 for m, p in fake.requests if m == "GET" and p.startswith(fake.base) and "watch=" not in p)


def test_the_object_is_applied_live_refused_when_invalid_and_relisted_after_410() -> None:
    fake = FakeObjectApi(GROUP, VERSION, NS, PLURAL)
    fake.create(policy_object(guaranteed=1))

    def reported(gen: int, kind: str = "Applied") -> bool:
        c = fake.condition(kind)
        return c is not None and c.get("observedGeneration") == gen

    async def scenario(api: Any) -> None:
        running = await start_server(
            None, "127.0.0.1:0", None, policy_source=f"kubernetes://{NS}/{NAME}", kube_api=api
        )
        try:
            assert running.secure
            await asyncio.to_thread(fake.wait_for, lambda: reported(1))
            assert fake.condition("Applied")["status"] == "True"  # type: ignore[index]
            assert await quotas(running) == {"acme": 1}

            # A new generation: applied live.
            fake.set_spec(policy_object(guaranteed=2)["spec"])
            await asyncio.to_thread(fake.wait_for, lambda: reported(2))
            assert fake.condition("Applied")["status"] == "True"  # type: ignore[index]
            assert await quotas(running) == {"acme": 2}

            # An invalid one: refused with the validator's words; the policy in force stays.
            bad = policy_object(guaranteed=3)["spec"]
            bad["tenants"][0]["burstable"] = {"nominal": 3, "limit": 2}
            fake.set_spec(bad)
            await asyncio.to_thread(fake.wait_for, lambda: reported(3, "Valid"))
            valid, applied = fake.condition("Valid"), fake.condition("Applied")
            assert valid is not None and applied is not None
            assert (valid["status"], valid["reason"]) == ("False", "Invalid")
            assert "spec.tenants[0].burstable.nominal: nominal 3 is greater than limit 2" in valid["message"]
            assert (applied["status"], applied["observedGeneration"]) == ("False", 3)
            assert await quotas(running) == {"acme": 2}

            # Valid, but refused as Admin.ApplyPolicy refuses it: no admin left.
            fake.set_spec(policy_object(guaranteed=3, admin_tokens=[])["spec"])
            await asyncio.to_thread(fake.wait_for, lambda: reported(4))
            assert fake.condition("Valid")["status"] == "True"  # type: ignore[index]
            assert fake.condition("Applied")["reason"] == "NoAdmins"  # type: ignore[index]
            assert await quotas(running) == {"acme": 2}

            # 410 Gone on the open watch: the watcher lists again, then watches on.
            before = lists(fake)
            fake.expire_history()
            await asyncio.to_thread(fake.wait_for, lambda: lists(fake) > before)
            fake.set_spec(policy_object(guaranteed=0)["spec"])
            await asyncio.to_thread(fake.wait_for, lambda: reported(5))
            assert await quotas(running) == {"acme": 0}
            # Our own status writes (MODIFIED, same generation) applied nothing twice.
            assert running.loop.core.policy.tenants[0].guaranteed == 0
        finally:
            await running.stop(0)

    with serving(fake) as api:
        asyncio.run(scenario(api))


def test_an_invalid_object_at_start_up_is_a_policy_error() -> None:
    from scheduler.policy.errors import PolicyError

    fake = FakeObjectApi(GROUP, VERSION, NS, PLURAL)
    bad = policy_object()
    bad["spec"]["pool"]["minWorkers"] = 9
    fake.create(bad)
    with serving(fake) as api, pytest.raises(PolicyError) as e:
        asyncio.run(
            start_server(None, "127.0.0.1:0", None, policy_source=f"kubernetes://{NS}/{NAME}", kube_api=api)
        )
    assert "spec.pool.minWorkers" in str(e.value.problems[0])

    missing = FakeObjectApi(GROUP, VERSION, NS, PLURAL)
    missing.obj = None
    with serving(missing) as api, pytest.raises(PolicyError, match="404"):
        asyncio.run(
            start_server(None, "127.0.0.1:0", None, policy_source=f"kubernetes://{NS}/x", kube_api=api)
        )


@pytest.mark.parametrize("bad", ["kubernetes://ns", "kubernetes:///name", "file:///x", "kubernetes://a/b/c"])
def test_a_bad_policy_source_names_the_flag(bad: str) -> None:
    with pytest.raises(ValueError, match="--policy-source"):
        parse_policy_source(bad)
    assert parse_policy_source("kubernetes://ns/p") == PolicyRef("ns", "p")


def test_policy_and_policy_source_together_are_refused() -> None:
    with pytest.raises(ValueError, match="--policy and --policy-source"):
        asyncio.run(
            start_server("x.yaml", "127.0.0.1:0", None, policy_source="kubernetes://a/b", kube_api=object())
        )


def test_the_object_is_read_as_the_policy_file_it_holds() -> None:
    obj = copy.deepcopy(policy_object())
    obj["metadata"] |= {
        "namespace": NS,
        "uid": "u",
        "resourceVersion": "7",
        "generation": 2,
        "managedFields": [],
        "labels": {"a": "b"},
    }
    obj["status"] = {"conditions": []}
    doc = policy_document(obj)
    assert doc["metadata"] == {"name": NAME, "labels": {"a": "b"}}
    assert "status" not in doc and doc["spec"] == obj["spec"]


def test_a_replica_taking_the_lead_applies_the_objects_latest_version(tmp_path: Any) -> None:
    # Redis mode: the journal holds the policy of the last leader; the object changed while no
    # replica led. The new leader recovers the journal, then applies the object (not the journal).
    from tests.test_state_redis import REDIS_BIN, RedisProc

    if not os.path.exists(REDIS_BIN) and not os.environ.get("CI"):
        pytest.skip("redis-server not installed")
    from scheduler.serve import StateOptions

    redis_proc = RedisProc(str(tmp_path)).start()
    fake = FakeObjectApi(GROUP, VERSION, NS, PLURAL)
    fake.create(policy_object(guaranteed=1))

    async def lead_once(api: Any, want: int, generation: int) -> None:
        running = await start_server(
            None,
            "127.0.0.1:0",
            None,
            state=StateOptions(state=redis_proc.url, replica_id=f"r{generation}", leader_ttl_s=1.0),
            policy_source=f"kubernetes://{NS}/{NAME}",
            kube_api=api,
        )
        try:
            assert running.replica is not None and running.replica.serving
            assert await quotas(running) == {"acme": want}
            c = fake.condition("Applied")
            assert c is not None and (c["status"], c["observedGeneration"]) == ("True", generation)
        finally:
            await running.stop(0)

    try:
        with serving(fake) as api:
            asyncio.run(lead_once(api, 1, 1))  # a fresh store
            fake.set_spec(policy_object(guaranteed=2)["spec"])
            asyncio.run(lead_once(api, 2, 2))  # recovered: the journal says 1, the object 2
    finally:
        redis_proc.kill()


def test_a_failed_apply_leaves_the_watch_running_and_is_retried() -> None:
    """The state store unreachable mid-apply (or a step-down) must not end the watch: the version
    stays unhandled, its status says Unavailable, and the next delivery applies it."""
    from kubernetes import client

    from scheduler.kube.policy_watch import Outcome, PolicyWatcher
    from scheduler.ports import StateUnavailable

    watcher = PolicyWatcher(parse_policy_source(f"kubernetes://{NS}/{NAME}"), client.ApiClient())
    applied: list[Any] = []
    reports: list[Outcome] = []

    async def flaky(policy: Any, warnings: Any) -> Outcome:
        if not applied:
            applied.append(None)
            raise StateUnavailable("redis unreachable", 1.0)
        applied.append(policy)
        return Outcome(True, "Applied", "applied")

    async def report(obj: Any, valid: Any, outcome: Outcome) -> None:
        reports.append(outcome)

    watcher.bind(flaky)
    watcher._report = report  # type: ignore[method-assign]  # no API server in this test
    obj = policy_object(guaranteed=2)
    obj["metadata"].update(uid="u1", resourceVersion="7")

    async def go() -> None:
        await watcher._handle(obj)  # raises inside apply: must not propagate
        await watcher._handle(obj)  # the same version again: now applied

    asyncio.run(go())
    assert [r.reason for r in reports] == ["Unavailable", "Applied"]
    assert applied[-1] is not None and applied[-1].tenant("acme").guaranteed == 2
