"""Operating many pools (issue 24): the autoscaler sizes each pool on its own demand with its own
actuator and drains within the pool; KEDA's metric is the pool its ScaledObject names (over real
gRPC); the in-process pool registers `local-<pool>-N` workers into their pools; the local and
kubernetes actuators are built per pool; deploy/overlays/pools renders and validates."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from scheduler.core.pools import Pools
from scheduler.core.types import Acquire, Decision, Event, QoS, SessionId, TenantName, WorkerAdded, WorkerId
from scheduler.policy.model import AutoscalerSpec, Policy, PoolSpec, TenantSpec
from scheduler.server.keda_service import METRIC_NAME, add_keda_servicer
from slots.actuators.base import ScaleNote, WorkerInfo, WorkerPhase
from slots.actuators.factory import actuator_from_env
from slots.actuators.local import LocalActuator
from slots.autoscaler.decision import ScaleWorkerState
from slots.autoscaler.demand import CoreMembership
from slots.autoscaler.pools import PoolAutoscalers, PoolsDemand, default_pool_name
from tests.test_keda_scaler import KedaClient, M

FAST = AutoscalerSpec(
    scale_down_stabilization_s=0.0,
    scale_up_cooldown_s=0.0,
    scale_down_cooldown_s=0.0,
    drain_timeout_s=30.0,
)


def two_pools(**gpu: Any) -> Policy:
    return Policy(
        pools=(
            PoolSpec(name="cpu", slots_per_worker=2, workers=1, min_workers=1, max_workers=6, floor=0),
            PoolSpec(
                name="gpu",
                labels=(("gpu", "true"),),
                slots_per_worker=1,
                workers=1,
                min_workers=1,
                max_workers=4,
                floor=0,
                **gpu,
            ),
        ),
        tenants=(TenantSpec("t", burstable_nominal=20, burstable_limit=20),),
        autoscaler=FAST,
    )


class PoolActuator:
    """One pool's workers in a dict; a started worker joins that pool at once."""

    def __init__(self, pool: str, slots: int, register: Callable[[str, int, str], None]) -> None:
        self.pool, self.slots, self.register = pool, slots, register
        self.workers: dict[str, WorkerPhase] = {}
        self.calls: list[tuple[str, object]] = []
        self.notes: list[ScaleNote] = []

    def adopt(self, wid: str) -> None:
        self.workers[wid] = WorkerPhase.RUNNING
        self.register(wid, self.slots, self.pool)

    def scale_to(self, n: int) -> None:
        self.calls.append(("scale_to", n))
        while len(self.workers) < n:
            self.adopt(f"{self.pool}-w{len(self.workers) + len(self.calls)}")

    def remove(self, worker_ids: list[str]) -> None:
        self.calls.append(("remove", tuple(worker_ids)))
        for wid in worker_ids:
            self.workers.pop(wid, None)

    def list(self) -> list[WorkerInfo]:
        return [WorkerInfo(w, p) for w, p in self.workers.items()]

    def poll_errors(self) -> list[str]:
        return []

    def record(self, note: ScaleNote) -> None:
        self.notes.append(note)


class World:
    """Pools of a two-pool policy, a virtual clock, one autoscaler loop and actuator per pool."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.core = Pools(policy)
        self.now = 0.0
        self.registry = CollectorRegistry()
        self.actuators: dict[str, PoolActuator] = {}

        def make(spec: PoolSpec, several: bool) -> PoolActuator:
            assert several
            a = PoolActuator(spec.name, spec.slots_per_worker, self.register)
            self.actuators[spec.name] = a
            return a

        self.auto = PoolAutoscalers(
            lambda: self.core.policy,
            self.core.describe,
            CoreMembership(self.submit),
            make,
            clock=lambda: self.now,
            registry=self.registry,
        )

    def register(self, wid: str, slots: int, pool: str) -> None:
        self.submit(WorkerAdded(WorkerId(wid), slots, pool=pool))

    def submit(self, event: Event) -> list[Decision]:
        return self.core.handle(event, self.now)

    def acquire(self, pool: str, *sids: str) -> None:
        for s in sids:
            self.submit(Acquire(SessionId(s), TenantName("t"), QoS.BURSTABLE, pool=pool))

    def states(self, pool: str) -> dict[str, str]:
        return {w.worker_id: w.state.value for w in self.core.describe(pool).workers}


def test_a_busy_pool_scales_up_while_an_idle_one_does_not() -> None:
    w = World(two_pools())
    assert list(w.auto.loops) == ["cpu", "gpu"]
    w.actuators["cpu"].adopt("cpu-0")
    w.actuators["gpu"].adopt("gpu-0")
    w.acquire("cpu", *(f"s{i}" for i in range(8)))  # 8 slots of demand: 4 cpu workers of 2
    reports = w.auto.tick(1.0)
    cpu, gpu = w.auto.loops["cpu"].last, w.auto.loops["gpu"].last
    assert cpu is not None and gpu is not None and set(reports) == {"cpu", "gpu"}
    assert cpu.decision is not None and cpu.decision.desired == 4 and cpu.asked_for == 3
    assert gpu.decision is not None and gpu.decision.desired == 1 and gpu.asked_for == 0
    assert ("scale_to", 4) in w.actuators["cpu"].calls
    assert not any(c[0] == "scale_to" for c in w.actuators["gpu"].calls)
    assert len(w.states("cpu")) == 4 and len(w.states("gpu")) == 1  # the new workers joined cpu
    assert {w.core.worker_pool(WorkerId(x)) for x in w.states("cpu")} == {"cpu"}
    # The metrics of several pools carry the pool.
    got = w.registry.get_sample_value("slotsched_autoscaler_desired_workers", {"pool": "cpu"})
    assert got == 4.0
    assert w.registry.get_sample_value("slotsched_autoscaler_desired_workers", {"pool": "gpu"}) == 1.0


def test_a_pool_sized_by_its_own_autoscaler_settings() -> None:
    # The gpu pool's own spec.pools[].autoscaler: BestEffort weighs 0 there, 0.5 elsewhere.
    w = World(two_pools(autoscaler=AutoscalerSpec(weight_best_effort=0.0)))
    w.actuators["gpu"].adopt("gpu-0")
    w.actuators["cpu"].adopt("cpu-0")
    for p in ("cpu", "gpu"):
        for i in range(4):
            w.submit(Acquire(SessionId(f"{p}-be{i}"), TenantName("t"), QoS.BEST_EFFORT, pool=p))
    w.auto.tick(1.0)
    cpu, gpu = w.auto.loops["cpu"].last, w.auto.loops["gpu"].last
    assert cpu is not None and cpu.decision is not None and gpu is not None and gpu.decision is not None
    assert gpu.decision.weighted_demand_slots == 1.0  # its one busy slot; the waiters weigh 0
    assert cpu.decision.weighted_demand_slots > gpu.decision.weighted_demand_slots


def test_drain_before_removal_stays_within_the_pool() -> None:
    w = World(two_pools())
    for i in range(3):
        w.actuators["cpu"].adopt(f"cpu-{i}")  # 3 idle cpu workers: min is 1
        w.actuators["gpu"].adopt(f"gpu-{i}")
    w.acquire("gpu", "g0", "g1", "g2")  # every gpu worker busy
    w.auto.tick(1.0)
    cpu, gpu = w.auto.loops["cpu"].last, w.auto.loops["gpu"].last
    assert cpu is not None and gpu is not None
    assert len(cpu.drained) == 2 and all(x.startswith("cpu-") for x in cpu.drained)
    assert gpu.drained == ()
    assert set(w.states("gpu").values()) == {ScaleWorkerState.READY.value}
    # Empty, the drained cpu workers are removed by the cpu pool's actuator only.
    w.now = 2.0
    w.auto.tick(2.0)
    removed = [c for c in w.actuators["cpu"].calls if c[0] == "remove"]
    assert removed and set(removed[0][1]) == set(cpu.drained)  # type: ignore[arg-type]
    assert not any(c[0] == "remove" for c in w.actuators["gpu"].calls)
    assert len(w.states("cpu")) == 1 and len(w.states("gpu")) == 3


def test_one_pool_is_one_loop_with_the_metrics_of_before_pools() -> None:
    pol = Policy(pool=PoolSpec(slots_per_worker=2, floor=0), tenants=(TenantSpec("t", burstable_limit=4),))
    registry = CollectorRegistry()
    core = Pools(pol)
    made: list[bool] = []

    def make(spec: PoolSpec, several: bool) -> PoolActuator:
        made.append(several)
        return PoolActuator("", 2, lambda wid, s, p: None)

    auto = PoolAutoscalers(lambda: pol, core.describe, CoreMembership(lambda e: []), make, registry=registry)
    assert list(auto.loops) == ["default"] and made == [False] and auto.first is auto.loops["default"]
    assert auto.first.pool is None
    auto.tick(0.0)
    assert registry.get_sample_value("slotsched_autoscaler_desired_workers") is not None


# --- KEDA per pool, over real gRPC ------------------------------------------------------------


def _keda(demand: PoolsDemand, body: Callable[[KedaClient], Any]) -> None:
    async def go() -> None:
        server = grpc.aio.server()
        add_keda_servicer(server, demand, lambda: 99)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                await body(KedaClient(ch))
        finally:
            await server.stop(None)

    asyncio.run(go())


def _ref(**md: str) -> Any:
    return M["ScaledObjectRef"](name="workers", namespace="slots", scalerMetadata=md)


def test_keda_reads_the_demand_of_the_pool_its_metadata_names() -> None:
    w = World(two_pools())
    w.actuators["cpu"].adopt("cpu-0")
    w.acquire("cpu", "a", "b", "c", "d", "e")  # cpu: 2 busy + 3 pending; gpu: nothing
    demand = PoolsDemand(w.core.describe, lambda: w.core.policy)

    async def body(c: KedaClient) -> None:
        async def metric(**md: str) -> float:
            req = M["GetMetricsRequest"](scaledObjectRef=_ref(**md), metricName=METRIC_NAME)
            got = await c.get_metrics(req, timeout=5)
            return float(got.metricValues[0].metricValueFloat)

        assert await metric(pool="cpu") == 5.0
        assert await metric(pool="gpu") == 0.0
        assert await metric() == 5.0  # no pool: the default one (no pool named default: the first)
        assert (await c.is_active(_ref(pool="cpu"), timeout=5)).result is True
        assert (await c.is_active(_ref(pool="gpu"), timeout=5)).result is False
        spec = await c.get_metric_spec(_ref(pool="gpu"), timeout=5)
        assert spec.metricSpecs[0].targetSize == 1  # the gpu pool's slots per worker
        spec = await c.get_metric_spec(_ref(pool="cpu"), timeout=5)
        assert spec.metricSpecs[0].targetSize == 2
        for call in (
            c.is_active(_ref(pool="tpu"), timeout=5),
            c.get_metric_spec(_ref(pool="tpu"), timeout=5),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "'tpu'" in (e.value.details() or "") and "pool" in (e.value.details() or "")

    _keda(demand, body)


def test_the_default_pool_is_the_one_named_default() -> None:
    pol = Policy(pools=(PoolSpec(name="a"), PoolSpec(name="default"), PoolSpec(name="b")))
    assert default_pool_name(pol) == "default"
    assert default_pool_name(Policy(pool=PoolSpec(name="solo"))) == "solo"


# --- the server: local workers per pool, KEDA per pool through the real wiring ---------------

WORKER_TOKEN, ADMIN_TOKEN, TENANT_TOKEN = "tok-worker", "tok-admin", "tok-tenant"


def _hash(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


POLICY_YAML = f"""
apiVersion: slotsched.dev/v1alpha1
kind: SchedulingPolicy
metadata: {{name: two}}
spec:
  pools:
    - {{name: cpu, slotsPerWorker: 2, workers: 2, minWorkers: 1, maxWorkers: 4, floor: 0}}
    - name: gpu
      labels: {{gpu: "true"}}
      slotsPerWorker: 1
      workers: 1
      minWorkers: 1
      maxWorkers: 2
      floor: 0
  tenants:
    - name: t
      burstable: {{nominal: 2, limit: 4}}
      tokens: ["{_hash(TENANT_TOKEN)}"]
  access:
    admins: ["{_hash(ADMIN_TOKEN)}"]
    workers:
      - tokens: ["{_hash(WORKER_TOKEN)}"]
        workerIdPrefix: "w-"
        maxSlots: 4
        pools: [cpu, gpu]
"""


def test_the_server_registers_local_workers_per_pool_and_serves_keda_per_pool(tmp_path: Path) -> None:
    from scheduler.serve import start_server

    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_YAML)

    async def go() -> None:
        running = await start_server(str(path), metrics_listen=None, autoscaler_env={})
        try:
            core = running.loop.core
            where = {
                w.worker_id: core.worker_pool(WorkerId(w.worker_id)) for w in core.describe("cpu").workers
            }
            assert where == {"local-cpu-0": "cpu", "local-cpu-1": "cpu"}
            assert [w.worker_id for w in core.describe("gpu").workers] == ["local-gpu-0"]
            assert running.autoscaler is None and running.autoscalers is None  # SLOTSCHED_AUTOSCALER off
            async with grpc.aio.insecure_channel(running.target) as ch:
                c = KedaClient(ch)
                spec = await c.get_metric_spec(_ref(pool="gpu", token=WORKER_TOKEN), timeout=5)
                assert spec.metricSpecs[0].targetSize == 1
                spec = await c.get_metric_spec(_ref(pool="cpu", token=WORKER_TOKEN), timeout=5)
                assert spec.metricSpecs[0].targetSize == 2
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await c.is_active(_ref(pool="nope", token=WORKER_TOKEN), timeout=5)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'nope'" in (
                    e.value.details() or ""
                )
        finally:
            await running.stop(0)

    asyncio.run(go())


def test_the_server_runs_one_autoscaler_loop_per_pool(tmp_path: Path) -> None:
    from scheduler.serve import start_server

    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_YAML)

    async def go() -> None:
        env = {"SLOTSCHED_AUTOSCALER": "dry-run"}
        running = await start_server(str(path), metrics_listen=None, static_pool=False, autoscaler_env=env)
        try:
            assert running.autoscalers is not None
            assert list(running.autoscalers.loops) == ["cpu", "gpu"]
            assert running.autoscaler is running.autoscalers.loops["cpu"]
            reports = running.autoscalers.tick(running.loop.now())
            assert set(reports) == {"cpu", "gpu"}
            for name, loop in running.autoscalers.loops.items():
                assert loop.pool == name and loop.last is not None and loop.last.decision is not None
            cpu = running.autoscalers.actuators["cpu"]
            gpu = running.autoscalers.actuators["gpu"]
            assert cpu is not gpu
            assert ("scale_to", 1) in cpu.calls and ("scale_to", 1) in gpu.calls  # type: ignore[attr-defined]
        finally:
            await running.stop(0)

    asyncio.run(go())


# --- actuators per pool -----------------------------------------------------------------------


def test_the_local_actuator_of_a_pool_starts_workers_that_join_it() -> None:
    a = actuator_from_env({"SLOTSCHED_AUTOSCALER": "local"}, scheduler="127.0.0.1:1", slots=1, pool="gpu")
    assert isinstance(a, LocalActuator)
    assert a.id_prefix == "worker-gpu" and a.pool == "gpu"
    argv = a.argv("worker-gpu-1")
    assert argv[-2:] == ["--pool", "gpu"] and "worker-gpu-1" in argv and "1" in argv
    templ = {
        "SLOTSCHED_AUTOSCALER": "local",
        "SLOTSCHED_WORKER_COMMAND": "run --pool={pool} --id {worker_id}",
    }
    b = actuator_from_env(templ, scheduler="x:1", slots=2, pool="cpu")
    assert isinstance(b, LocalActuator) and b.argv("w") == ["run", "--pool=cpu", "--id", "w"]
    one = actuator_from_env({"SLOTSCHED_AUTOSCALER": "local"}, scheduler="x:1", slots=2)
    assert isinstance(one, LocalActuator) and "--pool" not in one.argv("worker-1")  # as before pools


def test_the_kubernetes_actuator_of_a_pool_scales_its_own_target() -> None:
    pytest.importorskip("kubernetes")
    env = {"SLOTSCHED_AUTOSCALER": "kubernetes", "SLOTSCHED_AUTOSCALER_TARGET": "Deployment/slotsched-worker"}
    with pytest.raises(ValueError, match="pool 'gpu' has no autoscaler target"):
        actuator_from_env(env, scheduler="x:1", slots=1, pool="gpu")  # one target cannot size two pools


# --- the overlay ------------------------------------------------------------------------------


def test_the_pools_overlay_builds_and_every_object_passes_its_schema() -> None:
    from tests.test_deploy_overlays import test_every_object_passes_its_schema

    test_every_object_passes_its_schema("pools")


def test_the_pools_overlay_has_a_worker_deployment_and_a_scaled_object_per_pool() -> None:
    from tests.test_deploy_manifests import arg, find, policy_of, render

    objs = render("pools")
    policy = policy_of(objs)
    assert policy.pool_names() == ("cpu", "gpu")
    workers = {
        d["metadata"]["name"]: d
        for d in find(objs, "Deployment")
        if d["spec"]["template"]["spec"]["containers"][0]["name"] == "worker"
    }
    pool_of = {
        name: arg(d["spec"]["template"]["spec"]["containers"][0], "--pool") for name, d in workers.items()
    }
    assert pool_of == {"slotsched-worker": "cpu", "slotsched-worker-gpu": "gpu"}
    for name, d in workers.items():
        c = d["spec"]["template"]["spec"]["containers"][0]
        spec = policy.pool_spec(pool_of[name] or "")
        assert spec is not None and arg(c, "--slots") == str(spec.slots_per_worker)
        assert spec.target == f"Deployment/{name}"
        assert "replicas" not in d["spec"]  # KEDA's
        assert d["spec"]["selector"]["matchLabels"]["slotsched.dev/pool"] == spec.name
    scaled = {so["spec"]["scaleTargetRef"]["name"]: so for so in find(objs, "ScaledObject")}
    assert set(scaled) == set(workers)
    for name, so in scaled.items():
        (trigger,) = so["spec"]["triggers"]
        assert trigger["metadata"]["pool"] == pool_of[name]
        spec = policy.pool_spec(pool_of[name] or "")
        assert spec is not None and so["spec"]["maxReplicaCount"] == spec.max_workers
        assert so["spec"]["minReplicaCount"] == spec.min_workers
    for entry in policy.access.workers:
        assert set(entry.pools) == {"cpu", "gpu"}


def test_a_pool_added_live_gets_its_autoscaler_and_a_removed_one_loses_it() -> None:
    w = World(two_pools())
    closed: list[str] = []
    for name, a in w.actuators.items():
        a.close = lambda n=name: closed.append(n)  # type: ignore[attr-defined]
    tpu = PoolSpec(name="tpu", labels=(("tpu", "v5"),), slots_per_worker=4, workers=0, max_workers=3, floor=0)
    cpu = w.policy.pool_specs()[0]
    w.core.apply_policy(replace(w.policy, pools=(cpu, tpu)), w.now)
    assert list(w.auto.loops) == ["cpu", "gpu"]  # until the next reconcile (each period)
    assert w.auto.reconcile() == (["tpu"], ["gpu"])
    assert list(w.auto.loops) == ["cpu", "tpu"] and closed == ["gpu"]
    w.acquire("tpu", "t1", "t2", "t3", "t4", "t5")  # 5 slots of demand: 2 tpu workers of 4
    w.auto.tick(1.0)
    tpu_loop = w.auto.loops["tpu"].last
    assert tpu_loop is not None and tpu_loop.decision is not None and tpu_loop.decision.desired == 2
    assert ("scale_to", 2) in w.actuators["tpu"].calls
    assert {w.core.worker_pool(WorkerId(x)) for x in w.states("tpu")} == {"tpu"}
    assert w.registry.get_sample_value("slotsched_autoscaler_desired_workers", {"pool": "tpu"}) == 2.0
    assert w.auto.reconcile() == ([], [])


def test_run_starts_the_loop_of_a_pool_added_live() -> None:
    w = World(two_pools())
    w.auto.period_s = 0.01
    tpu = PoolSpec(name="tpu", slots_per_worker=4, workers=0, max_workers=3, floor=0)

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(w.auto.run(stop))
        await asyncio.sleep(0.05)
        w.core.apply_policy(replace(w.policy, pools=(*w.policy.pool_specs(), tpu)), w.now)
        for _ in range(200):
            if w.auto.loops.get("tpu") is not None and w.auto.loops["tpu"].last is not None:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(go())
    assert w.auto.loops["tpu"].last is not None  # its loop ran a tick
