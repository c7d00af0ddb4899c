"""The leader lease's renewals on one grid (scheduler/state/lease.py): the next renewal is never
later than an interval after the last was sent, and falls on a multiple of the interval, so the
replicas of every pool a process leads renew together, in one write to Redis
(scheduler/state/resp_shared.py)."""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from scheduler.server.loop import SchedulerLoop
from scheduler.server.registry import WorkerRegistry
from scheduler.state.lease import next_renewal
from scheduler.state.redis_store import RedisStore
from scheduler.state.replica import Replica, StateMetrics
from scheduler.state.resp_shared import SharedLines
from tests.test_core_state_io import POLICY
from tests.test_state_redis import RedisProc


@pytest.mark.parametrize(
    ("sent", "step", "due"),
    [
        (0.0, 0.25, 0.25),  # on the grid: one interval on
        (0.1, 0.25, 0.25),  # off it: the next grid point, sooner than 0.35
        (0.249, 0.25, 0.25),  # just before a point: that point (a renewal soon, then aligned)
        (0.25 - 1e-9, 0.25, 0.5),  # a hair before: counts as on it, never a renewal at once
        (0.25, 0.25, 0.5),
        (1000.37, 0.25, 1000.5),
        (7.0, 1.0, 8.0),
        (7.999, 1.0, 8.0),
    ],
)
def test_the_next_renewal_is_the_last_grid_point_within_an_interval(
    sent: float, step: float, due: float
) -> None:
    assert next_renewal(sent, step) == pytest.approx(due)


@given(st.floats(0, 1e6, allow_nan=False), st.sampled_from([0.025, 0.1, 0.25, 1.0, 2.5]))
def test_a_renewal_is_never_later_than_before_and_replicas_meet_on_the_grid(sent: float, step: float) -> None:
    due = next_renewal(sent, step)
    assert sent < due <= sent + step * (1 + 2e-6)  # the lease's deadline rule is untouched
    k = round(due / step)
    assert due == pytest.approx(k * step, abs=1e-6)  # a grid point: every replica's same one
    assert next_renewal(due, step) == pytest.approx(due + step, abs=1e-6)  # then one a step


def test_the_pools_a_process_leads_renew_in_one_write_a_tick() -> None:
    """Three pools' replicas on one Redis, leading at different moments: after the first renewal
    each is on the grid, and the line carries one write per tick for all three."""
    with tempfile.TemporaryDirectory(prefix="slotsched-grid-") as d:
        r = RedisProc(d).start()

        async def go() -> None:
            async def nothing(*_: Any) -> None:
                return None

            lines = SharedLines()
            reps: list[Replica] = []
            for i in range(3):
                loop = SchedulerLoop(POLICY)
                store = RedisStore(r.url, f"grid{i}", "me", 0.5, lines)
                reps.append(
                    Replica(
                        store,
                        loop,
                        WorkerRegistry(loop, 5.0),
                        POLICY,
                        StateMetrics(CollectorRegistry()),
                        on_lead=nothing,
                        on_step_down=nothing,
                        leader_ttl_s=0.4,
                    )  # fmt: skip
                )
            try:
                for rep in reps:
                    await rep.start()
                    await asyncio.sleep(0.03)  # off each other's phase
                assert all(rep.serving for rep in reps)
                line = reps[0].store._lease  # type: ignore[attr-defined]
                sent = {id(rep): 0 for rep in reps}
                counted: list[int] = []

                def tally(rep: Replica, real: Any) -> Any:
                    async def extend(ttl_s: float, now: float) -> bool:
                        sent[id(rep)] += 1
                        return bool(await real(ttl_s, now))

                    return extend

                for rep in reps:
                    rep.store.extend_lead = tally(rep, rep.store.extend_lead)  # type: ignore[method-assign]
                await asyncio.sleep(0.25)  # every replica renewed at least once: on the grid now
                w0, s0 = line.writes, sum(sent.values())
                while sum(sent.values()) - s0 < 3 * 8:  # eight ticks of three renewals
                    await asyncio.sleep(0.02)
                counted = [line.writes - w0, sum(sent.values()) - s0]
                assert all(rep.serving for rep in reps)
                # One write carries a tick's three renewals (a tick may be caught half counted at
                # either end): far fewer writes than renewals, which one write each would equal.
                assert counted[0] <= counted[1] / 3 + 2, counted
            finally:
                for rep in reps:
                    await rep.stop()
                    await rep.store.close()

        try:
            asyncio.run(go())
        finally:
            r.kill()
