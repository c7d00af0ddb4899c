"""Per-pool leadership from a second implementation: a Node client (@grpc/grpc-js and
@grpc/proto-loader, pinned in tests/node) built from the proto and the documented metadata alone
(tests/node/pool_follow.js) acquires a session in each pool of two `serve --leadership pool`
replicas over a real redis-server (tests/test_pool_leadership.py's `cluster`), starting at the
first target it is given and following each NOT_LEADER's `x-slotsched-leader` for the pool that
`x-slotsched-pool` names.

Run with the targets in both orders, so each pool is once led by the first target (granted there,
no redirect) and once by the second (exactly one redirect): every pool is granted, in its own
pool, by the replica that leads it. Skipped on a laptop without node (or redis-server); in CI
(CI set) a missing one fails."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from tests.grpc_fixtures import TOKENS
from tests.test_channel_node import NODE, NODE_DIR, NPM, PROTO_DIR, _node_modules
from tests.test_pool_leadership import POOLS, cluster, spread, until
from tests.test_state_redis import REDIS_BIN


async def _follow(targets: list[str]) -> tuple[int, str, str]:
    assert NODE is not None
    args = [NODE, "pool_follow.js", ",".join(targets), TOKENS["acme"], str(PROTO_DIR), *POOLS]
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=NODE_DIR, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _check(seen: dict[str, dict[str, Any]], owner: dict[str, str], targets: list[str]) -> None:
    """Each pool granted in itself by its leader; one redirect exactly when the leader is not
    the first target."""
    assert set(seen) == set(POOLS), seen
    for pool, line in seen.items():
        assert line["lease_pool"] == pool, f"granted in another pool: {line}"
        assert line["granted_by"] == owner[pool], f"not granted by its leader: {line} {owner}"
        want = 0 if owner[pool] == targets[0] else 1
        assert line["redirects"] == want, f"redirect count: {line} {owner} {targets}"
        assert line["retries"] == 0, f"retried: {line}"  # every leader known: no election under way
        assert line["released"] is True, f"not released: {line}"


def test_a_node_client_follows_each_pools_leader() -> None:
    if NODE is None or NPM is None:
        if os.environ.get("CI"):
            pytest.fail("node and npm are needed for per-pool leadership's second-implementation test")
        pytest.skip("node/npm not installed")
    if not os.path.exists(REDIS_BIN):
        if os.environ.get("CI"):
            pytest.fail("redis-server is needed for per-pool leadership's second-implementation test")
        pytest.skip("redis-server not installed")
    _node_modules()
    asyncio.run(_follows_each_pools_leader())


async def _follows_each_pools_leader() -> None:
    async with cluster(2) as (_policy, _url, servers, _keys):
        owner: dict[str, str] = await until("the pools to spread over both replicas", spread(servers))
        # Ground truth from each replica itself, not from what the client was told.
        led = {p: s.target for s in servers if s.pools is not None for p in s.pools.led_here()}
        assert led == owner
        forward = [s.target for s in servers]
        for targets in (forward, forward[::-1]):
            assert any(owner[p] == targets[1] for p in POOLS)  # at least one redirect to follow
            code, out, err = await _follow(targets)
            assert code == 0, f"node client failed ({targets}): {out}{err}"
            lines = [json.loads(line) for line in out.strip().splitlines()]
            seen = {line["pool"]: line for line in lines}
            assert len(seen) == len(lines) == len(POOLS), lines
            # Leadership did not move while the client ran: the expectation still holds.
            assert spread(servers)() == owner
            _check(seen, owner, targets)
            # The checks tell the orders and the leaders apart: told the other order, or the
            # other leader of each pool, they fail.
            with pytest.raises(AssertionError, match="redirect count"):
                _check(seen, owner, targets[::-1])
            swapped = {p: next(t for t in forward if t != owner[p]) for p in POOLS}
            with pytest.raises(AssertionError, match="not granted by its leader"):
                _check(seen, swapped, targets)
