"""The Kubernetes actuator with the real `kubernetes` client against a small API server started
by the test: the exact requests it makes (method, path, content type, body)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from slots.actuators.base import ActuatorError, ScaleNote, WorkerPhase
from slots.actuators.kubernetes import DELETION_COST, KubernetesActuator, ScaleTarget

NS = "slots"
SELECTOR = "app=slotsched-worker"
SCALE = f"/apis/apps/v1/namespaces/{NS}/deployments/workers/scale"
STS_SCALE = f"/apis/apps/v1/namespaces/{NS}/statefulsets/workers/scale"
POOL = f"/apis/slotsched.dev/v1alpha1/namespaces/{NS}/workerpools/pool"
PODS = f"/api/v1/namespaces/{NS}/pods"
EVENTS = f"/api/v1/namespaces/{NS}/events"


def pod(name: str, phase: str = "Running", ready: bool = True, waiting: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}
    if waiting:
        status["containerStatuses"] = [
            {
                "name": "worker",
                "image": "slotsched:dev",
                "imageID": "",
                "ready": False,
                "restartCount": 5,
                "state": {"waiting": {"reason": waiting}},
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "slotsched-worker"}},
        "spec": {"containers": [{"name": "worker", "image": "slotsched:dev"}]},
        "status": status,
    }


@dataclass
class Request:
    method: str
    path: str
    content_type: str | None
    body: Any


@dataclass
class FakeApi:
    replicas: int = 3
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    pool_replicas: int = 2
    requests: list[Request] = field(default_factory=list)
    forbid: set[str] = field(default_factory=set)  # paths answered 403

    def scale(self, kind: str) -> dict[str, Any]:
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": "workers", "namespace": NS},
            "spec": {"replicas": self.replicas},
            "status": {"replicas": self.replicas, "selector": SELECTOR},
        }

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        route = path.split("?")[0]
        if route in self.forbid:
            return 403, status(403, "Forbidden", f'deployments.apps "workers" is forbidden: {method}')
        if route in (SCALE, STS_SCALE):
            if method == "PATCH":
                self.replicas = body["spec"]["replicas"]
            return 200, self.scale(route)
        if route == POOL:
            if method == "PATCH":
                self.pool_replicas = body["spec"]["replicas"]
            return 200, {
                "apiVersion": "slotsched.dev/v1alpha1",
                "kind": "WorkerPool",
                "metadata": {"name": "pool", "namespace": NS},
                "spec": {"replicas": self.pool_replicas},
            }
        if route == PODS and method == "GET":
            return 200, {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {},
                "items": list(self.pods.values()),
            }
        m = re.fullmatch(f"{PODS}/([^/]+)", route)
        if m and method == "PATCH":
            p = self.pods.get(m.group(1))
            if p is None:
                return 404, status(404, "NotFound", f'pods "{m.group(1)}" not found')
            p["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
            return 200, p
        if route == EVENTS and method == "POST":
            return 201, body
        return 404, status(404, "NotFound", f"no route {method} {route}")


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, client.ApiClient]]:
    fake = FakeApi(pods={n: pod(n) for n in ("workers-a", "workers-b", "workers-c")})

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            body = json.loads(raw) if raw else None
            fake.requests.append(Request(self.command, self.path, self.headers.get("Content-Type"), body))
            code, out = fake.handle(self.command, self.path, body)
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    api_client = client.ApiClient(cfg)
    try:
        yield fake, api_client
    finally:
        server.shutdown()
        server.server_close()


def calls(fake: FakeApi) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in fake.requests]


def test_scale_up_patches_the_deployment_scale_subresource(api: tuple[FakeApi, client.ApiClient]) -> None:
    fake, c = api
    act = KubernetesActuator(ScaleTarget.deployment("workers", NS), api_client=c)
    act.scale_to(5)
    assert calls(fake) == [("GET", SCALE), ("PATCH", SCALE)]
    patch = fake.requests[-1]
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body == {"spec": {"replicas": 5}}
    fake.requests.clear()
    act.scale_to(4)  # never lowers the count: only remove() does, for drained pods
    assert calls(fake) == [("GET", SCALE)]


def test_remove_annotates_exactly_the_drained_pods_then_lowers_replicas(
    api: tuple[FakeApi, client.ApiClient],
) -> None:
    fake, c = api
    act = KubernetesActuator(ScaleTarget.deployment("workers", NS), api_client=c)
    act.remove(["workers-b", "workers-gone"])
    assert calls(fake) == [
        ("PATCH", f"{PODS}/workers-b"),
        ("PATCH", f"{PODS}/workers-gone"),  # 404: already gone, not counted
        ("GET", SCALE),
        ("PATCH", SCALE),
    ]
    annotate = fake.requests[0]
    assert annotate.content_type == "application/merge-patch+json"
    assert annotate.body == {"metadata": {"annotations": {DELETION_COST: "-1000"}}}
    assert DELETION_COST == "controller.kubernetes.io/pod-deletion-cost"
    assert fake.requests[-1].body == {"spec": {"replicas": 2}}
    fake.requests.clear()
    act.remove(["workers-b"])  # a retry: the pod was already scaled away, nothing is done twice
    assert fake.requests == []


def test_list_maps_pods_to_workers_and_reports_failures_once(api: tuple[FakeApi, client.ApiClient]) -> None:
    fake, c = api
    fake.pods["workers-b"] = pod("workers-b", phase="Pending", ready=False)
    fake.pods["workers-c"] = pod("workers-c", ready=False, waiting="CrashLoopBackOff")
    deleting = pod("workers-d")
    deleting["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    fake.pods["workers-d"] = deleting
    act = KubernetesActuator(ScaleTarget.deployment("workers", NS), api_client=c)
    ws = act.list()
    assert [(w.worker_id, w.phase) for w in ws] == [
        ("workers-a", WorkerPhase.RUNNING),
        ("workers-b", WorkerPhase.STARTING),
        ("workers-c", WorkerPhase.STARTING),
        ("workers-d", WorkerPhase.STOPPING),
    ]
    # The selector comes from the scale subresource, read once.
    assert calls(fake) == [("GET", SCALE), ("GET", f"{PODS}?labelSelector=app%3Dslotsched-worker")]
    assert act.poll_errors() == ["pod workers-c: a container is waiting with CrashLoopBackOff"]
    act.list()
    assert act.poll_errors() == []


def test_every_decision_becomes_an_event_with_its_numbers(api: tuple[FakeApi, client.ApiClient]) -> None:
    fake, c = api
    act = KubernetesActuator(
        ScaleTarget.deployment("workers", NS), api_client=c, clock=lambda: 1_700_000_000.0
    )
    act.record(
        ScaleNote(
            "up",
            desired=6,
            current=3,
            weighted_demand_slots=11.5,
            reason="scale_up",
            at_ceiling=False,
            estimated_drain_s=42.0,
        )
    )
    act.record(ScaleNote("down", 2, 4, 3.0, "scale_down", False, 0.0, ("workers-b", "workers-c")))
    assert calls(fake) == [("POST", EVENTS), ("POST", EVENTS)]
    up, down = (r.body for r in fake.requests)
    assert up["involvedObject"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "workers",
        "namespace": NS,
    }
    assert up["reason"] == "ScaleUp" and up["type"] == "Normal" and up["count"] == 1
    assert up["message"] == (
        "scale up: desired=6 current=3 weighted_demand_slots=11.5 reason=scale_up "
        "at_ceiling=false estimated_drain_s=42.0"
    )
    assert up["source"]["component"] == "slotsched-autoscaler"
    assert up["firstTimestamp"].startswith("2023-11-14T22:13:20")
    assert up["metadata"]["name"].startswith("workers.") and up["metadata"]["namespace"] == NS
    assert down["reason"] == "ScaleDown"
    assert "desired=2 current=4 weighted_demand_slots=3 reason=scale_down" in down["message"]
    assert down["message"].endswith("drain=workers-b,workers-c")
    assert fake.requests[0].content_type == "application/json"


def test_a_custom_resource_target_patches_spec_replicas(api: tuple[FakeApi, client.ApiClient]) -> None:
    fake, c = api
    target = ScaleTarget.custom("slotsched.dev", "v1alpha1", "workerpools", "WorkerPool", "pool", NS)
    act = KubernetesActuator(target, pod_selector=SELECTOR, api_client=c)
    act.scale_to(4)
    act.remove(["workers-a"])
    assert calls(fake) == [
        ("GET", POOL),
        ("PATCH", POOL),
        ("PATCH", f"{PODS}/workers-a"),
        ("GET", POOL),
        ("PATCH", POOL),
    ]
    assert [r.body for r in fake.requests if r.method == "PATCH" and r.path == POOL] == [
        {"spec": {"replicas": 4}},
        {"spec": {"replicas": 3}},
    ]
    act.record(ScaleNote("up", 4, 2, 7.0, "scale_up", True, 10.0))
    ev = fake.requests[-1].body
    assert (
        ev["involvedObject"]["apiVersion"] == "slotsched.dev/v1alpha1"
        and ev["involvedObject"]["kind"] == "WorkerPool"
    )
    assert ev["type"] == "Warning"  # at the ceiling


def test_a_statefulset_removes_only_its_highest_ordinals(api: tuple[FakeApi, client.ApiClient]) -> None:
    fake, c = api
    fake.pods = {f"workers-{i}": pod(f"workers-{i}") for i in range(3)}
    act = KubernetesActuator(ScaleTarget.statefulset("workers", NS), api_client=c)
    with pytest.raises(ActuatorError, match="highest ordinals") as err:
        act.remove(["workers-0"])
    assert not err.value.retry
    assert calls(fake) == [("GET", STS_SCALE)]
    act.remove(["workers-2"])
    assert fake.requests[-1].method == "PATCH" and fake.requests[-1].body == {"spec": {"replicas": 2}}


def test_http_errors_become_typed_actuator_errors(api: tuple[FakeApi, client.ApiClient]) -> None:
    fake, c = api
    fake.forbid.add(SCALE)
    act = KubernetesActuator(ScaleTarget.deployment("workers", NS), api_client=c)
    with pytest.raises(ActuatorError, match="HTTP 403") as err:
        act.scale_to(5)
    assert not err.value.retry and "forbidden" in str(err.value)


def test_targets_parse_from_text() -> None:
    from slots.actuators.factory import parse_target

    assert parse_target("Deployment/workers", NS) == ScaleTarget.deployment("workers", NS)
    assert parse_target("statefulset/w") == ScaleTarget.statefulset("w")
    assert parse_target("workerpools.slotsched.dev/v1alpha1/WorkerPool/pool", NS) == ScaleTarget.custom(
        "slotsched.dev", "v1alpha1", "workerpools", "WorkerPool", "pool", NS
    )
    with pytest.raises(ValueError, match="expected Deployment/NAME"):
        parse_target("pods/x")
