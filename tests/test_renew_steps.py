"""Renewals in expiry steps (issue 44 item 2): a renewal that must move a lease's expiry moves it
to now + TTL + a step, and is journaled with that expiry; one that finds the expiry already past
now + TTL changes nothing and is not journaled. A follower that replays only what was journaled
holds the very state its leader holds (so a new leader never expires a lease the old one renewed),
and an old journal's `renew` records replay as they did (now + TTL)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from typing import Any

import pytest

from scheduler.core.engine import RENEW_STEP_TTLS
from scheduler.core.records import CoreRecords
from scheduler.core.types import (
    Acquire,
    Granted,
    Lease,
    QoS,
    Release,
    Renew,
    Renewed,
    SessionId,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerId,
)
from scheduler.policy.model import TenantSpec
from scheduler.ports import Extras
from scheduler.server.loop import SchedulerLoop
from scheduler.state import codec
from tests.test_sim_scenarios import pool_policy

TTL = 30.0
STEP = TTL * RENEW_STEP_TTLS


class _Journal:
    """The loop's journal, kept as the bytes a store would get (one entry per record here)."""

    def __init__(self) -> None:
        self.rows: list[bytes] = []

    def record(self, event: Any, now: float, extras: Extras) -> None:
        self.rows.append(codec.encode(event, now, extras))

    def durable(self) -> Any:  # pragma: no cover - nothing awaits here
        raise AssertionError


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _policy(slots: int = 4) -> Any:
    return pool_policy(TenantSpec("t"), workers=1, slots=slots, ttl=TTL)


def _leader(slots: int = 4) -> tuple[SchedulerLoop, _Journal, _Clock]:
    clock = _Clock()
    loop = SchedulerLoop(_policy(slots), clock=clock)
    journal = _Journal()
    loop.journal = journal  # type: ignore[assignment]
    return loop, journal, clock


def _records(loop: SchedulerLoop) -> CoreRecords:
    got = loop.core.export_records()
    assert isinstance(got, CoreRecords)
    return dataclasses.replace(got, now=0.0)  # a quiet renewal reads the clock, nothing else


def _grant(loop: SchedulerLoop, sid: str) -> Lease:
    pool = loop.core.names()[0]
    for d in loop.submit(Acquire(SessionId(sid), TenantName("t"), QoS.BEST_EFFORT, None, pool)):
        if isinstance(d, Granted):
            return d.lease
    raise AssertionError(f"{sid} not granted")


def _renew(loop: SchedulerLoop, lease: Lease) -> Renewed:
    (d,) = loop.submit(Renew(lease.session, lease.lease_id, lease.epoch))
    assert isinstance(d, Renewed)
    return d


def _run(body: Any) -> Any:
    async def main() -> Any:
        return body()

    return asyncio.run(main())


def test_a_renewal_moves_the_expiry_a_step_past_a_ttl_and_the_next_ones_change_nothing() -> None:
    def body() -> None:
        loop, journal, clock = _leader()
        loop.submit(WorkerAdded(WorkerId("w0"), 4, "w0:1", (), loop.core.names()[0]))
        lease = _grant(loop, "s")
        assert lease.expires_at == clock.t + TTL  # a grant: one TTL
        clock.t += 1.0
        first = _renew(loop, lease)
        assert not first.quiet and first.lease.expires_at == clock.t + TTL + STEP
        n = len(journal.rows)
        kept = json.loads(journal.rows[-1])
        assert kept["t"] == "renew_until" and kept["until"] == first.lease.expires_at
        for _ in range(3):  # within the step: nothing moves, nothing is journaled (and before
            clock.t += STEP / 8  # the next usage sample, 10 s on: an event then changes state)
            again = _renew(loop, lease)
            assert again.quiet and again.lease.expires_at == first.lease.expires_at
        assert len(journal.rows) == n
        clock.t = first.lease.expires_at - TTL + 0.5  # now + TTL passes the expiry: it moves
        moved = _renew(loop, lease)
        assert not moved.quiet and moved.lease.expires_at == clock.t + TTL + STEP
        assert len(journal.rows) == n + 1

    _run(body)


def test_a_session_that_stops_renewing_expires_where_its_last_renewal_put_it() -> None:
    def body() -> None:
        loop, _, clock = _leader()
        loop.submit(WorkerAdded(WorkerId("w0"), 4, "w0:1", (), loop.core.names()[0]))
        lease = _grant(loop, "s")
        clock.t += 1.0
        until = _renew(loop, lease).lease.expires_at
        clock.t += 2.0
        assert _renew(loop, lease).quiet  # its last renewal: not journaled
        clock.t = until - 0.001
        assert loop.core.session(SessionId("s")) is not None
        assert all(type(d).__name__ != "Expired" for d in loop.submit(Tick()))
        clock.t = until
        assert any(type(d).__name__ == "Expired" for d in loop.submit(Tick()))

    _run(body)


@pytest.mark.parametrize("seed", range(12))
def test_a_follower_replaying_only_what_was_journaled_holds_the_leaders_state(seed: int) -> None:
    """Random acquires, releases, renewals and ticks over time: after every event, a follower
    that applied the journal so far (through the codec) exports the records its leader does;
    every lease expiry it holds is the leader's, so none expires earlier after a take-over."""
    rnd = random.Random(seed)

    def body() -> None:
        leader, journal, clock = _leader(slots=3)
        follower = SchedulerLoop(_policy(3), clock=clock)
        follower.begin_shutdown()
        leader.submit(WorkerAdded(WorkerId("w0"), 3, "w0:1", (), leader.core.names()[0]))
        held: dict[str, Lease] = {}
        applied = quiet = 0
        for i in range(400):
            clock.t += rnd.choice((0.01, 0.5, 3.0, 9.0, 20.0))
            roll = rnd.random()
            if roll < 0.2:
                pool = leader.core.names()[0]
                out = leader.submit(Acquire(SessionId(f"s{i}"), TenantName("t"), QoS.BEST_EFFORT, None, pool))
            elif roll < 0.3 and held:
                lease = held.pop(rnd.choice(sorted(held)))
                out = leader.submit(Release(lease.session, lease.lease_id, lease.epoch))
            elif roll < 0.9 and held:
                lease = held[rnd.choice(sorted(held))]
                out = leader.submit(Renew(lease.session, lease.lease_id, lease.epoch))
                quiet += any(isinstance(d, Renewed) and d.quiet for d in out)
            else:
                out = leader.submit(Tick())
            for d in out:
                if isinstance(d, Granted):
                    held[d.lease.session] = d.lease
                elif type(d).__name__ in ("Expired", "Ended", "Revoked") and getattr(d, "lease", None):
                    held.pop(d.lease.session, None)  # type: ignore[union-attr]
            for raw in journal.rows[applied:]:
                follower.replay(*codec.decode(raw))
            applied = len(journal.rows)
            assert _records(follower) == _records(leader), f"diverged at event {i}"
        assert quiet > 0  # the run did skip renewals

    _run(body)


def test_an_old_journals_renew_record_replays_as_now_plus_ttl() -> None:
    old = b'{"at":1010.0,"epoch":1,"lease_id":"w0/0#1","session":"s","t":"renew","v":1}'
    rec, at, _ = codec.decode(old)
    assert rec == Renew(SessionId("s"), "w0/0#1", 1, 0.0) and at == 1010.0  # type: ignore[arg-type]

    def body() -> None:
        clock = _Clock()
        loop = SchedulerLoop(_policy(), clock=clock)
        loop.begin_shutdown()
        pool = loop.core.names()[0]
        loop.replay(WorkerAdded(WorkerId("w0"), 4, "w0:1", (), pool), 1000.0)
        loop.replay(Acquire(SessionId("s"), TenantName("t"), QoS.BEST_EFFORT, None, pool), 1000.0)
        (d,) = loop.replay(rec, at)
        assert isinstance(d, Renewed) and d.lease.expires_at == 1010.0 + TTL

    _run(body)


def test_a_batch_is_one_entry_that_an_entry_reader_splits_and_a_record_reader_refuses() -> None:
    a = codec.encode(Tick(), 1.0)
    b = codec.encode(Renew(SessionId("s"), "w/0#1", 1, 45.5), 2.0)  # type: ignore[arg-type]
    assert codec.pack([a]) == a  # a lone record is its own entry, as before packing
    entry = codec.pack([a, b])
    got = codec.decode_entry(entry)
    assert [(r, at) for r, at, _ in got] == [(Tick(), 1.0), (Renew(SessionId("s"), "w/0#1", 1, 45.5), 2.0)]  # type: ignore[arg-type]
    with pytest.raises(codec.CodecError):  # a build that reads one record an entry fails loudly
        codec.decode(entry)


def test_with_several_pools_a_renewal_at_which_another_pools_timer_fires_is_journaled() -> None:
    """One loop over several pools fires every pool's due timers at any event: a renewal at which
    another pool's lease expired changed that pool's state, so it is not quiet."""
    from tests.test_core_pools import _pools  # cpu and gpu pools, one slot each

    p = _pools({"cpu": 1, "gpu": 1})
    a = [d for d in p.handle(Acquire(SessionId("a"), TenantName("acme"), QoS.BURSTABLE, pool="cpu"), 1.0)]
    b = [d for d in p.handle(Acquire(SessionId("b"), TenantName("acme"), QoS.BURSTABLE, pool="gpu"), 2.0)]
    (la,) = [d.lease for d in a if isinstance(d, Granted)]
    (lb,) = [d.lease for d in b if isinstance(d, Granted)]
    renew_a = Renew(la.session, la.lease_id, la.epoch)
    first = p.handle(renew_a, 17.0)
    assert isinstance(first[0], Renewed) and not first[0].quiet  # moved a's expiry, to 62
    (quiet,) = p.handle(renew_a, 20.0)
    assert isinstance(quiet, Renewed) and quiet.quiet
    assert lb.expires_at + TTL <= first[0].lease.expires_at  # alone, a's renewal then is quiet
    out = p.handle(renew_a, lb.expires_at)  # b's lease (gpu) expires at this event
    renewed = [d for d in out if isinstance(d, Renewed)]
    assert any(type(d).__name__ == "Expired" for d in out)
    assert renewed and not renewed[0].quiet and renewed[0].lease.expires_at == first[0].lease.expires_at
