"""Invariants of the core under random event sequences (hypothesis stateful testing).

After every step: leases <= slots and one lease per slot; quotas never exceeded; the floor
invariant; no session lost; epochs strictly increase per slot; every yield (but a drain's) is
for a waiter still queued. A yield that ends (Yield or revocation at its deadline) hands its
slot to another session in the same event: no revoke, and no yield into an idle slot, without a
waiter that needed it. At the end, replaying the same events on a fresh core gives the same
decisions.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scheduler.core.engine import Core
from scheduler.core.lifecycle import LeaseState
from scheduler.core.types import (
    Acquire,
    Decision,
    Ended,
    Event,
    Expired,
    Granted,
    Lease,
    LeaseId,
    QoS,
    Queued,
    Refused,
    Release,
    Renew,
    Resumed,
    Revoked,
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
)
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec

TENANTS = (
    TenantSpec("sre", weight=1, guaranteed=2, burstable_nominal=1, burstable_limit=3),
    TenantSpec("prod", weight=2, guaranteed=1, burstable_nominal=2, burstable_limit=4, best_effort_limit=2),
    TenantSpec("batch", weight=1),
)
POLICY = Policy(
    pool=PoolSpec(slots_per_worker=2, workers=3, floor=2),
    timing=TimingSpec(yield_grace_s=5, lease_ttl_s=20, min_runtime_s=8),
    queue=QueueSpec(max_pending=12, max_pending_per_tenant=8),
    tenants=TENANTS,
)
SESSIONS = [SessionId(f"s{i}") for i in range(14)]


class CoreMachine(RuleBasedStateMachine):
    policy = POLICY

    def __init__(self) -> None:
        super().__init__()
        self.core = Core(self.policy)
        self.now = 0.0
        self.log: list[tuple[float, Event]] = []
        self.decisions: list[list[Decision]] = []
        self.workers: dict[str, int] = {}
        self.next_worker = 0
        self.capacity_shrank = False
        # What every session that ever asked is now, from the decisions alone.
        self.state: dict[SessionId, str] = {}
        self.last_epoch: dict[str, int] = {}
        self.waiters: dict[LeaseId, SessionId | None] = {}

    def apply(self, ev: Event) -> list[Decision]:
        self.log.append((self.now, ev))
        # Leases yielding for a waiter (not for a drain) before the event, by id.
        for_waiter = {
            lease.lease_id: lease
            for lease, state in self.core.leases()
            if state is LeaseState.YIELDING and self.core.yields_for(lease.lease_id) is not None
        }
        self.waiters = {lid: self.core.yields_for(lid) for lid in for_waiter}
        out = self.core.handle(ev, self.now)
        self.decisions.append(out)
        self.check_yields_served(ev, out, for_waiter)
        for d in out:
            if isinstance(d, Granted):
                self.state[d.lease.session] = "held"
                slot = str(d.lease.slot)
                assert d.lease.epoch > self.last_epoch.get(slot, 0), "epoch must strictly increase per slot"
                self.last_epoch[slot] = d.lease.epoch
            elif isinstance(d, Queued):
                self.state[d.session] = "queued"
            elif isinstance(d, Revoked):
                assert d.reason.value, "a revoke has a reason"
                self.state[d.lease.session] = "revoked"  # a Queued or Granted follows
            elif isinstance(d, Expired):
                self.state[d.lease.session] = "expired"
            elif isinstance(d, Ended):
                self.state[d.session] = "yielded" if d.reason.value == "yielded" else "ended"
            elif isinstance(d, Refused):
                assert d.message
                self.state.setdefault(d.session, "refused")
        return out

    def check_yields_served(self, ev: Event, out: list[Decision], for_waiter: dict[LeaseId, Lease]) -> None:
        """A yield for a waiter that ends (revoked at its deadline, or yielded) gives its slot to
        another session in the same event; a cancelled yield was one for a waiter."""
        granted = {str(d.lease.slot): d.lease.session for d in out if isinstance(d, Granted)}
        ended = [d.lease for d in out if isinstance(d, Revoked) and d.reason.value == "yield_deadline"]
        if isinstance(ev, Yield) and ev.lease_id in for_waiter:
            # Unless the timers that fired first served the waiter with another slot (a Granted
            # before the Ended): the yield was then called off before the event applied, and the
            # holder's Yield, crossing the cancellation, is its own (as after a tick at that time).
            waiter = self.waiters.get(ev.lease_id)
            yielded = [i for i, d in enumerate(out) if isinstance(d, Ended) and d.reason.value == "yielded"]
            served_first = bool(yielded) and any(
                isinstance(d, Granted) and d.lease.session == waiter for d in out[: yielded[0]]
            )
            if not served_first:
                ended += [
                    d.lease for d in out if isinstance(d, Ended) and d.lease and d.reason.value == "yielded"
                ]
        for lease in ended:
            if lease.lease_id in for_waiter:
                to = granted.get(str(lease.slot))
                assert to is not None and to != lease.session, (
                    f"the yield of {lease.lease_id} ended with no waiter taking its slot: {out}"
                )
        for d in out:
            if isinstance(d, YieldCancelled):
                assert d.lease.lease_id in for_waiter, f"cancelled a yield that was for no waiter: {d}"

    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(slots=st.integers(1, 3))
    def add_worker(self, slots: int) -> None:
        if len(self.workers) >= 4:
            return
        wid = f"w{self.next_worker}"
        self.next_worker += 1
        self.workers[wid] = slots
        self.apply(WorkerAdded(WorkerId(wid), slots))

    @precondition(lambda self: len(self.workers) > 1)
    @rule(data=st.data(), remove=st.booleans())
    def drain_or_remove(self, data: st.DataObject, remove: bool) -> None:
        wid = data.draw(st.sampled_from(sorted(self.workers)))
        self.capacity_shrank = True
        if remove:
            del self.workers[wid]
            self.apply(WorkerRemoved(WorkerId(wid)))
        else:
            self.apply(WorkerDraining(WorkerId(wid), 3.0))

    @rule(
        s=st.sampled_from(SESSIONS),
        tenant=st.sampled_from([t.name for t in TENANTS]),
        qos=st.sampled_from(list(QoS)),
        dt=st.floats(0, 3),
    )
    def acquire(self, s: SessionId, tenant: str, qos: QoS, dt: float) -> None:
        self.advance(dt)
        out = self.apply(Acquire(s, TenantName(tenant), qos))
        assert out, "an acquire is always answered"

    @rule(s=st.sampled_from(SESSIONS), dt=st.floats(0, 3))
    def release(self, s: SessionId, dt: float) -> None:
        self.advance(dt)
        view = self.core.session(s)
        if view is None:
            return
        if view.lease is None:
            self.apply(Release(s))
        else:
            self.apply(Release(s, view.lease.lease_id, view.lease.epoch))

    @rule(s=st.sampled_from(SESSIONS), dt=st.floats(0, 3), with_snapshot=st.booleans())
    def yield_(self, s: SessionId, dt: float, with_snapshot: bool) -> None:
        self.advance(dt)
        view = self.core.session(s)
        if view is not None and view.lease is not None:
            snap = SnapshotRef(f"mem://{s}/{self.now}") if with_snapshot else None
            self.apply(Yield(s, view.lease.lease_id, view.lease.epoch, snap))

    @rule(dt=st.floats(0, 10))
    def renew_all_and_tick(self, dt: float) -> None:
        self.advance(dt)
        for lease, _state in list(self.core.leases()):
            # Some holders are dead and never renew. Not `hash()`: it is salted per process, so a
            # stored failing example would replay differently (hypothesis reports it as flaky).
            if int(lease.session[1:]) % 3:
                self.apply(Renew(lease.session, lease.lease_id, lease.epoch))
        self.apply(Tick())

    @rule(outage=st.floats(0, 100))
    def resumed_after_an_outage(self, outage: float) -> None:
        """A new leader takes over after `outage` seconds: no lease ends because of the outage."""
        since = self.log[-1][0] if self.log else self.now  # the last time the core saw, as journaled
        self.advance(outage)
        live = {lease.lease_id for lease, _ in self.core.leases()}
        out = self.apply(Resumed(since))
        ended = {d.lease.lease_id for d in out if isinstance(d, Expired | Revoked)}
        assert not (ended & live), f"the outage itself ended leases: {sorted(ended & live)}"

    @rule(s=st.sampled_from(SESSIONS))
    def stale_call_is_refused(self, s: SessionId) -> None:
        view = self.core.session(s)
        if view is not None and view.lease is not None:
            out = self.apply(Renew(s, view.lease.lease_id, view.lease.epoch - 1))
            # Time may have moved on since the last event: a timer due now (the lease's expiry or
            # yield deadline) fires first, and then the session holds nothing to be stale about.
            gone = any(isinstance(d, Expired | Revoked) and d.lease.session == s for d in out)
            codes = [getattr(d, "code", None) for d in out]
            assert ("not_found" in codes or "stale_epoch" in codes) if gone else "stale_epoch" in codes, out

    @invariant()
    def slots_quotas_floor(self) -> None:
        view = self.core.describe()
        busy = {}
        for lease, _state in self.core.leases():
            key = str(lease.slot)
            assert key not in busy, "one lease per slot"
            busy[key] = lease
        slots = sum(w.slots for w in view.workers)
        assert len(busy) <= slots
        for t in view.tenants:
            assert t.held[0] <= t.guaranteed
            assert t.held[1] <= t.burstable_limit
            assert t.best_effort_limit is None or t.held[2] <= t.best_effort_limit
        if not self.capacity_shrank:
            assert view.free + view.preemptible >= view.floor - view.held[0], view

    @invariant()
    def no_session_lost(self) -> None:
        for s, st_ in self.state.items():
            view = self.core.session(s)
            if st_ == "held":
                assert view is not None and view.lease is not None, s
            elif st_ == "queued":
                assert view is not None and view.lease is None, s
            elif st_ in ("ended", "expired"):
                assert view is None, s
            elif st_ in ("revoked", "yielded"):
                raise AssertionError(f"{s} was {st_} but neither re-queued nor granted")
            elif st_ == "refused":
                assert view is None
        for _lease, state in self.core.leases():
            assert state in (LeaseState.ACTIVE, LeaseState.YIELDING)

    @invariant()
    def every_yield_is_for_a_queued_waiter(self) -> None:
        draining = {w.worker_id for w in self.core.describe().workers if w.state.value != "ready"}
        for lease, state in self.core.leases():
            if state is not LeaseState.YIELDING:
                continue
            waiter = self.core.yields_for(lease.lease_id)
            if waiter is None:
                assert lease.slot.worker in draining, f"{lease.lease_id} yields for no one"
            else:
                view = self.core.session(waiter)
                assert view is not None and view.lease is None, f"{lease.lease_id} yields for {waiter}"
                # A yield for its own tenant's waiter is a checkpoint spent for nothing.
                assert view.tenant != lease.tenant, f"{lease.lease_id} yields for {waiter} of its own tenant"

    @invariant()
    def the_earliest_timer_is_exact(self) -> None:
        """`Timers.earliest`, all `next_due` reads on an event and what `deadline_bound` gives
        pools.py, is the earliest timer entry between events: never later (a timer would not
        fire), and not earlier either."""
        timers = self.core._timers
        heads = [q[0][0] for q in (timers.maturing, timers.deadlines, timers.expiries) if q]
        assert timers.earliest == min(heads, default=math.inf), (timers.earliest, heads)

    @invariant()
    def quiescent(self) -> None:
        """Every event leaves nothing undone: a pass at the same instant decides nothing more and
        changes nothing, so a Tick at which no timer fires skips it (engine.py).

        (Checked on replays, so the core under test is not disturbed.)"""
        if not self.log:
            return
        after = []
        for forced in (False, True):
            replay = Core(self.policy)
            for now, ev in self.log:
                replay.handle(ev, now)
            replay._pass_owed = forced  # True: the Tick runs the pass it would skip
            more = replay.handle(Tick(), self.log[-1][0])  # the instant of the last event: no timer due
            assert not more, more
            after.append(replay.export_records())
        assert after[0] == after[1], "a pass after the event's own changes nothing"

    def teardown(self) -> None:
        replay = Core(self.policy)
        for (now, ev), want in zip(self.log, self.decisions, strict=True):
            assert replay.handle(ev, now) == want, "replaying the same events gives the same decisions"


CoreMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestCoreMachine = CoreMachine.TestCase


class ShortWindowMachine(CoreMachine):
    """The same invariants with a share window of 4 s (spec.fairness.shareWindowSeconds): steps of
    up to 10 s make age, not share, order most waiters of tiers 3-4."""

    policy = dataclasses.replace(POLICY, fairness=dataclasses.replace(POLICY.fairness, share_window_s=4.0))


ShortWindowMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestShortWindowMachine = ShortWindowMachine.TestCase
