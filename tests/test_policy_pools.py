"""Policies of several pools (issue 24): spec.pools, a tenant's quotas per pool, worker entries
naming their pools. Every rule in a table of good and bad documents (the error's key path
asserted), the round trip, the projection one pool's core runs under, the diff, the CRD, and the
shipped example deploy/policy-pools-example.yaml."""

from __future__ import annotations

import copy
import io
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from scheduler.cli.policy import validate_main
from scheduler.policy.diff import diff_lines, diff_policies, summary
from scheduler.policy.errors import PolicyError, Problem
from scheduler.policy.identities import hash_token
from scheduler.policy.model import DEFAULT_POOL, AutoscalerSpec, Policy, TenantPoolQuota
from scheduler.policy.schema import API_VERSION, KIND, RESTART_ONLY
from scheduler.policy.validate import policy_from_dict
from scheduler.policy.yaml_io import load_policy, parse_policy, policy_to_dict, policy_to_yaml
from tests.test_policy_crd import api_server_errors

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy" / "policy-pools-example.yaml"
TOKEN_A = hash_token("pools-a")
TOKEN_B = hash_token("pools-b")
WORKER_CPU = hash_token("pools-worker-cpu")
WORKER_GPU = hash_token("pools-worker-gpu")

Doc = dict[str, Any]
Mutation = Callable[[Doc], None]


def base() -> Doc:
    """Two pools (cpu: 4 x 2 = 8 slots, floor 2; gpu: 2 x 1 = 2 slots, floor 1), two tenants and a
    worker entry per pool; valid and without warnings."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "pools"},
        "spec": {
            "pools": [
                {
                    "name": "cpu",
                    "labels": {"template": "python", "kind": "cpu", "cpuModel": "icelake"},
                    "compatibility": ["cpuModel"],
                    "slotsPerWorker": 2,
                    "workers": 4,
                    "minWorkers": 1,
                    "maxWorkers": 8,
                    "floor": 2,
                },
                {
                    "name": "gpu",
                    "labels": {"gpu": "a100", "cpuModel": "sapphire-rapids"},
                    "compatibility": ["cpuModel"],
                    "slotsPerWorker": 1,
                    "workers": 2,
                    "minWorkers": 1,
                    "maxWorkers": 4,
                    "floor": 1,
                    "autoscaler": {"scaleUp": {"pods": 1}, "startDelaySeconds": 120},
                    "target": "Deployment/worker-gpu",
                },
            ],
            "tenants": [
                {
                    "name": "a",
                    "guaranteed": 1,
                    "burstable": {"nominal": 1, "limit": 4},
                    "tokens": [TOKEN_A],
                    "pools": [{"pool": "gpu", "guaranteed": 1, "burstableNominal": 0, "burstableLimit": 1}],
                },
                {
                    "name": "b",
                    "burstable": {"nominal": 2, "limit": 6},
                    "tokens": [TOKEN_B],
                    # no GPU at all
                    "pools": [
                        {
                            "pool": "gpu",
                            "guaranteed": 0,
                            "burstableNominal": 0,
                            "burstableLimit": 0,
                            "bestEffortLimit": 0,
                        }
                    ],
                },
            ],
            "access": {
                "workers": [
                    {"tokens": [WORKER_CPU], "workerIdPrefix": "cpu-", "pools": ["cpu"]},
                    {"tokens": [WORKER_GPU], "workerIdPrefix": "gpu-", "pools": ["gpu"]},
                ]
            },
        },
    }


def single() -> Doc:
    """A policy of one pool, written as today (`spec.pool`)."""
    doc = base()
    spec = doc["spec"]
    spec["pool"] = {"slotsPerWorker": 2, "workers": 4, "minWorkers": 1, "maxWorkers": 8, "floor": 2}
    del spec["pools"]
    for t in spec["tenants"]:
        del t["pools"]
    for w in spec["access"]["workers"][1:]:
        spec["access"]["workers"].remove(w)
    del spec["access"]["workers"][0]["pools"]
    return doc


def setter(path: str, value: object) -> Mutation:
    """A mutation that sets `path` ("spec.pools.1.name"; digits index lists, one past the end
    appends) to `value`."""

    def apply(doc: Doc) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        if last.isdigit() and int(last) == len(node):
            node.append(value)
        else:
            node[int(last) if last.isdigit() else last] = value

    return apply


def deleter(path: str) -> Mutation:
    def apply(doc: Doc) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        del node[int(last) if last.isdigit() else last]

    return apply


def both(*mutations: Mutation) -> Mutation:
    def apply(doc: Doc) -> None:
        for m in mutations:
            m(doc)

    return apply


def errors_of(doc: object) -> list[Problem]:
    with pytest.raises(PolicyError) as info:
        policy_from_dict(doc)
    return info.value.problems


def round_trips(policy: Policy) -> None:
    again, _ = policy_from_dict(policy_to_dict(policy))
    assert again == policy
    from_yaml, _ = parse_policy(yaml.dump(policy_to_dict(policy)))
    assert from_yaml == policy
    assert parse_policy(policy_to_yaml(policy))[0] == policy


# --- the table of bad documents ----------------------------------------------------------------

GPU_QUOTA = "spec.tenants.0.pools.0"

# (id, mutation, path that must carry the error, words the message must contain)
ERROR_CASES: list[tuple[str, Mutation, str, str]] = [
    # spec.pool and spec.pools
    ("pool-and-pools", setter("spec.pool", {"workers": 2}), "spec.pools", "spec.pool and spec.pools"),
    ("pools-not-a-list", setter("spec.pools", {"name": "cpu"}), "spec.pools", "expected a list of pools"),
    ("pools-empty", setter("spec.pools", []), "spec.pools", "empty"),
    ("pool-entry-not-a-mapping", setter("spec.pools.1", "gpu"), "spec.pools[1]", "expected a mapping"),
    (
        "pool-unknown-key",
        setter("spec.pools.0.slotPerWorker", 2),
        "spec.pools[0].slotPerWorker",
        "slotsPerWorker",
    ),
    # names
    ("pool-name-missing", deleter("spec.pools.1.name"), "spec.pools[1].name", "required"),
    ("pool-name-upper", setter("spec.pools.1.name", "GPU"), "spec.pools[1].name", "not a valid pool name"),
    (
        "pool-name-underscore",
        setter("spec.pools.1.name", "gpu_a"),
        "spec.pools[1].name",
        "not a valid pool name",
    ),
    (
        "pool-name-dash-end",
        setter("spec.pools.1.name", "gpu-"),
        "spec.pools[1].name",
        "not a valid pool name",
    ),
    ("pool-name-too-long", setter("spec.pools.1.name", "g" * 64), "spec.pools[1].name", "at most 63"),
    ("pool-name-type", setter("spec.pools.1.name", 7), "spec.pools[1].name", "expected a string"),
    ("pool-name-duplicate", setter("spec.pools.1.name", "cpu"), "spec.pools[1].name", "duplicate pool name"),
    # the keys of spec.pool, per entry
    ("pool-slots-zero", setter("spec.pools.1.slotsPerWorker", 0), "spec.pools[1].slotsPerWorker", ">= 1"),
    ("pool-min-above-max", setter("spec.pools.1.minWorkers", 9), "spec.pools[1].minWorkers", "greater than"),
    ("pool-workers-outside", setter("spec.pools.1.workers", 5), "spec.pools[1].workers", "outside"),
    (
        "pool-floor-above-capacity",
        setter("spec.pools.1.floor", 3),
        "spec.pools[1].floor",
        "larger than the pool",
    ),
    ("pool-floor-bad-percent", setter("spec.pools.1.floor", "half"), "spec.pools[1].floor", "bad percent"),
    ("pool-floor-percent-150", setter("spec.pools.1.floor", "150%"), "spec.pools[1].floor", "at most 100%"),
    # labels
    ("labels-not-a-mapping", setter("spec.pools.0.labels", ["gpu"]), "spec.pools[0].labels", "mapping"),
    (
        "label-value-number",
        setter("spec.pools.0.labels.gen", 3),
        "spec.pools[0].labels.gen",
        "expected a string",
    ),
    (
        "label-value-bad",
        setter("spec.pools.0.labels.kind", "c p u"),
        "spec.pools[0].labels.kind",
        "label value",
    ),
    ("label-value-too-long", setter("spec.pools.0.labels.kind", "c" * 64), "spec.pools[0].labels.kind", "63"),
    ("label-key-bad", setter("spec.pools.0.labels.-kind", "x"), "spec.pools[0].labels.-kind", "label key"),
    (
        "label-key-too-long",
        setter("spec.pools.0.labels." + "k" * 64, "x"),
        "spec.pools[0].labels." + "k" * 64,
        "63",
    ),
    (
        "label-key-bad-prefix",
        setter("spec.pools.0.labels.EXAMPLE/gpu", "x"),
        "spec.pools[0].labels.EXAMPLE/gpu",
        "prefix",
    ),
    # compatibility
    (
        "compatibility-not-a-label",
        setter("spec.pools.1.compatibility", ["gpu", "region"]),
        "spec.pools[1].compatibility[1]",
        "'region' is not a label of this pool",
    ),
    (
        "compatibility-duplicate",
        setter("spec.pools.1.compatibility", ["gpu", "gpu"]),
        "spec.pools[1].compatibility[1]",
        "duplicate",
    ),
    (
        "compatibility-not-a-list",
        setter("spec.pools.1.compatibility", "gpu"),
        "spec.pools[1].compatibility",
        "list",
    ),
    (
        "compatibility-not-a-string",
        setter("spec.pools.1.compatibility", [1]),
        "spec.pools[1].compatibility[0]",
        "string",
    ),
    # autoscaler and target
    (
        "pool-autoscaler-bad",
        setter("spec.pools.1.autoscaler.scaleUp", {"pods": 0}),
        "spec.pools[1].autoscaler.scaleUp.pods",
        ">= 1",
    ),
    (
        "pool-autoscaler-unknown-key",
        setter("spec.pools.1.autoscaler.speed", 1),
        "spec.pools[1].autoscaler.speed",
        "unknown key",
    ),
    (
        "pool-target-spaces",
        setter("spec.pools.1.target", "Deployment/a b"),
        "spec.pools[1].target",
        "actuator",
    ),
    ("pool-target-type", setter("spec.pools.1.target", 3), "spec.pools[1].target", "expected a string"),
    # tenants' pools
    (
        "tenant-pools-not-a-list",
        setter("spec.tenants.0.pools", {"pool": "gpu"}),
        "spec.tenants[0].pools",
        "list",
    ),
    (
        "tenant-pool-entry-not-a-mapping",
        setter("spec.tenants.0.pools.0", "gpu"),
        "spec.tenants[0].pools[0]",
        "expected a mapping",
    ),
    (
        "tenant-pool-unknown",
        setter(f"{GPU_QUOTA}.pool", "tpu"),
        "spec.tenants[0].pools[0].pool",
        "unknown pool 'tpu': the policy's pools are cpu, gpu",
    ),
    ("tenant-pool-missing", deleter(f"{GPU_QUOTA}.pool"), "spec.tenants[0].pools[0].pool", "required"),
    (
        "tenant-pool-duplicate",
        setter("spec.tenants.0.pools", [{"pool": "gpu"}, {"pool": "cpu"}, {"pool": "gpu"}]),
        "spec.tenants[0].pools[2].pool",
        "duplicate entry for pool 'gpu' (also at spec.tenants[0].pools[0].pool)",
    ),
    (
        "tenant-pool-unknown-key",
        setter(f"{GPU_QUOTA}.burstable", 1),
        "spec.tenants[0].pools[0].burstable",
        "did you mean burstableLimit",
    ),
    (
        "tenant-pool-negative",
        setter(f"{GPU_QUOTA}.guaranteed", -1),
        "spec.tenants[0].pools[0].guaranteed",
        "negative",
    ),
    (
        "tenant-pool-not-integer",
        setter(f"{GPU_QUOTA}.bestEffortLimit", 1.5),
        "spec.tenants[0].pools[0].bestEffortLimit",
        "integer",
    ),
    (
        "tenant-pool-nominal-above-limit",
        setter(f"{GPU_QUOTA}.burstableNominal", 2),
        "spec.tenants[0].pools[0].burstableNominal",
        "in pool 'gpu': Burstable nominal 2 is greater than limit 1",
    ),
    (
        "tenant-pool-nominal-above-tenant-wide-limit",
        both(deleter(f"{GPU_QUOTA}.burstableLimit"), setter(f"{GPU_QUOTA}.burstableNominal", 5)),
        "spec.tenants[0].pools[0].burstableNominal",
        "greater than limit 4 (the tenant-wide one",
    ),
    (
        "tenant-pool-limit-below-tenant-wide-nominal",
        both(deleter(f"{GPU_QUOTA}.burstableNominal"), setter(f"{GPU_QUOTA}.burstableLimit", 0)),
        "spec.tenants[0].pools[0].burstableLimit",
        "Burstable nominal 1 is greater than limit 0",
    ),
    # worker entries' pools
    (
        "worker-pools-required",
        deleter("spec.access.workers.1.pools"),
        "spec.access.workers[1].pools",
        "required when spec.pools has more than one pool",
    ),
    (
        "worker-pools-null",
        setter("spec.access.workers.1.pools", None),
        "spec.access.workers[1].pools",
        "required when spec.pools has more than one pool",
    ),
    (
        "worker-pool-unknown",
        setter("spec.access.workers.1.pools", ["gpu", "tpu"]),
        "spec.access.workers[1].pools[1]",
        "unknown pool 'tpu'",
    ),
    (
        "worker-pool-duplicate",
        setter("spec.access.workers.1.pools", ["gpu", "gpu"]),
        "spec.access.workers[1].pools[1]",
        "duplicate pool 'gpu'",
    ),
    (
        "worker-pools-empty",
        setter("spec.access.workers.1.pools", []),
        "spec.access.workers[1].pools",
        "non-empty",
    ),
    (
        "worker-pools-string",
        setter("spec.access.workers.1.pools", "gpu"),
        "spec.access.workers[1].pools",
        "list",
    ),
    (
        "worker-pool-number",
        setter("spec.access.workers.1.pools", [1]),
        "spec.access.workers[1].pools[0]",
        "pool name",
    ),
]


@pytest.mark.parametrize(("case", "mutate", "path", "words"), ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_a_bad_pools_policy_names_the_key_path(case: str, mutate: Mutation, path: str, words: str) -> None:
    doc = base()
    mutate(doc)
    problems = errors_of(doc)
    hits = [p for p in problems if p.path == path]
    assert hits, f"{case}: no error at {path}: {problems}"
    assert any(words in p.message for p in hits), f"{case}: {hits}"


SINGLE_ERROR_CASES: list[tuple[str, Mutation, str, str]] = [
    # With spec.pool, the one pool is `default`: quotas and worker entries may name it, nothing else.
    (
        "tenant-pool-unknown",
        setter("spec.tenants.0.pools", [{"pool": "gpu"}]),
        "spec.tenants[0].pools[0].pool",
        "unknown pool 'gpu': the policy's pools are default",
    ),
    (
        "worker-pool-unknown",
        setter("spec.access.workers.0.pools", ["cpu"]),
        "spec.access.workers[0].pools[0]",
        "unknown pool 'cpu'",
    ),
    # spec.pool keeps today's keys only.
    ("pool-labels", setter("spec.pool.labels", {"a": "b"}), "spec.pool.labels", "unknown key"),
    ("pool-name", setter("spec.pool.name", "cpu"), "spec.pool.name", "unknown key"),
]


@pytest.mark.parametrize(
    ("case", "mutate", "path", "words"), SINGLE_ERROR_CASES, ids=[c[0] for c in SINGLE_ERROR_CASES]
)
def test_a_bad_single_pool_policy_names_the_key_path(
    case: str, mutate: Mutation, path: str, words: str
) -> None:
    doc = single()
    mutate(doc)
    hits = [p for p in errors_of(doc) if p.path == path]
    assert any(words in p.message for p in hits), f"{case}: {hits}"


def test_every_error_is_reported_at_once() -> None:
    doc = base()
    for m in (
        setter("spec.pools.1.name", "cpu"),
        setter("spec.pools.0.compatibility", ["region"]),
        setter(f"{GPU_QUOTA}.pool", "tpu"),
        setter("spec.access.workers.1.pools", ["tpu"]),
    ):
        m(doc)
    paths = {p.path for p in errors_of(doc)}
    assert {
        "spec.pools[1].name",
        "spec.pools[0].compatibility[0]",
        "spec.tenants[0].pools[0].pool",
        "spec.access.workers[1].pools[0]",
    } <= paths


# --- good documents: what the policy holds --------------------------------------------------------


def test_spec_pools_builds_every_pool_and_pool_is_the_first() -> None:
    policy, warnings = policy_from_dict(base())
    assert warnings == []
    assert policy.pool_names() == ("cpu", "gpu")
    assert policy.pool == policy.pools[0]
    cpu, gpu = policy.pools
    # Labels are kept by key, whatever the file's order.
    assert cpu.labels == (("cpuModel", "icelake"), ("kind", "cpu"), ("template", "python"))
    assert cpu.compatibility == ("cpuModel",) and cpu.compat_labels() == (("cpuModel", "icelake"),)
    assert cpu.autoscaler is None and cpu.target == ""
    assert (gpu.slots_per_worker, gpu.workers, gpu.floor, gpu.target) == (1, 2, 1, "Deployment/worker-gpu")
    assert gpu.matches((("gpu", "a100"),)) and not cpu.matches((("gpu", "a100"),))
    # The pool's autoscaler keys override spec.autoscaler's, the rest are spec.autoscaler's.
    assert gpu.autoscaler == AutoscalerSpec(scale_up_pods=1, start_delay_s=120.0)
    a, b = policy.tenants
    assert a.pools == (TenantPoolQuota("gpu", 1, 0, 1, None, False),)
    assert b.pools == (TenantPoolQuota("gpu", 0, 0, 0, 0, True),)
    w_cpu, w_gpu = policy.access.workers
    assert (w_cpu.pools, w_gpu.pools) == (("cpu",), ("gpu",))
    assert w_cpu.may_join("cpu", policy.pool_names()) and not w_cpu.may_join("gpu", policy.pool_names())
    # maxSlots absent: the largest slotsPerWorker of the entry's pools.
    assert (w_cpu.max_slots, w_gpu.max_slots) == (2, 1)


def test_a_pool_autoscaler_inherits_spec_autoscaler() -> None:
    doc = base()
    doc["spec"]["autoscaler"] = {"tolerance": 0.3, "scaleUp": {"pods": 8, "percent": 50}}
    policy, _ = policy_from_dict(doc)
    assert policy.pools[1].autoscaler == AutoscalerSpec(
        tolerance=0.3, scale_up_pods=1, scale_up_percent=50.0, start_delay_s=120.0
    )
    assert policy.for_pool("cpu").autoscaler == policy.autoscaler
    assert policy.for_pool("gpu").autoscaler == policy.pools[1].autoscaler
    round_trips(policy)


def test_a_worker_entry_max_slots_is_the_largest_of_its_pools_unless_given() -> None:
    doc = base()
    doc["spec"]["access"]["workers"][1]["pools"] = ["gpu", "cpu"]
    doc["spec"]["access"]["workers"][0]["maxSlots"] = 1
    policy, _ = policy_from_dict(doc)
    assert [w.max_slots for w in policy.access.workers] == [1, 2]
    assert policy.access.workers[1].pools == ("gpu", "cpu")


def test_one_entry_in_spec_pools_needs_no_worker_pools() -> None:
    doc = base()
    del doc["spec"]["pools"][1]
    for t in doc["spec"]["tenants"]:
        del t["pools"]
    del doc["spec"]["access"]["workers"][1]
    del doc["spec"]["access"]["workers"][0]["pools"]
    policy, _ = policy_from_dict(doc)
    assert policy.pools == (policy.pool,) and policy.pool.name == "cpu"
    assert policy.access.workers[0].may_join("cpu", policy.pool_names())
    round_trips(policy)


def test_a_single_pool_policy_is_as_before() -> None:
    policy, warnings = policy_from_dict(single())
    assert warnings == []
    assert policy.pools == () and policy.pool.name == DEFAULT_POOL
    assert policy.pool_names() == (DEFAULT_POOL,)
    assert all(t.pools == () for t in policy.tenants)
    assert policy.for_pool(DEFAULT_POOL) is policy
    d = policy_to_dict(policy)
    assert "pools" not in d["spec"] and set(d["spec"]["pool"]) == {
        "slotsPerWorker",
        "workers",
        "minWorkers",
        "maxWorkers",
        "floor",
    }
    assert all("pools" not in t for t in d["spec"]["tenants"])
    assert all("pools" not in w for w in d["spec"]["access"]["workers"])
    round_trips(policy)


def test_a_single_pool_policy_may_name_default() -> None:
    doc = single()
    doc["spec"]["tenants"][0]["pools"] = [{"pool": "default", "guaranteed": 0}]
    doc["spec"]["access"]["workers"][0]["pools"] = ["default"]
    policy, _ = policy_from_dict(doc)
    assert policy.pools == ()
    assert policy.for_pool("default").tenants[0].guaranteed == 0
    assert policy.access.workers[0].pools == ("default",)
    round_trips(policy)


# --- the projection one pool's core runs under ---------------------------------------------------


def test_for_pool_projects_each_tenant_quotas() -> None:
    doc = base()
    doc["spec"]["tenants"][0]["bestEffort"] = {"limit": 3}
    doc["spec"]["tenants"][1]["bestEffort"] = {"limit": 5}
    doc["spec"]["tenants"][1]["pools"].append({"pool": "cpu", "bestEffortLimit": None})
    policy, _ = policy_from_dict(doc)

    def quotas(pool: str) -> list[tuple[str, int, int, int, int | None]]:
        view = policy.for_pool(pool)
        assert view.pool == policy.pool_spec(pool) and view.pools == ()
        return [
            (t.name, t.guaranteed, t.burstable_nominal, t.burstable_limit, t.best_effort_limit)
            for t in view.tenants
        ]

    # a: tenant-wide in cpu; its gpu entry sets three keys, the BestEffort cap stays tenant-wide.
    # b: no cap in cpu (bestEffortLimit: null), nothing at all in gpu.
    assert quotas("cpu") == [("a", 1, 1, 4, 3), ("b", 0, 2, 6, None)]
    assert quotas("gpu") == [("a", 1, 0, 1, 3), ("b", 0, 0, 0, 0)]
    assert all(t.pools == () for t in policy.for_pool("gpu").tenants)
    round_trips(policy)
    with pytest.raises(KeyError):
        policy.for_pool("tpu")


# --- commitments per pool --------------------------------------------------------------------------


def test_commitment_warnings_are_per_pool_on_projected_quotas() -> None:
    doc = base()
    # a gets 2 Guaranteed in gpu, whose floor is 1: only gpu is over-committed.
    doc["spec"]["tenants"][0]["pools"][0]["guaranteed"] = 2
    policy, warnings = policy_from_dict(doc)
    floors = [w for w in warnings if w.path.endswith(".floor")]
    assert [(w.path, "pool 'gpu'" in w.message) for w in floors] == [("spec.pools[1].floor", True)]
    assert "Guaranteed quotas add up to 2 slots but the floor is 1" in floors[0].message
    # Tenant-wide, the same quotas would fit cpu's floor of 2: no warning there.
    assert policy.for_pool("cpu").tenants[0].guaranteed == 1


def test_no_shared_remainder_is_warned_per_pool() -> None:
    doc = base()
    doc["spec"]["tenants"][1]["pools"][0]["burstableNominal"] = 1
    doc["spec"]["tenants"][1]["pools"][0]["burstableLimit"] = 1
    _, warnings = policy_from_dict(doc)
    (w,) = [w for w in warnings if w.path == "spec.tenants"]
    assert w.message.startswith("pool 'gpu': ") and "add up to 2 slots" in w.message


def test_a_tenant_wide_guaranteed_counts_in_every_pool_it_does_not_override() -> None:
    doc = base()
    del doc["spec"]["tenants"][0]["pools"]  # a: 1 Guaranteed in gpu too
    doc["spec"]["tenants"][1]["guaranteed"] = 1
    del doc["spec"]["tenants"][1]["pools"][0]["guaranteed"]  # b: 1 in gpu as well
    _, warnings = policy_from_dict(doc)
    assert [w.path for w in warnings if w.path.endswith(".floor")] == ["spec.pools[1].floor"]


def test_the_renewals_bucket_counts_the_leases_of_every_pool() -> None:
    doc = base()
    for t in doc["spec"]["tenants"]:
        t["bestEffort"] = {"limit": 0}
    # a may hold 1 + 4 in cpu and 1 + 1 in gpu: 7 leases, renewed 3 times a TTL of 30 s = 0.7/s.
    doc["spec"]["rateLimits"] = {"renewals": {"qps": 0.6}}
    _, warnings = policy_from_dict(doc)
    (w,) = [w for w in warnings if w.path == "spec.rateLimits.renewals.qps" and "'a'" in w.message]
    assert "up to 7 leases in its 2 pools" in w.message and "0.7 a second" in w.message
    doc["spec"]["rateLimits"] = {"renewals": {"qps": 0.7}}
    _, warnings = policy_from_dict(doc)
    assert not [w for w in warnings if "'a'" in w.message]


# --- round trips -----------------------------------------------------------------------------------


def test_round_trip_multi_pool() -> None:
    policy, _ = policy_from_dict(base())
    round_trips(policy)
    spec = policy_to_dict(policy)["spec"]
    assert "pool" not in spec and [p["name"] for p in spec["pools"]] == ["cpu", "gpu"]
    # The pool's autoscaler is written as what it changes of spec.autoscaler.
    assert spec["pools"][1]["autoscaler"] == {"scaleUp": {"pods": 1}, "startDelaySeconds": 120.0}
    assert "autoscaler" not in spec["pools"][0] and "target" not in spec["pools"][0]
    assert spec["tenants"][1]["pools"] == [
        {"pool": "gpu", "guaranteed": 0, "burstableNominal": 0, "burstableLimit": 0, "bestEffortLimit": 0}
    ]
    assert [w["pools"] for w in spec["access"]["workers"]] == [["cpu"], ["gpu"]]


@pytest.mark.parametrize(
    "mutate",
    [
        setter("spec.pools.0.floor", "12.5%"),
        setter("spec.pools.1.autoscaler", {}),  # an autoscaler equal to spec.autoscaler
        deleter("spec.pools.1.autoscaler"),
        setter("spec.pools.0.labels", {"region": "eu-west-1", "example.com/gpu": "", "cpuModel": "x.y_z"}),
        both(deleter("spec.pools.0.compatibility"), deleter("spec.pools.1.compatibility")),
        setter(f"{GPU_QUOTA}.bestEffortLimit", None),
        setter("spec.tenants.0.pools", [{"pool": "cpu"}, {"pool": "gpu", "bestEffortLimit": 2}]),
        setter("spec.access.workers.0.pools", ["cpu", "gpu"]),
        setter("spec.access.workers.0.maxSlots", 1),
    ],
    ids=[
        "percent-floor",
        "empty-autoscaler",
        "no-autoscaler",
        "labels",
        "no-compatibility",
        "be-null",
        "quota-entries",
        "worker-two-pools",
        "max-slots",
    ],
)
def test_round_trip_variants(mutate: Mutation) -> None:
    doc = base()
    mutate(doc)
    policy, _ = policy_from_dict(doc)
    round_trips(policy)


def test_round_trip_example() -> None:
    round_trips(load_policy(EXAMPLE)[0])


# --- diff -------------------------------------------------------------------------------------------


def _policy(*mutations: Mutation, doc: Doc | None = None) -> Policy:
    d = copy.deepcopy(doc) if doc is not None else base()
    for m in mutations:
        m(d)
    return policy_from_dict(d)[0]


DIFF_CASES: list[tuple[str, list[Mutation], list[str]]] = [
    ("same", [], []),
    (
        "pool-workers",
        [setter("spec.pools.1.workers", 3)],
        ["~ pools[gpu].workers: 2 -> 3" + f" (takes effect at restart: {RESTART_ONLY['workers']})"],
    ),
    ("pool-label", [setter("spec.pools.1.labels.gpu", "h100")], ["~ pools[gpu].labels.gpu: a100 -> h100"]),
    (
        "pool-label-added",
        [setter("spec.pools.1.labels.region", "eu")],
        ["~ pools[gpu].labels.region: (unset) -> eu"],
    ),
    (
        "pool-compatibility",
        [setter("spec.pools.1.compatibility", ["cpuModel", "gpu"])],
        ["~ pools[gpu].compatibility: [cpuModel] -> [cpuModel, gpu]"],
    ),
    (
        "pool-target",
        [setter("spec.pools.1.target", "Deployment/gpu-2")],
        [
            "~ pools[gpu].target: Deployment/worker-gpu -> Deployment/gpu-2"
            + f" (takes effect at restart: {RESTART_ONLY['target']})"
        ],
    ),
    (
        "pool-autoscaler",
        [setter("spec.pools.1.autoscaler.startDelaySeconds", 60)],
        ["~ pools[gpu].autoscaler.startDelaySeconds: 120 -> 60"],
    ),
    (
        "tenant-pool-quota",
        [setter(f"{GPU_QUOTA}.guaranteed", 0)],
        ["~ tenants[a].pools[gpu].guaranteed: 1 -> 0"],
    ),
    (
        "tenant-pool-quota-added",
        [
            setter(
                "spec.tenants.0.pools",
                [*base()["spec"]["tenants"][0]["pools"], {"pool": "cpu", "guaranteed": 0}],
            )
        ],
        ["~ tenants[a].pools[cpu].guaranteed: (unset) -> 0"],
    ),
    (
        "tenant-be-in-pool",
        [setter("spec.tenants.1.pools.0.bestEffortLimit", 2)],
        ["~ tenants[b].pools[gpu].bestEffortLimit: 0 -> 2"],
    ),
    (
        "worker-pools",
        [setter("spec.access.workers.1.pools", ["gpu", "cpu"])],
        ["~ access.workers[1].maxSlots: 1 -> 2", "~ access.workers[1].pools: [gpu] -> [cpu, gpu]"],
    ),
    (
        "pool-added",
        [
            setter(
                "spec.pools.2",
                {"name": "free", "labels": {"tier": "free"}, "workers": 2, "floor": 0},
            ),
            setter(
                "spec.access.workers.2",
                {"tokens": [hash_token("w-free")], "workerIdPrefix": "free-", "pools": ["free"]},
            ),
        ],
        [
            "+ pool free",
            "~ access.workers[2].tokens: 0 entries -> 1 entry",
            "~ access.workers[2].workerIdPrefix: (unset) -> free-",
            "~ access.workers[2].maxSlots: (unset) -> 2",
            "~ access.workers[2].pools: (unset) -> [free]",
        ],
    ),
    (
        "pool-removed",
        [
            deleter("spec.pools.1"),
            deleter("spec.tenants.0.pools"),
            deleter("spec.tenants.1.pools"),
            deleter("spec.access.workers.1"),
        ],
        [
            "- pool gpu",
            "~ access.workers[1].tokens: 1 entry -> 0 entries",
            "~ access.workers[1].workerIdPrefix: gpu- -> (unset)",
            "~ access.workers[1].maxSlots: 1 -> (unset)",
            "~ access.workers[1].pools: [gpu] -> (unset)",
        ],
    ),
]


@pytest.mark.parametrize(("case", "mutations", "lines"), DIFF_CASES, ids=[c[0] for c in DIFF_CASES])
def test_diff_of_pools(case: str, mutations: list[Mutation], lines: list[str]) -> None:
    d = diff_policies(_policy(), _policy(*mutations))
    assert diff_lines(d) == lines
    assert d.empty == (not lines)
    if not lines:
        assert summary(d) == "no change"


def test_diff_summary_names_pools_added_and_removed() -> None:
    d = diff_policies(_policy(), _policy(doc=_renamed_gpu()))
    assert (d.pools_added, d.pools_removed) == (("gpu-2",), ("gpu",))
    assert summary(d).startswith("pools added: gpu-2; pools removed: gpu")
    # The removed pool's quotas went with it: no line each; the new pool's quotas are shown.
    lines = diff_lines(d)
    assert lines[:2] == ["+ pool gpu-2", "- pool gpu"]
    assert not [line for line in lines if "pools[gpu]." in line]
    assert "~ tenants[a].pools[gpu-2].guaranteed: (unset) -> 1" in lines


def _renamed_gpu() -> Doc:
    doc = base()
    doc["spec"]["pools"][1]["name"] = "gpu-2"
    for t in doc["spec"]["tenants"]:
        for q in t["pools"]:
            q["pool"] = "gpu-2"
    doc["spec"]["access"]["workers"][1]["pools"] = ["gpu-2"]
    return doc


def test_diff_from_one_pool_to_several() -> None:
    old = policy_from_dict(single())[0]
    new = policy_from_dict(base())[0]
    d = diff_policies(old, new)
    assert (d.pools_added, d.pools_removed) == (("cpu", "gpu"), ("default",))
    assert diff_lines(d)[:3] == ["+ pool cpu", "+ pool gpu", "- pool default"]
    # Policies of one pool still diff as `pool.*`.
    d1 = diff_policies(old, _policy(setter("spec.pool.workers", 5), doc=single()))
    assert diff_lines(d1) == [
        "~ pool.workers: 4 -> 5" + f" (takes effect at restart: {RESTART_ONLY['workers']})"
    ]
    assert summary(d1) == "pool.workers: 4 -> 5" + f" (takes effect at restart: {RESTART_ONLY['workers']})"


# --- the CRD ----------------------------------------------------------------------------------------


def test_the_crd_accepts_pools_policies() -> None:
    assert api_server_errors(base()) == []
    assert api_server_errors(yaml.safe_load(EXAMPLE.read_text())) == []
    assert api_server_errors(policy_to_dict(policy_from_dict(base())[0])) == []
    doc = base()
    doc["spec"]["tenants"][1]["pools"][0]["bestEffortLimit"] = None  # nullable: no cap in gpu
    assert api_server_errors(doc) == []


CRD_BAD: list[tuple[str, Mutation]] = [
    ("pool name upper case", setter("spec.pools.1.name", "GPU")),
    ("pool name too long", setter("spec.pools.1.name", "g" * 64)),
    ("pool without a name", deleter("spec.pools.1.name")),
    ("duplicate pool names", setter("spec.pools.1.name", "cpu")),
    ("pools empty", setter("spec.pools", [])),
    ("pool unknown key", setter("spec.pools.0.slotPerWorker", 2)),
    ("pool slotsPerWorker 0", setter("spec.pools.0.slotsPerWorker", 0)),
    ("pool target with spaces", setter("spec.pools.1.target", "a b")),
    ("compatibility twice", setter("spec.pools.1.compatibility", ["gpu", "gpu"])),
    ("tenant pool without a pool", deleter(f"{GPU_QUOTA}.pool")),
    ("tenant pool twice", setter("spec.tenants.0.pools", [{"pool": "gpu"}, {"pool": "gpu"}])),
    ("tenant pool negative", setter(f"{GPU_QUOTA}.guaranteed", -1)),
    ("tenant pool unknown key", setter(f"{GPU_QUOTA}.burstable", 1)),
    ("worker pools empty", setter("spec.access.workers.0.pools", [])),
    ("worker pool twice", setter("spec.access.workers.0.pools", ["cpu", "cpu"])),
    ("worker pool bad name", setter("spec.access.workers.0.pools", ["CPU"])),
]


@pytest.mark.parametrize(("case", "mutate"), CRD_BAD, ids=[c for c, _ in CRD_BAD])
def test_a_bad_pools_policy_is_refused_by_the_validator_and_by_the_crd(case: str, mutate: Mutation) -> None:
    doc = base()
    mutate(doc)
    assert errors_of(doc), f"{case}: the validator accepted it"
    assert api_server_errors(doc), f"{case}: the CRD accepted it"


# Not expressible in the CRD (see crd.py): the scheduler refuses them and reports them in status.
SCHEDULER_ONLY: list[tuple[str, Mutation]] = [
    ("pool and pools", setter("spec.pool", {"workers": 2})),
    ("pool floor above its capacity", setter("spec.pools.1.floor", 3)),
    ("label value with spaces", setter("spec.pools.0.labels.kind", "c p u")),
    ("compatibility not a label", setter("spec.pools.1.compatibility", ["region"])),
    ("tenant pool unknown", setter(f"{GPU_QUOTA}.pool", "tpu")),
    ("worker pool unknown", setter("spec.access.workers.0.pools", ["tpu"])),
    ("worker entry naming no pool", deleter("spec.access.workers.0.pools")),
]


@pytest.mark.parametrize(("case", "mutate"), SCHEDULER_ONLY, ids=[c for c, _ in SCHEDULER_ONLY])
def test_what_only_the_scheduler_refuses(case: str, mutate: Mutation) -> None:
    doc = base()
    mutate(doc)
    assert errors_of(doc), f"{case}: the validator accepted it"
    assert not api_server_errors(doc), f"{case}: now expressible in the CRD: move the row"


# --- the shipped example and `policy validate` ------------------------------------------------------


def test_the_example_is_valid_and_has_what_the_issue_asks() -> None:
    policy, warnings = load_policy(EXAMPLE)
    assert warnings == []
    assert len(policy.pools) >= 3
    cpu = next(p for p in policy.pools if p.label("kind") == "cpu" and p.label("cpuModel"))
    gpu = next(p for p in policy.pools if p.label("gpu") == "a100")
    tier = next(p for p in policy.pools if p.label("tier") == "free")
    assert cpu.label("template") == "python"
    assert gpu.compatibility == ("cpuModel",)
    assert tier is not None
    # A tenant with no GPU quota at all, and tenants with tenant-wide quotas and overrides.
    in_gpu = policy.for_pool(gpu.name).tenants
    assert any(
        (t.guaranteed, t.burstable_nominal, t.burstable_limit, t.best_effort_limit) == (0, 0, 0, 0)
        for t in in_gpu
    )
    assert all(t.pools for t in policy.tenants)
    assert all(w.pools for w in policy.access.workers)
    assert {n for w in policy.access.workers for n in w.pools} == set(policy.pool_names())


def test_policy_validate_lists_each_pool() -> None:
    out = io.StringIO()
    assert validate_main(str(EXAMPLE), out) == 0
    text = out.getvalue()
    assert "is valid: 4 tenants, 3 pools, capacity 44 slots, floor 7" in text
    assert (
        "  pool gpu-a100: labels cpuModel=sapphire-rapids, gpu=a100, kind=gpu, template=python; "
        "compatibility cpuModel; capacity 4 slots (4 workers x 1), floor 1"
    ) in text
    assert "  pool free-tier: labels kind=cpu, template=python, tier=free; capacity 16 slots" in text


def test_policy_validate_of_one_pool_is_unchanged(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(single()))
    out = io.StringIO()
    assert validate_main(str(path), out) == 0
    assert out.getvalue().splitlines() == [
        "warning: spec.access.admins: empty: the Admin service refuses everyone (slotsched status, policy "
        "apply), and a running scheduler refuses to apply this policy",  # serve says it too
        "policy pools is valid: 2 tenants, capacity 8 slots, floor 2, 1 worker token",
    ]


def test_policy_validate_names_the_key_path(tmp_path: pathlib.Path) -> None:
    doc = base()
    doc["spec"]["tenants"][0]["pools"][0]["pool"] = "tpu"
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = io.StringIO()
    assert validate_main(str(path), out) == 1
    assert "error: spec.tenants[0].pools[0].pool: unknown pool 'tpu'" in out.getvalue()
