"""Recycling: a worker past spec.autoscaler.recycle is replaced gracefully — the replacement
first, then a drain whose actors resume from their snapshots — one worker at a time, with
nothing lost and capacity never below the floor; and the heartbeat that carries RSS and age."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.api.gen.slotsched.v1 import workers_pb2
from scheduler.autoscale_wiring import vitals_of
from scheduler.policy.model import AutoscalerSpec, Policy, PoolSpec, TenantSpec, TimingSpec
from scheduler.policy.yaml_io import load_policy
from scheduler.sim.recycling import run_recycle
from scheduler.sim.traces.convert import samples_dir
from scheduler.sim.workload import load_workload
from slots.autoscaler.decision import ScaleWorker, ScaleWorkerState
from slots.autoscaler.demand import CoreDemand, Vitals
from slots.autoscaler.recycle import AGE, MEMORY, pick_recycle
from tests.grpc_fixtures import ADMIN_TOKEN, Client, policy_yaml, running_server
from tests.test_autoscaler_loop import World

GIB = 2**30
SPEC = AutoscalerSpec(recycle_memory_bytes=GIB, recycle_max_age_s=3600.0)


def w(
    wid: str, rss: int = 0, started: float | None = 0.0, state: ScaleWorkerState = ScaleWorkerState.READY
) -> ScaleWorker:
    return ScaleWorker(wid, state, 0, 0.0, 0.0, rss, started)


@pytest.mark.parametrize(
    ("workers", "spec", "want"),
    [
        ((w("a", GIB // 2), w("b", GIB // 2)), SPEC, None),  # none past a threshold
        ((w("a", GIB // 2), w("b", GIB)), SPEC, ("b", MEMORY)),  # at the threshold
        ((w("a", 2 * GIB), w("b", 3 * GIB)), SPEC, ("b", MEMORY)),  # the most over first
        ((w("a", 0, -4000.0), w("b", 2 * GIB, 900.0)), SPEC, ("b", MEMORY)),  # memory before age
        ((w("a", 0, -4000.0), w("b", 0, -9000.0)), SPEC, ("b", AGE)),  # the oldest first
        ((w("a", 0, None),), SPEC, None),  # age unknown: never by age
        ((w("a", 2 * GIB, state=ScaleWorkerState.DRAINING),), SPEC, None),  # already leaving
        ((w("a", 9 * GIB, -9e9),), AutoscalerSpec(), None),  # thresholds at 0: off
    ],
)
def test_which_worker_is_recycled(
    workers: tuple[ScaleWorker, ...], spec: AutoscalerSpec, want: tuple[str, str] | None
) -> None:
    assert pick_recycle(workers, 1000.0, spec) == want


def recycle_world() -> tuple[World, dict[str, int]]:
    """Two busy workers, pinned (min = max = 2: at the floor and the ceiling), w1 leaking."""
    pol = Policy(
        pool=PoolSpec(slots_per_worker=2, workers=2, min_workers=2, max_workers=2, floor=0),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=10_000, min_runtime_s=0),
        autoscaler=AutoscalerSpec(scale_down_cooldown_s=0, recycle_memory_bytes=GIB),
        tenants=(TenantSpec("t", burstable_nominal=20, burstable_limit=20),),
    )
    world = World(pol)
    rss = {"w1": GIB // 4, "w2": GIB // 4}
    world.auto.source = CoreDemand(
        world.core.describe,
        lambda: world.core.policy,
        lambda: {wid: Vitals(n, 0.0) for wid, n in rss.items()},
    )
    world.auto.tick(0.0)
    assert set(world.actuator.workers) == {"w1", "w2"}
    world.at(1.0)
    world.acquire("s0", "s1", "s2", "s3")
    assert {world.worker_of(s) for s in world.leases} == {"w1", "w2"}
    return world, rss


def test_a_leaking_worker_is_replaced_first_then_drained_and_every_actor_resumes() -> None:
    world, rss = recycle_world()
    on_w1 = {s for s in world.leases if world.worker_of(s) == "w1"}
    rss["w1"] = 2 * GIB  # past the threshold
    world.at(15.0)
    first = world.auto.tick(15.0)
    # The replacement is asked for (the pool goes to 3 of max 2: a surge of one), w1 not drained.
    assert first.asked_for == 1 and first.recycled == () and first.drained == ()
    assert set(world.actuator.workers) == {"w1", "w2", "w3"}
    world.at(30.0)
    second = world.auto.tick(30.0)
    assert second.recycled == ("w1",) and second.drained == ("w1",)
    assert world.actuator.notes[-1].reason == "recycle" and world.actuator.notes[-1].workers == ("w1",)
    # Its actors checkpoint and yield; re-asking with their snapshots, they resume on w3.
    world.answer_yields()
    world.acquire(*sorted(on_w1))
    assert all(world.worker_of(s) == "w3" for s in on_w1)
    assert world.revoked == []
    world.at(31.0)
    gone = world.auto.reap(31.0)
    assert gone.removed == ("w1",) and set(world.actuator.workers) == {"w2", "w3"}
    rss.pop("w1")
    rss["w3"] = GIB // 4
    world.at(45.0)
    after = world.auto.tick(45.0)
    assert after.asked_for == 0 and after.recycled == ()  # one at a time, and done
    samples = {
        s.labels.get("cause"): s.value
        for m in world.registry.collect()
        if m.name == "slotsched_autoscaler_recycles"
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert samples == {"memory": 1.0}


def test_only_one_worker_at_a_time_is_recycled() -> None:
    world, rss = recycle_world()
    rss["w1"] = rss["w2"] = 2 * GIB
    world.at(15.0)
    world.auto.tick(15.0)
    world.at(30.0)
    r = world.auto.tick(30.0)
    assert r.recycled in (("w1",), ("w2",)) and r.drained == r.recycled  # the other waits its turn


def test_on_the_diurnal_sample_a_leaking_worker_is_replaced_with_nothing_lost() -> None:
    s = samples_dir()
    policy, _ = load_policy(s / "diurnal-3d-policy.yaml")
    out = run_recycle(policy, load_workload(s / "diurnal-3d.csv.xz"))
    assert out.recycled == ("e001",)
    assert out.work_lost_slot_s == 0 and out.revocations == 0
    assert out.drained_sessions > 0 and out.resumed_sessions == out.drained_sessions
    assert out.min_capacity_slots >= out.floor_slots


def test_the_heartbeat_carries_memory_and_uptime_to_the_registry() -> None:
    with running_server(policy_yaml()) as server:
        assert server.running is not None
        registry = server.running.registry

        async def go() -> None:
            async with Client(server.target, token=ADMIN_TOKEN) as admin:
                await admin.workers.Register(
                    workers_pb2.RegisterRequest(worker_id="w-rss", address="10.0.0.9:7000", slots=2),
                    metadata=admin.md,
                )
                await admin.workers.Heartbeat(
                    workers_pb2.HeartbeatRequest(worker_id="w-rss", rss_bytes=3 * GIB, uptime_seconds=120.0),
                    metadata=admin.md,
                )

        asyncio.run(go())
        entry = registry.workers["w-rss"]  # type: ignore[index]
        assert entry.rss_bytes == 3 * GIB
        assert entry.started_at is not None and entry.last_heartbeat is not None
        assert entry.last_heartbeat - entry.started_at == pytest.approx(120.0)
        # What the autoscaler's CoreDemand reads (scheduler/autoscale_wiring.py): heartbeaten only.
        assert vitals_of([registry])["w-rss"] == Vitals(3 * GIB, entry.started_at)
        assert not any(wid.startswith("local-") for wid in vitals_of([registry]))


def test_the_worker_reports_its_own_memory_and_uptime() -> None:
    from slots.worker import vitals

    assert vitals.rss_bytes() > 10 * 2**20 and vitals.uptime_s() > 0
