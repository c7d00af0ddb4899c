"""The core's internals as public pieces: `Core.export_records` / `Core.from_records` without JSON, and
the victim a preemption picks from its heaps is the first candidate by `victims.victim_order`."""

from __future__ import annotations

import random

import pytest

from scheduler.core.engine import Core
from scheduler.core.lifecycle import LeaseState
from scheduler.core.records import CoreRecords, LeaseRecord
from scheduler.core.types import (
    Acquire,
    QoS,
    Release,
    SessionId,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerId,
    YieldCause,
    YieldRequested,
)
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec

TENANTS = (
    TenantSpec("a", weight=1, burstable_nominal=1, burstable_limit=6),
    TenantSpec("b", weight=2, burstable_nominal=0, burstable_limit=6),
    TenantSpec("c", weight=3, burstable_nominal=1, burstable_limit=6),
    TenantSpec("d", weight=1),
    TenantSpec("vip", weight=1, guaranteed=20),
)
POLICY = Policy(
    pool=PoolSpec(slots_per_worker=4, workers=3, floor=0),
    timing=TimingSpec(yield_grace_s=5, lease_ttl_s=1000, min_runtime_s=3),
    queue=QueueSpec(max_pending=100, max_pending_per_tenant=100),
    tenants=TENANTS,
)


def _busy(seed: int) -> tuple[Core, float]:
    """A full pool of BestEffort and Burstable leases of four tenants, after some churn."""
    rng = random.Random(seed)
    core = Core(POLICY)
    for w in range(3):
        core.handle(WorkerAdded(WorkerId(f"w{w}"), 4), 0.0)
    now, n = 0.0, 0
    for _ in range(40):
        now += rng.random()
        held = [lease for lease, _ in core.leases()]
        if held and rng.random() < 0.3:
            lease = rng.choice(held)
            core.handle(Release(lease.session, lease.lease_id, lease.epoch), now)
        else:
            n += 1
            qos = rng.choice((QoS.BURSTABLE, QoS.BEST_EFFORT))
            core.handle(Acquire(SessionId(f"s{n}"), TenantName(rng.choice("abcd")), qos), now)
    while core.describe().free > 0:  # full: a Guaranteed request must preempt
        n += 1
        core.handle(Acquire(SessionId(f"s{n}"), TenantName(rng.choice("abcd")), QoS.BEST_EFFORT), now)
    return core, now


@pytest.mark.parametrize("seed", range(12))
def test_the_victim_is_the_first_candidate_in_victim_order(seed: int) -> None:
    core, now = _busy(seed)
    records = core.export_records()
    shares = {t.name: t.share for t in core.describe().tenants}
    last_preempted = {u.tenant: u.last_preempted for u in records.usage}
    preempted = dict(records.preempted)

    def session_rule(i: int, lr: LeaseRecord) -> tuple[int, int]:
        # Never preempted first, newest grant first (grant order: a later lease is newer);
        # then the least recently preempted.
        p = preempted.get(lr.lease.session, 0)
        return (0, -i) if p == 0 else (1, p)

    candidates = [
        (
            (
                0 if lr.lease.qos is QoS.BEST_EFFORT else 1,
                -shares[lr.lease.tenant],
                last_preempted.get(lr.lease.tenant, 0),
                lr.lease.tenant,
                session_rule(i, lr),
            ),
            lr,
        )
        for i, lr in enumerate(records.leases)
        if lr.candidate
    ]
    out = core.handle(Acquire(SessionId("g"), TenantName("vip"), QoS.GUARANTEED), now)
    # (The pass after it may also start a fairness yield: only the Guaranteed one is this rule's.)
    asked = [d for d in out if isinstance(d, YieldRequested) and d.cause is YieldCause.GUARANTEED]
    assert candidates, "a full pool of BestEffort and borrowing Burstable leases has candidates"
    expected = min(candidates, key=lambda c: c[0])[1]
    assert len(asked) == 1
    assert asked[0].lease == expected.lease


@pytest.mark.parametrize("seed", range(6))
def test_restore_from_records_decides_as_the_original(seed: int) -> None:
    core, now = _busy(seed)
    records = core.export_records()
    assert isinstance(records, CoreRecords)
    rebuilt = Core.from_records(POLICY, records)
    assert rebuilt.export_records() == records
    rng = random.Random(seed + 100)
    for i in range(30):
        now += rng.random() * 2
        if i % 3 == 0:
            ev: Acquire | Tick = Acquire(SessionId(f"x{i}"), TenantName(rng.choice("abcd")), QoS.BEST_EFFORT)
        else:
            ev = Tick()
        assert rebuilt.handle(ev, now) == core.handle(ev, now)
    assert rebuilt.export_records() == core.export_records()
    assert {lease.lease_id: s for lease, s in rebuilt.leases()} == {
        lease.lease_id: s for lease, s in core.leases()
    }


def test_restore_refuses_records_that_do_not_fit_the_policy() -> None:
    core, _ = _busy(0)
    other = Policy(pool=POLICY.pool, timing=POLICY.timing, queue=POLICY.queue, tenants=TENANTS[:2])
    with pytest.raises(ValueError, match="neither in the policy nor retired"):
        Core.from_records(other, core.export_records())
    assert LeaseState.ACTIVE in {s for _, s in core.leases()}
