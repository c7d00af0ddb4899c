"""The journal codec and replay: every record round-trips, and replaying a journal (with or
without a snapshot in the middle) rebuilds the very same core. No Redis needed here."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.engine import Core
from scheduler.core.types import (
    Acquire,
    Decision,
    EndReason,
    Event,
    Granted,
    LeaseId,
    QoS,
    Release,
    Renew,
    Resumed,
    SessionId,
    SnapshotRef,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerDraining,
    WorkerId,
    WorkerRemoved,
    Yield,
    YieldRequested,
)
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.server.loop import EndedSession, LoopState
from scheduler.server.registry import WorkerEntry
from scheduler.state import codec, state_read, state_write
from scheduler.state.config import StateConfigError, parse_state

SNAP = SnapshotRef("s3://b/k", 12, "ab" * 32, 17.5)
POLICY = Policy(
    pool=PoolSpec(slots_per_worker=2, workers=2, floor=1),
    timing=TimingSpec(yield_grace_s=3, lease_ttl_s=10, min_runtime_s=2),
    queue=QueueSpec(max_pending=10, max_pending_per_tenant=6),
    tenants=(
        TenantSpec("sre", weight=1, guaranteed=1, burstable_nominal=1, burstable_limit=3),
        TenantSpec("prod", weight=2, burstable_nominal=1, burstable_limit=3, best_effort_limit=2),
    ),
)

CASES: list[tuple[codec.Record, codec.Extras | None]] = [
    (WorkerAdded(WorkerId("w1"), 4, "10.0.0.1:7000"), None),
    (WorkerAdded(WorkerId("w2"), 1, "h:1"), codec.Extras(labels={"zone": "a"}, static=True)),
    (WorkerDraining(WorkerId("w1"), 5.5), None),
    (WorkerDraining(WorkerId("w1"), None), None),
    (WorkerRemoved(WorkerId("w1")), None),
    (Acquire(SessionId("acme/s"), TenantName("acme"), QoS.GUARANTEED), None),
    (
        Acquire(SessionId("acme/s"), TenantName("acme"), QoS.BEST_EFFORT, SNAP),
        codec.Extras(wait_timeout_s=2.5),
    ),
    (Release(SessionId("acme/s"), LeaseId("w1/0#3"), 3), None),
    (Release(SessionId("acme/s")), None),
    (Renew(SessionId("acme/s"), LeaseId("w1/0#3"), 3), None),
    (Yield(SessionId("acme/s"), LeaseId("w1/0#3"), 3, SNAP), None),
    (Yield(SessionId("acme/s"), LeaseId("w1/0#3"), 3), None),
    (Tick(), None),
    (Resumed(1234.5), None),
    (codec.PolicyRecord(POLICY), None),
]


@pytest.mark.parametrize(("record", "extras"), CASES, ids=lambda c: type(c).__name__)
def test_every_record_round_trips(record: codec.Record, extras: codec.Extras | None) -> None:
    raw = codec.encode(record, 123.25, extras)
    doc = json.loads(raw)
    assert doc["v"] == codec.FORMAT_VERSION and isinstance(doc["t"], str)
    back, at, x = codec.decode(raw)
    assert back == record and at == 123.25
    assert x == (extras or codec.Extras())
    again = codec.encode(back, at, x)
    if not isinstance(record, codec.PolicyRecord):  # YAML may spell a number differently
        assert again == raw  # stable: the same bytes again
    assert codec.decode(again)[0] == record


@pytest.mark.parametrize(
    "raw",
    [b'{"v": 2, "at": 0, "t": "tick"}', b'{"v": 1, "at": 0, "t": "teleport"}', b"[]", b"{", b'{"v": 1}'],
)
def test_unreadable_records_are_refused(raw: bytes) -> None:
    with pytest.raises(codec.CodecError):
        codec.decode(raw)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("memory", True),
        ("redis://127.0.0.1:6379/0", True),
        ("redis://redis.slotsched.svc:6379", True),
        ("redis://h:notaport/0", False),
        ("http://h:6379/0", False),
        ("redis:///0", False),
        ("redis://h:6379/x", False),
    ],
)
def test_state_flag_parsing(value: str, ok: bool) -> None:
    if ok:
        parse_state(value)
    else:
        with pytest.raises(StateConfigError, match="--state"):
            parse_state(value)


# ------------------------------------------------------------------ replay reproduces the core

SESSIONS = [SessionId(f"t/s{i}") for i in range(8)]


def _fingerprint(core: Core) -> Any:
    return (
        core.describe(),
        sorted((lease, state) for lease, state in core.leases()),
        [(v.session, v.position, v.waiting_since, v.resume_from) for v in core.queue()],
        core.next_deadline(),
    )


def _draw_event(data: st.DataObject, core: Core, workers: list[WorkerId]) -> Event:
    kind = data.draw(
        st.sampled_from(
            ["worker", "drain", "acquire", "acquire", "release", "renew", "yield", "tick", "resumed"]
        )
    )
    leases = sorted(lease for lease, _ in core.leases())
    if kind == "worker" or not workers:
        wid = WorkerId(f"w{len(workers)}")
        workers.append(wid)
        return WorkerAdded(wid, data.draw(st.integers(1, 3)), f"{wid}:1")
    if kind == "drain":
        wid = data.draw(st.sampled_from(workers))
        if data.draw(st.booleans()):
            return WorkerRemoved(wid)
        return WorkerDraining(wid, data.draw(st.none() | st.floats(0, 5)))
    if kind == "acquire":
        return Acquire(
            data.draw(st.sampled_from(SESSIONS)),
            TenantName(data.draw(st.sampled_from(["sre", "prod"]))),
            data.draw(st.sampled_from(list(QoS))),
            data.draw(st.none() | st.just(SNAP)),
        )
    if kind in ("release", "renew", "yield") and leases:
        lease = data.draw(st.sampled_from(leases))
        if kind == "release":
            return Release(lease.session, lease.lease_id, lease.epoch)
        if kind == "renew":
            return Renew(lease.session, lease.lease_id, lease.epoch)
        return Yield(lease.session, lease.lease_id, lease.epoch, data.draw(st.none() | st.just(SNAP)))
    if kind == "release":
        return Release(data.draw(st.sampled_from(SESSIONS)))
    if kind == "resumed":
        return Resumed(data.draw(st.floats(0, 50)))
    return Tick()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 60))
def test_replaying_the_journal_rebuilds_the_same_core(data: st.DataObject, n: int) -> None:
    live = Core(POLICY)
    journal: list[bytes] = []
    decisions: list[list[Decision]] = []
    workers: list[WorkerId] = []
    now = 0.0
    cut = data.draw(st.integers(0, n))  # a snapshot after this many events
    snap: bytes | None = None
    for i in range(n):
        if i == cut:
            state = LoopState(live, {}, {}, {}, {}, {}, OrderedDict())
            snap = state_write.state_bytes(state_write.State(state, {}, now))
        now += data.draw(st.floats(0, 6))
        ev = _draw_event(data, live, workers)
        decisions.append(live.handle(ev, now))
        journal.append(codec.encode(ev, now))

    # From the beginning, through the codec.
    replayed = Core(POLICY)
    for raw, want in zip(journal, decisions, strict=True):
        rec, at, _ = codec.decode(raw)
        assert not isinstance(rec, codec.PolicyRecord)
        assert replayed.handle(rec, at) == want
    assert _fingerprint(replayed) == _fingerprint(live)

    # From the snapshot, then the journal tail after it.
    if snap is not None:
        restored = state_read.read_state(snap, state_write.current_fingerprint()).loop.core
        for raw in journal[cut:]:
            rec, at, _ = codec.decode(raw)
            assert not isinstance(rec, codec.PolicyRecord)
            restored.handle(rec, at)
        assert _fingerprint(restored) == _fingerprint(live)


def _busy_state() -> tuple[state_write.State, float]:
    """A loop state with leases, a pending yield, a queue, ended sessions and workers."""
    core = Core(POLICY)
    now = 0.0
    state = LoopState(core, {}, {}, {}, {}, {}, OrderedDict())
    core.handle(WorkerAdded(WorkerId("w0"), 2, "w0:1"), now)
    state.addresses[WorkerId("w0")] = "w0:1"
    for i, (tenant, qos) in enumerate(
        [("prod", QoS.BEST_EFFORT), ("prod", QoS.BEST_EFFORT), ("sre", QoS.GUARANTEED)]
    ):
        s = SessionId(f"{tenant}/s{i}")
        state.qos[s] = qos
        now += 1
        for d in core.handle(Acquire(s, TenantName(tenant), qos, SNAP if i == 0 else None), now):
            if isinstance(d, YieldRequested):
                state.yields[d.lease.lease_id] = d
            elif isinstance(d, Granted):
                state.waited[d.lease.session] = d.waited_s
    state.wait_timeouts[SessionId("sre/s2")] = 30.0
    state.ended[SessionId("prod/old")] = EndedSession(EndReason.RELEASED, QoS.BURSTABLE, SNAP, 0.5)
    state.ended[SessionId("prod/older")] = EndedSession(EndReason.EXPIRED, QoS.BEST_EFFORT, None, 0.25)
    workers = {
        WorkerId("w0"): WorkerEntry(WorkerId("w0"), "w0:1", 2, 0.0, {"zone": "a"}, 3.5, False, True),
        WorkerId("w9"): WorkerEntry(WorkerId("w9"), "w9:1", 1, 1.0, {}, None, True, False),
    }
    assert state.yields, "the scenario has a pending yield"
    return state_write.State(state, workers, now), now


def test_a_snapshot_is_plain_versioned_json_that_round_trips() -> None:
    state, now = _busy_state()
    data = state_write.state_bytes(state)
    doc = json.loads(data)
    assert doc["format"] == state_write.SNAPSHOT_FORMAT and doc["core"]["format"] == 2
    back = state_read.read_state(data, state_write.current_fingerprint())
    a, b = state.loop, back.loop
    assert _fingerprint(b.core) == _fingerprint(a.core) and b.core.policy == a.core.policy
    assert (b.addresses, b.yields, b.waited, b.qos, b.wait_timeouts) == (
        a.addresses,
        a.yields,
        a.waited,
        a.qos,
        a.wait_timeouts,
    )
    assert list(b.ended.items()) == list(a.ended.items()) and isinstance(b.ended, OrderedDict)
    assert back.workers == state.workers and back.last_now == now
    again = json.loads(state_write.state_bytes(back))
    assert again.pop("policy") and doc.pop("policy")  # YAML may spell a number differently
    assert again == doc  # otherwise the same document again
    # The restored core goes on exactly as the original.
    for ev in [Tick(), Release(SessionId("prod/s9")), Tick()]:
        now += 6
        assert b.core.handle(ev, now) == a.core.handle(ev, now)


def test_a_snapshot_survives_a_code_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing in a snapshot depends on the sources that wrote it: with no fingerprint at all
    (the stored label ignored, the old source-hash function gone) the format number suffices."""
    state, _ = _busy_state()
    data = state_write.state_bytes(state)
    assert not hasattr(state_write, "fingerprint")  # no hash of the sources any more
    monkeypatch.setattr(state_write, "current_fingerprint", lambda: "slotsched-snapshot/2:some-other-build")
    for written_by in (None, "slotsched-snapshot/2:an-older-build", state_write.current_fingerprint()):
        back = state_read.read_state(data, written_by)
        assert _fingerprint(back.loop.core) == _fingerprint(state.loop.core)


def test_a_snapshot_of_a_newer_format_is_refused() -> None:
    state, _ = _busy_state()
    doc = json.loads(state_write.state_bytes(state))
    doc["format"] = state_write.SNAPSHOT_FORMAT + 1
    with pytest.raises(
        state_read.SnapshotMismatch, match="written by a newer build; this build reads formats"
    ):
        state_read.read_state(json.dumps(doc).encode(), "slotsched-snapshot/3")
    doc["format"] = state_write.SNAPSHOT_FORMAT
    doc["core"]["format"] = 99  # a core state this build does not know: refused, not guessed
    with pytest.raises(state_write.StateSnapshotError, match="core state format 99"):
        state_read.read_state(json.dumps(doc).encode())


def test_an_old_pickle_snapshot_is_refused_clearly() -> None:
    import pickle

    with pytest.raises(state_read.SnapshotMismatch, match="pickle of an earlier build"):
        state_read.read_state(pickle.dumps({"core": 1}), "slotsched-state/1:0123456789abcdef")
    with pytest.raises(state_write.StateSnapshotError, match="no format number"):
        state_read.read_state(b'{"core": {}}')


def test_a_bad_state_url_never_echoes_its_password() -> None:
    with pytest.raises(StateConfigError) as err:
        parse_state("redis://:hunter2-secret@redis:6379/x")
    assert "hunter2" not in str(err.value)
    assert "redis://:***@redis:6379/x" in str(err.value)
