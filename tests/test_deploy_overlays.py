"""The rendered overlays (deploy/overlays/*) are valid and work as a deploy: every object passes its
schema offline (kubernetes-validate for core kinds, the vendored CRD schemas of KEDA and the
Prometheus Operator for theirs), workers are reachable and share snapshots, one owner scales the
workers, the NetworkPolicies let through exactly who should, the alert rules pass `promtool
check rules`, a real /metrics scrape passes `promtool check metrics`, and the dashboard asks
for metrics that exist.

Rendering needs kubectl, promtool comes from Debian's `prometheus` package (installed by a
fixture when missing and running as root); without them the tests are skipped, under `CI` they
fail.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import functools
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.test_deploy_manifests import (
    OVERLAYS,
    ROOT,
    arg,
    autoscaler_on,
    container,
    env_of,
    expand,
    exported_metrics,
    find,
    kubectl,
    one,
    policy_of,
    queried_metrics,
    render,
    scheduler,
    worker,
)

SCHEMAS = Path(__file__).resolve().parent / "schemas"
K8S_VERSIONS = ("1.28", "1.30", "1.37")
WORKER_DEPLOYMENT = "slotsched-worker"


def _missing(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


# --- schemas ---------------------------------------------------------------------------------


def _closed(schema: Any) -> Any:
    """The schema with additionalProperties: false wherever it lists properties and allows no
    unknown fields: the API server prunes undeclared fields silently, so a typo would vanish."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def crd_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    group, _, version = api_version.rpartition("/")
    path = SCHEMAS / f"{group}_{kind}_{version}.json"
    if not path.exists():
        return None
    schema = _closed(json.loads(path.read_text(encoding="utf-8")))
    # The CRD's metadata is `type: object`; what the API server checks of it is ObjectMeta.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema  # type: ignore[no-any-return]


def validate_crd(obj: dict[str, Any], schema: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError if `obj` breaks `schema`. No check of the schema itself:
    its Go patterns (`^(?i)...`) are not ECMA regexes, though Python's `re` reads them."""
    error = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(schema).iter_errors(obj))
    if error is not None:
        raise error


def _schemas_read_once() -> None:
    """kubernetes_validate reads and parses its schema files at every `validate()`, its large
    `_definitions.json` included (most of this test's time): read each once a run (they are the
    package's data and never change; nothing writes to what is read)."""
    from kubernetes_validate import utils

    if not hasattr(utils.schema_contents, "cache_info"):
        utils.schema_contents = functools.cache(utils.schema_contents)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_passes_its_schema(overlay: str) -> None:
    import kubernetes_validate

    _schemas_read_once()
    checked: dict[str, int] = {}
    objs = render(overlay)
    for obj in objs:
        kind = obj["kind"]
        if kind == "SchedulingPolicy":
            # Against the CRD rendered with it (generated from the validator): schema, list keys
            # and CEL rules, as the API server would check them (tests/test_policy_crd.py).
            from tests.test_policy_crd import api_server_errors

            (crd,) = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
            schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            assert api_server_errors(obj, schema) == [], f"{overlay}: {obj['metadata']['name']}"
            checked[kind] = checked.get(kind, 0) + 1
            continue
        schema = crd_schema(obj["apiVersion"], kind)
        if schema is not None:
            try:
                validate_crd(obj, schema)
            except jsonschema.ValidationError as e:
                pytest.fail(
                    f"{overlay}: {kind} {obj['metadata']['name']}: {e.message} at {list(e.absolute_path)}"
                )
            checked[kind] = checked.get(kind, 0) + 1
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                pytest.fail(
                    f"{overlay}: no schema for {obj['apiVersion']} {kind}: vendor it in tests/schemas/"
                )
            except kubernetes_validate.ValidationError as e:
                pytest.fail(
                    f"{overlay}: {kind} {obj['metadata']['name']} invalid in Kubernetes {version}: {e}"
                )
        checked[kind] = checked.get(kind, 0) + 1
    assert {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "PrometheusRule"} <= set(checked)
    assert {"ServiceMonitor", "PodMonitor"} <= set(checked)
    if overlay != "dev":  # components/policy-crd
        assert {"SchedulingPolicy", "CustomResourceDefinition"} <= set(checked)


def test_the_crd_schemas_catch_what_the_api_server_would_refuse_or_prune() -> None:
    so = copy.deepcopy(one(render("keda"), "ScaledObject"))
    schema = crd_schema(so["apiVersion"], so["kind"])
    assert schema is not None
    validate_crd(so, schema)
    so["spec"]["maxReplicaCount"] = "twenty"
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(so, schema)
    rule = copy.deepcopy(one(render("dev"), "PrometheusRule"))
    rule_schema = crd_schema(rule["apiVersion"], rule["kind"])
    assert rule_schema is not None
    rule["spec"]["groups"][0]["rules"][0]["fro"] = "5m"  # a typo the API server would drop
    with pytest.raises(jsonschema.ValidationError, match="fro"):
        validate_crd(rule, rule_schema)


# --- reachable workers, shared snapshots, one scaler ------------------------------------------


def worker_scalers(objs: list[dict[str, Any]]) -> list[str]:
    """Who sets the worker Deployment's replicas besides its manifest: KEDA, an HPA, the autoscaler."""
    found = []
    for so in find(objs, "ScaledObject"):
        ref = so["spec"]["scaleTargetRef"]
        if ref.get("kind", "Deployment") == "Deployment" and ref["name"] == WORKER_DEPLOYMENT:
            found.append("keda")
    for hpa in find(objs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        if ref["kind"] == "Deployment" and ref["name"] == WORKER_DEPLOYMENT:
            found.append("hpa")
    if autoscaler_on(objs):
        target = env_of(scheduler(objs)).get("SLOTSCHED_AUTOSCALER_TARGET", {}).get("value")
        if target == f"Deployment/{WORKER_DEPLOYMENT}":
            found.append("autoscaler")
    return found


def max_workers(objs: list[dict[str, Any]]) -> int:
    """The most worker pods the overlay can run: its replicas, or what its scaler may reach."""
    dep = one(objs, "Deployment", WORKER_DEPLOYMENT)
    most = dep["spec"].get("replicas", 1)
    for so in find(objs, "ScaledObject"):
        if so["spec"]["scaleTargetRef"]["name"] == WORKER_DEPLOYMENT:
            most = max(most, so["spec"].get("maxReplicaCount", 100))  # KEDA's default maximum
    if "autoscaler" in worker_scalers(objs):
        most = max(most, policy_of(objs).pool.max_workers)
    return int(most)


def shared_snapshot_store(objs: list[dict[str, Any]]) -> str | None:
    """Why the workers' snapshot store is shared by all of them (None if it is not)."""
    from snapshots.config import store_from_url

    c = worker(objs)
    url = expand(arg(c, "--snapshots") or "", c)
    store_from_url(url)  # raises on a URL the worker would refuse
    if url.startswith("s3://"):
        return f"S3 {url}"
    path = url.removeprefix("file://")
    spec = one(objs, "Deployment", WORKER_DEPLOYMENT)["spec"]["template"]["spec"]
    mounts = [
        m
        for m in c.get("volumeMounts", [])
        if path == m["mountPath"] or path.startswith(m["mountPath"] + "/")
    ]
    for m in mounts:
        (vol,) = [v for v in spec.get("volumes", []) if v["name"] == m["name"]]
        claim = vol.get("persistentVolumeClaim", {}).get("claimName")
        if claim:
            pvc = one(objs, "PersistentVolumeClaim", claim)
            if "ReadWriteMany" in pvc["spec"]["accessModes"]:
                return f"RWX volume {claim}"
    return None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_advertise_their_pod_ip_on_the_port_they_listen_on(overlay: str) -> None:
    objs = render(overlay)
    c = worker(objs)
    listen, advertise = arg(c, "--listen"), arg(c, "--advertise")
    assert listen and advertise, f"{overlay}: a worker without --listen/--advertise hands out 127.0.0.1"
    listen_host, _, listen_port = listen.rpartition(":")
    assert listen_host in ("0.0.0.0", "::"), f"{overlay}: --listen {listen} is not reachable from other pods"
    host, _, port = advertise.rpartition(":")
    assert port == listen_port
    # The host is the pod IP from the downward API, never a loopback or fixed address.
    assert host == "$(POD_IP)", advertise
    assert env_of(c)["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    resolved = expand(advertise, c, POD_IP="10.244.1.7").rpartition(":")[0]
    assert not ipaddress.ip_address(resolved).is_loopback
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert int(port) in ports.values()
    svc = one(objs, "Service", WORKER_DEPLOYMENT)
    assert svc["spec"]["clusterIP"] == "None", "the workers' Service must be headless"
    assert (
        svc["spec"]["selector"]
        == one(objs, "Deployment", WORKER_DEPLOYMENT)["spec"]["selector"]["matchLabels"]
    )
    (svc_port,) = svc["spec"]["ports"]
    assert ports[svc_port["targetPort"]] == int(port)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_share_a_snapshot_store_wherever_there_can_be_more_than_one(overlay: str) -> None:
    objs = render(overlay)
    if max_workers(objs) > 1:
        assert shared_snapshot_store(objs), f"{overlay}: {max_workers(objs)} workers, pod-local snapshots"
        c = worker(objs)
        if expand(arg(c, "--snapshots") or "", c).startswith("s3://"):
            # Credentials from the boto3 chain: the Secret's keys (or a workload identity).
            (ref,) = [e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e]
            keys = set(one(objs, "Secret", ref)["data"])
            assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= keys
    else:
        assert overlay == "dev"
    assert (max_workers(render("dev")), max_workers(render("redis"))) == (1, 2)


def test_a_pod_local_store_with_two_workers_is_caught() -> None:
    objs = copy.deepcopy(render("redis"))
    c = worker(objs)
    for e in c["env"]:
        if e["name"] == "SLOTSCHED_SNAPSHOTS":
            e["value"] = "file:///var/lib/slotsched/snapshots"
    assert max_workers(objs) == 2 and shared_snapshot_store(objs) is None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_owner_scales_the_workers(overlay: str) -> None:
    objs = render(overlay)
    scalers = worker_scalers(objs)
    want = {"dev": [], "redis": [], "keda": ["keda"], "autoscaler": ["autoscaler"], "redis-sentinel": []}
    assert scalers == want[overlay]
    dep = one(objs, "Deployment", WORKER_DEPLOYMENT)
    # A scaled Deployment leaves replicas to its scaler, so `kubectl apply` does not reset them.
    assert ("replicas" in dep["spec"]) == (not scalers)


def test_turning_both_on_is_caught() -> None:
    objs = copy.deepcopy(render("keda"))
    scheduler(objs)["env"] += [
        {"name": "SLOTSCHED_AUTOSCALER", "value": "kubernetes"},
        {"name": "SLOTSCHED_AUTOSCALER_TARGET", "value": f"Deployment/{WORKER_DEPLOYMENT}"},
    ]
    assert worker_scalers(objs) == ["keda", "autoscaler"]


# --- KEDA's credential ------------------------------------------------------------------------

POLICY_FILE = Path(__file__).resolve().parents[1] / "deploy" / "base" / "policy" / "policy.yaml"


def _env_values(objs: list[dict[str, Any]], c: dict[str, Any]) -> dict[str, str]:
    """A container's literal and Secret-sourced env vars, resolved from the rendered Secrets."""
    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            data = one(objs, "Secret", ref["name"])["data"]  # one the overlay generates
            env[e["name"]] = base64.b64decode(data[ref["key"]]).decode()
    return env


def keda_scaler_metadata(objs: list[dict[str, Any]]) -> dict[str, str]:
    """The ScaledObjectRef.scalerMetadata KEDA sends the scheduler for the worker trigger, as
    KEDA v2.20.2 builds it (pkg/scalers/external_scaler.go, parseExternalScalerMetadata): the
    trigger's metadata, each `<key>FromEnv` value replaced by that env var of the target's
    container (dropped if unset). A TriggerAuthentication's params are not forwarded."""
    so = one(objs, "ScaledObject", WORKER_DEPLOYMENT)
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] in ("external", "external-push")
    ref = so["spec"]["scaleTargetRef"]
    env = _env_values(
        objs, container(one(objs, "Deployment", ref["name"]), ref.get("envSourceContainerName"))
    )
    out: dict[str, str] = {}
    for key, value in trigger["metadata"].items():
        if not key.endswith("FromEnv"):
            out[key] = value
        elif env.get(value):
            out[key] = env[value]
    return out


def test_keda_presents_a_token_of_its_own_with_the_worker_role_only() -> None:
    from scheduler.policy.identities import identity_for_token
    from scheduler.policy.model import WORKER
    from scheduler.policy.yaml_io import parse_policy

    objs = render("keda")
    md = keda_scaler_metadata(objs)
    token = md.get("token") or md.get("tokenFromEnv")  # what keda_service.py reads
    assert token, "KEDA would call the scaler with no credential: refused with a policy"
    assert "token" not in one(objs, "ScaledObject", WORKER_DEPLOYMENT)["spec"]["triggers"][0]["metadata"], (
        "a literal token in the ScaledObject is not a secret"
    )
    # The placeholder's hash is in the policy file and in the SchedulingPolicy the scheduler reads.
    for policy in (parse_policy(POLICY_FILE.read_text(encoding="utf-8"))[0], policy_of(objs)):
        keda = identity_for_token(policy, token)
        assert keda.role == WORKER, keda.describe()  # the KEDA endpoint needs worker or admin
        # Least privilege: not the worker pods' credential, and it may act as none of them.
        pods = identity_for_token(policy, _env_values(objs, worker(objs))["SLOTSCHED_TOKEN"])
        assert pods.role == WORKER and pods.key != keda.key
        assert not keda.may_act_as("slotsched-worker-7d4b9c8f6-x2k9p")
        assert keda.worker is not None and keda.worker.max_slots == 1


def test_a_real_scheduler_with_the_deploy_policy_answers_keda() -> None:
    """The metadata KEDA would send reaches a scheduler running the deploy's policy; without
    KEDA's env resolution (the literal env var name) or without it at all, it is refused."""
    import grpc

    from scheduler.api.gen.externalscaler import externalscaler_pb2 as pb
    from scheduler.api.gen.externalscaler import externalscaler_pb2_grpc as pb_grpc
    from scheduler.serve import start_server

    objs = render("keda")
    resolved = keda_scaler_metadata(objs)
    literal = one(objs, "ScaledObject", WORKER_DEPLOYMENT)["spec"]["triggers"][0]["metadata"]
    no_token = {k: v for k, v in resolved.items() if not k.startswith("token")}

    async def main() -> dict[str, grpc.StatusCode]:
        server = await start_server(str(POLICY_FILE), "127.0.0.1:0", None)
        codes: dict[str, grpc.StatusCode] = {}
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
                stub = pb_grpc.ExternalScalerStub(ch)  # type: ignore[no-untyped-call]
                for name, md in (("resolved", resolved), ("literal", literal), ("none", no_token)):
                    ref = pb.ScaledObjectRef(name=WORKER_DEPLOYMENT, namespace="slotsched", scalerMetadata=md)
                    try:
                        spec = await stub.GetMetricSpec(ref, timeout=5)
                        assert spec.metricSpecs[0].targetSize == 4  # pool.slotsPerWorker
                        codes[name] = grpc.StatusCode.OK
                    except grpc.aio.AioRpcError as e:
                        codes[name] = e.code()
        finally:
            await server.stop(0)
        return codes

    assert asyncio.run(main()) == {
        "resolved": grpc.StatusCode.OK,
        "literal": grpc.StatusCode.PERMISSION_DENIED,
        "none": grpc.StatusCode.UNAUTHENTICATED,
    }


# --- grant keys ------------------------------------------------------------------------------

GRANT_SECRET = "slotsched-grant-keys"
SECRETS_DIR = Path(__file__).resolve().parents[1] / "deploy" / "base" / "secrets"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")


def _secret_names_used(pod_spec: dict[str, Any]) -> set[str]:
    """Every Secret a pod can read: env, envFrom and volumes, of all its containers."""
    names: set[str] = set()
    for c in pod_spec.get("initContainers", []) + pod_spec["containers"]:
        for e in c.get("env", []):
            if "secretKeyRef" in e.get("valueFrom", {}):
                names.add(e["valueFrom"]["secretKeyRef"]["name"])
        names |= {e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e}
    for v in pod_spec.get("volumes", []):
        if "secret" in v:
            names.add(v["secret"]["secretName"])
        for src in v.get("projected", {}).get("sources", []):
            if "secret" in src:
                names.add(src["secret"]["name"])
    return names


def _pod_spec(o: dict[str, Any]) -> dict[str, Any]:
    spec = o["spec"]["jobTemplate"]["spec"] if o["kind"] == "CronJob" else o["spec"]
    return spec["template"]["spec"]  # type: ignore[no-any-return]


def _worker_containers(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every container that runs `slotsched worker`, in any workload of the overlay."""
    return [
        c
        for o in objs
        if o["kind"] in WORKLOADS
        for c in _pod_spec(o)["containers"]
        if c.get("args", [])[:1] == ["worker"]
    ]


def check_grant_keys(objs: list[dict[str, Any]]) -> None:
    """Every scheduler replica makes grants from the secrets of GRANT_SECRET (the same for all,
    so lease ids and grants survive a failover), and no pod but the scheduler's can read them.
    Every worker checks grants (SLOTSCHED_VERIFY_GRANTS, as `slotsched worker` reads it) with
    the keys the scheduler hands it, and reads no public-key Secret (g1 is for an old scheduler)."""
    from scheduler.cli import build_parser
    from scheduler.cli.worker import VERIFY_GRANTS_ENV, grant_verifier
    from scheduler.grants import GRANT_KEYS_ENV, GRANT_PUBLIC_KEYS_ENV, GrantClaim, GrantKeyring

    sched = scheduler(objs)
    assert env_of(sched)[GRANT_KEYS_ENV]["valueFrom"]["secretKeyRef"] == {"name": GRANT_SECRET, "key": "keys"}
    ring = GrantKeyring.parse(_env_values(objs, sched)[GRANT_KEYS_ENV])
    workers = _worker_containers(objs)
    assert workers, "no worker container"
    for c in workers:
        env = _env_values(objs, c)
        assert GRANT_PUBLIC_KEYS_ENV not in env, "a worker is given g1 public keys"
        assert env.get(VERIFY_GRANTS_ENV) == "1", f"a worker checks no grants ({VERIFY_GRANTS_ENV} unset)"
        verifier = grant_verifier(build_parser().parse_args(c["args"]), env)
        assert verifier is not None, "a worker checks no grants"
        assert verifier.public == {}, "a worker is given g1 public keys"
        # What the worker checks, with the keys its Register/Heartbeat answers carry, is what
        # the scheduler makes.
        claim = GrantClaim("acme", "s1", "w/0#1", 1, "w", 0)
        installed = verifier.with_keys("w", ring.worker_keys("w"))
        installed.verify(ring.sign(claim, 1000.0), claim, 1000.0)
    assert not find(objs, "Secret", "slotsched-grant-public-keys"), "the g1 public-key Secret is back"
    readers = [
        o["metadata"]["name"]
        for o in objs
        if o["kind"] in WORKLOADS and GRANT_SECRET in _secret_names_used(_pod_spec(o))
    ]
    assert readers == ["slotsched-scheduler"], f"pods that can read the grant secret: {readers}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_schedulers_share_one_grant_secret_and_every_worker_verifies_grants(overlay: str) -> None:
    check_grant_keys(render(overlay))


def test_a_worker_reading_the_grant_secret_or_checking_no_grants_is_caught() -> None:
    objs = copy.deepcopy(render("redis"))
    worker(objs)["env"].append(
        {"name": "LEAK", "valueFrom": {"secretKeyRef": {"name": GRANT_SECRET, "key": "keys"}}}
    )
    with pytest.raises(AssertionError, match="can read the grant secret"):
        check_grant_keys(objs)
    for value in (None, "0"):
        objs = copy.deepcopy(render("redis"))
        env = [e for e in worker(objs)["env"] if e["name"] != "SLOTSCHED_VERIFY_GRANTS"]
        if value is not None:
            env.append({"name": "SLOTSCHED_VERIFY_GRANTS", "value": value})
        worker(objs)["env"] = env
        with pytest.raises(AssertionError, match="checks no grants"):
            check_grant_keys(objs)


def test_the_worker_reads_its_verify_grants_default_from_the_environment() -> None:
    from scheduler.cli import build_parser
    from scheduler.cli.worker import grant_verifier

    args = build_parser().parse_args(["worker", "--worker-id", "w"])
    assert grant_verifier(args, {}) is None
    for on in ("1", "true", " YES ", "on"):
        assert grant_verifier(args, {"SLOTSCHED_VERIFY_GRANTS": on}) is not None
    for off in ("", "0", "false", "no", "off"):
        assert grant_verifier(args, {"SLOTSCHED_VERIFY_GRANTS": off}) is None
    with pytest.raises(ValueError, match="SLOTSCHED_VERIFY_GRANTS"):
        grant_verifier(args, {"SLOTSCHED_VERIFY_GRANTS": "maybe"})
    flagged = build_parser().parse_args(["worker", "--worker-id", "w", "--verify-grants"])
    assert grant_verifier(flagged, {"SLOTSCHED_VERIFY_GRANTS": "0"}) is not None  # the flag wins


def test_the_placeholder_grant_key_file_parses_and_is_the_only_grant_file() -> None:
    from scheduler.grants import GrantKeyring

    ring = GrantKeyring.load(str(SECRETS_DIR / "grant-keys"))
    assert ring.kids == ("replace-me",)  # marked like the other placeholders
    assert sorted(p.name for p in SECRETS_DIR.glob("grant*")) == ["grant-keys"]


def _readme_secrets_block() -> str:
    text = (ROOT / "docs" / "operators.md").read_text(encoding="utf-8")
    step = text.split("## Deploy", 1)[1].split("**Create the tokens and Secrets.**", 1)[1]
    return textwrap.dedent(step.split("```sh\n", 1)[1].split("```", 1)[0])


def test_the_readme_secrets_block_replaces_every_placeholder(tmp_path: Path) -> None:
    """The operators guide's secrets commands, run as written on a copy of deploy/: every secrets file is
    replaced, the grant keys parse and match, and the overlays still render."""
    from scheduler.grants import GrantKeyring

    kubectl()
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    before = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "deploy").rglob("secrets/*")}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)  # `python3 -m scheduler.grants` as installed
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "KEY_ID": "AKIAEXAMPLE",
        "SECRET": "example-secret",
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _readme_secrets_block()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for rel, old in before.items():
        new = (tmp_path / rel).read_bytes()
        assert new != old and b"replace-me" not in new, f"the guide leaves the placeholder {rel}"
    secrets = tmp_path / "deploy" / "base" / "secrets"
    assert GrantKeyring.load(str(secrets / "grant-keys")).kids == ("k1",)
    rendered = subprocess.run(
        [kubectl(), "kustomize", str(tmp_path / "deploy" / "overlays" / "keda")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rendered.returncode == 0, rendered.stderr
    objs = [d for d in yaml.safe_load_all(rendered.stdout) if d is not None]
    check_grant_keys(objs)
    assert _env_values(objs, scheduler(objs))["SLOTSCHED_GRANT_KEYS"] == (secrets / "grant-keys").read_text()


# --- disruption budgets, network policies, scraping -------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_workload_has_one_disruption_budget(overlay: str) -> None:
    objs = render(overlay)
    pdbs = find(objs, "PodDisruptionBudget")
    for name in ("slotsched-scheduler", WORKER_DEPLOYMENT):
        labels = one(objs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        covering = [p for p in pdbs if p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, f"{overlay}: {name} is covered by {len(covering)} budgets"
        assert covering[0]["spec"].get("maxUnavailable") == 1
    # The scheduler's standby is never Ready (leader-only readiness): it must stay evictable.
    assert (
        one(objs, "PodDisruptionBudget", "slotsched-scheduler")["spec"]["unhealthyPodEvictionPolicy"]
        == "AlwaysAllow"
    )


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "this test reads matchLabels only"
    wanted: dict[str, str] = selector.get("matchLabels", {})
    return wanted.items() <= labels.items()


def allowed(
    objs: list[dict[str, Any]],
    to: dict[str, str],
    port: int,
    *,
    namespace: str = "slotsched",
    labels: dict[str, str],
) -> bool:
    """Would the NetworkPolicies admit a TCP connection from a pod (namespace, labels) to `to`:port?"""
    ns_labels = {"kubernetes.io/metadata.name": namespace}
    policies = [p for p in find(objs, "NetworkPolicy") if _selects(p["spec"]["podSelector"], to)]
    policies = [p for p in policies if "Ingress" in p["spec"]["policyTypes"]]
    if not policies:
        return True  # not isolated
    for p in policies:
        own_ns = p["metadata"]["namespace"]
        for rule in p["spec"].get("ingress", []):
            if rule.get("ports") and port not in [x["port"] for x in rule["ports"]]:
                continue
            for peer in rule.get("from", []):
                ns_sel = peer.get("namespaceSelector")
                ns_ok = _selects(ns_sel, ns_labels) if ns_sel is not None else namespace == own_ns
                pod_ok = _selects(peer.get("podSelector", {}), labels)
                if ns_ok and pod_ok:
                    return True
    return False


SCHEDULER = {"app.kubernetes.io/name": "slotsched-scheduler"}
WORKER = {"app.kubernetes.io/name": "slotsched-worker"}
REDIS = {"app.kubernetes.io/name": "slotsched-redis"}
RUNTIME = {"app": "agents", "slotsched.dev/client": "true"}
STRANGER = {"app": "something-else"}
PROMETHEUS = {"app.kubernetes.io/name": "prometheus"}
KEDA = {"app.kubernetes.io/name": "keda-operator"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_admit_exactly_who_should(overlay: str) -> None:
    objs = render(overlay)
    # The scheduler's gRPC port: workers and labelled runtimes, not anyone else.
    assert allowed(objs, SCHEDULER, 50051, labels=WORKER)
    assert allowed(objs, SCHEDULER, 50051, namespace="agents", labels=RUNTIME)
    assert not allowed(objs, SCHEDULER, 50051, namespace="agents", labels=STRANGER)
    assert not allowed(objs, SCHEDULER, 50051, labels=STRANGER)
    # KEDA's operator only where KEDA asks the scheduler for demand.
    assert allowed(objs, SCHEDULER, 50051, namespace="keda", labels=KEDA) == (overlay == "keda")
    # Workers: the runtimes may start actors; nobody else.
    assert allowed(objs, WORKER, 50052, namespace="agents", labels=RUNTIME)
    assert not allowed(objs, WORKER, 50052, namespace="agents", labels=STRANGER)
    # Metrics: Prometheus of the monitoring namespace only, and only the metrics ports.
    for target, port in ((SCHEDULER, 9464), (WORKER, 9465)):
        assert allowed(objs, target, port, namespace="monitoring", labels=PROMETHEUS)
        assert not allowed(objs, target, port, namespace="agents", labels=PROMETHEUS)
        assert not allowed(objs, target, port, labels=RUNTIME)
    assert not allowed(objs, SCHEDULER, 50051, namespace="monitoring", labels=PROMETHEUS)
    # Redis: the scheduler only; with Sentinel also the Redis pods themselves (replication, the
    # sentinels), on both ports.
    for sts in find(objs, "StatefulSet", "slotsched-redis"):
        ports = [
            p["containerPort"] for c in sts["spec"]["template"]["spec"]["containers"] for p in c["ports"]
        ]
        sentinel = 26379 in ports
        assert sorted(ports) == ([6379, 26379] if sentinel else [6379])
        for port in ports:
            assert allowed(objs, REDIS, port, labels=SCHEDULER)
            assert allowed(objs, REDIS, port, labels=REDIS) == sentinel
            for labels in (WORKER, STRANGER, RUNTIME, PROMETHEUS):
                assert not allowed(objs, REDIS, port, labels=labels), (port, labels)
            for ns, labels in (("agents", RUNTIME), ("agents", SCHEDULER), ("monitoring", PROMETHEUS)):
                assert not allowed(objs, REDIS, port, namespace=ns, labels=labels), (port, ns, labels)
    # Every port a pod exposes is covered by a policy that names it.
    for kind in ("Deployment", "StatefulSet"):
        for d in find(objs, kind):
            labels = d["spec"]["template"]["metadata"]["labels"]
            for c in d["spec"]["template"]["spec"]["containers"]:
                for p in c.get("ports", []):
                    covered = [
                        pol
                        for pol in find(objs, "NetworkPolicy")
                        if _selects(pol["spec"]["podSelector"], labels)
                        and any(
                            p["containerPort"] in [x["port"] for x in r.get("ports", [])]
                            for r in pol["spec"]["ingress"]
                        )
                    ]
                    assert covered, (
                        f"{overlay}: {d['metadata']['name']}:{p['containerPort']} has no NetworkPolicy"
                    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_operator_scrapes_the_metrics_ports(overlay: str) -> None:
    objs = render(overlay)
    sm = one(objs, "ServiceMonitor", "slotsched-scheduler")
    svc = [
        s for s in find(objs, "Service") if _selects(sm["spec"]["selector"], s["metadata"].get("labels", {}))
    ]
    assert [s["metadata"]["name"] for s in svc] == ["slotsched-scheduler"]
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in svc[0]["spec"]["ports"]}
    assert arg(scheduler(objs), "--metrics-listen") == "0.0.0.0:9464"
    pm = one(objs, "PodMonitor", "slotsched-worker")
    labels = one(objs, "Deployment", WORKER_DEPLOYMENT)["spec"]["template"]["metadata"]["labels"]
    assert _selects(pm["spec"]["selector"], labels)
    (pod_endpoint,) = pm["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for p in worker(objs)["ports"]}
    assert ports[pod_endpoint["port"]] == int(
        (arg(worker(objs), "--metrics-listen") or ":").rpartition(":")[2]
    )
    # The Prometheus Operator ignores prometheus.io annotations: none should suggest otherwise.
    assert "prometheus.io/" not in yaml.safe_dump_all(objs)


# --- promtool ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def promtool() -> Iterator[str]:
    path = shutil.which("promtool")
    if path is None and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"],
            capture_output=True,
            timeout=600,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        path = shutil.which("promtool")
    if path is None:
        _missing("promtool is not installed (Debian: apt-get install prometheus) and could not be installed")
    assert path is not None
    yield path


def _check_rules(promtool: str, tmp_path: Path, groups: list[dict[str, Any]], name: str) -> str:
    rules = tmp_path / f"{name}.rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False), encoding="utf-8")
    done = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"promtool check rules {name}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_promtool_checks_the_alert_rules(overlay: str, promtool: str, tmp_path: Path) -> None:
    groups = [g for r in find(render(overlay), "PrometheusRule") for g in r["spec"]["groups"]]
    assert groups
    out = _check_rules(promtool, tmp_path, groups, overlay)
    n = sum(len(g["rules"]) for g in groups)
    assert f"SUCCESS: {n} rules found" in out


def test_promtool_finds_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    groups = copy.deepcopy(one(render("dev"), "PrometheusRule")["spec"]["groups"])
    groups[0]["rules"][0]["expr"] = "sum(rate(slotsched_grants_total[5m]) > "
    with pytest.raises(AssertionError, match="promtool check rules"):
        _check_rules(promtool, tmp_path, groups, "broken")


def test_promtool_checks_a_real_metrics_scrape(promtool: str) -> None:
    from tests.grpc_fixtures import running_server

    # Dev mode (built-in policy, a static pool): the pool gauges are present.
    with running_server(None) as server, urllib.request.urlopen(server.metrics_url, timeout=10) as resp:
        text = resp.read()
    assert b"slotsched_held_leases" in text and b"slotsched_time_to_slot_seconds_bucket" in text
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert done.returncode == 0, f"promtool check metrics:\n{done.stdout.decode()}{done.stderr.decode()}"


# --- the dashboard -----------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    objs = render("dev")
    cms = [c for c in find(objs, "ConfigMap") if c["metadata"].get("labels", {}).get("grafana_dashboard")]
    assert len(cms) == 1, "one ConfigMap labelled grafana_dashboard"
    ((_, text),) = cms[0]["data"].items()
    return json.loads(text)  # type: ignore[no-any-return]


def dashboard_queries() -> dict[str, list[str]]:
    return {
        p["title"]: [t["expr"] for t in p.get("targets", [])]
        for p in dashboard()["panels"]
        if p["type"] != "row"
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_ships_the_dashboard(overlay: str) -> None:
    objs = render(overlay)
    cm = one(objs, "ConfigMap", "slotsched-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_dashboard_has_the_panels_an_operator_looks_at() -> None:
    queries = dashboard_queries()
    need = {
        "Slots held by class and tenant": ("slotsched_held_leases", ["class", "tenant"]),
        "Queue by class": ("slotsched_pending_sessions", ["class"]),
        "Time to slot by class (p50, p95, p99)": ("slotsched_time_to_slot_seconds_bucket", ["class"]),
        "Preemptions": ("slotsched_preemptions_total", ["cause"]),
        "Work lost": ("slotsched_work_lost_slot_seconds_total", []),
        "Floor headroom": ("slotsched_floor_slots", []),
        "Desired vs actual workers": ("slotsched_autoscaler_desired_workers", []),
        "Failovers and journal": ("slotsched_recoveries_total", []),
        # Per tenant, as Kueue per queue (scheduler/server/metrics.py).
        "Time to slot by tenant (p95)": ("slotsched_time_to_slot_seconds_bucket", ["tenant"]),
        "Quota use by tenant": ("slotsched_tenant_guaranteed_quota_slots", ["tenant"]),
        "Grants and refusals by tenant": ("slotsched_refusals_total", ["tenant", "reason"]),
        "Preemptions by tenant": ("slotsched_preemptions_total", ["victim_tenant", "preemptor_tenant"]),
    }
    for title, (metric, by) in need.items():
        assert title in queries, f"no panel {title!r}"
        text = " ".join(queries[title])
        assert metric in text, (title, metric)
        for label in by:
            assert label in text, (title, label)


def test_dashboard_queries_name_only_metrics_that_exist() -> None:
    exported = exported_metrics(state=True, autoscaler=True, worker_metrics=True)
    seen = set()
    for title, exprs in dashboard_queries().items():
        assert exprs, f"panel {title!r} has no query"
        for expr in exprs:
            for metric in queried_metrics(expr):
                assert metric in exported, f"panel {title!r} queries {metric}, which no registry exports"
                seen.add(metric)
    assert len(seen) >= 20


def test_dashboard_queries_parse(promtool: str, tmp_path: Path) -> None:
    # promtool parses PromQL only inside rules: each query becomes a recording rule.
    rules = [
        {"record": f"slotsched:dashboard_query:{i}", "expr": expr}
        for i, expr in enumerate(e for exprs in dashboard_queries().values() for e in exprs)
    ]
    _check_rules(promtool, tmp_path, [{"name": "dashboard", "rules": rules}], "dashboard")


def test_panels_do_not_overlap() -> None:
    cells: set[tuple[int, int]] = set()
    for p in dashboard()["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {p['title']!r} overlaps another"
                cells.add((x, y))
