"""The replica's group commit (scheduler/state/replica.py, `record` / `_cut` / `_appended`) against
a store that records what it is sent and answers when the test says: the first record goes out at
once, what is applied while it is in flight goes next as one batch, in order; nothing is told
durable before its batch is in; a failed batch refuses every later `durable()` at once (before
the step-down task runs) and nothing after it ever reaches the store (no hole in the journal)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from scheduler.core.types import Acquire, QoS, SessionId, TenantName
from scheduler.ports import StateUnavailable
from scheduler.server.loop import SchedulerLoop
from scheduler.server.registry import WorkerRegistry
from scheduler.state import codec
from scheduler.state.replica import Replica, StateMetrics
from scheduler.state.store import StoreUnavailable
from tests.test_core_state_io import POLICY


class _Store:
    """Sends are recorded; the test answers them with `answer(i, outcome)`."""

    token = "me:1"
    where = "the test's store"
    idle_tail_ms = 0

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []
        self.done: list[Any] = []

    def append_nowait(self, records: list[bytes], token: str, done: Any) -> bool:
        self.sent.append(records)
        self.done.append(done)
        return True

    def sessions(self, i: int) -> list[str]:
        # One journal entry per batch (codec.pack), its records in order.
        assert len(self.sent[i]) == 1
        return [rec.session for rec, _, _ in codec.decode_entry(self.sent[i][0])]  # type: ignore[union-attr]


def _replica(loop: SchedulerLoop, store: _Store, stepped: list[bool]) -> Replica:
    async def nothing(*_: Any) -> None:
        return None

    async def down() -> None:
        stepped.append(True)

    r = Replica(
        store,  # type: ignore[arg-type]
        loop,
        WorkerRegistry(loop, 5.0),
        POLICY,
        StateMetrics(CollectorRegistry()),
        on_lead=nothing,
        on_step_down=down,
    )
    r.serving = True
    loop.journal = r
    return r


def _acquire(loop: SchedulerLoop, name: str) -> None:
    loop.submit(Acquire(SessionId(f"a/{name}"), TenantName("a"), QoS.BURSTABLE))


def test_the_first_record_goes_at_once_the_rest_follow_as_one_batch_in_order() -> None:
    async def go() -> None:
        loop, store, stepped = SchedulerLoop(POLICY), _Store(), []
        r = _replica(loop, store, stepped)
        _acquire(loop, "s1")
        assert store.sessions(0) == ["a/s1"]  # sent from `record`: no task, no loop pass
        first = r.durable()
        _acquire(loop, "s2")
        _acquire(loop, "s3")
        second = r.durable()
        assert len(store.sent) == 1  # one batch in flight at a time
        await asyncio.sleep(0.01)
        assert not asyncio.ensure_future(first).done()  # nothing told before its batch is in
        store.done[0]("1-0")
        assert store.sessions(1) == ["a/s2", "a/s3"]  # sent from the reply's callback
        await asyncio.wait_for(first, 1)
        assert not asyncio.ensure_future(second).done()
        store.done[1]("2-0")
        await asyncio.wait_for(second, 1)
        assert r.durable() is loop.durable_done()  # nothing pending: the already-done awaitable
        assert stepped == []

    asyncio.run(go())


def test_a_failed_batch_refuses_durable_at_once_and_nothing_after_it_is_sent() -> None:
    async def go() -> None:
        loop, store, stepped = SchedulerLoop(POLICY), _Store(), []
        r = _replica(loop, store, stepped)
        _acquire(loop, "s1")
        first = asyncio.ensure_future(r.durable())
        _acquire(loop, "s2")  # waits behind the batch in flight
        second = asyncio.ensure_future(r.durable())
        store.done[0](StoreUnavailable("redis 127.0.0.1:6379: connection reset"))
        # Synchronously: a handler asking now must not be told its event is durable.
        assert not r.serving
        with pytest.raises(StateUnavailable):
            await r.durable()
        for fut in (first, second):
            with pytest.raises(StateUnavailable):
                await asyncio.wait_for(fut, 1)
        await asyncio.sleep(0.01)
        assert stepped == [True]  # the rest of the step-down ran in its task
        _acquire(loop, "s3")  # applied to a state this replica no longer leads: not journaled
        assert len(store.sent) == 1

    asyncio.run(go())


def test_a_reply_of_an_earlier_term_touches_nothing_of_the_new_one() -> None:
    async def go() -> None:
        loop, store, stepped = SchedulerLoop(POLICY), _Store(), []
        r = _replica(loop, store, stepped)
        _acquire(loop, "s1")
        old = asyncio.ensure_future(r.durable())
        r._term += 1  # as a take-over does (it also resets the batch state)
        r._batch, r._batch_fut, r._inflight_fut, r._flushing = [], None, None, False
        _acquire(loop, "s2")
        assert store.sessions(1) == ["a/s2"]
        store.done[0]("1-0")  # the old term's batch lands late: its waiters hear, nothing more
        await asyncio.wait_for(old, 1)
        assert len(store.sent) == 2 and r._inflight_fut is not None
        store.done[1]("2-0")
        await asyncio.wait_for(r.durable(), 1)
        assert stepped == []

    asyncio.run(go())


def test_a_snapshot_falling_due_mid_event_waits_for_the_next_cut() -> None:
    """`record` runs inside `loop.submit`, before e.g. the registry has its entry: a snapshot must
    not be captured there. The decision to send at once is taken once: a snapshot that falls
    due right after it (the interval passing) waits for the next cut, between events."""

    async def go() -> None:
        loop, store, stepped = SchedulerLoop(POLICY), _Store(), []
        r = _replica(loop, store, stepped)
        due = iter([False, True, True, True])
        r._snapshot_due = lambda: next(due)  # type: ignore[method-assign]
        captured: list[int] = []
        r._cut_snapshot = lambda: captured.append(len(store.sent)) or None  # type: ignore[method-assign,func-returns-value]
        _acquire(loop, "s1")
        assert len(store.sent) == 1 and captured == []  # sent from `record`, nothing captured
        _acquire(loop, "s2")
        store.done[0]("1-0")  # the reply's callback cuts the next batch: between events
        assert captured == [1] and store.sessions(1) == ["a/s2"]

    asyncio.run(go())


def test_a_store_that_raises_on_send_fails_the_batch_and_steps_down() -> None:
    """An exception from `append_nowait` itself (not a reply) must not leave the batch unsettled:
    its waiters would hang and the replica would keep its lease, serving nothing."""

    class _Raising(_Store):
        def append_nowait(self, records: list[bytes], token: str, done: Any) -> bool:
            raise RuntimeError("the store's loop is closed")

    async def go() -> None:
        loop, store, stepped = SchedulerLoop(POLICY), _Raising(), []
        r = _replica(loop, store, stepped)
        _acquire(loop, "s1")
        assert not r.serving
        with pytest.raises(StateUnavailable):
            await asyncio.wait_for(r.durable(), 1)
        await asyncio.sleep(0.01)
        assert stepped == [True]

    asyncio.run(go())
