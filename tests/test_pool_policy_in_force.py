"""Per-pool leadership authenticates by the policy in force (docs/design.md, "Pools across
replicas"): a `--policy-source` version applied by the replica's watcher (PoolLeadership.
bind_watcher) changes who may call, as it does with one leader. The watcher is a stand-in that
hands the replica the version, as PolicyWatcher does (tests/test_policy_watch.py)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import grpc
import yaml

from scheduler.api.gen.slotsched.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler.policy.identities import hash_token
from scheduler.policy.yaml_io import parse_policy
from scheduler.server.policy_log import PolicyLog
from tests.grpc_fixtures import TOKENS, pools_policy_yaml
from tests.test_pool_leadership import ACME, POOLS, cluster, leaders, until
from tests.test_pool_leadership import pytestmark as needs_redis

pytestmark = needs_redis
NEW_TOKEN = "acme-rotated-token"


class _Watcher:
    ref = "kubernetes://slotsched/cluster"

    def bind(self, apply: Any, reporting: Any) -> None:
        self.apply = apply


async def _code(target: str, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    """The status of a GetSession for a session nobody has: NOT_FOUND once authenticated."""
    async with grpc.aio.insecure_channel(target) as ch:
        try:
            await scheduler_pb2_grpc.SchedulerStub(ch).GetSession(
                scheduler_pb2.GetSessionRequest(session_id="nobody"), metadata=metadata, timeout=5
            )
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def test_a_rotated_token_is_taken_and_the_old_one_refused() -> None:
    doc = yaml.safe_load(pools_policy_yaml(workers_per_pool=1))
    new = copy.deepcopy(doc)
    acme = next(t for t in new["spec"]["tenants"] if t["name"] == "acme")
    assert acme["tokens"] == [hash_token(TOKENS["acme"])]
    acme["tokens"] = [hash_token(NEW_TOKEN)]
    rotated = parse_policy(yaml.safe_dump(new))[0]

    async def body() -> None:
        async with cluster(1) as (_, _, servers, _):
            (server,) = servers
            await until("every pool led here", lambda: all(leaders(servers)[p] for p in POOLS))
            assert server.pools is not None
            watcher = _Watcher()
            server.pools.bind_watcher(watcher, True, PolicyLog(watcher.ref, durable=True))  # type: ignore[arg-type]
            assert await _code(server.target, ACME) == grpc.StatusCode.NOT_FOUND
            outcome = await watcher.apply(rotated, [])
            assert outcome.applied, outcome
            assert await _code(server.target, ACME) == grpc.StatusCode.PERMISSION_DENIED  # an unknown token
            new_acme = (("authorization", f"Bearer {NEW_TOKEN}"),)
            assert await _code(server.target, new_acme) == grpc.StatusCode.NOT_FOUND

    asyncio.run(asyncio.wait_for(body(), 60))
