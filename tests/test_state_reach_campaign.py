"""Only a real answer from the store marks it reachable: a pool's replica that may not lead and
cannot reach its store never says "answers again" (it never asked), its `slotsched.state` health
stays down, and the log says "unreachable" once, then at most once every few seconds."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from scheduler.server.loop import SchedulerLoop
from scheduler.server.registry import WorkerRegistry
from scheduler.state.reach import REPORT_EVERY_S, StoreReach
from scheduler.state.replica import Replica, StateMetrics
from scheduler.state.store import StoreUnavailable
from tests.test_core_state_io import POLICY


class _Cut:
    """A store cut from the replica: every call fails; each call moves the test's clock 0.1 s."""

    token = "me:1"
    where = "redis://10.0.0.9:6379"
    idle_tail_ms = 0

    def __init__(self) -> None:
        self.calls = 0
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def _fail(self, *_: Any) -> Any:
        self.calls += 1
        self.now += 0.1
        await asyncio.sleep(0)
        raise StoreUnavailable("redis 10.0.0.9:6379: connection refused")

    try_lead = leader_address = _fail


@pytest.mark.parametrize("may_lead", [False, True])
def test_a_cut_replica_never_says_the_store_answers(may_lead: bool, caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> tuple[list[str | None], _Cut]:
        async def nothing(*_: Any) -> None:
            return None

        told: list[str | None] = []

        async def on_store(down: str | None) -> None:
            told.append(down)

        loop, store = SchedulerLoop(POLICY), _Cut()
        r = Replica(
            store,  # type: ignore[arg-type]
            loop,
            WorkerRegistry(loop, 5.0),
            POLICY,
            StateMetrics(CollectorRegistry()),
            on_lead=nothing,
            on_step_down=nothing,
            campaign_interval_s=0.0,
            may_lead=lambda: may_lead,
        )
        r.reach = StoreReach(store.where, on_store, clock=store.clock)
        r._pos = "0-0"  # a loaded standby: it campaigns
        if not may_lead:  # not its pool: its campaign asks the store nothing, 300 times over
            for _ in range(300):
                await r._campaign()
                store.now += 0.1
            return told, store
        task = asyncio.create_task(r._run())
        for _ in range(10_000):  # bounded: 300 tries, 30 s of the store's clock
            if store.calls >= 300:
                break
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return told, store

    with caplog.at_level(logging.INFO, logger="slotsched.state"):
        told, store = asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if r.name == "slotsched.state"]
    assert not [m for m in lines if "answers again" in m]
    if not may_lead:  # it never asked the store, so it says nothing of it
        assert store.calls == 0 and told == [] and not [m for m in lines if "unreachable" in m]
        return
    assert store.calls >= 300
    assert len(told) == 1 and told[0] is not None and "unreachable" in told[0]  # health: down, once
    unreachable = [m for m in lines if "unreachable" in m]
    assert 1 <= len(unreachable) <= 1 + store.now / REPORT_EVERY_S
