"""The Kubernetes manifests in deploy/ are valid YAML, name their kind and apiVersion, and agree
with the code: ports, the policy, the RBAC the actuator needs, metric names the alerts query."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from scheduler.policy.yaml_io import parse_policy
from scheduler.server.metrics import Metrics
from slots.autoscaler.metrics import AutoscalerMetrics

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
FILES = sorted(DEPLOY.glob("*.yaml"))


def docs(name: str) -> list[dict[str, Any]]:
    with open(DEPLOY / name, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def one(name: str, kind: str) -> dict[str, Any]:
    found = [d for d in docs(name) if d["kind"] == kind]
    assert len(found) == 1, f"{name}: expected one {kind}"
    return found[0]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_document_has_kind_and_api_version(path: Path) -> None:
    found = docs(path.name)
    assert found, f"{path.name} is empty"
    for d in found:
        assert isinstance(d.get("kind"), str) and d["kind"], path.name
        assert re.fullmatch(r"([a-z0-9.-]+/)?v\d+(alpha\d+|beta\d+)?", d.get("apiVersion", "")), path.name
        assert d.get("metadata", {}).get("name"), f"{path.name}: {d['kind']} has no name"


def test_the_expected_manifests_exist() -> None:
    names = {p.name for p in FILES}
    want = {"scheduler-deployment.yaml", "worker-deployment.yaml", "rbac.yaml", "prometheus-rules.yaml"}
    assert want | {"keda-scaledobject.yaml", "redis.yaml"} <= names


def test_scheduler_deployment_ports_probe_and_policy() -> None:
    dep = one("scheduler-deployment.yaml", "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": 50051, "metrics": 9464}
    assert c["readinessProbe"]["grpc"]["port"] == 50051
    assert (
        dep["spec"]["template"]["spec"]["serviceAccountName"]
        == one("rbac.yaml", "ServiceAccount")["metadata"]["name"]
    )
    svc = one("scheduler-deployment.yaml", "Service")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 50051, "metrics": 9464}
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    cm = one("scheduler-deployment.yaml", "ConfigMap")
    policy, _warnings = parse_policy(cm["data"]["policy.yaml"])  # raises on any error
    assert policy.pool.slots_per_worker == 4
    mount = c["volumeMounts"][0]["mountPath"]
    assert f"--policy={mount}/policy.yaml" in c["args"]


def test_scheduler_runs_two_replicas_on_the_redis_of_redis_yaml() -> None:
    from urllib.parse import urlsplit

    from scheduler.state.redis_store import parse_state

    dep = one("scheduler-deployment.yaml", "Deployment")
    assert dep["spec"]["replicas"] == 2
    c = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    url = parse_state(env["SLOTSCHED_STATE"]["value"])
    assert url is not None
    svc = one("redis.yaml", "Service")
    u = urlsplit(url)
    assert u.hostname == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    assert u.port == svc["spec"]["ports"][0]["port"]
    assert "--replica-id=$(POD_NAME)" in c["args"]
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # Ready = leader (gRPC health); alive = listening, so a standby is never restarted.
    assert "grpc" in c["readinessProbe"] and "grpc" not in c["livenessProbe"]
    sts = one("redis.yaml", "StatefulSet")
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    conf = one("redis.yaml", "ConfigMap")["data"]["redis.conf"].split("\n")
    assert "appendonly yes" in conf and "appendfsync always" in conf


def test_worker_deployment_uses_the_pod_name_as_worker_id() -> None:
    dep = one("worker-deployment.yaml", "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--worker-id=$(POD_NAME)" in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    cm = one("scheduler-deployment.yaml", "ConfigMap")
    policy, _ = parse_policy(cm["data"]["policy.yaml"])
    assert f"--slots={policy.pool.slots_per_worker}" in c["args"]
    # The Worker service is not open to anyone: runtimes must show their token.
    assert "--accept-token-hash=$(SLOTSCHED_RUNTIME_TOKEN_HASH)" in c["args"]
    assert (
        env["SLOTSCHED_RUNTIME_TOKEN_HASH"]["valueFrom"]["secretKeyRef"]["name"] == "slotsched-runtime-token"
    )
    # ... and the scheduler registers no in-process pool whose workers no client could reach.
    sched = one("scheduler-deployment.yaml", "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--no-static-pool" in sched["args"]


def test_rbac_grants_what_the_kubernetes_actuator_calls() -> None:
    role = one("rbac.yaml", "Role")
    grants = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    for need in [
        ("apps", "deployments/scale", "get"),
        ("apps", "deployments/scale", "patch"),
        ("", "pods", "list"),
        ("", "pods", "patch"),
        ("", "events", "create"),
    ]:
        assert need in grants, need
    binding = one("rbac.yaml", "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_keda_scaled_object_points_at_the_scheduler_grpc_port() -> None:
    so = one("keda-scaledobject.yaml", "ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert (
        so["spec"]["scaleTargetRef"]["name"]
        == one("worker-deployment.yaml", "Deployment")["metadata"]["name"]
    )
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "external"
    svc = one("scheduler-deployment.yaml", "Service")
    assert (
        trigger["metadata"]["scalerAddress"]
        == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local:50051"
    )


def test_alerts_query_metrics_that_exist() -> None:
    rule = one("prometheus-rules.yaml", "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {
        "SlotschedAtCeiling",
        "SlotschedGuaranteedTimeToSlotHigh",
        "SlotschedWorkLost",
        "SlotschedRevocations",
    } <= set(alerts)
    assert alerts["SlotschedAtCeiling"]["for"] == "10m"
    exported = set()
    for registry in (Metrics().registry, CollectorRegistry()):
        if not list(registry.collect()):
            AutoscalerMetrics(registry)
        for fam in registry.collect():
            exported |= {s.name for s in fam.samples} | {fam.name}
    # Histogram buckets and unobserved labelled counters have no samples yet: add their names.
    exported |= {
        "slotsched_time_to_slot_seconds_bucket",
        "slotsched_revocations_total",
        "slotsched_autoscaler_decisions_total",
    }
    for name, a in alerts.items():
        for metric in re.findall(r"\bslotsched_[a-z_]+", a["expr"]):
            assert metric in exported, f"{name} queries unknown metric {metric}"
    cm = one("scheduler-deployment.yaml", "ConfigMap")
    policy, _ = parse_policy(cm["data"]["policy.yaml"])
    assert f"> {policy.timing.yield_grace_s:g}" in alerts["SlotschedGuaranteedTimeToSlotHigh"]["expr"]
