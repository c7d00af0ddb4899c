"""deploy/overlays/replicas (issue 25, "pools across replicas"): three scheduler replicas under
per-pool leadership (`serve --leadership pool`) on Redis with Sentinel, running the two pools of
overlays/pools. Read from the RENDERED overlay (`kubectl kustomize`, what `kubectl apply -k`
applies): three replicas that all serve, each advertising its own pod IP, Ready on gRPC health
service "" (a live member reaching Redis, not a per-leader check), rolled one surge pod at a
time without dropping below three, one eviction at a time, spread over nodes, and a policy of
more than one pool. Every check is also run on a broken copy of the render, to show it can fail.

The overlay is not in tests/test_deploy_manifests.py's OVERLAYS (another file), so the generic
per-overlay checks of tests/test_deploy_manifests.py and tests/test_deploy_overlays.py (schemas,
secrets, grant keys, budgets, metrics, promtool) are run on it from here.

Rendering needs kubectl (skipped without it, failing under `CI`, as tests/test_deploy_manifests.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tests.test_deploy_manifests as manifests
import tests.test_deploy_overlays as overlays
from scheduler.serve import default_advertise
from scheduler.state.config import parse_state
from scheduler.state.redis_connect import parse_target
from tests.test_deploy_manifests import arg, env_of, find, one, policy_object, redis_state, render, scheduler

OVERLAY = "replicas"
DEPLOYMENT = "slotsched-scheduler"
REPLICAS = 3
HOSTNAME = "kubernetes.io/hostname"
Objs = list[dict[str, Any]]

# Session fixture of tests/test_deploy_overlays.py (finds or installs promtool), used here too.
promtool = overlays.promtool


def deployment(objs: Objs) -> dict[str, Any]:
    return one(objs, "Deployment", DEPLOYMENT)


def pod_labels(objs: Objs) -> dict[str, str]:
    return deployment(objs)["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"this test reads matchLabels only: {selector}"
    wanted: dict[str, str] = selector.get("matchLabels", {})
    return bool(wanted) and wanted.items() <= labels.items()


# --- the checks (each raises AssertionError naming what is wrong) ------------------------------


def check_three_replicas(objs: Objs) -> None:
    assert not find(objs, "StatefulSet", DEPLOYMENT), "the scheduler is base's Deployment"
    assert deployment(objs)["spec"].get("replicas") == REPLICAS, f"want {REPLICAS} replicas"


def check_pool_leadership(objs: Objs) -> None:
    args = scheduler(objs)["args"]
    assert args[0] == "serve"
    flag = arg(scheduler(objs), "--leadership")
    if flag is None and "--leadership" in args:  # `--leadership pool`, two args
        flag = args[args.index("--leadership") + 1]
    assert flag == "pool", f"--leadership is {flag!r}, not pool"


def check_sentinel_state(objs: Objs) -> None:
    c = scheduler(objs)
    # --state, or SLOTSCHED_STATE (what --state defaults to: the password stays off the command line).
    url = redis_state(objs)
    assert url is not None and url.startswith("redis+sentinel://"), f"--state is {url!r}, not Sentinel"
    assert parse_state(url) == url  # what `slotsched serve` checks at start-up
    target = parse_target(url)
    assert target.mode == "sentinel" and target.replicas >= 1 and target.sentinel_auth
    sts = one(objs, "StatefulSet", "slotsched-redis")
    svc = one(objs, "Service", sts["spec"]["serviceName"])
    ns = svc["metadata"]["namespace"]
    want = tuple(
        (f"{sts['metadata']['name']}-{i}.{svc['metadata']['name']}.{ns}.svc", 26379) for i in range(3)
    )
    assert target.hosts == want, f"the state URL names {target.hosts}, not the three sentinels"
    assert not any("REDIS_PASSWORD" in a for a in c["args"]), "the Redis password on the command line"


def check_own_pod_address(objs: Objs) -> None:
    c = scheduler(objs)
    pod_ip = env_of(c).get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    assert pod_ip == "status.podIP", "POD_IP must be the downward API's status.podIP"
    listen = arg(c, "--listen") or ""
    host, _, port = listen.rpartition(":")
    assert host == "0.0.0.0" and port == "50051", f"--listen {listen}"
    advertise = arg(c, "--advertise")
    # Unset: the server advertises $POD_IP:<listen port> (scheduler/serve.py default_advertise).
    assert advertise in (None, f"$(POD_IP):{port}"), f"--advertise {advertise} is not this pod's address"
    got = default_advertise(host, int(port), {"POD_IP": "10.244.1.7"})
    assert got == f"10.244.1.7:{port}", got
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports.get("grpc") == int(port)


def check_readiness_on_health_service_empty(objs: Objs) -> None:
    c = scheduler(objs)
    probe = c.get("readinessProbe", {})
    assert set(probe) & {"grpc", "tcpSocket", "httpGet", "exec"} == {"grpc"}, "readiness must be gRPC health"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert probe["grpc"]["port"] == ports["grpc"], f"readiness probes port {probe['grpc']['port']}"
    service = probe["grpc"].get("service", "")
    assert service == "", f"readiness probes health service {service!r}, not '' (every live replica serves)"


def check_rolling_update(objs: Objs) -> None:
    strategy = deployment(objs)["spec"].get("strategy", {})
    assert strategy.get("type") == "RollingUpdate", f"strategy {strategy}"
    rolling = strategy.get("rollingUpdate", {})
    assert rolling.get("maxUnavailable") == 0, f"maxUnavailable {rolling.get('maxUnavailable')!r}, not 0"
    assert rolling.get("maxSurge") == 1, f"maxSurge {rolling.get('maxSurge')!r}, not 1"


def check_disruption_budget(objs: Objs) -> None:
    labels = pod_labels(objs)
    budgets = [p for p in find(objs, "PodDisruptionBudget") if _matches(p["spec"]["selector"], labels)]
    assert len(budgets) == 1, f"the scheduler pods are covered by {len(budgets)} budgets"
    spec = budgets[0]["spec"]
    assert spec.get("maxUnavailable") == 1 and "minAvailable" not in spec, f"budget {spec}"
    # The budget selects the Deployment's pods and nothing else of this deploy.
    assert spec["selector"]["matchLabels"] == deployment(objs)["spec"]["selector"]["matchLabels"]
    for kind in ("Deployment", "StatefulSet"):
        for d in find(objs, kind):
            if d["metadata"]["name"] != DEPLOYMENT:
                assert not _matches(spec["selector"], d["spec"]["template"]["metadata"]["labels"])


def check_anti_affinity(objs: Objs) -> None:
    pod = deployment(objs)["spec"]["template"]["spec"]
    terms = (
        pod.get("affinity", {})
        .get("podAntiAffinity", {})
        .get("preferredDuringSchedulingIgnoredDuringExecution", [])
    )
    spreading = [
        t
        for t in terms
        if t["podAffinityTerm"].get("topologyKey") == HOSTNAME
        and _matches(t["podAffinityTerm"].get("labelSelector", {}), pod_labels(objs))
        and t.get("weight", 0) > 0
    ]
    assert spreading, (
        "no preferred podAntiAffinity on kubernetes.io/hostname against the scheduler's own pods"
    )


def check_several_pools(objs: Objs) -> None:
    assert policy_object(objs) is not None, "the policy should be overlays/pools' SchedulingPolicy"
    names = manifests.policy_of(objs).pool_names()
    assert len(names) > 1, f"the policy has pools {names}: nothing to spread over the replicas"


def check_base_security_context(objs: Objs) -> None:
    base = render("redis-sentinel")
    want_pod = deployment(base)["spec"]["template"]["spec"]["securityContext"]
    got_pod = deployment(objs)["spec"]["template"]["spec"].get("securityContext")
    assert got_pod == want_pod, f"pod securityContext {got_pod}, not base's"
    got = scheduler(objs).get("securityContext")
    assert got == scheduler(base)["securityContext"], f"container securityContext {got}, not base's"
    assert want_pod["runAsNonRoot"] is True


CHECKS: list[Callable[[Objs], None]] = [
    check_three_replicas,
    check_pool_leadership,
    check_sentinel_state,
    check_own_pod_address,
    check_readiness_on_health_service_empty,
    check_rolling_update,
    check_disruption_budget,
    check_anti_affinity,
    check_several_pools,
    check_base_security_context,
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda f: f.__name__)
def test_the_rendered_overlay_passes(check: Callable[[Objs], None]) -> None:
    check(render(OVERLAY))


# --- each check can fail: broken copies of the render --------------------------------------------


def _c(objs: Objs) -> dict[str, Any]:
    return scheduler(objs)


def _env(objs: Objs, name: str) -> dict[str, Any]:
    (e,) = [e for e in _c(objs)["env"] if e["name"] == name]
    return e


def _budget(objs: Objs) -> dict[str, Any]:
    return one(objs, "PodDisruptionBudget", DEPLOYMENT)


def _affinity_term(objs: Objs) -> dict[str, Any]:
    spec = deployment(objs)["spec"]["template"]["spec"]
    return spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]  # type: ignore[no-any-return]


def _one_pool(objs: Objs) -> None:
    obj = one(objs, "SchedulingPolicy", "cluster")
    spec = obj["spec"]
    spec["pools"] = spec["pools"][:1]
    for entry in [*spec["tenants"], *spec["access"]["workers"]]:
        entry.pop("pools", None)


def _set(d: dict[str, Any], key: str, value: Any) -> None:
    d[key] = value


BREAKS: dict[str, tuple[Callable[[Objs], None], Callable[[Objs], object]]] = {
    "two replicas": (check_three_replicas, lambda o: _set(deployment(o)["spec"], "replicas", 2)),
    "replicas left to the default": (check_three_replicas, lambda o: deployment(o)["spec"].pop("replicas")),
    "no --leadership": (check_pool_leadership, lambda o: _c(o)["args"].remove("--leadership=pool")),
    "--leadership single": (
        check_pool_leadership,
        lambda o: _set(_c(o), "args", [a.replace("=pool", "=single") for a in _c(o)["args"]]),
    ),
    "plain redis:// state": (
        check_sentinel_state,
        lambda o: _set(
            _env(o, "SLOTSCHED_STATE"), "value", "redis://:$(REDIS_PASSWORD)@slotsched-redis:6379/0"
        ),
    ),
    "memory state": (check_sentinel_state, lambda o: _c(o)["env"].remove(_env(o, "SLOTSCHED_STATE"))),
    "two sentinels named": (
        check_sentinel_state,
        lambda o: _set(
            _env(o, "SLOTSCHED_STATE"),
            "value",
            _env(o, "SLOTSCHED_STATE")["value"].replace(
                ",slotsched-redis-2.slotsched-redis.slotsched.svc:26379", ""
            ),
        ),
    ),
    "no POD_IP": (check_own_pod_address, lambda o: _c(o)["env"].remove(_env(o, "POD_IP"))),
    "POD_IP is the node's": (
        check_own_pod_address,
        lambda o: _set(_env(o, "POD_IP")["valueFrom"]["fieldRef"], "fieldPath", "status.hostIP"),
    ),
    "a fixed --advertise": (
        check_own_pod_address,
        lambda o: _c(o)["args"].append("--advertise=10.0.0.1:50051"),
    ),
    "listening on loopback": (
        check_own_pod_address,
        lambda o: _set(_c(o), "args", [a.replace("0.0.0.0:50051", "127.0.0.1:50051") for a in _c(o)["args"]]),
    ),
    "readiness on a pool's health": (
        check_readiness_on_health_service_empty,
        lambda o: _set(_c(o)["readinessProbe"]["grpc"], "service", "slotsched.pool/cpu"),
    ),
    "readiness on a TCP socket": (
        check_readiness_on_health_service_empty,
        lambda o: _set(_c(o), "readinessProbe", {"tcpSocket": {"port": 50051}}),
    ),
    "readiness on the metrics port": (
        check_readiness_on_health_service_empty,
        lambda o: _set(_c(o)["readinessProbe"]["grpc"], "port", 9464),
    ),
    "Recreate": (
        check_rolling_update,
        lambda o: _set(deployment(o)["spec"], "strategy", {"type": "Recreate"}),
    ),
    "maxUnavailable 1": (
        check_rolling_update,
        lambda o: _set(deployment(o)["spec"]["strategy"]["rollingUpdate"], "maxUnavailable", 1),
    ),
    "maxSurge 25%": (
        check_rolling_update,
        lambda o: _set(deployment(o)["spec"]["strategy"]["rollingUpdate"], "maxSurge", "25%"),
    ),
    "budget maxUnavailable 2": (
        check_disruption_budget,
        lambda o: _set(_budget(o)["spec"], "maxUnavailable", 2),
    ),
    "budget minAvailable": (
        check_disruption_budget,
        lambda o: _set(_budget(o), "spec", {"minAvailable": 2, "selector": _budget(o)["spec"]["selector"]}),
    ),
    "budget selecting other pods": (
        check_disruption_budget,
        lambda o: _set(
            _budget(o)["spec"]["selector"], "matchLabels", {"app.kubernetes.io/name": "slotsched-x"}
        ),
    ),
    "no scheduler budget": (check_disruption_budget, lambda o: o.remove(_budget(o))),
    "no anti-affinity": (
        check_anti_affinity,
        lambda o: deployment(o)["spec"]["template"]["spec"].pop("affinity"),
    ),
    "spread over zones only": (
        check_anti_affinity,
        lambda o: _set(_affinity_term(o)["podAffinityTerm"], "topologyKey", "topology.kubernetes.io/zone"),
    ),
    "anti-affinity to the workers": (
        check_anti_affinity,
        lambda o: _set(
            _affinity_term(o)["podAffinityTerm"]["labelSelector"],
            "matchLabels",
            {"app.kubernetes.io/name": "slotsched-worker"},
        ),
    ),
    "one pool": (check_several_pools, _one_pool),
    "pod securityContext dropped": (
        check_base_security_context,
        lambda o: deployment(o)["spec"]["template"]["spec"].pop("securityContext"),
    ),
    "container may escalate": (
        check_base_security_context,
        lambda o: _set(_c(o)["securityContext"], "allowPrivilegeEscalation", True),
    ),
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_each_check_catches_a_broken_render(name: str) -> None:
    check, breaking = BREAKS[name]
    objs = copy.deepcopy(render(OVERLAY))
    breaking(objs)
    with pytest.raises(AssertionError, match=CAUGHT_AS[name]):
        check(objs)


# What each check says about each broken copy: it fails for the reason it is there for.
CAUGHT_AS = {
    "two replicas": "want 3 replicas",
    "replicas left to the default": "want 3 replicas",
    "no --leadership": "--leadership is None, not pool",
    "--leadership single": "--leadership is 'single', not pool",
    "plain redis:// state": "'redis://.*not Sentinel",
    "memory state": "--state is None, not Sentinel",
    "two sentinels named": "not the three sentinels",
    "no POD_IP": "POD_IP must be",
    "POD_IP is the node's": "POD_IP must be",
    "a fixed --advertise": "--advertise 10.0.0.1:50051 is not this pod's address",
    "listening on loopback": "--listen 127.0.0.1:50051",
    "readiness on a pool's health": "health service 'slotsched.pool/cpu', not ''",
    "readiness on a TCP socket": "readiness must be gRPC health",
    "readiness on the metrics port": "readiness probes port 9464",
    "Recreate": "strategy {'type': 'Recreate'}",
    "maxUnavailable 1": "maxUnavailable 1, not 0",
    "maxSurge 25%": "maxSurge '25%', not 1",
    "budget maxUnavailable 2": "^budget .*'maxUnavailable': 2",
    "budget minAvailable": "^budget .*'minAvailable': 2",
    "budget selecting other pods": "covered by 0 budgets",
    "no scheduler budget": "covered by 0 budgets",
    "no anti-affinity": "no preferred podAntiAffinity",
    "spread over zones only": "no preferred podAntiAffinity",
    "anti-affinity to the workers": "no preferred podAntiAffinity",
    "one pool": r"pools \('cpu',\): nothing to spread",
    "pod securityContext dropped": "pod securityContext None",
    "container may escalate": "container securityContext .*'allowPrivilegeEscalation': True",
}


def test_every_check_is_broken_at_least_once() -> None:
    assert set(CAUGHT_AS) == set(BREAKS)
    assert {check for check, _ in BREAKS.values()} == set(CHECKS)


# --- composed, not copied: the pieces are those of overlays/redis-sentinel and overlays/pools ---------


def _same(a: Objs, b: Objs, kind: str, name: str) -> None:
    assert one(a, kind, name) == one(b, kind, name), f"{kind} {name} differs"


def test_redis_is_overlays_redis_sentinels_and_the_pools_are_overlays_pools() -> None:
    objs, sentinel, pools = render(OVERLAY), render("redis-sentinel"), render("pools")
    # Redis with Sentinel, unchanged; none of components/redis's single Redis is left over.
    for kind in ("StatefulSet", "Service", "Secret", "NetworkPolicy", "PodDisruptionBudget"):
        _same(objs, sentinel, kind, "slotsched-redis")
    _same(objs, sentinel, "PrometheusRule", "slotsched-state")
    (cm,) = [c for c in find(objs, "ConfigMap") if c["metadata"]["name"].startswith("slotsched-redis")]
    assert cm == one(sentinel, "ConfigMap", cm["metadata"]["name"])
    assert env_of(scheduler(objs))["SLOTSCHED_STATE"] == env_of(scheduler(sentinel))["SLOTSCHED_STATE"]
    # The pools: the same policy, worker Deployments and ScaledObjects as overlays/pools.
    _same(objs, pools, "SchedulingPolicy", "cluster")
    for name in ("slotsched-worker", "slotsched-worker-gpu"):
        _same(objs, pools, "Deployment", name)
        _same(objs, pools, "ScaledObject", name)
    # The scheduler differs from overlays/redis-sentinel's only where the replicas overlay says.
    ours, theirs = copy.deepcopy(deployment(objs)), copy.deepcopy(deployment(sentinel))
    for d in (ours, theirs):
        spec = d["spec"]
        for key in ("replicas", "strategy"):
            spec.pop(key)
        pod = spec["template"]["spec"]
        pod.pop("affinity", None)
        c = pod["containers"][0]
        c["args"] = [a for a in c["args"] if not a.startswith("--leadership")]
        c["readinessProbe"]["grpc"].setdefault("service", "")
    assert ours == theirs


def test_the_intermediate_kustomization_is_not_an_overlay() -> None:
    # pools-without-redis/ only strips components/redis from overlays/pools; it is no deploy.
    root = Path(manifests.DEPLOY) / "overlays" / OVERLAY
    assert sorted(p.name for p in root.iterdir()) == ["kustomization.yaml", "pools-without-redis"]
    assert "Not an overlay to apply" in (root / "pools-without-redis" / "kustomization.yaml").read_text()


# --- the generic per-overlay checks, on this overlay ----------------------------------------------
# Not run here: those that name the overlays they expect (one_owner_scales_the_workers,
# network_policies_admit_exactly_who_should: KEDA only in "keda"), count two pods of the image
# (pods_of_the_image_run_as_its_user: overlays/pools' gpu workers make three), want the workers'
# Service to select exactly the cpu Deployment's pods (workers_advertise_their_pod_ip_...: in
# overlays/pools it selects both pools' workers, by design) or read `spec.pool`
# (scheduler_ports_probes_and_policy, worker_identity_slots_and_tokens; also Recreate). What they
# check of the scheduler is checked above or by tests/test_pools_operate.py for the workers.

GENERIC = [
    manifests.test_every_object_has_kind_api_version_name_and_namespace,
    manifests.test_every_secret_the_pods_reference_is_generated,
    manifests.test_rbac_grants_what_the_policy_watcher_calls,
    manifests.test_kubernetes_api_access_only_for_the_autoscaler_and_the_policy_watcher,
    manifests.test_alerts_query_metrics_the_overlay_exports,
    overlays.test_every_object_passes_its_schema,
    overlays.test_workers_share_a_snapshot_store_wherever_there_can_be_more_than_one,
    overlays.test_schedulers_share_one_grant_secret_and_every_worker_verifies_grants,
    overlays.test_each_workload_has_one_disruption_budget,
    overlays.test_prometheus_operator_scrapes_the_metrics_ports,
    overlays.test_every_overlay_ships_the_dashboard,
]


@pytest.mark.parametrize("check", GENERIC, ids=lambda f: f.__name__.removeprefix("test_"))
def test_the_generic_overlay_checks_pass(check: Callable[[str], None]) -> None:
    check(OVERLAY)


def test_promtool_checks_the_alert_rules(promtool: str, tmp_path: Path) -> None:
    overlays.test_promtool_checks_the_alert_rules(OVERLAY, promtool, tmp_path)
