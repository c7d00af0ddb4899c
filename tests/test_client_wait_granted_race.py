"""`wait_granted` across a lease that goes before the waiter resumes.

What bench/failover.py saw around leader kills: a session granted a slot lent from the floor was
asked to yield it at once (the Guaranteed probe reclaimed the floor), yielded and was queued again,
all between the moment its waiter saw "ready" and the moment `wait_granted` went on: it raised
`SessionEnded` ("ended (None)") for a session that was not over, and the runtime gave it up. The
waiter must wait on for the next grant. Every interleaving of up to a few loop passes is tried
(the state is driven directly: no server, no stream)."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.client import AsyncClient, LeaseInfo, Phase, QoS, Slot
from scheduler.client.errors import SessionEnded
from scheduler.client.phases import SessionEvent
from scheduler.client.session import AsyncSession


def _move(s: AsyncSession, lease: LeaseInfo | None, event: SessionEvent) -> None:
    """The session's state set directly (no server, no stream): its lease, and its phase moved."""
    s._state.lease = lease
    s._state.move(event)


def _lease(epoch: int) -> LeaseInfo:
    return LeaseInfo("s", f"w/0#{epoch}", epoch, Slot("w", 0), "w:1", None, None, QoS.BURSTABLE)


@pytest.mark.parametrize("passes", range(6))
def test_a_lease_that_goes_before_the_waiter_resumes_does_not_end_the_wait(passes: int) -> None:
    async def body() -> None:
        client = AsyncClient("127.0.0.1:1", token="t")  # never dialled
        s = client.session("s", QoS.BURSTABLE)
        s.start = lambda: None  # type: ignore[method-assign]  # no stream: the test drives the state
        waiter = asyncio.create_task(s.wait_granted(5))
        await asyncio.sleep(0)
        first, second = _lease(1), _lease(2)
        _move(s, first, SessionEvent.GRANTED)
        s._state.notify()
        for _ in range(passes):
            await asyncio.sleep(0)
        if not waiter.done():
            _move(s, None, SessionEvent.YIELDED)  # yielded, queued again
            s._state.notify()
            await asyncio.sleep(0.01)
            assert not waiter.done(), "the wait ended though the session is only queued"
            _move(s, second, SessionEvent.GRANTED)
            s._state.notify()
            assert await waiter == second
        else:
            assert waiter.result() == first
        # A session that is really over still ends the wait, with its error.
        _move(s, None, SessionEvent.ENDED)
        s._state.end_reason = "revoked"
        s.ended.set()
        with pytest.raises(SessionEnded):
            await s.wait_granted(1)

    asyncio.run(body())


@pytest.mark.parametrize("yield_sent", [True, False], ids=["after-our-yield", "no-yield"])
def test_queued_on_reattach_after_our_yield_is_not_a_lost_lease(yield_sent: bool) -> None:
    """A leader applied our Yield and died before the Ended{YIELDED} reached us; the new leader,
    on re-attach, reports the session as queued. That is our yield, not a lease taken from us
    (bench/failover.py counted such sessions as lost). Without a Yield of ours it is a loss."""
    from scheduler.api.gen.slotsched.v1 import scheduler_pb2

    async def body() -> None:
        client = AsyncClient("127.0.0.1:1", token="t")
        s = client.session("s", QoS.BURSTABLE)
        lease = _lease(3)
        _move(s, lease, SessionEvent.GRANTED)
        s._state.move(SessionEvent.YIELD_ASKED)
        if yield_sent:
            s._yielder.sent = lease.key
        s._events.apply(scheduler_pb2.LeaseEvent(queued=scheduler_pb2.Queued(position=1)))
        assert s.lease is None and s.phase is Phase.QUEUED
        assert s.lost_lease.is_set() is (not yield_sent)

    asyncio.run(body())
