"""What every state store must guarantee (scheduler/state/store.py's list), one test per
guarantee, run against every store and topology: RedisStore on one Redis, on a primary with a
replica watched by Sentinels (every append WAITs for the replica), and on a Redis Cluster (every
key of the pool in one hash slot, appends WAIT for one replica).

Each topology is started once for the module; each test uses a pool of its own (a fresh key
prefix), with two replicas' views of it, `a` and `b`, built from a `--state` URL as the
server builds them (scheduler/state/config.py). A new store is a row of `STORES`: a context
that starts it and gives a factory of its stores, and one of stores where nothing answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from scheduler.state.config import state_url
from scheduler.state.members import Member, Members
from scheduler.state.store import (
    START,
    Entry,
    Position,
    StaleTerm,
    StateStore,
    StoredSnapshot,
    StoreUnavailable,
)
from tests.redis_topology import ClusterSet, SentinelSet, free_cluster_port, free_port
from tests.test_state_redis import RedisProc
from tests.test_state_redis import pytestmark as needs_redis

pytestmark = needs_redis

#: `(pool prefix, replica id) -> StateStore`: one replica's view of a pool of a running store.
Open = Callable[[str, str], StateStore]
#: `prefix -> Members`: the replicas' membership (members.py) in a running store.
OpenMembers = Callable[[str], Members]
#: A running store: its stores, stores of the same kind where nothing answers, its membership.
Topology = tuple[Open, Open, OpenMembers]


def _stores(url: str, timeout_s: float) -> Open:
    """Stores of `url` as `serve --state URL` builds them (scheduler/state/config.py)."""
    kind = state_url(url)
    assert kind is not None
    return lambda prefix, replica: kind.store(prefix, replica, timeout_s)


def _topology(live: str, dead: str) -> Topology:
    url = state_url(live)
    assert url is not None
    return _stores(live, 2.0), _stores(dead, 0.3), lambda prefix: url.members(prefix, 2.0)


@contextlib.contextmanager
def _redis() -> Iterator[Topology]:
    with tempfile.TemporaryDirectory(prefix="slotsched-contract-") as d:
        r = RedisProc(d).start()
        try:
            yield _topology(r.url, f"redis://127.0.0.1:{free_port()}/0")
        finally:
            r.kill()


@contextlib.contextmanager
def _sentinel() -> Iterator[Topology]:
    with tempfile.TemporaryDirectory(prefix="slotsched-contract-") as d:
        # No test here fails the primary over: a long down-after, so a slow PING on a loaded
        # machine does not fail it over (or leave it "subjectively down": "No master found").
        s = SentinelSet(d, replicas=1, sentinels=1, down_after_ms=10_000).start()
        try:
            yield _topology(s.url(), f"redis+sentinel://127.0.0.1:{free_port()}/slotsched/0")
        finally:
            s.close()


@contextlib.contextmanager
def _cluster() -> Iterator[Topology]:
    with tempfile.TemporaryDirectory(prefix="slotsched-contract-") as d:
        c = ClusterSet(d, primaries=3, replicas=1).start()
        try:
            yield _topology(c.url(), f"redis+cluster://127.0.0.1:{free_cluster_port()}")
        finally:
            c.close()


#: name: the context that runs it. Every test below runs against each.
STORES: dict[str, Callable[[], contextlib.AbstractContextManager[Topology]]] = {
    "redis": _redis,
    "redis+sentinel": _sentinel,
    "redis+cluster": _cluster,
}


@pytest.fixture(scope="module", params=sorted(STORES))
def topology(request: pytest.FixtureRequest) -> Iterator[Topology]:
    with STORES[request.param]() as stores:
        yield stores


@contextlib.asynccontextmanager
async def _pair(topology: Topology) -> AsyncIterator[tuple[StateStore, StateStore]]:
    """Two replicas' views of a pool of their own."""
    open_ = topology[0]
    prefix = f"c{uuid.uuid4().hex[:8]}"
    a, b = open_(prefix, "a"), open_(prefix, "b")
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def _journal(store: StateStore, after: Position = START, chunk: int = 2000) -> list[Entry]:
    return [e async for rows in store.journal_after(after, chunk) for e in rows]


def _run(topology: Topology, body: Callable[[StateStore, StateStore], Awaitable[None]]) -> None:
    async def go() -> None:
        async with _pair(topology) as (a, b):
            await body(a, b)

    asyncio.run(go())


# ---------------------------------------------------------------- the lease and its term


def test_one_leader_until_its_lease_lapses(topology: Topology) -> None:
    async def body(a: StateStore, b: StateStore) -> None:
        # Timed from before a's win, so a slow machine can only make the checks vacuous, never
        # wrong: b may lead from a's win + ttl on, never before.
        loop, ttl = asyncio.get_running_loop(), 1.0
        t0 = loop.time()
        assert await a.try_lead(ttl)
        assert not await b.try_lead(5.0) or loop.time() - t0 >= ttl  # a holds it
        while not await b.try_lead(5.0):  # not renewed: it lapses by the store's clock
            assert loop.time() - t0 < ttl + 30, "a's lease never lapsed"
            await asyncio.sleep(0.05)
        assert loop.time() - t0 >= ttl
        assert not await a.try_lead(5.0)

    _run(topology, body)


def test_every_won_term_is_new_also_for_the_same_replica(topology: Topology) -> None:
    async def body(a: StateStore, b: StateStore) -> None:
        seen = {a.token, b.token}  # the tokens before any win
        for _ in range(3):
            assert await a.try_lead(5.0)  # a again (it still holds the lease): a new term
            assert a.token not in seen
            seen.add(a.token)
        await a.resign()
        assert await b.try_lead(5.0)
        assert b.token not in seen

    _run(topology, body)


def test_renewal_keeps_only_its_own_term_and_records_the_leaders_clock(topology: Topology) -> None:
    async def body(a: StateStore, b: StateStore) -> None:
        assert await a.alive() is None  # no leader renewed yet
        # Ttls far above the pauses between calls, so a loaded machine does not lapse them.
        loop, first = asyncio.get_running_loop(), 1.0
        t0 = loop.time()
        assert await a.try_lead(first)
        assert await a.extend_lead(10.0, 1234.5)
        assert await a.alive() == 1234.5
        assert not await b.extend_lead(5.0, 9999.0)  # not b's to keep, nor to stamp
        assert await a.alive() == 1234.5
        while loop.time() - t0 <= first + 0.2:  # renewed past its first ttl: still a's
            await asyncio.sleep(0.2)
            assert await a.extend_lead(10.0, 1235.0)
        assert not await b.try_lead(5.0)
        await a.resign()
        assert await b.try_lead(5.0)  # resigned: free at once

    _run(topology, body)


# ---------------------------------------------------------------- fenced writes


def test_a_stale_terms_writes_are_refused_and_leave_nothing_visible(topology: Topology) -> None:
    async def body(a: StateStore, b: StateStore) -> None:
        assert await a.try_lead(5.0)
        first = a.token
        kept = await a.append([b"one"], first)
        assert await a.try_lead(5.0)  # a new term of the same replica
        with pytest.raises(StaleTerm):
            await a.append([b"stale-1", b"stale-2"], first)  # all or nothing: nothing
        with pytest.raises(StaleTerm):
            await b.append([b"other"], b.token)  # another replica's
        with pytest.raises(StaleTerm):
            await a.save_snapshot(b"data", "fp", kept, 1.0, first)
        assert not await a.publish_address("old:1", first)
        await a.append([b"two"], a.token)
        assert [r for _, r in await _journal(b)] == [b"one", b"two"]
        assert await b.load_snapshot() is None and not await b.trimmed()
        assert await b.leader_address() is None

    _run(topology, body)


def test_append_nowait_tells_its_outcome_or_sends_nothing(topology: Topology) -> None:
    async def body(a: StateStore, b: StateStore) -> None:
        assert await a.try_lead(5.0)
        await a.append([b"warm"], a.token)  # a lean connection opens on first use
        outcomes: asyncio.Queue[Position | BaseException] = asyncio.Queue()
        for token in (a.token, "a:stale"):
            if not a.append_nowait([b"now"], token, outcomes.put_nowait):
                return  # this store cannot send at once: the replica awaits `append`
            got = await asyncio.wait_for(outcomes.get(), 5)
            if token == a.token:
                assert not isinstance(got, BaseException)
                assert (await _journal(b))[-1] == (got, b"now")
            else:
                assert isinstance(got, StaleTerm)
        assert [r for _, r in await _journal(b)] == [b"warm", b"now"]

    _run(topology, body)


# ---------------------------------------------------------------- the journal


def test_the_journal_keeps_append_order_and_reads_on_from_any_position(topology: Topology) -> None:
    async def body(a: StateStore, b: StateStore) -> None:
        assert await a.try_lead(5.0)
        last = await a.append([b"r1", b"r2"], a.token)
        await a.append([b"r3"], a.token)
        await a.append([b"r4", b"r5", b"r6"], a.token)
        entries = await _journal(b)
        assert [r for _, r in entries] == [b"r1", b"r2", b"r3", b"r4", b"r5", b"r6"]
        assert entries[1][0] == last  # an append gives its last entry's position
        assert len({p for p, _ in entries}) == 6
        assert [r for _, r in await _journal(b, last)] == [b"r3", b"r4", b"r5", b"r6"]
        assert await _journal(b, entries[-1][0]) == []
        chunks = [rows async for rows in b.journal_after(START, chunk=4)]
        assert [len(c) for c in chunks] == [4, 2] and [e for c in chunks for e in c] == entries

    _run(topology, body)


def test_a_snapshot_trims_what_the_one_before_it_covered(topology: Topology) -> None:
    async def body(a: StateStore, b: StateStore) -> None:
        assert await a.try_lead(5.0)
        for r in (b"r1", b"r2", b"r3", b"r4", b"r5"):
            await a.append([r], a.token)
        (p1, _), (p2, _), (p3, _), (p4, _), (p5, _) = await _journal(b)
        assert not await b.trimmed() and not await b.trimmed_past(START)
        # The first snapshot drops nothing: a standby anywhere behind it reads on.
        await a.save_snapshot(b"state", "fp/3", p2, 1.5, a.token)
        assert await b.load_snapshot() == StoredSnapshot(b"state", "fp/3", p2, 1.5)
        assert len(await _journal(b)) == 5 and not await b.trimmed()
        assert not await b.trimmed_past(START) and not (await b.tail(START, 50)).gap
        assert [r for _, r in await _journal(b, p2)] == [b"r3", b"r4", b"r5"]
        # The next drops what the first covered (up to p2), and keeps what follows.
        await a.save_snapshot(b"later", "fp/3", p4, 2.5, a.token)
        assert await b.load_snapshot() == StoredSnapshot(b"later", "fp/3", p4, 2.5)
        assert [r for _, r in await _journal(b)] == [b"r3", b"r4", b"r5"]
        assert [r for _, r in await _journal(b, p4)] == [b"r5"]
        assert await b.trimmed()
        assert await b.trimmed_past(START) and await b.trimmed_past(p1)
        assert not await b.trimmed_past(p2) and not await b.trimmed_past(p3)
        # the tail of a standby that had read up to p1 has a gap; up to p2 (behind the newest
        # snapshot, not behind the trim) or later, none
        gap = await b.tail(p1, 50)
        assert gap.gap
        assert not (await b.tail(p2, 50)).gap
        assert [r for _, r in (await b.tail(p3, 50)).entries] == [b"r4", b"r5"]
        await a.save_snapshot(b"last", "fp/3", p5, 3.0, a.token)  # drops up to p4
        assert [r for _, r in await _journal(b)] == [b"r5"]
        assert await b.trimmed_past(p3) and not await b.trimmed_past(p4)

    _run(topology, body)


def test_the_tail_waits_for_new_entries(topology: Topology) -> None:
    async def body(a: StateStore, b: StateStore) -> None:
        assert await a.try_lead(5.0)
        last = await a.append([b"r1"], a.token)
        tail = await b.tail(last, 50)  # nothing new: back within about block_ms
        assert tail.entries == [] and not tail.gap
        waiting = asyncio.ensure_future(b.tail(last, 2000))
        await asyncio.sleep(0.1)
        new = await a.append([b"r2", b"r3"], a.token)
        tail = await asyncio.wait_for(waiting, 5)
        assert [r for _, r in tail.entries] == [b"r2", b"r3"] and tail.entries[-1][0] == new
        assert [r for _, r in (await b.tail(START, 50)).entries] == [b"r1", b"r2", b"r3"]

    _run(topology, body)


def test_the_leader_address_is_the_current_terms_only(topology: Topology) -> None:
    async def body(a: StateStore, b: StateStore) -> None:
        assert await b.leader_address() is None  # no leader
        assert await a.try_lead(5.0)
        assert await b.leader_address() is None  # a leads, has not published
        assert await a.publish_address("10.0.0.1:50051", a.token)
        assert await b.leader_address() == "10.0.0.1:50051"
        old = a.token
        await a.resign()
        assert await b.leader_address() is None
        assert await b.try_lead(5.0)
        assert await a.leader_address() is None  # never an earlier term's address
        assert not await a.publish_address("10.0.0.1:50051", old)
        assert await b.publish_address("10.0.0.2:50051", b.token)
        assert await a.leader_address() == "10.0.0.2:50051"

    _run(topology, body)


# ---------------------------------------------------------------- one failure type


def test_a_store_that_does_not_answer_raises_store_unavailable(topology: Topology) -> None:
    async def go() -> None:
        store = topology[1]("dead", "a")
        try:
            for call in (
                lambda: store.try_lead(1.0),
                lambda: store.extend_lead(1.0, 0.0),
                lambda: store.append([b"x"], store.token),
                lambda: store.load_snapshot(),
                lambda: store.tail(START, 10),
                lambda: _journal(store),
            ):
                with pytest.raises(StoreUnavailable):
                    await call()
        finally:
            with contextlib.suppress(StoreUnavailable):
                await store.close()

    asyncio.run(go())


# ---------------------------------------------------------------- the replicas' membership


def test_a_member_is_live_from_its_beat_until_its_ttl_by_the_stores_clock(topology: Topology) -> None:
    async def go() -> None:
        members = topology[2](f"m{uuid.uuid4().hex[:8]}")
        try:
            assert await members.live() == []
            # Timed from before r1's beat: a slow machine makes a check vacuous, never wrong.
            loop, ttl = asyncio.get_running_loop(), 1.0
            t0 = loop.time()
            assert await members.beat("r1", "10.0.0.1:50051", ttl) == [Member("r1", "10.0.0.1:50051")]
            both = await members.beat("r2", "10.0.0.2:50051", 60.0)
            r1_r2 = [Member("r1", "10.0.0.1:50051"), Member("r2", "10.0.0.2:50051")]
            assert both == r1_r2 or loop.time() - t0 >= ttl
            while await members.live() != [Member("r2", "10.0.0.2:50051")]:  # r1 did not beat again
                assert loop.time() - t0 < ttl + 30, "r1 never lapsed"
                await asyncio.sleep(0.05)
            assert loop.time() - t0 >= ttl  # it lapsed by its ttl, not before
            assert await members.beat("r1", "10.0.0.9:50051", 60.0) == [  # back, at its new address
                Member("r1", "10.0.0.9:50051"),
                Member("r2", "10.0.0.2:50051"),
            ]
            await members.leave("r2")  # a graceful exit: gone at once
            assert await members.live() == [Member("r1", "10.0.0.9:50051")]
        finally:
            await members.close()

    asyncio.run(go())


def test_a_membership_that_does_not_answer_raises_store_unavailable() -> None:
    async def go() -> None:
        dead = state_url(f"redis://127.0.0.1:{free_port()}/0")
        assert dead is not None
        members = dead.members("dead", 0.3)
        try:
            for call in (lambda: members.beat("r", "x", 1.0), members.live, lambda: members.leave("r")):
                with pytest.raises(StoreUnavailable):
                    await call()
        finally:
            with contextlib.suppress(StoreUnavailable):
                await members.close()

    asyncio.run(go())


def test_the_owners_table_is_written_by_compare_and_set(topology: Topology) -> None:
    async def go() -> None:
        members = topology[2](f"m{uuid.uuid4().hex[:8]}")
        try:
            assert await members.owners() == (0, {})
            assert await members.set_owners(0, {"cpu": "r1", "gpu": "r2"}, [])
            assert not await members.set_owners(0, {"cpu": "r3"}, [])  # a stale version: nothing written
            assert await members.owners() == (1, {"cpu": "r1", "gpu": "r2"})
            await members.beat("r2", "r2:1", 30)
            # Computed from a membership read before r2 beat: nothing written (members.py).
            assert not await members.set_owners(1, {"cpu": "r1"}, [])
            assert not await members.set_owners(1, {"cpu": "r1"}, ["r1", "r2"])
            assert await members.set_owners(1, {"cpu": "r2"}, ["r2"])  # the whole table: gpu is gone
            assert await members.owners() == (2, {"cpu": "r2"})
        finally:
            await members.close()

    asyncio.run(go())
