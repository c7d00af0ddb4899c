"""The server's permit operations (SessionOps) answer the permit's own decision whatever else the
event decided: a request whose pass first steps the effective limit back up (a LimitChanged,
which names no permit) is still granted."""

from __future__ import annotations

import asyncio

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.core.budget.types import LimitChanged, PermitRequest
from scheduler.core.types import WorkerAdded, WorkerId
from scheduler.grants import GrantKeyring
from scheduler.policy.yaml_io import parse_policy
from scheduler.server.loop import SchedulerLoop
from scheduler.server.session_ops import SessionOps
from tests.budget_fixtures import budget_policy_yaml, permit_request, settle_request


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_request_whose_pass_recovers_the_limit_is_granted() -> None:
    async def main() -> None:
        clock = Clock()
        loop = SchedulerLoop(parse_policy(budget_policy_yaml())[0], clock=clock)
        loop.submit(WorkerAdded(WorkerId("w1"), 4))
        ops = SessionOps(loop, GrantKeyring.generate())
        ops.open("acme", scheduler_pb2.AcquireRequest(session_id="s", qos=common_pb2.QOS_CLASS_BURSTABLE))
        clock.now += 60.0  # a minute of the budget in its buckets
        first = ops.request_permit("acme", permit_request("s"))
        assert first.HasField("granted")
        throttled = settle_request("s", first.permit_id, throttled=True)
        assert ops.settle_permit("acme", throttled).charged.input_tokens == 50  # the limit drops
        clock.now += 61.0  # a minute without a throttle: the next pass steps it back up
        seen: list[object] = []
        handle = loop.permits.handle

        def spy(event: object, tenant: str = "") -> tuple[object, ...]:
            out = handle(event, tenant)  # type: ignore[arg-type]
            if isinstance(event, PermitRequest):
                seen.extend(out)
            return out

        loop.permits.handle = spy  # type: ignore[method-assign, assignment]
        second = ops.request_permit("acme", permit_request("s"))
        assert isinstance(seen[0], LimitChanged)  # decided before the grant, in the same event
        assert second.HasField("granted"), second

    asyncio.run(main())
