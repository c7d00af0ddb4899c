"""Under per-pool leadership each pool's replica would count a budget apart, so permits are
refused there, naming the limitation (docs/design.md, "Token budgets"); a new leader term counts
afresh under a new incarnation, so the old term's permits are charged as debts when settled."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from scheduler.grants import GrantKeyring
from scheduler.policy.yaml_io import parse_policy
from scheduler.server import errors
from scheduler.server.loop import SchedulerLoop
from scheduler.server.pool_routes import PoolUnit
from scheduler.server.registry import WorkerRegistry
from scheduler.server.session_ops import SessionOps
from tests.budget_fixtures import budget_policy_yaml, permit_request


def test_a_pool_unit_refuses_permits_naming_the_limitation() -> None:
    async def main() -> None:
        loop = SchedulerLoop(parse_policy(budget_policy_yaml())[0])
        ops = SessionOps(loop, GrantKeyring.generate())
        registry = WorkerRegistry(loop, 5.0)
        PoolUnit("default", loop, ops, registry)
        with pytest.raises(errors.RpcFailure) as e:
            ops.request_permit("acme", permit_request("s"))
        assert e.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert "per-pool leadership" in e.value.message
        PoolUnit("", loop, ops, registry)  # one leader for every pool: served
        out = ops.request_permit("acme", permit_request("s"))
        assert isinstance(out, errors.RpcFailure) and out.code is grpc.StatusCode.NOT_FOUND  # no session

    asyncio.run(main())


def test_a_new_term_names_permits_afresh() -> None:
    async def main() -> None:
        loop = SchedulerLoop(parse_policy(budget_policy_yaml())[0])
        old = loop.permits.new_id()
        assert loop.permits.issued_here(old)
        loop.resume()
        assert not loop.permits.issued_here(old) and loop.permits.new_id() != old
        loop.close()

    asyncio.run(main())
