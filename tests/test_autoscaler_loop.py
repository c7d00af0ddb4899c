"""The autoscaler loop around a real Core with an in-memory actuator: scale up under load, drain
then remove when load leaves (no session lost), and actuator failures kept as data."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from scheduler.core.engine import Core
from scheduler.core.types import (
    Acquire,
    Decision,
    Event,
    Granted,
    Lease,
    QoS,
    Release,
    Revoked,
    SessionId,
    SnapshotRef,
    TenantName,
    WorkerAdded,
    WorkerId,
    Yield,
    YieldCause,
    YieldRequested,
)
from scheduler.policy.model import AutoscalerSpec, Policy, PoolSpec, TenantSpec, TimingSpec
from slots.actuators.base import ScaleNote, WorkerInfo, WorkerPhase
from slots.autoscaler.demand import CoreDemand, CoreMembership, scale_input_from_pool
from slots.autoscaler.loop import Autoscaler


class FakeActuator:
    """Workers in a dict; a started worker registers with the core at once (as a real one would)."""

    def __init__(self, register: Callable[[str], None]) -> None:
        self.register = register
        self.workers: dict[str, WorkerPhase] = {}
        self.seq = 0
        self.calls: list[tuple[str, object]] = []
        self.fail_next: list[str] = []  # method names whose next call raises
        self.pending_errors: list[str] = []
        self.notes: list[ScaleNote] = []

    def _maybe_fail(self, name: str) -> None:
        if name in self.fail_next:
            self.fail_next.remove(name)
            raise RuntimeError(f"{name}: cloud quota exceeded")

    def scale_to(self, n: int) -> None:
        self.calls.append(("scale_to", n))
        self._maybe_fail("scale_to")
        while len(self.workers) < n:
            self.seq += 1
            wid = f"w{self.seq}"
            self.workers[wid] = WorkerPhase.RUNNING
            self.register(wid)

    def remove(self, worker_ids: list[str]) -> None:
        self.calls.append(("remove", tuple(worker_ids)))
        self._maybe_fail("remove")
        for wid in worker_ids:
            self.workers.pop(wid, None)

    def list(self) -> list[WorkerInfo]:
        self._maybe_fail("list")
        return [WorkerInfo(w, p) for w, p in self.workers.items()]

    def poll_errors(self) -> list[str]:
        out, self.pending_errors = self.pending_errors, []
        return out

    def record(self, note: ScaleNote) -> None:
        self.notes.append(note)


class World:
    """A Core, a virtual clock, and holders that answer yield requests (unless stubborn)."""

    def __init__(self, policy: Policy, clock: Callable[[], float] | None = None) -> None:
        self.core = Core(policy)
        self.now = 0.0
        self.leases: dict[str, Lease] = {}
        self.stubborn: set[str] = set()
        self.revoked: list[str] = []
        self.actuator = FakeActuator(lambda wid: self.submit(WorkerAdded(WorkerId(wid), 2)))
        self.registry = CollectorRegistry()
        self.auto = Autoscaler(
            CoreDemand(self.core.describe, lambda: self.core.policy),
            CoreMembership(self.submit),
            self.actuator,
            lambda: self.core.policy,
            clock=clock or (lambda: self.now),
            registry=self.registry,
        )

    def submit(self, event: Event) -> list[Decision]:
        out = self.core.handle(event, self.now)
        for d in out:
            if isinstance(d, Granted):
                self.leases[d.lease.session] = d.lease
            elif isinstance(d, Revoked):
                self.leases.pop(d.lease.session, None)
                self.revoked.append(d.lease.session)
            elif isinstance(d, YieldRequested):
                assert d.cause is YieldCause.DRAIN
        return out

    def at(self, t: float) -> None:
        self.now = t

    def acquire(self, *sids: str) -> None:
        for s in sids:
            self.submit(Acquire(SessionId(s), TenantName("t"), QoS.BURSTABLE))

    def release(self, *sids: str) -> None:
        for s in sids:
            lease = self.leases.pop(s)
            self.submit(Release(SessionId(s), lease.lease_id, lease.epoch))

    def answer_yields(self) -> None:
        """Holders asked to yield checkpoint and yield (stubborn ones never do)."""
        for lease, state in list(self.core.leases()):
            if state.value == "yielding" and lease.session not in self.stubborn:
                self.leases.pop(lease.session)
                snap = SnapshotRef(f"mem://{lease.session}/{lease.epoch}")
                self.submit(Yield(lease.session, lease.lease_id, lease.epoch, snap))

    def worker_of(self, sid: str) -> str:
        return self.leases[sid].slot.worker

    def sessions_alive(self) -> set[str]:
        """Every session the core still knows: holding or queued."""
        return {lease.session for lease, _ in self.core.leases()} | {v.session for v in self.core.queue()}


def policy(drain_timeout: float = 30.0) -> Policy:
    return Policy(
        pool=PoolSpec(slots_per_worker=2, workers=0, min_workers=1, max_workers=6, floor=0),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=10_000, min_runtime_s=10_000),
        autoscaler=AutoscalerSpec(
            scale_down_stabilization_s=60, scale_down_cooldown_s=0, drain_timeout_s=drain_timeout
        ),
        tenants=(TenantSpec("t", burstable_nominal=20, burstable_limit=20),),
    )


def loaded_world(drain_timeout: float = 30.0) -> World:
    """Load arrives: 8 sessions on a 1-worker pool; the loop scales to 4 workers, all granted."""
    w = World(policy(drain_timeout))
    r = w.auto.tick(0.0)
    assert r.asked_for == 1 and set(w.actuator.workers) == {"w1"}
    w.at(1.0)
    w.acquire(*(f"s{i}" for i in range(8)))
    assert len(w.leases) == 2
    w.at(15.0)
    r = w.auto.tick(15.0)
    assert r.decision is not None and r.decision.desired == 4 and r.asked_for == 3
    assert len(w.leases) == 8 and len(w.actuator.workers) == 4
    assert [n.direction for n in w.actuator.notes] == ["up", "up"]
    assert w.actuator.notes[-1].desired == 4 and w.actuator.notes[-1].weighted_demand_slots == 8
    return w


def test_load_arrives_scale_up_load_leaves_drain_then_remove_no_session_lost() -> None:
    w = loaded_world()
    keep = ["s0", "s7"]  # on w1 (the oldest) and on w4
    assert (w.worker_of("s0"), w.worker_of("s7")) == ("w1", "w4")
    w.at(20.0)
    w.release(*(s for s in list(w.leases) if s not in keep))

    # Within the stabilization window nothing is drained.
    w.at(30.0)
    r = w.auto.tick(30.0)
    assert r.decision is not None and r.decision.desired == 4 and r.drained == ()

    # Past the window: down to 1; idle workers first, then the busy one with the least lease work.
    w.at(100.0)
    r = w.auto.tick(100.0)
    assert r.decision is not None and r.decision.desired == 1
    assert r.drained == ("w2", "w3", "w4") and r.removed == ()
    assert w.actuator.notes[-1].direction == "down" and w.actuator.notes[-1].workers == ("w2", "w3", "w4")
    states = {v.worker_id: v.state.value for v in w.core.describe().workers}
    assert states == {"w1": "ready", "w2": "draining", "w3": "draining", "w4": "draining"}

    # s7 checkpoints and yields; it is re-queued and granted again on w1 with its snapshot.
    w.at(102.0)
    w.answer_yields()
    assert w.worker_of("s7") == "w1" and w.leases["s7"].resume_from is not None
    r = w.auto.reap(102.0)
    assert r.removed == ("w2", "w3", "w4")
    assert set(w.actuator.workers) == {"w1"}
    assert [v.worker_id for v in w.core.describe().workers] == ["w1"]
    assert w.sessions_alive() == set(keep) and w.revoked == []
    assert not w.auto.busy_draining


def test_a_holder_that_never_yields_is_revoked_at_the_drain_timeout_and_requeued() -> None:
    w = loaded_world(drain_timeout=30.0)
    w.at(20.0)
    w.release(*(s for s in list(w.leases) if s not in ("s0", "s7")))
    w.stubborn.add("s7")
    w.at(100.0)
    r = w.auto.tick(100.0)
    assert "w4" in r.drained
    w.at(110.0)
    r = w.auto.reap(110.0)
    assert "w4" not in r.removed  # still busy, timeout not reached
    w.at(130.0)
    r = w.auto.reap(130.0)  # the core revoked s7 at the deadline; the worker is empty and leaves
    assert "w4" in r.removed and "w4" not in w.actuator.workers
    assert w.revoked == ["s7"]
    assert w.worker_of("s7") == "w1"  # re-queued and granted again, not lost
    assert w.sessions_alive() == {"s0", "s7"}


def test_actuator_failures_are_reported_and_the_loop_keeps_going() -> None:
    w = World(policy())
    w.actuator.fail_next = ["scale_to", "list"]
    w.actuator.pending_errors = ["worker w9 exited with code 1"]
    r1 = w.auto.tick(0.0)
    assert any("list failed" in e and "quota exceeded" in e for e in r1.errors)
    assert "worker w9 exited with code 1" in r1.errors
    assert r1.asked_for == 0 and not w.actuator.workers
    r2 = w.auto.tick(15.0)
    assert any("scale_to(1) failed: RuntimeError" in e for e in r2.errors)
    assert not w.actuator.workers
    r3 = w.auto.tick(30.0)
    assert r3.errors == () and r3.asked_for == 1 and set(w.actuator.workers) == {"w1"}
    assert [m for _, m in w.auto.errors][:2] == [r1.errors[0], r1.errors[1]]
    assert w.registry.get_sample_value("slotsched_autoscaler_actuator_errors_total") == 3


def test_a_failed_remove_is_retried_and_the_worker_stays_draining_meanwhile() -> None:
    w = loaded_world()
    w.at(20.0)
    w.release(*list(w.leases))
    w.at(100.0)
    w.auto.tick(100.0)
    w.actuator.fail_next = ["remove"]
    r = w.auto.reap(101.0)
    assert r.removed == () and any("remove(" in e for e in r.errors)
    assert {v.state.value for v in w.core.describe().workers} == {"ready", "draining"}
    r = w.auto.reap(102.0)
    assert r.removed == ("w2", "w3", "w4") and len(w.core.describe().workers) == 1


def test_metrics_carry_the_decision() -> None:
    w = loaded_world()
    reg = w.registry
    assert reg.get_sample_value("slotsched_autoscaler_desired_workers") == 4
    up = "slotsched_autoscaler_decisions_total"
    assert reg.get_sample_value(up, {"direction": "up", "reason": "at_min"}) == 1  # from no worker
    assert reg.get_sample_value(up, {"direction": "up", "reason": "scale_up"}) == 1
    assert reg.get_sample_value("slotsched_autoscaler_at_ceiling") == 0
    assert reg.get_sample_value("slotsched_autoscaler_estimated_drain_seconds") is not None
    w.at(16.0)
    w.acquire(*(f"x{i}" for i in range(20)))  # 8 held + 20 queued = 28 slots > 6 workers x 2
    w.auto.tick(16.0)
    assert reg.get_sample_value("slotsched_autoscaler_at_ceiling") == 1


def test_scale_input_from_pool_maps_classes_and_workers() -> None:
    w = loaded_world()
    inp = scale_input_from_pool(w.core.describe(), 2, 50.0, {"w1": 3.0})
    assert inp.busy_by_class == {"guaranteed": 0, "burstable": 8, "besteffort": 0}
    assert inp.pending_by_class == {"guaranteed": 0, "burstable": 0, "besteffort": 0}
    assert [(v.worker_id, v.busy_slots, v.ready_since) for v in inp.workers][:2] == [
        ("w1", 2, 3.0),
        ("w2", 2, 50.0),
    ]


def test_run_decides_on_its_period_and_stops() -> None:
    t0 = time.monotonic()
    w = World(policy(), clock=lambda: time.monotonic() - t0)
    w.auto.period_s = 0.05

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(w.auto.run(stop))
        for _ in range(100):
            await asyncio.sleep(0.02)
            if w.actuator.workers:
                break
        w.now = time.monotonic() - t0
        w.acquire(*(f"s{i}" for i in range(6)))
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(w.actuator.workers) >= 3:
                break
        stop.set()
        await asyncio.wait_for(task, 2.0)

    asyncio.run(go())
    assert len(w.actuator.workers) == 3 and len(w.leases) == 6


def test_dry_run_only_says_what_it_would_do() -> None:
    from slots.actuators.dry_run import DryRunActuator

    core = Core(policy())
    dry = DryRunActuator()
    auto = Autoscaler(
        CoreDemand(core.describe, lambda: core.policy),
        CoreMembership(lambda ev: core.handle(ev, 0.0)),
        dry,
        lambda: core.policy,
    )
    r = auto.tick(0.0)
    assert r.errors == () and r.asked_for == 1
    assert [c[0] for c in dry.calls] == ["record", "scale_to"] and dry.calls[1] == ("scale_to", 1)
    assert core.describe().workers == ()  # nothing was started
