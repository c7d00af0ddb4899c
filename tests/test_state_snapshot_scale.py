"""State snapshot format 3 and the leader's snapshot cadence: the compact format round-trips any
reachable state, older formats are still read, a capture taken on the loop is not changed by
what the loop does while it is encoded in a thread, and a snapshot is due by the tail bound and
the duty cycle (compaction.snapshot_due's table).
No Redis here (tests/test_state_redis.py runs the real store); figures are bench/recovery.py's."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from scheduler.core.engine import Core
from scheduler.core.types import (
    Acquire,
    EndReason,
    Granted,
    QoS,
    Release,
    SessionId,
    TenantName,
    Tick,
    WorkerId,
    YieldRequested,
)
from scheduler.core.victims import session_key
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.ports import EndedSession, Extras, LoopState, StateUnavailable, WorkerEntry
from scheduler.server.loop import SchedulerLoop
from scheduler.server.registry import WorkerRegistry
from scheduler.state import state_read, state_write
from scheduler.state.compaction import snapshot_due
from scheduler.state.redis_store import RedisStore
from scheduler.state.replica import Replica, StateMetrics
from scheduler.state.store import StoreUnavailable
from tests.test_core_state_io import POLICY, SNAP, _apply, _Gen, _observe, _scenario, export_doc, from_doc
from tests.test_state_codec import _busy_state, _fingerprint

DATA = Path(__file__).parent / "data"


def _random_state(data: st.DataObject, n: int) -> tuple[state_write.State, _Gen]:
    """A core after `n` random events, with loop bookkeeping and workers drawn beside it."""
    gen = _Gen()
    core = Core(POLICY)
    loop = LoopState(core, {}, {}, {}, {}, {}, OrderedDict())
    for _ in range(n):
        for d in _apply(core, gen.draw(data, core), gen.now, gen):
            if isinstance(d, YieldRequested):
                loop.yields[d.lease.lease_id] = d
    for lease, _ in core.leases():
        loop.qos[lease.session] = lease.qos
        loop.waited[lease.session] = data.draw(st.floats(0, 100, allow_nan=False))
    for view in core.queue():
        loop.qos[view.session] = QoS(view.qos)
        if data.draw(st.booleans()):
            loop.wait_timeouts[view.session] = data.draw(st.floats(0.5, 600))
    for i in range(data.draw(st.integers(0, 3))):
        ref = data.draw(st.none() | st.just(SNAP))
        loop.ended[SessionId(f"old{i}")] = EndedSession(EndReason.RELEASED, QoS.BURSTABLE, ref, float(i))
    workers: dict[WorkerId, WorkerEntry] = {}
    for wid in gen.workers:
        loop.addresses[wid] = f"{wid}:1"
        hb = data.draw(st.none() | st.floats(0, 100))
        workers[wid] = WorkerEntry(wid, f"{wid}:1", gen.slots[wid], 0.5, {"zone": "a"}, hb, False, False)
    return state_write.State(loop, workers, gen.now), gen


def _same_state(a: state_write.State, b: state_write.State) -> None:
    # Heaps are compared as the document has them (sorted): their layout in memory may differ.
    assert export_doc(b.loop.core) == export_doc(a.loop.core)
    assert _observe(b.loop.core) == _observe(a.loop.core)
    la, lb = a.loop, b.loop
    assert (lb.addresses, lb.yields, lb.waited, lb.qos, lb.wait_timeouts) == (
        la.addresses,
        la.yields,
        la.waited,
        la.qos,
        la.wait_timeouts,
    )
    assert list(lb.ended.items()) == list(la.ended.items()) and isinstance(lb.ended, OrderedDict)
    assert b.workers == a.workers and b.last_now == a.last_now


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(0, 60), m=st.integers(1, 30))
def test_format_3_round_trips_any_state_and_the_rebuilt_core_decides_alike(
    data: st.DataObject, n: int, m: int
) -> None:
    state, gen = _random_state(data, n)
    raw = state_write.state_bytes(state)
    doc = json.loads(raw)  # plain JSON, whatever wrote it
    assert (
        doc["format"] == state_write.SNAPSHOT_FORMAT == 3 and doc["core"]["format"] == state_write.CORE_FORMAT
    )
    back = state_read.read_state(raw, state_write.current_fingerprint())
    _same_state(state, back)
    again = json.loads(state_write.state_bytes(back))
    # export -> import -> export: the same (YAML may spell a number of the policy differently)
    assert [k for k in doc if again[k] != doc[k]] in ([], ["policy"])
    live, rebuilt = state.loop.core, back.loop.core
    for _ in range(m):
        step = gen.draw(data, live)
        assert _apply(rebuilt, step, gen.now) == _apply(live, step, gen.now, gen), step
    assert export_doc(rebuilt) == export_doc(live)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(0, 50), m=st.integers(1, 40))
def test_a_capture_is_not_changed_by_what_the_loop_does_while_it_is_encoded(
    data: st.DataObject, n: int, m: int
) -> None:
    """The leader captures on the loop and encodes in a thread while events go on: the bytes
    are those of the state at the capture, whatever the events do to it meanwhile (earmarks,
    yields, grants, renewals, removed workers, bookkeeping)."""
    state, gen = _random_state(data, n)
    at_capture = state_write.state_bytes(state)
    captured = state_write.capture(state)
    core, loop = state.loop.core, state.loop
    for i in range(m):
        for d in _apply(core, gen.draw(data, core), gen.now, gen):
            if isinstance(d, YieldRequested):
                loop.yields[d.lease.lease_id] = d
        loop.qos[SessionId(f"new{i}")] = QoS.BEST_EFFORT
        loop.waited.clear()
        loop.ended.popitem(last=False) if loop.ended else None
        for w in state.workers.values():
            w.last_heartbeat, w.draining = gen.now, True
            w.labels["zone"] = "b"
    state.workers.clear()
    assert state_write.write_state(captured) == at_capture


def _usage_from_zero(core: Core) -> None:
    """What loading a state an older build wrote (no usage in it) does: usage from zero, now,
    and no session or tenant counts as preempted before."""
    core._preempt_seq = 0
    for r in (*core._leases.values(), *core._requests.values()):
        r.preempted = 0
    for t in core._tenants.values():
        t.last_preempted = 0
        for cls in range(3):
            t.pick[cls] = sorted(session_key(core._leases[lid]) for lid in t.candidates[cls])
            t.mpick[cls] = sorted(session_key(core._leases[lid]) for lid in t.mature[cls])
        t.usage = t.usage_acc = t.usage_slots = 0.0
        t.usage_at = core._now
        core._refresh(t)
    core._usage_last, core._usage_next = core._now, core._now + core.policy.fairness.usage_sampling_s


def test_a_format_2_snapshot_written_by_the_previous_build_is_read() -> None:
    """tests/data/state_snapshot_v2.json was written by the format-2 build from `_busy_state`."""
    want, _ = _busy_state()
    _usage_from_zero(want.loop.core)
    back = state_read.read_state((DATA / "state_snapshot_v2.json").read_bytes(), "slotsched-snapshot/2")
    assert _fingerprint(back.loop.core) == _fingerprint(want.loop.core)
    _same_state(want, back)
    # Written again, it is format 3 and reads back the same.
    again = state_read.read_state(state_write.state_bytes(back))
    _same_state(want, again)


def test_a_format_1_core_state_is_read() -> None:
    """tests/data/core_state_v1.json: the busy scenario's core, exported by the format-1 build."""
    core, _ = _scenario()
    _usage_from_zero(core)
    doc = json.loads((DATA / "core_state_v1.json").read_text())
    assert doc["format"] == 1
    rebuilt = from_doc(core.policy, doc)
    assert _observe(rebuilt) == _observe(core)
    now = 30.0
    events: list[Tick | Acquire] = [Tick(), Acquire(SessionId("s9"), TenantName("ml"), QoS.BURSTABLE), Tick()]
    for ev in events:
        now += 20
        assert rebuilt.handle(ev, now) == core.handle(ev, now)
        assert _observe(rebuilt) == _observe(core)


def test_a_malformed_format_3_snapshot_is_refused_with_what_is_wrong() -> None:
    state, _ = _busy_state()
    doc = json.loads(state_write.state_bytes(state))
    bad = json.loads(json.dumps(doc))
    bad["core"]["requests"][0] = bad["core"]["requests"][0][:-1]
    with pytest.raises(state_write.StateSnapshotError, match="every request row must have 10 columns"):
        state_read.read_state(json.dumps(bad).encode())
    # A previous build's document (9 request columns, no `revoked`) is read, and a short row of
    # it is refused too: the document's columns say which build wrote it, not a row's length.
    old = json.loads(json.dumps(doc))
    old["core"]["request_fields"] = old["core"]["request_fields"][:-1]
    old["core"]["requests"] = [row[:-1] for row in old["core"]["requests"]]
    state_read.read_state(json.dumps(old).encode())
    old["core"]["requests"][0] = old["core"]["requests"][0][:-1]
    with pytest.raises(state_write.StateSnapshotError, match="every request row must have 9 columns"):
        state_read.read_state(json.dumps(old).encode())
    bad = json.loads(json.dumps(doc))
    bad["core"]["request_fields"].reverse()
    with pytest.raises(state_write.StateSnapshotError, match="not the columns of format 2"):
        state_read.read_state(json.dumps(bad).encode())
    bad = json.loads(json.dumps(doc))
    bad["core"]["requests"][0][0] = 7
    with pytest.raises(state_write.StateSnapshotError, match="a request's session: expected str"):
        state_read.read_state(json.dumps(bad).encode())
    bad = json.loads(json.dumps(doc))
    bad["core"]["requests"][0][1] = "nobody"
    with pytest.raises(state_write.StateSnapshotError, match="unknown tenant"):
        state_read.read_state(json.dumps(bad).encode())


# (tail entries, live sessions, s since the last cut, the last one's cost in s, duty) -> due;
# every=1000, ratio=0.05, interval=60 s.
DUE_TABLE = [
    # the tail bound, as before the duty cycle (nothing stored yet: no cost)
    ((0, 0, 3600.0, 0.0, 20.0), False),  # nothing new, nothing to cut
    ((999, 0, 1.0, 0.0, 20.0), False),
    ((1000, 0, 0.0, 0.0, 20.0), True),  # max(every, ...)
    ((1499, 30_000, 1.0, 0.0, 20.0), False),
    ((1500, 30_000, 1.0, 0.0, 20.0), True),  # ratio x live
    ((1500, 30_000, 1.0, 0.01, 20.0), True),  # a cheap snapshot: the tail bound decides
    ((1, 0, 60.0, 0.0, 20.0), True),  # the interval, with one entry
    ((1, 0, 59.9, 0.0, 20.0), False),
    # at scale: 30,000 sessions journal ~1,500 entries a second; a snapshot took 0.5 s
    ((1500, 30_000, 1.0, 0.5, 20.0), False),  # the old rule: one every second
    ((9900, 30_000, 9.9, 0.5, 20.0), False),  # the tail past its bound, the duty not yet
    ((15_000, 30_000, 10.0, 0.5, 20.0), True),  # 20 x 0.5 s: 1/20 of the time at most
    ((1400, 30_000, 10.0, 0.5, 20.0), False),  # the duty met, the tail bound not
    # the interval waits for the duty too: a 4 s snapshot, one entry a minute
    ((1, 0, 60.0, 4.0, 20.0), False),
    ((1, 0, 80.0, 4.0, 20.0), True),
    ((0, 0, 80.0, 4.0, 20.0), False),
    # duty 0: the tail bound alone
    ((1500, 30_000, 0.0, 0.5, 0.0), True),
]


@pytest.mark.parametrize(("args", "due"), DUE_TABLE)
def test_when_a_snapshot_is_due(args: tuple[int, int, float, float, float], due: bool) -> None:
    tail, live, since, cost, duty = args
    got = snapshot_due(tail, live, since, cost, every=1000, ratio=0.05, interval_s=60.0, duty=duty)
    assert got is due


class _Store:
    token = "me:1"
    where = "the test's store"
    idle_tail_ms = 0
    saved = 0

    async def save_snapshot(self, *_: Any) -> None:
        self.saved += 1

    def append_nowait(self, records: list[bytes], token: str, done: Any) -> bool:
        return False  # no lean connection: the replica awaits `append`


def _replica(loop: SchedulerLoop, **kw: Any) -> Replica:
    async def nothing(*_: Any) -> None:
        return None

    r = Replica(
        _Store(),  # type: ignore[arg-type]
        loop,
        WorkerRegistry(loop, 5.0),
        POLICY,
        StateMetrics(CollectorRegistry()),
        on_lead=nothing,
        on_step_down=nothing,
        **kw,
    )
    r.serving = True
    return r


def test_a_snapshot_is_due_after_the_tail_bound_and_one_at_a_time() -> None:
    async def go() -> None:
        loop = SchedulerLoop(POLICY)
        r = _replica(loop, snapshot_every=100, snapshot_interval_s=3600, snapshot_ratio=0.5)
        assert r.tail_bound(0) == 100 and r.tail_bound(1000) == 500  # max(every, ratio x live)
        r._snapshot_size = 1000
        r._since_snapshot = 499
        assert r._cut_snapshot() is None
        r._since_snapshot = 500
        cut = r._cut_snapshot()
        assert cut is not None and r._since_snapshot == 0 and r._snapshot_events == 500
        assert r._snapshot_size == cut.size == 0  # the next bound follows the state's size
        # While one is being encoded and stored, no other is cut: the tail grows meanwhile.
        r._snapshot_task = asyncio.get_running_loop().create_future()  # type: ignore[assignment]
        r._since_snapshot = 10_000
        assert r._cut_snapshot() is None
        r._snapshot_task = None
        assert r._cut_snapshot() is not None
        # Time: a quiet leader still snapshots every snapshot_interval_s.
        r.snapshot_interval_s = 0.0
        r._since_snapshot = 1
        assert r._cut_snapshot() is not None
        r._since_snapshot = 0
        assert r._cut_snapshot() is None  # nothing new, nothing to cut

    asyncio.run(go())


def test_the_next_snapshot_waits_for_the_duty_times_the_last_ones_cost() -> None:
    async def go() -> None:
        loop = SchedulerLoop(POLICY)
        r = _replica(loop, snapshot_every=100, snapshot_interval_s=3600, snapshot_duty=20)
        r._since_snapshot = 100
        cut = r._cut_snapshot()
        assert cut is not None and r._snapshot_cost == 0.0
        r._save_snapshot(cut, "1-0", "me:1")
        assert r._snapshot_task is not None
        await r._snapshot_task  # encoded in a thread and stored: what it took is kept
        assert r.store.saved == 1  # type: ignore[attr-defined]
        assert r._snapshot_cost >= r._capture_s > 0
        r._snapshot_cost = 1.0  # say it took 1 s: the next is due 20 s after this one's cut
        r._since_snapshot = 10_000
        r._last_snapshot -= 19.5
        assert r._cut_snapshot() is None
        r._last_snapshot -= 0.5
        assert r._cut_snapshot() is not None

    asyncio.run(go())


def test_a_snapshot_not_stored_does_not_space_the_next() -> None:
    async def go() -> None:
        async def down(*_: Any) -> None:
            raise StoreUnavailable("timed out after 10 s")

        loop = SchedulerLoop(POLICY)
        r = _replica(loop, snapshot_every=100, snapshot_interval_s=3600, snapshot_duty=20)
        r.store.save_snapshot = down  # type: ignore[method-assign]
        r._snapshot_cost, r._last_snapshot = 0.01, r._last_snapshot - 1.0
        r._since_snapshot = 100
        cut = r._cut_snapshot()
        assert cut is not None
        r._since_snapshot = 7
        r._save_snapshot(cut, "1-0", "me:1")
        assert r._snapshot_task is not None
        await r._snapshot_task
        assert r._snapshot_cost == 0.01  # the wait of a failed store is not a snapshot's cost
        assert r._since_snapshot == 107  # its events count towards the next

    asyncio.run(go())


# ------------------------------------------------------------------ with a real redis-server

SMALL = Policy(
    pool=PoolSpec(slots_per_worker=10, workers=4, floor=0),
    timing=TimingSpec(yield_grace_s=5, lease_ttl_s=60, min_runtime_s=2),
    queue=QueueSpec(max_pending=5000, max_pending_per_tenant=5000),
    tenants=(
        TenantSpec("a", guaranteed=10, burstable_nominal=10, burstable_limit=40),
        TenantSpec("b", weight=2, burstable_nominal=10, burstable_limit=40, best_effort_limit=20),
    ),
)


def test_a_background_snapshot_covers_exactly_the_journal_up_to_its_batch(tmp_path: Path) -> None:
    """Snapshots are encoded and stored while events go on being journaled: a cold recovery
    (snapshot + tail, from a real redis-server) rebuilds exactly the live leader's state."""
    from tests.test_state_redis import REDIS_BIN, RedisProc

    if not Path(REDIS_BIN).exists():
        pytest.skip("redis-server not installed")
    server = RedisProc(str(tmp_path)).start()
    try:
        asyncio.run(_snapshot_while_serving(server.url))
    finally:
        server.kill()


async def _snapshot_while_serving(url: str) -> None:
    async def nothing(*_: Any) -> None:
        return None

    def replica(loop: SchedulerLoop, registry: WorkerRegistry, name: str) -> Replica:
        store = RedisStore(url, "snap", name, timeout_s=10.0)
        metrics = StateMetrics(CollectorRegistry())
        # Every 40 entries, however little time passed (no duty cycle): several snapshots in flight.
        return Replica(
            store,
            loop,
            registry,
            SMALL,
            metrics,
            on_lead=nothing,
            on_step_down=nothing,
            snapshot_every=40,
            snapshot_duty=0.0,
        )

    clock = iter(range(10**6))
    loop = SchedulerLoop(SMALL, clock=lambda: float(next(clock)))
    registry = WorkerRegistry(loop, 5.0)
    leader = replica(loop, registry, "leader")
    assert await leader.store.try_lead(30.0)
    leader.serving, loop.journal = True, leader
    loop.resume()
    for w in range(4):
        registry.register(WorkerId(f"w{w}"), f"h{w}:1", 10, {"zone": str(w % 2)})
    held: list[Any] = []
    snapshots = 0
    for i in range(600):
        tenant, qos = ("a", QoS.GUARANTEED) if i % 3 == 0 else ("b", [QoS.BURSTABLE, QoS.BEST_EFFORT][i % 2])
        if i % 4 == 3 and held:
            lease = held.pop(0)
            ds = loop.submit(Release(lease.session, lease.lease_id, lease.epoch))
        else:
            key = SessionId(f"{tenant}/s{i}")
            ds = loop.submit(Acquire(key, TenantName(tenant), qos), Extras(wait_timeout_s=30.0))
        held += [d.lease for d in ds if isinstance(d, Granted)]
        if i % 7 == 0:
            task = leader._snapshot_task
            await loop.durable()
            snapshots += leader._snapshot_task is not task
    await loop.durable()
    assert leader._snapshot_task is not None and snapshots >= 3
    await leader._snapshot_task
    stored = await leader.store.load_snapshot()
    assert stored is not None and stored.fingerprint == state_write.current_fingerprint()
    tail = await leader.store.redis.xlen(leader.store.k_journal)
    assert 0 < tail < 600  # trimmed behind the last snapshot

    cold = SchedulerLoop(SMALL, clock=lambda: float(next(clock)))
    cold_registry = WorkerRegistry(cold, 5.0)
    successor = replica(cold, cold_registry, "cold")
    await successor._recover()
    assert export_doc(cold.core) == export_doc(loop.core)
    a, b = loop.export_state(), cold.export_state()
    assert (b.addresses, b.yields, b.waited, b.qos, b.wait_timeouts) == (
        a.addresses,
        a.yields,
        a.waited,
        a.qos,
        a.wait_timeouts,
    )
    assert {w: (e.address, e.slots, e.labels) for w, e in cold_registry.workers.items()} == {
        w: (e.address, e.slots, e.labels) for w, e in registry.workers.items()
    }
    for r in (leader, successor):
        await r.store.close()


def test_an_unforeseen_append_failure_answers_every_waiter_and_steps_down() -> None:
    """Not only Redis errors: whatever escapes an append settles its batch's waiters (a batch left
    unsettled would hang every reply waiting on it) and the leader steps down (appending later
    batches would leave a hole in the journal). Found by review."""

    class _Broken(_Store):
        async def append(self, records: list[bytes], token: str) -> str:
            raise ValueError("a reply this build cannot parse")

    async def go() -> None:
        loop = SchedulerLoop(POLICY)
        stepped: list[bool] = []

        async def down() -> None:
            stepped.append(True)

        r = _replica(loop)
        r.store = _Broken()  # type: ignore[assignment]
        r.on_step_down = down
        loop.journal = r
        loop.submit(Acquire(SessionId("a/s"), TenantName("a"), QoS.BURSTABLE))
        with pytest.raises(StateUnavailable):
            await asyncio.wait_for(r.durable(), 5)
        assert stepped == [True] and not r.serving

    asyncio.run(go())
