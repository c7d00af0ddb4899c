"""The kustomize overlays in deploy/overlays/ render, and what they render agrees with the code:
ports, probes, the policy, the RBAC the actuator needs, the metric names the alerts query, the
image's user and commands.

Every test reads the RENDERED overlays (`kubectl kustomize deploy/overlays/<name>`, what
`kubectl apply -k` applies), not the files under deploy/. Without kubectl these tests are
skipped, and under `CI` they fail instead. tests/test_deploy_overlays.py validates the rendered
objects against the Kubernetes and CRD schemas and checks reachability, snapshots, scaling,
promtool and the dashboard.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import CollectorRegistry

from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import parse_policy
from scheduler.server.metrics import Metrics
from scheduler.state.replica import StateMetrics
from slots.autoscaler.metrics import AutoscalerMetrics, DemandGauges
from slots.worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
OVERLAYS = ("dev", "redis", "keda", "autoscaler", "redis-sentinel")
IMAGE = "ghcr.io/slotsched/slotsched"
AUTOSCALER_OFF = ("", "off")


# --- rendering -------------------------------------------------------------------------------


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        message = "kubectl is not installed (Debian: apt-get install kubectl); it renders deploy/overlays"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@functools.cache
def _render(overlay: str) -> str:
    done = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"kubectl kustomize deploy/overlays/{overlay} failed:\n{done.stderr}"
    return done.stdout


def render(overlay: str) -> list[dict[str, Any]]:
    """The objects `kubectl apply -k deploy/overlays/<overlay>` would apply (a fresh copy)."""
    return [d for d in yaml.safe_load_all(_render(overlay)) if d is not None]


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(deployment: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    if name is None:
        assert len(containers) == 1, deployment["metadata"]["name"]
        return containers[0]  # type: ignore[no-any-return]
    (c,) = [c for c in containers if c["name"] == name]
    return c  # type: ignore[no-any-return]


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def scheduler(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return container(one(objs, "Deployment", "slotsched-scheduler"))


def worker(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return container(one(objs, "Deployment", "slotsched-worker"))


def arg(c: dict[str, Any], flag: str) -> str | None:
    """The value of `--flag=value` in a container's args (None if absent)."""
    values = [a.split("=", 1)[1] for a in c.get("args", []) if a.startswith(flag + "=")]
    assert len(values) <= 1, f"{flag} given twice"
    return values[0] if values else None


def expand(text: str, c: dict[str, Any], **values: str) -> str:
    """Kubernetes' $(VAR) expansion of args/env values, with `values` for fieldRef/secret vars."""
    env = env_of(c)

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in values:
            return values[name]
        e = env.get(name)
        assert e is not None, f"$({name}) names no env var of container {c['name']}"
        assert "value" in e, f"$({name}) needs a value for the test (valueFrom)"
        return expand(e["value"], c, **values)

    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, text)


def policy_object(objs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The SchedulingPolicy object the scheduler watches (--policy-source), None if it reads a file."""
    source = arg(scheduler(objs), "--policy-source")
    if source is None:
        return None
    ns, name = source.removeprefix("kubernetes://").split("/")
    assert ns == "$(POD_NAMESPACE)", source
    obj = one(objs, "SchedulingPolicy", name)
    dep = one(objs, "Deployment", "slotsched-scheduler")
    assert obj["metadata"]["namespace"] == dep["metadata"]["namespace"]
    return obj


def policy_of(objs: list[dict[str, Any]]) -> Policy:
    """The policy the scheduler reads: the SchedulingPolicy object of --policy-source, or the
    ConfigMap mounted where --policy points."""
    c = scheduler(objs)
    obj = policy_object(objs)
    if obj is not None:
        from scheduler.kube.policy_watch import policy_document
        from scheduler.policy.validate import policy_from_dict

        assert arg(c, "--policy") is None
        return policy_from_dict(policy_document(obj))[0]  # raises on any error
    path = arg(c, "--policy")
    assert path is not None
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = one(objs, "Deployment", "slotsched-scheduler")["spec"]["template"]["spec"]["volumes"]
    (vol,) = [v for v in vols if mount.get(v["name"]) == os.path.dirname(path)]
    cm = one(objs, "ConfigMap", vol["configMap"]["name"])
    policy, _warnings = parse_policy(cm["data"][os.path.basename(path)])  # raises on any error
    return policy


def autoscaler_on(objs: list[dict[str, Any]]) -> bool:
    env = env_of(scheduler(objs))
    value = env.get("SLOTSCHED_AUTOSCALER", {}).get("value", "")
    flag = arg(scheduler(objs), "--autoscaler") or ""
    return value not in AUTOSCALER_OFF or flag not in AUTOSCALER_OFF


def redis_state(objs: list[dict[str, Any]]) -> str | None:
    """The scheduler's --state (or SLOTSCHED_STATE) with the password expanded; None = memory."""
    c = scheduler(objs)
    value = arg(c, "--state") or env_of(c).get("SLOTSCHED_STATE", {}).get("value")
    if value in (None, "memory"):
        return None
    return expand(value, c, REDIS_PASSWORD="pw")


def _no_pool(pool: str) -> NoReturn:
    raise KeyError(pool)


def exported_metrics(*, state: bool, autoscaler: bool, worker_metrics: bool) -> set[str]:
    """Names the processes export, from their real registries (families and sample names)."""
    registries = [Metrics().registry]
    extra = CollectorRegistry()
    if state:
        StateMetrics(extra)
    if autoscaler:
        AutoscalerMetrics(extra)
    else:  # without the loop the scheduler exports the drain estimate and oldest waits itself
        extra.register(DemandGauges(tuple, _no_pool))  # no pools: its families, empty
    registries.append(extra)
    if worker_metrics:
        registries.append(WorkerMetrics().registry)
    names: set[str] = set()
    for registry in registries:
        for fam in registry.collect():
            names.add(fam.name)
            names |= {s.name for s in fam.samples}
            if fam.type == "histogram":
                names |= {fam.name + "_bucket", fam.name + "_count", fam.name + "_sum"}
            elif fam.type == "counter":
                names |= {fam.name + "_total", fam.name + "_created"}
    # Collectors that ask the loop at scrape time export nothing without a server: the scheduler's
    # pool gauges are named in scheduler/server/metrics.py's _pool_gauges.
    names |= {
        "slotsched_pending_sessions",
        "slotsched_held_leases",
        "slotsched_fair_share",
        "slotsched_capacity_slots",
        "slotsched_floor_slots",
        "slotsched_free_slots",
        "slotsched_tenant_weight",
        "slotsched_tenant_guaranteed_quota_slots",
        "slotsched_tenant_nominal_quota_slots",
        "slotsched_tenant_limit_slots",
    }
    return names


def metrics_of(objs: list[dict[str, Any]]) -> set[str]:
    return exported_metrics(
        state=redis_state(objs) is not None,
        autoscaler=autoscaler_on(objs),
        worker_metrics=arg(worker(objs), "--metrics-listen") is not None,
    )


# --- the overlays render and hold what they promise -------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_has_kind_api_version_name_and_namespace(overlay: str) -> None:
    objs = render(overlay)
    assert objs, overlay
    for d in objs:
        assert isinstance(d.get("kind"), str) and d["kind"], overlay
        assert re.fullmatch(r"([a-z0-9.-]+/)?v\d+(alpha\d+|beta\d+)?", d.get("apiVersion", "")), d
        assert d["metadata"].get("name"), f"{overlay}: a {d['kind']} has no name"
        # cluster-wide objects (a CRD is; the SchedulingPolicy objects it defines are Namespaced)
        if d["kind"] not in ("Namespace", "CustomResourceDefinition"):
            assert d["metadata"].get("namespace") == "slotsched", (overlay, d["kind"], d["metadata"]["name"])


POLICY_CRD_OVERLAYS = ["redis", "keda", "autoscaler", "redis-sentinel"]  # components/policy-crd


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_policy_is_an_object_with_its_crd_or_a_file_never_both(overlay: str) -> None:
    # deploy/policy-example.yaml (the annotated example) is never applied; the deploy's policy,
    # base/policy/policy.yaml, is either the ConfigMap's content (dev) or the one SchedulingPolicy
    # object, next to its generated CRD, that the scheduler watches.
    objs = render(overlay)
    assert {o["metadata"]["name"] for o in objs} >= {"slotsched-scheduler", "slotsched-worker"}
    policies = find(objs, "SchedulingPolicy")
    if overlay not in POLICY_CRD_OVERLAYS:
        assert not policies and not find(objs, "CustomResourceDefinition")
        return
    (obj,) = policies
    assert obj is policy_object(objs)
    (crd,) = find(objs, "CustomResourceDefinition")
    from scheduler.policy.crd import crd as generated

    assert crd["spec"] == generated()["spec"]
    deploy_policy = yaml.safe_load((DEPLOY / "base" / "policy" / "policy.yaml").read_text())
    assert obj["spec"] == deploy_policy["spec"]
    assert not find(objs, "ConfigMap", "slotsched-policy")  # a policy edit rolls no pod
    pod = one(objs, "Deployment", "slotsched-scheduler")["spec"]["template"]["spec"]
    assert "policy" not in {v["name"] for v in pod["volumes"]}


@pytest.mark.parametrize("overlay", POLICY_CRD_OVERLAYS)
def test_rbac_grants_what_the_policy_watcher_calls(overlay: str) -> None:
    objs = render(overlay)
    role = one(objs, "Role", "slotsched-policy")
    grants = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert grants == {("slotsched.dev", "schedulingpolicies", v) for v in ("get", "list", "watch")} | {
        ("slotsched.dev", "schedulingpolicies/status", v) for v in ("get", "patch", "update")
    }
    binding = one(objs, "RoleBinding", "slotsched-policy")
    assert binding["roleRef"]["name"] == "slotsched-policy"
    (subject,) = binding["subjects"]
    sa = one(objs, "ServiceAccount")
    assert (subject["name"], subject["namespace"]) == (sa["metadata"]["name"], sa["metadata"]["namespace"])
    spec = one(objs, "Deployment", "slotsched-scheduler")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True
    pod_namespace = env_of(scheduler(objs))["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert pod_namespace == "metadata.namespace"  # --policy-source's $(POD_NAMESPACE)


def test_the_flat_manifests_are_gone() -> None:
    # `kubectl apply -f deploy/` must not apply a half deploy: the manifests live in base/ and
    # components/, the operator's path is `kubectl apply -k deploy/overlays/<name>`.
    # Only the example policies (issue 24 ships deploy/policy-pools-example.yaml by that path).
    assert sorted(p.name for p in DEPLOY.glob("*.yaml")) == [
        "policy-budgets-example.yaml",
        "policy-example.yaml",
        "policy-pools-example.yaml",
    ]
    # pools has two worker Deployments (one per pool): tests/test_pools_operate.py validates it;
    # replicas (per-pool leadership over three replicas): tests/test_deploy_replicas.py.
    assert {p.name for p in (DEPLOY / "overlays").iterdir()} == {*OVERLAYS, "pools", "replicas"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scheduler_ports_probes_and_policy(overlay: str) -> None:
    objs = render(overlay)
    dep = one(objs, "Deployment", "slotsched-scheduler")
    c = scheduler(objs)
    assert c["args"][0] == "serve"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": 50051, "metrics": 9464}
    assert arg(c, "--listen") == "0.0.0.0:50051" and arg(c, "--metrics-listen") == "0.0.0.0:9464"
    assert c["readinessProbe"]["grpc"]["port"] == 50051
    # Ready = leader (gRPC health); alive = listening, so a standby is never restarted.
    assert "grpc" not in c["livenessProbe"] and c["livenessProbe"]["tcpSocket"]["port"] == 50051
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    sa = one(objs, "ServiceAccount")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    svc = one(objs, "Service", "slotsched-scheduler")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 50051, "metrics": 9464}
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert policy_of(objs).pool.slots_per_worker == 4
    # ... and the scheduler registers no in-process pool whose workers no client could reach.
    assert "--no-static-pool" in c["args"]
    assert "--replica-id=$(POD_NAME)" in c["args"]
    assert env_of(c)["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_dev_runs_one_scheduler_in_memory() -> None:
    objs = render("dev")
    assert one(objs, "Deployment", "slotsched-scheduler")["spec"]["replicas"] == 1
    assert redis_state(objs) is None
    assert not find(objs, "StatefulSet")


@pytest.mark.parametrize("overlay", ["redis", "keda", "autoscaler"])
def test_two_schedulers_on_a_redis_with_aof_and_a_password(overlay: str) -> None:
    from scheduler.state.config import parse_state

    objs = render(overlay)
    assert one(objs, "Deployment", "slotsched-scheduler")["spec"]["replicas"] == 2
    url = redis_state(objs)
    assert url is not None and parse_state(url) == url
    svc = one(objs, "Service", "slotsched-redis")
    u = urlsplit(url)
    assert u.hostname == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    assert u.port == svc["spec"]["ports"][0]["port"]
    sts = one(objs, "StatefulSet", "slotsched-redis")
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    conf = one(objs, "ConfigMap", "slotsched-redis")["data"]["redis.conf"].split("\n")
    assert "appendonly yes" in conf and "appendfsync always" in conf
    # Auth: Redis requires the Secret's password, and the scheduler's URL carries the same one.
    redis = container(sts)
    assert redis["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    secret_ref = env_of(redis)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert u.password == "pw"
    sched_ref = env_of(scheduler(objs))["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert sched_ref == secret_ref
    secret = one(objs, "Secret", secret_ref["name"])
    assert secret_ref["key"] in {**secret.get("data", {}), **secret.get("stringData", {})}
    # The password stays out of the scheduler's command line.
    assert not any("REDIS_PASSWORD" in a for a in scheduler(objs)["args"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_secret_the_pods_reference_is_generated(overlay: str) -> None:
    objs = render(overlay)
    secrets = {
        s["metadata"]["name"]: {**s.get("data", {}), **s.get("stringData", {})} for s in find(objs, "Secret")
    }
    refs: list[tuple[str, str | None]] = []
    for kind in ("Deployment", "StatefulSet"):
        for d in find(objs, kind):
            for c in d["spec"]["template"]["spec"]["containers"]:
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        refs.append((ref["name"], ref["key"]))
                for e in c.get("envFrom", []):
                    if "secretRef" in e:
                        refs.append((e["secretRef"]["name"], None))
    assert refs
    for name, key in refs:
        assert name in secrets, f"{overlay}: Secret {name} is referenced but not generated"
        if key is not None:
            assert key in secrets[name], f"{overlay}: Secret {name} has no key {key}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_worker_identity_slots_and_tokens(overlay: str) -> None:
    objs = render(overlay)
    c = worker(objs)
    assert c["args"][0] == "worker"
    assert arg(c, "--worker-id") == "$(POD_NAME)"
    env = env_of(c)
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert arg(c, "--slots") == str(policy_of(objs).pool.slots_per_worker)
    svc = one(objs, "Service", "slotsched-scheduler")
    assert arg(c, "--scheduler") == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:50051"
    # The Worker service is not open to anyone: runtimes must show their token.
    assert arg(c, "--accept-token-hash") == "$(SLOTSCHED_RUNTIME_TOKEN_HASH)"
    assert (
        env["SLOTSCHED_RUNTIME_TOKEN_HASH"]["valueFrom"]["secretKeyRef"]["name"] == "slotsched-runtime-token"
    )
    # The worker's own token (SLOTSCHED_TOKEN) is one the policy lists as a worker agent.
    ref = env["SLOTSCHED_TOKEN"]["valueFrom"]["secretKeyRef"]
    import base64

    from scheduler.policy.identities import hash_token

    secret = one(objs, "Secret", ref["name"])
    token = base64.b64decode(secret["data"][ref["key"]]).decode()
    (entry,) = [w for w in policy_of(objs).access.workers if hash_token(token) in w.tokens]
    # ...bound to the worker ids the Deployment's pods get (the pod name is --worker-id).
    assert entry.allows(f"{one(objs, 'Deployment', 'slotsched-worker')['metadata']['name']}-5d9c8-x7k2p")
    runtime = base64.b64decode(one(objs, "Secret", "slotsched-runtime-token")["data"]["sha256"]).decode()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", runtime)


@pytest.mark.parametrize("overlay", ["autoscaler"])
def test_rbac_grants_what_the_kubernetes_actuator_calls(overlay: str) -> None:
    objs = render(overlay)
    role = one(objs, "Role", "slotsched-autoscaler")
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
    binding = one(objs, "RoleBinding", "slotsched-autoscaler")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    sa = one(objs, "ServiceAccount")
    (subject,) = binding["subjects"]
    assert (subject["name"], subject["namespace"]) == (sa["metadata"]["name"], sa["metadata"]["namespace"])
    spec = one(objs, "Deployment", "slotsched-scheduler")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True
    env = env_of(scheduler(objs))
    assert env["SLOTSCHED_AUTOSCALER"]["value"] == "kubernetes"
    assert env["SLOTSCHED_AUTOSCALER_TARGET"]["value"] == "Deployment/slotsched-worker"
    labels = one(objs, "Deployment", "slotsched-worker")["spec"]["selector"]["matchLabels"]
    assert env["SLOTSCHED_AUTOSCALER_POD_SELECTOR"]["value"] == ",".join(
        f"{k}={v}" for k, v in labels.items()
    )
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubernetes_api_access_only_for_the_autoscaler_and_the_policy_watcher(overlay: str) -> None:
    objs = render(overlay)
    want = {"slotsched-autoscaler"} if autoscaler_on(objs) else set()
    want |= {"slotsched-policy"} if policy_object(objs) is not None else set()
    assert {r["metadata"]["name"] for r in find(objs, "Role")} == want
    assert {r["metadata"]["name"] for r in find(objs, "RoleBinding")} == want
    assert not find(objs, "ClusterRole") and not find(objs, "ClusterRoleBinding")
    if want:
        return
    assert one(objs, "ServiceAccount")["automountServiceAccountToken"] is False
    assert (
        "automountServiceAccountToken"
        not in one(objs, "Deployment", "slotsched-scheduler")["spec"]["template"]["spec"]
    )


def test_keda_scaled_object_points_at_the_scheduler_grpc_port() -> None:
    objs = render("keda")
    so = one(objs, "ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert (
        so["spec"]["scaleTargetRef"]["name"]
        == one(objs, "Deployment", "slotsched-worker")["metadata"]["name"]
    )
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "external"
    svc = one(objs, "Service", "slotsched-scheduler")
    assert (
        trigger["metadata"]["scalerAddress"]
        == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local:50051"
    )
    policy = policy_of(objs)
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (
        policy.pool.min_workers,
        policy.pool.max_workers,
    )


def alerts(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for rule in find(objs, "PrometheusRule"):
        for g in rule["spec"]["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    assert r["alert"] not in found, f"alert {r['alert']} defined twice"
                    found[r["alert"]] = r
    return found


def queried_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\bslotsched_[a-z_]+", expr))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_alerts_query_metrics_the_overlay_exports(overlay: str) -> None:
    # An alert on a metric the overlay's processes never export can never fire: e.g. the
    # autoscaler's metrics exist only with SLOTSCHED_AUTOSCALER, the state metrics only on Redis.
    objs = render(overlay)
    found = alerts(objs)
    assert {"SlotschedGuaranteedTimeToSlotHigh", "SlotschedWorkLost", "SlotschedRevocations"} <= set(found)
    exported = metrics_of(objs)
    for name, a in found.items():
        text = a["expr"] + " ".join(a.get("annotations", {}).values())
        for metric in queried_metrics(text):
            assert metric in exported, f"{overlay}: alert {name} queries {metric}, which it does not export"
    policy = policy_of(objs)
    assert f"> {policy.timing.yield_grace_s:g}" in found["SlotschedGuaranteedTimeToSlotHigh"]["expr"]


def test_autoscaler_alerts_only_where_the_autoscaler_runs() -> None:
    with_it = alerts(render("autoscaler"))
    assert with_it["SlotschedAtCeiling"]["for"] == "10m"
    assert "SlotschedAutoscalerActuatorErrors" in with_it
    for overlay in ("dev", "redis", "keda"):
        assert not [a for a in alerts(render(overlay)) if "Autoscaler" in a or a == "SlotschedAtCeiling"]
    assert "SlotschedNoLeader" in alerts(render("redis")) and "SlotschedNoLeader" not in alerts(render("dev"))


# --- the image ---------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def image_user() -> tuple[int, int]:
    users = [rest for word, rest in dockerfile() if word == "USER"]
    assert users, "the Dockerfile sets no USER: the image would run as root"
    m = re.fullmatch(r"(\d+):(\d+)", users[-1])
    assert m, f"USER {users[-1]!r}: give numeric uid:gid, so runAsNonRoot can verify it"
    return int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_of_the_image_run_as_its_user(overlay: str) -> None:
    uid, gid = image_user()
    assert uid != 0
    seen = 0
    for d in render(overlay):
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = d["spec"]["template"]["spec"]
        for c in spec["containers"]:
            if not c["image"].startswith(IMAGE + ":"):
                continue
            seen += 1
            ctx = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
            assert ctx.get("runAsNonRoot") is True, (overlay, c["name"])
            assert ctx.get("runAsUser") == uid and ctx.get("runAsGroup") == gid, (overlay, c["name"])
            assert spec["securityContext"].get("fsGroup") == gid, (overlay, c["name"])
            assert ctx.get("allowPrivilegeEscalation") is False
    assert seen == 2, f"{overlay}: expected the scheduler and the worker to run {IMAGE}"


def test_image_commands_are_console_scripts_of_the_package() -> None:
    import json
    from importlib.metadata import entry_points

    from scheduler.cli import build_parser

    steps = dockerfile()
    entrypoint = json.loads(next(rest for word, rest in steps if word == "ENTRYPOINT"))
    cmd = json.loads(next(rest for word, rest in steps if word == "CMD"))
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert entrypoint == ["slotsched"]
    assert pyproject["project"]["scripts"]["slotsched"] == "scheduler.cli:main"
    (ep,) = entry_points(group="console_scripts", name="slotsched")
    assert ep.value == "scheduler.cli:main"  # what the installed package puts on PATH
    parser = build_parser()
    # The image's default command and every manifest's args parse with the real CLI: each
    # subcommand and flag exists ($(VAR)s filled with plausible values).
    parser.parse_args(cmd)
    fills = {
        "POD_NAME": "p-0",
        "POD_IP": "10.0.0.7",
        "SLOTSCHED_RUNTIME_TOKEN_HASH": "sha256:" + "0" * 64,
        "REDIS_PASSWORD": "pw",
        "POD_NAMESPACE": "slotsched",
    }
    for overlay in OVERLAYS:
        objs = render(overlay)
        for c in (scheduler(objs), worker(objs)):
            args = [expand(a, c, **fills) for a in c["args"]]
            parsed = parser.parse_args(args)
            if getattr(parsed, "policy_source", None):
                from scheduler.kube.policy_watch import parse_policy_source

                parse_policy_source(parsed.policy_source)


def test_image_python_satisfies_requires_python_and_pins_the_proto_compiler() -> None:
    from packaging.specifiers import SpecifierSet

    steps = dockerfile()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (arg_line,) = [rest for word, rest in steps if word == "ARG" and rest.startswith("PYTHON_VERSION=")]
    version = arg_line.split("=", 1)[1]
    assert version in SpecifierSet(pyproject["project"]["requires-python"])
    assert version == pyproject["tool"]["mypy"]["python_version"]  # the version the types are checked for
    froms = [rest for word, rest in steps if word == "FROM"]
    assert len(froms) >= 2, "multi-stage: a build stage and a slim runtime stage"
    assert all(f.split()[0] == "python:${PYTHON_VERSION}-slim" for f in froms)
    # The stubs are generated with the grpcio-tools the tests pin (tests/test_proto_generated.py).
    (pin,) = [
        t for t in pyproject["project"]["optional-dependencies"]["test"] if t.startswith("grpcio-tools")
    ]
    assert any(word == "RUN" and f"pip install {pin}" in rest for word, rest in steps)
    assert any(word == "RUN" and "scripts/gen_proto.py" in rest for word, rest in steps)


def _dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(negated, regex) per .dockerignore line, in Docker's syntax (`**` any depth, `!` re-include)."""
    out = []
    for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        pat = line[1:] if neg else line
        pat = pat.strip("/")
        rx = ""
        i = 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif pat.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif pat[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pat[i] == "?":
                rx, i = rx + "[^/]", i + 1
            else:
                rx, i = rx + re.escape(pat[i]), i + 1
        out.append((neg, re.compile(rx + r"(?:/.*)?")))  # a directory's pattern covers its contents
    return out


def in_build_context(path: str) -> bool:
    included = True
    for neg, rx in _dockerignore_patterns():
        if rx.fullmatch(path):
            included = neg
    return included


def test_files_the_dockerfile_copies_exist_and_reach_the_build_context() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    copies = [rest for word, rest in dockerfile() if word == "COPY" and "--from=" not in rest]
    assert copies
    for rest in copies:
        *sources, _dest = rest.split()
        for src in sources:
            path = ROOT / src
            assert path.exists(), f"COPY {src}: not in the repository"
            files = [t for t in tracked if t == src.rstrip("/") or t.startswith(src.rstrip("/") + "/")]
            assert files, f"COPY {src}: no tracked file"
            lost = [f for f in files if not in_build_context(f) and "__pycache__" not in f]
            assert not lost, f"COPY {src}: .dockerignore excludes {lost[:5]}"
    # ... and nothing the image must not carry: the repository, tests, deploy secrets.
    for f in (
        ".git/config",
        "tests/conftest.py",
        "deploy/base/secrets/worker-token.env",
        "x/__pycache__/a.pyc",
    ):
        assert not in_build_context(f), f
    # The package data setuptools installs (sample traces) is in the context too.
    assert in_build_context("scheduler/sim/samples/README.md")
