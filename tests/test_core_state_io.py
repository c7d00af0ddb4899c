"""The core's part of a state snapshot (scheduler/state/state_write.py's `core_doc`, read back by
state_read.py's `core_records`): a core rebuilt from its logical state (through JSON) decides
exactly as the original, event after event, and exports the same document again."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.engine import Core
from scheduler.core.lifecycle import LeaseState
from scheduler.core.types import (
    Acquire,
    Decision,
    Event,
    Granted,
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
    YieldCancelled,
    YieldRequested,
)
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.state import state_read, state_write

SNAP = SnapshotRef("s3://b/k", 12, "ab" * 32, 17.5)


def export_doc(core: Core) -> dict[str, Any]:
    """The core's part of a state snapshot, as JSON-ready data."""
    return state_write.core_doc(core.export_records())


def from_doc(policy: Policy, doc: Any) -> Core:
    """A core rebuilt from `export_doc`'s document; ValueError if unknown or malformed."""
    return Core.from_records(policy, state_read.core_records(doc))


TENANTS = (
    TenantSpec("sre", weight=1, guaranteed=2, burstable_nominal=1, burstable_limit=3),
    TenantSpec("prod", weight=2, guaranteed=1, burstable_nominal=2, burstable_limit=4, best_effort_limit=2),
    TenantSpec("batch", weight=1),
)
POLICY = Policy(
    pool=PoolSpec(slots_per_worker=2, workers=3, floor=2),
    timing=TimingSpec(yield_grace_s=5, lease_ttl_s=40, min_runtime_s=8),
    queue=QueueSpec(max_pending=12, max_pending_per_tenant=8),
    tenants=TENANTS,
)
# An ApplyPolicy: "batch" retires (keeps its leases and queue), "ml" joins, quotas and timing move.
POLICY_2 = Policy(
    pool=PoolSpec(slots_per_worker=2, workers=3, floor_percent=30),
    timing=TimingSpec(yield_grace_s=3, lease_ttl_s=30, min_runtime_s=2),
    queue=QueueSpec(max_pending=10, max_pending_per_tenant=6),
    tenants=(
        TenantSpec(
            "prod", weight=3, guaranteed=1, burstable_nominal=1, burstable_limit=3, best_effort_limit=3
        ),
        TenantSpec("sre", weight=1, guaranteed=1, burstable_nominal=2, burstable_limit=3),
        TenantSpec("ml", weight=2, burstable_nominal=1, burstable_limit=2),
    ),
)
TENANT_NAMES = ["sre", "prod", "sre", "prod", "batch", "ml"]
SESSIONS = [SessionId(f"s{i}") for i in range(20)]

Step = tuple[str, Any]  # ("event", Event) or ("policy", Policy)


def _observe(core: Core) -> Any:
    return (
        core.describe(),
        list(core.leases()),  # in order: grant order is state
        list(core.queue()),
        core.next_deadline(),
        [core.session(s) for s in SESSIONS],
    )


# The draws' strategies, built once (not at each draw: building one costs more than drawing).
_DT = st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 3.0, 9.0, 45.0])
_KIND = st.sampled_from(
    ["worker", "drain", "acquire", "acquire", "acquire", "acquire", "release", "release"]
    + ["withdraw", "renew", "yield", "tick", "resumed", "policy"]
)
_BOOL = st.booleans()
_SLOTS = st.integers(1, 3)
_DRAIN = st.none() | st.sampled_from([0.0, 2.0, 5.0])
_SESSION = st.sampled_from(SESSIONS)
_TENANT = st.sampled_from(TENANT_NAMES)
_QOS = st.sampled_from(list(QoS))
_SNAP = st.none() | st.just(SNAP)
_OUTAGE = st.sampled_from([0.0, 3.0, 40.0])
_POLICY = st.sampled_from([POLICY, POLICY_2])


class _Gen:
    """Random events over a small world: workers come, drain, go and come back under the same
    id; sessions of every tenant and class acquire, renew, yield, release; time jumps; outages;
    the policy changes."""

    def __init__(self) -> None:
        self.workers: list[WorkerId] = []
        self.removed: list[WorkerId] = []
        self.slots: dict[WorkerId, int] = {}
        self.waited_for: set[SessionId] = set()  # sessions a victim was asked to yield for
        self.now = 0.0

    def draw(self, data: st.DataObject, core: Core) -> Step:
        # Mostly small steps, so yields stay pending and waiters stay earmarked across events.
        self.now += data.draw(_DT, label="dt")
        kind = data.draw(_KIND, label="kind")
        leases = sorted(lease for lease, _ in core.leases())
        if kind == "worker" and len(self.workers) >= 3:
            kind = "acquire"  # a small pool keeps requests waiting and victims yielding
        if kind == "worker" or not self.workers:
            if self.removed and data.draw(_BOOL):
                # Back under the same id, maybe with another slot count: a new worker to the core.
                wid = self.removed.pop(data.draw(st.integers(0, len(self.removed) - 1)))
            else:
                wid = WorkerId(f"w{len(self.workers) + len(self.removed)}")
            self.slots[wid] = data.draw(_SLOTS)
            self.workers.append(wid)
            return ("event", WorkerAdded(wid, self.slots[wid], f"{wid}:1"))
        if kind == "drain":
            wid = data.draw(st.sampled_from(self.workers))
            if data.draw(_BOOL):
                self.workers.remove(wid)
                self.removed.append(wid)
                return ("event", WorkerRemoved(wid))
            return ("event", WorkerDraining(wid, data.draw(_DRAIN)))
        if kind == "acquire":
            return (
                "event",
                Acquire(
                    data.draw(_SESSION),
                    TenantName(data.draw(_TENANT)),
                    data.draw(_QOS),
                    data.draw(_SNAP),
                ),
            )
        if kind in ("release", "renew", "yield") and leases:
            lease = data.draw(st.sampled_from(leases))
            if kind == "release":
                return ("event", Release(lease.session, lease.lease_id, lease.epoch))
            if kind == "renew":
                return ("event", Renew(lease.session, lease.lease_id, lease.epoch))
            return (
                "event",
                Yield(lease.session, lease.lease_id, lease.epoch, data.draw(_SNAP)),
            )
        queued = [v.session for v in core.queue()]
        waited_for = [v for v in queued if v in self.waited_for]
        if kind == "withdraw" and waited_for:
            # A waiter a victim yields for gives up: that yield now serves no one (an orphan).
            return ("event", Release(data.draw(st.sampled_from(waited_for))))
        if kind == "withdraw" and queued:
            # A waiter gives up: the victim yielding for it (if any) yields for no one now.
            return ("event", Release(data.draw(st.sampled_from(queued))))
        if kind in ("release", "withdraw"):
            return ("event", Release(data.draw(_SESSION)))
        if kind == "resumed":
            since = self.now
            self.now += data.draw(_OUTAGE)
            return ("event", Resumed(since))
        if kind == "policy":
            return ("policy", data.draw(_POLICY))
        return ("event", Tick())


def _apply(core: Core, step: Step, now: float, gen: _Gen | None = None) -> list[Decision]:
    kind, what = step
    if kind == "policy":
        out = core.apply_policy(what, now)
    else:
        ev: Event = what
        out = core.handle(ev, now)
    if gen is not None:
        gen.waited_for.update(d.for_session for d in out if isinstance(d, YieldRequested) and d.for_session)
    return out


def _objects(doc: dict[str, Any], what: str) -> list[dict[str, Any]]:
    """The `leases` or `requests` rows of a format-2 document as objects, by its column header."""
    fields = doc[what[:-1] + "_fields"]
    return [dict(zip(fields, row, strict=True)) for row in doc[what]]


def _as_v1(doc: dict[str, Any]) -> dict[str, Any]:
    """A format-2 document as format 1 wrote it (objects; `matured` not stored)."""
    old = {k: v for k, v in doc.items() if not k.endswith("_fields")}
    old["format"] = 1
    old["leases"] = [{k: v for k, v in ld.items() if k != "matured"} for ld in _objects(doc, "leases")]
    old["requests"] = _objects(doc, "requests")
    return old


def _through_json(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(doc, allow_nan=False))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(0, 80), m=st.integers(1, 50))
def test_a_rebuilt_core_decides_like_the_original(data: st.DataObject, n: int, m: int) -> None:
    gen = _Gen()
    live = Core(POLICY)
    for _ in range(n):
        step = gen.draw(data, live)
        _apply(live, step, gen.now, gen)

    doc = _through_json(export_doc(live))
    assert doc["format"] == state_write.CORE_FORMAT
    rebuilt = from_doc(live.policy, doc)
    assert _through_json(export_doc(rebuilt)) == doc  # export -> import -> export: the same
    assert _observe(rebuilt) == _observe(live)

    for _ in range(m):
        step = gen.draw(data, live)
        want = _apply(live, step, gen.now, gen)
        assert _apply(rebuilt, step, gen.now) == want, step
        assert _observe(rebuilt) == _observe(live), step
    assert export_doc(rebuilt) == export_doc(live)


def _scenario() -> tuple[Core, float]:
    """A busy core: preemptions under way, an earmarked waiter, borrowing leases, a drained and a
    removed worker, a retired tenant with a queued request."""
    core = Core(POLICY)
    now = 0.0
    for wid in ("w0", "w1", "w2"):
        core.handle(WorkerAdded(WorkerId(wid), 2, f"{wid}:1"), now)
    for i, (tenant, qos) in enumerate(
        [("batch", QoS.BEST_EFFORT), ("batch", QoS.BEST_EFFORT), ("prod", QoS.BURSTABLE)]
        + [("prod", QoS.BEST_EFFORT), ("sre", QoS.BURSTABLE), ("batch", QoS.BEST_EFFORT)]
    ):
        now += 1
        core.handle(Acquire(SessionId(f"s{i}"), TenantName(tenant), qos), now)
    now += 10
    core.handle(Acquire(SessionId("s6"), TenantName("batch"), QoS.BEST_EFFORT), now)
    core.handle(Acquire(SessionId("s7"), TenantName("sre"), QoS.GUARANTEED), now)
    core.handle(WorkerDraining(WorkerId("w2"), 4.0), now)
    core.apply_policy(POLICY_2, now)
    return core, now


def test_a_busy_core_round_trips_through_json() -> None:
    core, now = _scenario()
    doc = _through_json(export_doc(core))
    assert any(lease["state"] == "yielding" for lease in _objects(doc, "leases")), doc["leases"]
    assert any(r["earmark"] is not None for r in _objects(doc, "requests")), doc["requests"]
    assert doc["retired"] == ["batch"]
    rebuilt = from_doc(core.policy, doc)
    assert _observe(rebuilt) == _observe(core)
    # Slots freed by leases other than the victims go to the earmarked waiters first.
    active = [lease for lease, state in core.leases() if state is LeaseState.ACTIVE]
    steps: list[Event] = [Release(lease.session, lease.lease_id, lease.epoch) for lease in active]
    steps += [Tick(), Acquire(SessionId("s9"), TenantName("ml"), QoS.BURSTABLE), Tick()]
    for step in steps:
        now += 1
        assert rebuilt.handle(step, now) == core.handle(step, now)
        assert _observe(rebuilt) == _observe(core)
        assert export_doc(rebuilt) == export_doc(core)


def test_a_worker_added_again_packs_as_a_new_worker_before_and_after_a_rebuild() -> None:
    """The free-slot heap keeps stale entries of a removed worker until they surface; the same
    id added again is a new worker (packed after one registered in between). A rebuilt core
    must skip the same stale entries, so they are state."""
    core = Core(POLICY)
    core.handle(WorkerAdded(WorkerId("a"), 1), 0.0)
    core.handle(WorkerRemoved(WorkerId("a")), 1.0)
    core.handle(WorkerAdded(WorkerId("b"), 1), 2.0)
    core.handle(WorkerAdded(WorkerId("a"), 1), 3.0)
    rebuilt = from_doc(core.policy, _through_json(export_doc(core)))
    acquire = Acquire(SessionId("s"), TenantName("prod"), QoS.GUARANTEED)
    want = core.handle(acquire, 4.0)
    assert rebuilt.handle(acquire, 4.0) == want
    assert [d.lease.slot.worker for d in want if isinstance(d, Granted)] == ["b"]


def test_stale_timers_still_wake_the_core() -> None:
    """A released lease's expiry entry stays in the timer heap until due: next_deadline reports
    it, before and after a rebuild."""
    core = Core(POLICY)
    core.handle(WorkerAdded(WorkerId("a"), 2), 0.0)
    core.handle(Acquire(SessionId("s"), TenantName("prod"), QoS.GUARANTEED), 0.0)
    (lease, _), *_ = core.leases()
    core.handle(Release(SessionId("s"), lease.lease_id, lease.epoch), 1.0)
    assert core.next_deadline() == 40.0
    rebuilt = from_doc(core.policy, _through_json(export_doc(core)))
    assert rebuilt.next_deadline() == 40.0


def test_an_unknown_format_is_refused() -> None:
    doc = export_doc(Core(POLICY))
    with pytest.raises(ValueError, match=r"format 3 is not one this build reads \(it reads \[1, 2\]\)"):
        from_doc(POLICY, {**doc, "format": 3})
    with pytest.raises(ValueError, match="format None"):
        from_doc(POLICY, {k: v for k, v in doc.items() if k != "format"})


def test_a_malformed_or_mismatched_state_is_refused() -> None:
    core, _ = _scenario()
    doc = export_doc(core)
    with pytest.raises(ValueError, match="malformed"):
        from_doc(core.policy, {k: v for k, v in doc.items() if k != "leases"})
    with pytest.raises(ValueError, match="does not match the policy|neither in the policy"):
        from_doc(POLICY, doc)  # exported under POLICY_2
    other = replace(POLICY_2, tenants=(*POLICY_2.tenants, TenantSpec("new")))
    with pytest.raises(ValueError, match="does not match the policy"):
        from_doc(other, doc)


def test_an_empty_core_round_trips() -> None:
    doc = _through_json(export_doc(Core(POLICY)))
    assert doc["now"] is None  # -inf: no event seen yet
    rebuilt = from_doc(POLICY, doc)
    assert _observe(rebuilt) == _observe(Core(POLICY))
    assert export_doc(rebuilt) == doc


def test_yields_left_for_no_one_by_an_older_build_are_taken_over_or_cancelled() -> None:
    """An older build left a victim yielding when its waiter gave up (an `orphan` in its
    document, without `yield_deadline`). This build reads such a document; at the next event a
    waiter with a right to a slot takes the first yield over (no new YieldRequested, the old
    deadline stands) and the other is cancelled."""
    core = Core(POLICY)
    core.handle(WorkerAdded(WorkerId("w0"), 2), 0.0)
    for s in ("s0", "s1"):
        core.handle(Acquire(SessionId(s), TenantName("batch"), QoS.BEST_EFFORT), 0.0)
    for s, t in (("s2", 1.0), ("s3", 2.0)):
        out = core.handle(Acquire(SessionId(s), TenantName("sre"), QoS.GUARANTEED), t)
        assert any(isinstance(d, YieldRequested) and d.for_session == s for d in out), out
    doc = _as_v1(_through_json(export_doc(core)))
    yielding = [ld["lease_id"] for ld in doc["leases"] if ld["state"] == "yielding"]
    assert len(yielding) == 2
    # The document of an older build: the waiters gone, their victims orphaned.
    for ld in doc["leases"]:
        ld["for_session"] = None
        del ld["yield_deadline"]
    doc["requests"], doc["earmark_order"], doc["orphans"] = [], [], yielding
    rebuilt = from_doc(core.policy, doc)
    out = rebuilt.handle(Acquire(SessionId("s4"), TenantName("prod"), QoS.GUARANTEED), 3.0)
    assert [type(d).__name__ for d in out] == ["Queued", "YieldCancelled"], out
    cancelled = out[1]
    assert isinstance(cancelled, YieldCancelled) and cancelled.lease.lease_id == yielding[1]
    states = {lease.lease_id: state for lease, state in rebuilt.leases()}
    assert states == {yielding[0]: LeaseState.YIELDING, yielding[1]: LeaseState.ACTIVE}
    # The first lease (s0's) was asked second, at 2 s: that deadline (+ 5 s grace) still holds.
    assert rebuilt.handle(Tick(), 6.9) == []
    out = rebuilt.handle(Tick(), 7.0)
    assert [type(d).__name__ for d in out] == ["Revoked", "Granted", "Queued"], out
    assert isinstance(out[1], Granted) and out[1].lease.session == "s4"
    assert export_doc(rebuilt)["orphans"] == []
