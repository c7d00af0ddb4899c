"""A snapshot that comes with a Yield after its lease was revoked at the yield deadline.

The rule (docs/design.md, "Checkpoint-and-yield preemption", step 4): the deadline protects the
waiter's latency, not the snapshot's validity. A Yield quoting the revoked lease (same id and
epoch) while its session is still queued brings the snapshot the session resumes from
(`LateSnapshot`); lateness costs the holder its slot, never its work. Anything else stays a stale
call. The rule survives a state snapshot taken between the revocation and the late Yield.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from scheduler.core.engine import Core
from scheduler.core.types import (
    Acquire,
    Decision,
    ErrorCode,
    Granted,
    LateSnapshot,
    Lease,
    QoS,
    Queued,
    Rejected,
    Release,
    Revoked,
    SessionId,
    SnapshotRef,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerId,
    Yield,
    YieldRequested,
)
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.state import state_read, state_write

OLD = SnapshotRef("file:///snaps/batch/v/1.snap", 10, "aa" * 32, 1.0)
LATE = SnapshotRef("file:///snaps/batch/v/2.snap", 20, "bb" * 32, 14.5)
GRACE = 5.0
POLICY = Policy(
    pool=PoolSpec(slots_per_worker=1, workers=1, floor=0),
    timing=TimingSpec(yield_grace_s=GRACE, lease_ttl_s=60, min_runtime_s=0),
    queue=QueueSpec(max_pending=10, max_pending_per_tenant=10),
    tenants=(TenantSpec("batch", weight=1), TenantSpec("sre", weight=1, guaranteed=1)),
)
VICTIM, WAITER = SessionId("v"), SessionId("g")


def _revoked() -> tuple[Core, Lease]:
    """One slot: batch's BestEffort `v` (resumed from OLD) asked to yield for sre's Guaranteed
    `g` at 10 s, and revoked at its deadline; `v` is queued again, `g` holds the slot."""
    core = Core(POLICY)
    core.handle(WorkerAdded(WorkerId("w0"), 1), 0.0)
    (granted,) = core.handle(Acquire(VICTIM, TenantName("batch"), QoS.BEST_EFFORT, OLD), 0.0)
    assert isinstance(granted, Granted)
    out = core.handle(Acquire(WAITER, TenantName("sre"), QoS.GUARANTEED), 10.0)
    assert any(isinstance(d, YieldRequested) for d in out), out
    out = core.handle(Tick(), 10.0 + GRACE)
    assert [type(d) for d in out] == [Revoked, Granted, Queued], out
    return core, granted.lease


def _through_a_state_snapshot(core: Core) -> Core:
    doc = state_write.core_doc(core.export_records())
    return Core.from_records(core.policy, state_read.core_records(doc))


def _resumes_from(core: Core, now: float) -> SnapshotRef | None:
    """Free the slot: what the victim's next grant resumes from."""
    view = core.session(WAITER)
    assert view is not None and view.lease is not None
    out = core.handle(Release(WAITER, view.lease.lease_id, view.lease.epoch), now)
    (g,) = [d for d in out if isinstance(d, Granted)]
    assert g.lease.session == VICTIM
    return g.lease.resume_from


def _same(lease: Lease) -> Yield:
    return Yield(VICTIM, lease.lease_id, lease.epoch, LATE)


def _other_epoch(lease: Lease) -> Yield:
    return Yield(VICTIM, lease.lease_id, lease.epoch + 1, LATE)


def _no_snapshot(lease: Lease) -> Yield:
    return Yield(VICTIM, lease.lease_id, lease.epoch)


Case = tuple[Callable[[Lease], Yield], bool, type[Decision], Any, SnapshotRef | None]

CASES: dict[str, Case] = {
    # late Yield, through a state snapshot first?, its first decision, its detail, resumes from
    "same-epoch": (_same, False, LateSnapshot, LATE, LATE),
    "same-epoch-after-failover": (_same, True, LateSnapshot, LATE, LATE),
    "another-epoch": (_other_epoch, False, Rejected, ErrorCode.STALE_EPOCH, OLD),
    "no-snapshot": (_no_snapshot, False, Queued, None, OLD),
}


@pytest.mark.parametrize(("late", "failover", "first", "detail", "resumes"), CASES.values(), ids=CASES.keys())
def test_a_late_snapshot_for_a_revoked_lease(
    late: Callable[[Lease], Yield],
    failover: bool,
    first: type[Decision],
    detail: Any,
    resumes: SnapshotRef | None,
) -> None:
    core, lease = _revoked()
    if failover:
        core = _through_a_state_snapshot(core)
    out = core.handle(late(lease), 16.0)
    assert type(out[0]) is first, out
    if isinstance(out[0], LateSnapshot):
        assert out[0] == LateSnapshot(VICTIM, lease.lease_id, lease.epoch, detail)
        assert isinstance(out[1], Queued) and out[1].session == VICTIM  # its place, for the answer
    if isinstance(out[0], Rejected):
        assert out[0].code is detail
    assert _resumes_from(core, 20.0) == resumes


def test_a_late_snapshot_keeps_the_place_and_repeats_harmlessly() -> None:
    core, lease = _revoked()
    before = core.session(VICTIM)
    out = core.handle(_same(lease), 16.0)
    again = core.handle(_same(lease), 16.5)  # a retry whose first answer was lost
    assert [type(d) for d in out] == [type(d) for d in again] == [LateSnapshot, Queued]
    after = core.session(VICTIM)
    assert before is not None and after is not None
    assert (after.position, after.waiting_since) == (before.position, before.waiting_since)


def test_too_late_once_the_session_was_granted_again() -> None:
    """Re-granted from the old snapshot before the late Yield came: the new holder already
    resumed, so the Yield is a stale call (the SDK resumes from its own late snapshot)."""
    core, lease = _revoked()
    assert _resumes_from(core, 15.5) == OLD
    (rejected,) = core.handle(_same(lease), 16.0)
    assert isinstance(rejected, Rejected) and rejected.code is ErrorCode.STALE_EPOCH


def test_a_state_document_of_an_older_build_without_the_revoked_column_reads() -> None:
    core, lease = _revoked()
    doc = state_write.core_doc(core.export_records())
    assert doc["request_fields"][-1] == "revoked" and doc["requests"][0][-1] == [lease.lease_id, lease.epoch]
    doc["request_fields"] = doc["request_fields"][:-1]
    doc["requests"] = [row[:-1] for row in doc["requests"]]
    older = Core.from_records(core.policy, state_read.core_records(doc))
    # What an older build knew: no revoked lease, so the late Yield is a stale call there.
    (rejected, *_) = older.handle(_same(lease), 16.0)
    assert isinstance(rejected, Rejected) and rejected.code is ErrorCode.STALE_EPOCH
