"""Who leads which pool, for an operator (`serve --leadership pool`), over a real redis-server and
two in-process replicas: Admin.DescribePool names each pool's leader replica, its address and its
term from any replica; `slotsched status` (and `--json`) shows them; the leader's log line names
the pool it leads."""

from __future__ import annotations

import asyncio
import json
import logging

import grpc
import pytest

from scheduler.api.gen.slotsched.v1 import admin_pb2, admin_pb2_grpc
from scheduler.cli.status_table import status_main
from tests.grpc_fixtures import ADMIN_TOKEN
from tests.test_pool_leadership import ADMIN, POOLS, cluster, spread, until
from tests.test_pool_leadership import pytestmark as needs_redis

pytestmark = needs_redis


def test_status_names_each_pools_leader_and_term(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        async with cluster(2) as (_policy, _url, servers, _keys):
            owner = await until("the pools to spread", spread(servers))
            by_target = {s.target: s for s in servers}
            want = {}
            for pool, target in owner.items():
                s = by_target[target]
                assert s.pools is not None
                rid = s.pools.replica_id
                want[pool] = (rid, target, s.pools.stores[pool].token)
            for s in servers:  # from either replica, each pool's leader as its lease says
                async with grpc.aio.insecure_channel(s.target) as ch:
                    admin = admin_pb2_grpc.AdminStub(ch)
                    for pool in POOLS:
                        desc = await admin.DescribePool(
                            admin_pb2.DescribePoolRequest(pool=pool), metadata=ADMIN
                        )
                        got = (desc.leader.replica_id, desc.leader.address, desc.leader.term)
                        assert got == want[pool], (s.target, pool, got, want[pool])
                        assert desc.leader.term.startswith(desc.leader.replica_id + ":")
            other = servers[0].target
            capsys.readouterr()
            assert await asyncio.to_thread(status_main, other, False, ADMIN_TOKEN, None) == 0
            text = capsys.readouterr().out
            for pool, (rid, target, term) in want.items():
                title = next(line for line in text.splitlines() if line.startswith(f"pool {pool} "))
                assert title.endswith(f"; leader {rid} at {target}, term {term}"), title
            assert await asyncio.to_thread(status_main, other, True, ADMIN_TOKEN, None) == 0
            doc = json.loads(capsys.readouterr().out)
            got = {
                p["pool"]: (p["leader"]["replicaId"], p["leader"]["address"], p["leader"]["term"])
                for p in doc["pools"]
            }
            assert got == want

    with caplog.at_level(logging.INFO, logger="slotsched.state"):
        asyncio.run(go())
    leading = [r.getMessage() for r in caplog.records if "leading as" in r.getMessage()]
    assert leading and all(any(m.startswith(f"pool {p}: leading as r") for p in POOLS) for m in leading), (
        leading
    )
