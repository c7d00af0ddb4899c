"""The server reads the one table of session commands (scheduler/api/commands.py): every unary
command has its operation, the per-session servicer serves one method per rpc from the table,
the rate limiter charges each command to the flow the table names; and a queued session's
wait_timeout (or a per-session Acquire's deadline) is its stream's to enforce."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.api import commands
from scheduler.api.gen.slotsched.v1 import scheduler_pb2_grpc
from scheduler.core.types import Queued, SessionId
from scheduler.policy.model import Policy, RateLimit, RateLimitsSpec, TenantSpec
from scheduler.server.errors import RpcFailure
from scheduler.server.ratelimit import RateLimiter
from scheduler.server.scheduler_service import SchedulerService
from scheduler.server.session_ops import UNARY_OPS
from scheduler.server.stream import GRANTED, QUEUED, LeaseStream, Notice


def test_every_command_but_the_streaming_one_has_its_operation() -> None:
    assert set(UNARY_OPS) == {c for c in commands.COMMANDS if not c.streaming}


@pytest.mark.parametrize("command", [c for c in commands.BY_RPC.values() if not c.streaming], ids=str)
def test_the_servicer_method_of_each_unary_rpc_is_built_from_the_table(command: commands.Command) -> None:
    method = getattr(SchedulerService, command.rpc)
    assert method is not getattr(scheduler_pb2_grpc.SchedulerServicer, command.rpc)  # not UNIMPLEMENTED
    assert method.__name__ == command.rpc


@pytest.mark.parametrize("command", commands.COMMANDS, ids=lambda c: c.name)
def test_each_command_is_charged_to_its_flow(command: commands.Command) -> None:
    one = RateLimit(qps=0.001, burst=1)
    policy = Policy(
        tenants=(TenantSpec(name="a"),),
        rate_limits=RateLimitsSpec(tenant=one, renewals=one),
    )
    lim = RateLimiter(lambda: policy, lambda: 0.0)
    lim.charge("a", command)
    with pytest.raises(RpcFailure) as e:
        lim.charge("a", command)
    assert command.flow.value in {"tenant", "renewals"}
    key = "spec.rateLimits.renewals" if command.flow is commands.Flow.RENEWALS else "spec.rateLimits.tenant"
    assert key in str(e.value.details)
    other = next(c for c in commands.COMMANDS if c.flow is not command.flow)
    lim.charge("a", other)  # the other bucket is untouched


class _Loop:
    """The loop as a stream's `Patience`: a clock, wait_timeouts, and what was withdrawn."""

    def __init__(self, wait: float | None) -> None:
        self.wait = wait
        self.withdrawn: list[SessionId] = []

    def now(self) -> float:
        return 100.0

    def wait_timeout(self, key: SessionId) -> float | None:
        return self.wait

    def withdraw_queued(self, key: SessionId) -> bool:
        self.withdrawn.append(key)
        return True


def _queued(stream: LeaseStream, at: float) -> None:
    stream.put(QUEUED, Notice(Queued(stream.key, 0, None), at), at)


@pytest.mark.parametrize(
    ("wait", "deadline", "granted", "why"),
    [
        (0.05, None, False, "wait_timeout 0.05s"),  # counted from the wait's start (at 100)
        (None, 100.05, False, "the caller's deadline"),
        (5.0, 100.05, False, "the caller's deadline"),  # the earlier of the two
        (0.05, None, True, ""),  # granted first: nothing withdrawn
        (None, None, False, ""),  # no patience given: waits on
    ],
)
def test_the_stream_owns_the_wait(
    wait: float | None, deadline: float | None, granted: bool, why: str
) -> None:
    async def go() -> tuple[list[SessionId], str]:
        loop = _Loop(wait)
        stream = LeaseStream(SessionId("t/s"))
        stream.patience = loop
        if deadline is not None:
            stream.give_up_at(deadline, "the caller's deadline")
        _queued(stream, 100.0)
        _queued(stream, 200.0)  # a position refresh: the wait's start stays
        if granted:
            stream.put(GRANTED, Notice(Queued(stream.key, 0, None), 100.0), 100.0)
        await asyncio.sleep(0.15)
        return loop.withdrawn, stream.withdrawn

    withdrawn, said = asyncio.run(go())
    assert said == why
    assert withdrawn == ([SessionId("t/s")] if why else [])


def test_a_detached_stream_waits_for_nobody() -> None:
    async def go() -> list[SessionId]:
        loop = _Loop(0.05)
        stream = LeaseStream(SessionId("t/s"))
        stream.patience = loop
        _queued(stream, 100.0)
        stream.disarm()  # what loop.detach does
        await asyncio.sleep(0.1)
        return loop.withdrawn

    assert asyncio.run(go()) == []
