"""Tests of the policy loader: every error kind names its key path, warnings show their numbers,
and a policy round-trips through its dict and YAML forms."""

from __future__ import annotations

import copy
import io
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cli.policy import validate_main
from scheduler.policy.defaults import DEFAULT_POLICY_YAML, default_policy
from scheduler.policy.errors import PolicyError, Problem
from scheduler.policy.identities import (
    NOBODY,
    CertName,
    Identity,
    SanType,
    hash_token,
    identities_for_names,
    identity_for_token,
    role_for_token,
    tenant_for_token,
)
from scheduler.policy.model import (
    AccessSpec,
    Policy,
    PoolSpec,
    RateLimit,
    RateLimitsSpec,
    TenantSpec,
    WorkerAccess,
)
from scheduler.policy.schema import API_VERSION, KIND
from scheduler.policy.validate import policy_from_dict
from scheduler.policy.yaml_io import load_policy, parse_policy, policy_to_dict, policy_to_yaml

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "deploy" / "policy-example.yaml"
TOKEN_A = hash_token("token-a")
TOKEN_B = hash_token("token-b")
ADMIN_A = hash_token("admin-a")
ADMIN_B = hash_token("admin-b")
WORKER_A = hash_token("worker-a")


def base() -> dict[str, Any]:
    """A valid policy document with no warnings: 4 workers x 2 slots, floor 2, three tenants."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "test"},
        "spec": {
            "pool": {"slotsPerWorker": 2, "workers": 4, "minWorkers": 1, "maxWorkers": 8, "floor": 2},
            "timing": {"yieldGraceSeconds": 10, "leaseTTLSeconds": 30, "minRuntimeSeconds": 30},
            "queue": {"maxPending": 100, "maxPendingPerTenant": 10, "bestEffortFraction": 0.8},
            "autoscaler": {
                "weights": {"guaranteed": 3, "burstable": 1, "bestEffort": 0.5},
                "tolerance": 0.1,
                "scaleUp": {"pods": 4, "percent": 100, "periodSeconds": 15},
            },
            "tenants": [
                {"name": "sre", "weight": 1, "guaranteed": 2, "burstable": {"nominal": 1, "limit": 4}},
                {
                    "name": "product",
                    "weight": 2,
                    "burstable": {"nominal": 2, "limit": 6},
                    "tokens": [TOKEN_A],
                },
                {"name": "batch", "burstable": {"nominal": 0, "limit": 0}, "bestEffort": {"limit": 100}},
            ],
        },
    }


def errors_of(doc: object) -> list[Problem]:
    with pytest.raises(PolicyError) as info:
        policy_from_dict(doc)
    return info.value.problems


def setter(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """A mutation that sets `path` ("spec.tenants.1.weight") to `value`."""

    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        if last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value

    return apply


def deleter(path: str) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        del node[last]

    return apply


# (id, mutation, path that must carry the error, words the message must contain)
ERROR_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    # document shape
    ("api-version-wrong", setter("apiVersion", "v1"), "apiVersion", API_VERSION),
    ("api-version-missing", deleter("apiVersion"), "apiVersion", "required"),
    ("kind-wrong", setter("kind", "Policy"), "kind", KIND),
    ("kind-missing", deleter("kind"), "kind", "required"),
    ("metadata-name-invalid", setter("metadata.name", "My Policy"), "metadata.name", "not a valid name"),
    ("metadata-name-type", setter("metadata.name", 7), "metadata.name", "expected a string"),
    # unknown keys, each naming the allowed ones
    ("unknown-key-top", setter("spce", {}), "spce", "allowed keys: apiVersion, kind, metadata, spec"),
    ("unknown-key-spec", setter("spec.tennants", []), "spec.tennants", "did you mean tenants?"),
    ("unknown-key-pool", setter("spec.pool.slotPerWorker", 2), "spec.pool.slotPerWorker", "slotsPerWorker"),
    ("unknown-key-timing", setter("spec.timing.grace", 1), "spec.timing.grace", "yieldGraceSeconds"),
    (
        "unknown-key-weights",
        setter("spec.autoscaler.weights.gold", 1),
        "spec.autoscaler.weights.gold",
        "bestEffort",
    ),
    ("unknown-key-tenant", setter("spec.tenants.1.quota", 1), "spec.tenants[1].quota", "guaranteed"),
    (
        "unknown-key-burstable",
        setter("spec.tenants.1.burstable.max", 9),
        "spec.tenants[1].burstable.max",
        "nominal, limit",
    ),
    (
        "unknown-key-best-effort",
        setter("spec.tenants.2.bestEffort.cap", 1),
        "spec.tenants[2].bestEffort.cap",
        "limit",
    ),
    # wrong types: bool is not an int, a float is not an int, a string is not a number
    ("bool-is-not-int", setter("spec.pool.workers", True), "spec.pool.workers", "boolean"),
    (
        "bool-is-not-number",
        setter("spec.timing.yieldGraceSeconds", False),
        "spec.timing.yieldGraceSeconds",
        "boolean",
    ),
    ("float-is-not-int", setter("spec.tenants.0.guaranteed", 1.5), "spec.tenants[0].guaranteed", "integer"),
    ("string-is-not-int", setter("spec.queue.maxPending", "100"), "spec.queue.maxPending", "integer"),
    ("null-is-not-int", setter("spec.pool.maxWorkers", None), "spec.pool.maxWorkers", "null"),
    (
        "nan",
        setter("spec.autoscaler.weights.guaranteed", float("nan")),
        "spec.autoscaler.weights.guaranteed",
        "finite",
    ),
    ("inf", setter("spec.timing.leaseTTLSeconds", float("inf")), "spec.timing.leaseTTLSeconds", "finite"),
    ("section-not-mapping", setter("spec.pool", [1, 2]), "spec.pool", "expected a mapping"),
    ("spec-not-mapping", setter("spec", "x"), "spec", "expected a mapping"),
    ("tenants-not-list", setter("spec.tenants", {"sre": {}}), "spec.tenants", "expected a list"),
    ("tenant-not-mapping", setter("spec.tenants.1", "product"), "spec.tenants[1]", "expected a mapping"),
    ("burstable-not-mapping", setter("spec.tenants.0.burstable", 3), "spec.tenants[0].burstable", "mapping"),
    ("tokens-not-list", setter("spec.tenants.1.tokens", TOKEN_A), "spec.tenants[1].tokens", "list"),
    ("floor-float", setter("spec.pool.floor", 2.5), "spec.pool.floor", "slot count or a percent"),
    # negative numbers and bounds
    ("negative-floor", setter("spec.pool.floor", -1), "spec.pool.floor", "negative"),
    ("negative-workers", setter("spec.pool.minWorkers", -1), "spec.pool.minWorkers", "negative"),
    (
        "negative-grace",
        setter("spec.timing.yieldGraceSeconds", -5),
        "spec.timing.yieldGraceSeconds",
        "negative",
    ),
    (
        "negative-guaranteed",
        setter("spec.tenants.0.guaranteed", -1),
        "spec.tenants[0].guaranteed",
        "negative",
    ),
    (
        "negative-limit",
        setter("spec.tenants.1.burstable.limit", -1),
        "spec.tenants[1].burstable.limit",
        "negative",
    ),
    (
        "negative-best-effort-limit",
        setter("spec.tenants.2.bestEffort.limit", -3),
        "spec.tenants[2].bestEffort.limit",
        "negative",
    ),
    (
        "negative-tolerance",
        setter("spec.autoscaler.tolerance", -0.1),
        "spec.autoscaler.tolerance",
        "negative",
    ),
    ("zero-slots-per-worker", setter("spec.pool.slotsPerWorker", 0), "spec.pool.slotsPerWorker", ">= 1"),
    ("zero-lease-ttl", setter("spec.timing.leaseTTLSeconds", 0), "spec.timing.leaseTTLSeconds", "> 0"),
    ("zero-scale-up-pods", setter("spec.autoscaler.scaleUp.pods", 0), "spec.autoscaler.scaleUp.pods", ">= 1"),
    (
        "best-effort-fraction-above-1",
        setter("spec.queue.bestEffortFraction", 1.5),
        "spec.queue.bestEffortFraction",
        "<= 1",
    ),
    # tenants
    ("weight-zero", setter("spec.tenants.0.weight", 0), "spec.tenants[0].weight", "> 0"),
    ("weight-negative", setter("spec.tenants.1.weight", -2), "spec.tenants[1].weight", "> 0"),
    (
        "nominal-above-limit",
        setter("spec.tenants.1.burstable", {"nominal": 7, "limit": 6}),
        "spec.tenants[1].burstable.nominal",
        "nominal 7 is greater than limit 6",
    ),
    (
        "duplicate-name",
        setter("spec.tenants.2.name", "sre"),
        "spec.tenants[2].name",
        "duplicate tenant name 'sre'",
    ),
    (
        "name-uppercase",
        setter("spec.tenants.0.name", "SRE"),
        "spec.tenants[0].name",
        "not a valid tenant name",
    ),
    (
        "name-leading-dash",
        setter("spec.tenants.0.name", "-sre"),
        "spec.tenants[0].name",
        "not a valid tenant name",
    ),
    (
        "name-trailing-underscore",
        setter("spec.tenants.0.name", "sre_"),
        "spec.tenants[0].name",
        "not a valid",
    ),
    ("name-space", setter("spec.tenants.0.name", "s re"), "spec.tenants[0].name", "not a valid tenant name"),
    ("name-empty", setter("spec.tenants.0.name", ""), "spec.tenants[0].name", "not a valid tenant name"),
    ("name-too-long", setter("spec.tenants.0.name", "a" * 64), "spec.tenants[0].name", "63"),
    ("name-missing", deleter("spec.tenants.1.name"), "spec.tenants[1].name", "required"),
    ("name-not-string", setter("spec.tenants.1.name", False), "spec.tenants[1].name", "expected a string"),
    # pool geometry
    ("floor-above-pool", setter("spec.pool.floor", 9), "spec.pool.floor", "4 workers x 2 slots = 8 slots"),
    ("floor-percent-above-100", setter("spec.pool.floor", "150%"), "spec.pool.floor", "at most 100%"),
    ("floor-percent-no-sign", setter("spec.pool.floor", "25"), "spec.pool.floor", "bad percent"),
    ("floor-percent-garbage", setter("spec.pool.floor", "abc%"), "spec.pool.floor", "bad percent"),
    ("floor-percent-negative", setter("spec.pool.floor", "-5%"), "spec.pool.floor", "bad percent"),
    ("min-above-max", setter("spec.pool.minWorkers", 9), "spec.pool.minWorkers", "greater than maxWorkers 8"),
    (
        "workers-above-max",
        setter("spec.pool.workers", 9),
        "spec.pool.workers",
        "outside [minWorkers 1, maxWorkers 8]",
    ),
    ("workers-below-min", setter("spec.pool.workers", 0), "spec.pool.workers", "outside [minWorkers 1"),
    # tokens
    (
        "token-plain",
        setter("spec.tenants.1.tokens", ["hunter2"]),
        "spec.tenants[1].tokens[0]",
        "64 lowercase hex",
    ),
    (
        "token-uppercase",
        setter("spec.tenants.1.tokens", [TOKEN_A.upper().replace("SHA256", "sha256")]),
        "spec.tenants[1].tokens[0]",
        "lowercase",
    ),
    (
        "token-short",
        setter("spec.tenants.1.tokens", ["sha256:abc"]),
        "spec.tenants[1].tokens[0]",
        "64 lowercase hex",
    ),
    (
        "token-other-algo",
        setter("spec.tenants.1.tokens", ["md5:" + "0" * 64]),
        "spec.tenants[1].tokens[0]",
        "sha256",
    ),
    (
        "token-not-string",
        setter("spec.tenants.1.tokens", [12]),
        "spec.tenants[1].tokens[0]",
        "expected a string",
    ),
    (
        "token-shared",
        setter("spec.tenants.2.tokens", [TOKEN_A]),
        "spec.tenants[2].tokens[0]",
        "spec.tenants[1].tokens[0]",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "path", "words"),
    [pytest.param(m, p, w, id=i) for i, m, p, w in ERROR_CASES],
)
def test_error_names_its_path(mutate: Callable[[dict[str, Any]], None], path: str, words: str) -> None:
    doc = base()
    mutate(doc)
    problems = errors_of(doc)
    at_path = [p for p in problems if p.path == path]
    assert at_path, f"no error at {path}: {problems}"
    assert any(words in p.message for p in at_path), at_path
    # the error is about the mutation, not collateral damage
    assert len(problems) == 1, problems


def test_base_is_valid_without_warnings() -> None:
    policy, warnings = policy_from_dict(base())
    assert warnings == []
    assert [t.name for t in policy.tenants] == ["sre", "product", "batch"]
    assert policy.tenants[2].best_effort_limit == 100
    assert policy.tenant("product") == TenantSpec(
        name="product", weight=2.0, burstable_nominal=2, burstable_limit=6, tokens=(TOKEN_A,)
    )


def test_all_errors_are_reported_at_once() -> None:
    doc = base()
    doc["kind"] = "Pod"
    doc["spec"]["pool"]["workers"] = True
    doc["spec"]["timing"]["leaseTTLSeconds"] = -1
    doc["spec"]["tenants"][0]["weight"] = 0
    doc["spec"]["tenants"][1]["burstable"] = {"nominal": 9, "limit": 1}
    doc["spec"]["tenants"][2]["name"] = "sre"
    paths = {p.path for p in errors_of(doc)}
    assert paths == {
        "kind",
        "spec.pool.workers",
        "spec.timing.leaseTTLSeconds",
        "spec.tenants[0].weight",
        "spec.tenants[1].burstable.nominal",
        "spec.tenants[2].name",
    }


def test_error_str_lists_one_problem_per_line() -> None:
    doc = base()
    doc["apiVersion"] = "v1"
    doc["spec"]["pool"]["floor"] = -1
    err = PolicyError(errors_of(doc))
    lines = str(err).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("apiVersion: ")
    assert lines[1] == "spec.pool.floor: must not be negative, got -1"


def test_plain_token_is_never_echoed() -> None:
    doc = base()
    doc["spec"]["tenants"][1]["tokens"] = ["s3cr3t-bearer-token"]
    assert "s3cr3t" not in str(PolicyError(errors_of(doc)))


@pytest.mark.parametrize(
    "doc",
    [pytest.param(None, id="empty"), pytest.param([1, 2], id="list"), pytest.param("text", id="scalar")],
)
def test_document_must_be_a_mapping(doc: object) -> None:
    (problem,) = errors_of(doc)
    assert problem.path == "(document)"
    assert KIND in problem.message


def test_minimal_policy_takes_defaults() -> None:
    policy, warnings = parse_policy(f"apiVersion: {API_VERSION}\nkind: {KIND}\n")
    assert policy == Policy()
    assert warnings == []


def test_sections_may_be_null_and_tenants_empty() -> None:
    text = f"apiVersion: {API_VERSION}\nkind: {KIND}\nmetadata:\nspec:\n  pool:\n  timing:\n  tenants: []\n"
    policy, _ = parse_policy(text)
    assert policy == Policy()


def test_burstable_limit_defaults_to_nominal() -> None:
    doc = base()
    doc["spec"]["tenants"][1]["burstable"] = {"nominal": 2}
    policy, _ = policy_from_dict(doc)
    assert policy.tenants[1].burstable_limit == 2


def test_best_effort_limit_null_means_uncapped() -> None:
    doc = base()
    doc["spec"]["tenants"][2]["bestEffort"] = {"limit": None}
    policy, _ = policy_from_dict(doc)
    assert policy.tenants[2].best_effort_limit is None


@pytest.mark.parametrize(
    ("floor", "percent", "slots"),
    [
        pytest.param("25%", 25.0, 2, id="25%"),
        pytest.param("12.5%", 12.5, 1, id="12.5%"),
        pytest.param("100%", 100.0, 8, id="100%"),
        pytest.param(" 0% ", 0.0, 0, id="0%-spaces"),
    ],
)
def test_floor_percent(floor: str, percent: float, slots: int) -> None:
    doc = base()
    doc["spec"]["pool"]["floor"] = floor
    doc["spec"]["tenants"][0]["guaranteed"] = 0
    policy, _ = policy_from_dict(doc)
    assert policy.pool.floor_percent == percent
    assert policy.pool.floor_slots(8) == slots


def test_labels_and_annotations_are_accepted() -> None:
    doc = base()
    doc["metadata"]["labels"] = {"team": "platform"}
    doc["metadata"]["annotations"] = {"owner": "sre@example.com"}
    policy_from_dict(doc)
    doc["metadata"]["labels"] = {"team": 3}
    assert [p.path for p in errors_of(doc)] == ["metadata.labels"]


# --- YAML text ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        pytest.param(
            f"apiVersion: {API_VERSION}\nkind: {KIND}\nspec:\n  pool: {{workers: 2\n  tenants: []\n",
            5,
            "invalid YAML",
            id="unclosed-flow-mapping",
        ),
        pytest.param(
            f"apiVersion: {API_VERSION}\nkind: {KIND}\nspec:\n  pool:\n    workers: 2\n    workers: 3\n",
            6,
            "duplicate key 'workers'",
            id="duplicate-key",
        ),
        pytest.param("a: b: c\n", 1, "mapping values are not allowed", id="bad-mapping"),
        pytest.param(f"apiVersion: {API_VERSION}\n\tkind: x\n", 2, "invalid YAML", id="tab"),
    ],
)
def test_yaml_syntax_error_has_line(text: str, line: int, words: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(text)
    (problem,) = info.value.problems
    assert problem.path == f"line {line}", problem
    assert words in problem.message


def test_yaml_one_one_booleans_are_not_names() -> None:
    # YAML 1.1 reads an unquoted `no` as false: a tenant called no must be quoted.
    text = f"apiVersion: {API_VERSION}\nkind: {KIND}\nspec:\n  tenants:\n    - name: no\n"
    with pytest.raises(PolicyError) as info:
        parse_policy(text)
    assert str(info.value) == "spec.tenants[0].name: expected a string, got a boolean (false)"


# --- warnings ----------------------------------------------------------------------------------


def test_warning_overcommitted_floor() -> None:
    doc = base()
    doc["spec"]["tenants"][1]["guaranteed"] = 4  # 2 + 4 = 6 > floor 2
    _, warnings = policy_from_dict(doc)
    (w,) = [w for w in warnings if w.path == "spec.pool.floor"]
    assert w.message == (
        "Guaranteed quotas add up to 6 slots but the floor is 2: a Guaranteed request within quota "
        "may wait for another tenant's Guaranteed lease"
    )


def test_warning_overcommitted_percent_floor_shows_percent() -> None:
    doc = base()
    doc["spec"]["pool"]["floor"] = "10%"  # 10% of 8 = 0.8 -> 1 slot
    _, warnings = policy_from_dict(doc)
    (w,) = warnings
    assert "add up to 2 slots but the floor is 1 (10% of 8 slots)" in w.message


@pytest.mark.parametrize(
    ("nominal", "committed"),
    [pytest.param(5, 8, id="equal-to-capacity"), pytest.param(7, 10, id="above-capacity")],
)
def test_warning_no_shared_remainder(nominal: int, committed: int) -> None:
    doc = base()
    doc["spec"]["tenants"][1]["burstable"] = {"nominal": nominal, "limit": 8}
    # Guaranteed 2, nominals 1 + nominal
    _, warnings = policy_from_dict(doc)
    (w,) = warnings
    assert w.path == "spec.tenants"
    assert f"Burstable nominals ({1 + nominal}) add up to {committed} slots" in w.message
    assert "Guaranteed quotas (2)" in w.message
    assert "the pool has 8 slots (4 workers x 2)" in w.message
    assert "BestEffort can starve" in w.message


def test_no_remainder_warning_just_below_capacity() -> None:
    doc = base()
    doc["spec"]["tenants"][1]["burstable"] = {"nominal": 3, "limit": 8}  # 2 + 1 + 3 = 7 < 8
    assert policy_from_dict(doc)[1] == []


def test_warnings_ride_along_with_errors() -> None:
    doc = base()
    doc["spec"]["tenants"][1]["guaranteed"] = 1  # 3 > floor 2
    doc["spec"]["timing"]["leaseTTLSeconds"] = 0
    with pytest.raises(PolicyError) as info:
        policy_from_dict(doc)
    assert [w.path for w in info.value.warnings] == ["spec.pool.floor"]


# --- round trips -------------------------------------------------------------------------------


def round_trips(policy: Policy) -> None:
    again, _ = policy_from_dict(policy_to_dict(policy))
    assert again == policy
    from_yaml, _ = parse_policy(policy_to_yaml(policy))
    assert from_yaml == policy


def test_round_trip_base() -> None:
    round_trips(policy_from_dict(base())[0])


def test_round_trip_default_and_example() -> None:
    round_trips(default_policy())
    round_trips(load_policy(EXAMPLE)[0])


def test_round_trip_hand_built_percent_floor() -> None:
    round_trips(Policy(pool=PoolSpec(floor_percent=12.5)))
    round_trips(Policy(pool=PoolSpec(floor_percent=1e-05)))


def test_to_dict_is_the_yaml_shape() -> None:
    d = policy_to_dict(default_policy())
    assert d["apiVersion"] == API_VERSION and d["kind"] == KIND
    assert d["spec"]["pool"] == {
        "slotsPerWorker": 2,
        "workers": 4,
        "minWorkers": 1,
        "maxWorkers": 8,
        "floor": 2,
    }
    assert d["spec"]["tenants"][0]["burstable"] == {"nominal": 1, "limit": 4}
    assert d["spec"]["tenants"][2]["bestEffort"] == {}
    yaml.safe_dump(d)  # plain data only


names = st.from_regex(r"[a-z0-9]([-a-z0-9_]{0,12}[a-z0-9])?", fullmatch=True)
policy_names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,12}[a-z0-9])?", fullmatch=True)
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False)
positive = st.floats(min_value=0, max_value=1e6, exclude_min=True, allow_nan=False)


@st.composite
def tenant_docs(draw: st.DrawFn, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": name}
    if draw(st.booleans()):
        doc["weight"] = draw(st.one_of(st.integers(1, 100), positive))
    if draw(st.booleans()):
        doc["guaranteed"] = draw(st.integers(0, 50))
    if draw(st.booleans()):
        nominal = draw(st.integers(0, 50))
        doc["burstable"] = {"nominal": nominal}
        if draw(st.booleans()):
            doc["burstable"]["limit"] = draw(st.integers(nominal, 100))
    if draw(st.booleans()):
        doc["bestEffort"] = {"limit": draw(st.one_of(st.none(), st.integers(0, 100)))}
    secrets = draw(st.lists(st.text(max_size=8), unique=True, max_size=3))
    doc["tokens"] = [hash_token(f"{name}:{s}") for s in secrets]  # names are unique, so tokens are
    return doc


@st.composite
def policy_docs(draw: st.DrawFn) -> dict[str, Any]:
    spw = draw(st.integers(1, 8))
    lo = draw(st.integers(0, 10))
    hi = draw(st.integers(max(lo, 1), 20))
    workers = draw(st.integers(lo, hi))
    floor: int | str = draw(
        st.one_of(
            st.integers(0, workers * spw),
            st.integers(0, 10000).map(lambda n: f"{n / 100}%"),
            st.floats(0, 100).map(lambda x: f"{x!r}%"),
        )
    )
    spec: dict[str, Any] = {
        "pool": {
            "slotsPerWorker": spw,
            "workers": workers,
            "minWorkers": lo,
            "maxWorkers": hi,
            "floor": floor,
        },
        "timing": {
            "yieldGraceSeconds": draw(seconds),
            "leaseTTLSeconds": draw(positive),
            "minRuntimeSeconds": draw(st.integers(0, 600)),
        },
        "queue": {
            "maxPending": draw(st.integers(0, 10**6)),
            "maxPendingPerTenant": draw(st.integers(0, 10**6)),
            "bestEffortFraction": draw(st.floats(0, 1)),
        },
        "autoscaler": {
            "weights": {"guaranteed": draw(seconds), "burstable": draw(seconds), "bestEffort": draw(seconds)},
            "scaleUp": {
                "pods": draw(st.integers(1, 100)),
                "percent": draw(positive),
                "periodSeconds": draw(positive),
            },
            "tolerance": draw(st.floats(0, 1)),
            "drainTimeoutSeconds": draw(seconds),
        },
        "tenants": [draw(tenant_docs(n)) for n in draw(st.lists(names, unique=True, max_size=5))],
    }
    if draw(st.booleans()):
        # "role:" cannot be a tenant token's prefix ("name:"): names have no ':'.
        roles = draw(st.lists(st.text(max_size=6), unique=True, max_size=4))
        split = draw(st.integers(0, len(roles)))
        spec["access"] = {
            "admins": [hash_token(f"role:{r}") for r in roles[:split]],
            "workers": [
                {
                    "tokens": [hash_token(f"role:{r}")],
                    "workerIds": [f"w{i}"],
                    "maxSlots": draw(st.integers(1, 8)),
                }
                for i, r in enumerate(roles[split:])
            ],
        }
    if draw(st.booleans()):
        spec["rateLimits"] = {
            k: {"qps": draw(st.floats(0.5, 1e4)), "burst": draw(st.integers(1, 10**4))}
            for k in draw(st.lists(st.sampled_from(["tenant", "admin", "worker"]), unique=True))
        }
    for section in ("timing", "queue", "autoscaler"):
        if draw(st.booleans()):
            del spec[section]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": draw(policy_names)}, "spec": spec}


@settings(max_examples=200, deadline=None)
@given(policy_docs())
def test_random_valid_specs_round_trip(doc: dict[str, Any]) -> None:
    original = copy.deepcopy(doc)
    policy, _ = policy_from_dict(doc)
    assert doc == original  # the input is not modified
    round_trips(policy)
    # and writing it back is stable
    assert policy_to_dict(policy_from_dict(policy_to_dict(policy))[0]) == policy_to_dict(policy)


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
JUNK_PATHS = [
    "spec",
    "metadata",
    "metadata.name",
    "spec.pool",
    "spec.pool.floor",
    "spec.pool.workers",
    "spec.autoscaler.weights",
    "spec.autoscaler.scaleUp.pods",
    "spec.tenants",
    "spec.tenants.0",
    "spec.tenants.1.name",
    "spec.tenants.1.burstable",
    "spec.tenants.1.tokens",
    "spec.tenants.2.bestEffort",
    "spec.access",
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(JUNK_PATHS), junk)
def test_junk_anywhere_is_a_policy_error_or_valid(path: str, value: object) -> None:
    doc = base()
    setter(path, value)(doc)
    try:
        policy_from_dict(doc)
    except PolicyError as e:
        assert e.problems
        assert all(p.path and p.message for p in e.problems)


# --- default policy, example file, validate_main -----------------------------------------------


def test_default_policy() -> None:
    policy, warnings = parse_policy(DEFAULT_POLICY_YAML)
    assert warnings == []
    assert policy == default_policy()
    assert policy.name == "default"
    assert (policy.pool.workers, policy.pool.slots_per_worker, policy.pool.floor) == (4, 2, 2)
    assert policy.tenants == (
        TenantSpec(name="sre", weight=1.0, guaranteed=2, burstable_nominal=1, burstable_limit=4),
        TenantSpec(name="product", weight=2.0, guaranteed=0, burstable_nominal=2, burstable_limit=6),
        TenantSpec(name="batch", weight=1.0, guaranteed=0, burstable_nominal=0, burstable_limit=0),
    )


def test_example_file_is_valid_without_warnings() -> None:
    policy, warnings = load_policy(EXAMPLE)
    assert warnings == []
    assert len(policy.tenants) == 4
    for tenant in policy.tenants:
        assert tenant.tokens, f"{tenant.name} has no token in the example"


def test_validate_main_valid(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(DEFAULT_POLICY_YAML)
    out = io.StringIO()
    assert validate_main(str(path), out) == 0
    # The built-in policy of dev mode names no credential: as a file, serving it would refuse everyone.
    assert out.getvalue().splitlines() == [
        "warning: spec.tenants: no tenant lists a token: every Scheduler call will be refused",
        "warning: spec.access.admins: empty: the Admin service refuses everyone (slotsched status, policy "
        "apply), and a running scheduler refuses to apply this policy",
        "warning: spec.access.workers: empty: no worker agent can register",
        "policy default is valid: 3 tenants, capacity 8 slots, floor 2",
    ]


def test_validate_main_warnings(tmp_path: pathlib.Path) -> None:
    doc = base()
    doc["spec"]["tenants"][1]["guaranteed"] = 4
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = io.StringIO()
    assert validate_main(str(path), out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("warning: spec.pool.floor: Guaranteed quotas add up to 6 slots")
    assert lines[-1] == "policy test is valid: 3 tenants, capacity 8 slots, floor 2"


def test_validate_main_errors(tmp_path: pathlib.Path) -> None:
    doc = base()
    doc["spec"]["pool"]["floor"] = "lots"
    doc["spec"]["tenants"][0]["weight"] = 0
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = io.StringIO()
    assert validate_main(str(path), out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("error: spec.pool.floor: bad percent 'lots'")
    assert lines[1] == "error: spec.tenants[0].weight: must be > 0, got 0"
    assert "2 errors" in lines[-1]


def test_validate_main_missing_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert validate_main(str(missing)) == 1
    assert f"error: {missing}: cannot read policy file" in capsys.readouterr().out


# --- tokens ------------------------------------------------------------------------------------


def test_hash_token() -> None:
    assert hash_token("") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert hash_token("abc") == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


@pytest.mark.parametrize(
    ("token", "tenant"),
    [
        pytest.param("token-a", "product", id="first-tenant-token"),
        pytest.param("token-b", "batch", id="second-token"),
        pytest.param("token-c", None, id="unknown"),
        pytest.param("", None, id="empty"),
        pytest.param(TOKEN_A, None, id="the-hash-is-not-the-token"),
    ],
)
def test_tenant_for_token(token: str, tenant: str | None) -> None:
    doc = base()
    doc["spec"]["tenants"][2]["tokens"] = [hash_token("token-x"), TOKEN_B]
    policy, _ = policy_from_dict(doc)
    assert tenant_for_token(policy, token) == tenant


# --- spec.access: roles bound to credentials ---------------------------------------------------


def w_entry(
    *tokens: str, ids: list[str] | None = None, prefix: str | None = None, slots: int = 2
) -> dict[str, Any]:
    """A worker entry document (tokens are hashes)."""
    doc: dict[str, Any] = {"tokens": list(tokens), "maxSlots": slots}
    if prefix is not None:
        doc["workerIdPrefix"] = prefix
    else:
        doc["workerIds"] = ids if ids is not None else ["w-0"]
    return doc


WA = WorkerAccess(tokens=(WORKER_A,), worker_ids=("w-0",), max_slots=2)

# (id, the spec.access section, the roles it grants)
ACCESS_GOOD: list[tuple[str, object, AccessSpec]] = [
    ("absent", None, AccessSpec()),
    ("empty", {}, AccessSpec()),
    ("empty-lists", {"admins": [], "workers": []}, AccessSpec()),
    ("null-lists", {"admins": None, "workers": None}, AccessSpec()),
    ("admins-only", {"admins": [ADMIN_A, ADMIN_B]}, AccessSpec(admins=(ADMIN_A, ADMIN_B))),
    ("admin-token-mapping", {"admins": [{"token": ADMIN_A}]}, AccessSpec(admins=(ADMIN_A,))),
    (
        "admin-identity",
        {"admins": [ADMIN_A, {"identity": "spiffe://example.org/ops"}]},
        AccessSpec(admins=(ADMIN_A,), admin_identities=("spiffe://example.org/ops",)),
    ),
    ("workers-only", {"workers": [w_entry(WORKER_A)]}, AccessSpec(workers=(WA,))),
    (
        "both",
        {"admins": [ADMIN_A], "workers": [w_entry(WORKER_A)]},
        AccessSpec(admins=(ADMIN_A,), workers=(WA,)),
    ),
    (
        "prefix-default-slots-from-pool",  # base(): slotsPerWorker 2
        {"workers": [{"tokens": [WORKER_A], "workerIdPrefix": "pool-"}]},
        AccessSpec(workers=(WorkerAccess(tokens=(WORKER_A,), worker_id_prefix="pool-", max_slots=2),)),
    ),
    (
        "two-tokens-one-identity-for-rotation",
        {"workers": [w_entry(WORKER_A, ADMIN_B, ids=["w-0", "w-1"], slots=4)]},
        AccessSpec(workers=(WorkerAccess((WORKER_A, ADMIN_B), (), ("w-0", "w-1"), None, 4),)),
    ),
    (
        "certificate-identity",
        {"workers": [{"identities": ["worker.pool.svc"], "workerIds": ["w-0"], "maxSlots": 2}]},
        AccessSpec(
            workers=(WorkerAccess(identities=("worker.pool.svc",), worker_ids=("w-0",), max_slots=2),)
        ),
    ),
    (
        "disjoint-scopes",
        {"workers": [w_entry(WORKER_A, prefix="a-"), w_entry(ADMIN_B, ids=["b-0"])]},
        AccessSpec(
            workers=(
                WorkerAccess((WORKER_A,), (), (), "a-", 2),
                WorkerAccess((ADMIN_B,), (), ("b-0",), None, 2),
            )
        ),
    ),
]


@pytest.mark.parametrize(("section", "want"), [pytest.param(s, w, id=i) for i, s, w in ACCESS_GOOD])
def test_access_section_valid(section: object, want: AccessSpec) -> None:
    doc = base()
    if section is not None:
        doc["spec"]["access"] = section
    policy, warnings = policy_from_dict(doc)
    assert policy.access == want
    assert warnings == []
    round_trips(policy)


NEW_SHAPE = '{tokens: ["sha256:<hex>"], workerIds: [...] or workerIdPrefix: "...", maxSlots: N}'

# (id, the spec.access section, path that must carry the error, words the message must contain)
ACCESS_BAD: list[tuple[str, object, str, str]] = [
    # shape and unknown keys
    ("not-a-mapping", [ADMIN_A], "spec.access", "expected a mapping with keys admins, workers"),
    ("unknown-key", {"admin": [ADMIN_A]}, "spec.access.admin", "did you mean admins?"),
    ("unknown-key-tenants", {"tenants": []}, "spec.access.tenants", "allowed keys: admins, workers"),
    ("admins-not-a-list", {"admins": ADMIN_A}, "spec.access.admins", "expected a list of token hashes"),
    ("workers-not-a-list", {"workers": {"w": WORKER_A}}, "spec.access.workers", "expected a list"),
    # bad hashes, located by index
    ("admin-plain-token", {"admins": [ADMIN_A, "hunter2"]}, "spec.access.admins[1]", "64 lowercase hex"),
    (
        "admin-uppercase",
        {"admins": [ADMIN_A.upper().replace("SHA256", "sha256")]},
        "spec.access.admins[0]",
        "lowercase",
    ),
    (
        "admin-both-keys",
        {"admins": [{"token": ADMIN_A, "identity": "a.b"}]},
        "spec.access.admins[0]",
        "exactly one",
    ),
    (
        "admin-bad-identity",
        {"admins": [{"identity": "*.ops.example"}]},
        "spec.access.admins[0].identity",
        "wildcards",
    ),
    (
        "worker-short",
        {"workers": [w_entry("sha256:abc")]},
        "spec.access.workers[0].tokens[0]",
        "64 lowercase hex",
    ),
    (
        "worker-other-algo",
        {"workers": [w_entry("md5:" + "0" * 64)]},
        "spec.access.workers[0].tokens[0]",
        "sha256",
    ),
    ("worker-not-mapping", {"workers": [7]}, "spec.access.workers[0]", "expected a worker credential entry"),
    # the old shape: a bare hash names no worker ids, so it is refused with the new shape shown
    ("worker-plain-hash", {"workers": [WORKER_A]}, "spec.access.workers[0]", NEW_SHAPE),
    (
        "worker-no-credential",
        {"workers": [{"workerIds": ["w-0"]}]},
        "spec.access.workers[0]",
        "no credential",
    ),
    (
        "worker-no-scope",
        {"workers": [{"tokens": [WORKER_A]}]},
        "spec.access.workers[0]",
        "exactly one of workerIds",
    ),
    (
        "worker-both-scopes",
        {"workers": [{"tokens": [WORKER_A], "workerIds": ["a"], "workerIdPrefix": "a"}]},
        "spec.access.workers[0]",
        "exactly one of workerIds",
    ),
    (
        "worker-empty-prefix",
        {"workers": [w_entry(WORKER_A, prefix="")]},
        "spec.access.workers[0].workerIdPrefix",
        "every id",
    ),
    (
        "worker-empty-ids",
        {"workers": [w_entry(WORKER_A, ids=[])]},
        "spec.access.workers[0].workerIds",
        "empty",
    ),
    (
        "worker-dup-id",
        {"workers": [w_entry(WORKER_A, ids=["a", "a"])]},
        "spec.access.workers[0].workerIds[1]",
        "duplicate",
    ),
    (
        "worker-zero-slots",
        {"workers": [w_entry(WORKER_A, slots=0)]},
        "spec.access.workers[0].maxSlots",
        ">= 1",
    ),
    (
        "worker-1024-slots",
        {"workers": [w_entry(WORKER_A, slots=1024)]},
        "spec.access.workers[0].maxSlots",
        "<= 256",
    ),
    (
        "worker-unknown-key",
        {"workers": [{**w_entry(WORKER_A), "slots": 2}]},
        "spec.access.workers[0].slots",
        "maxSlots",
    ),
    # one worker id belongs to one entry
    (
        "same-id-twice",
        {"workers": [w_entry(WORKER_A, ids=["w-0"]), w_entry(ADMIN_B, ids=["w-0"])]},
        "spec.access.workers[1]",
        "also in the scope of spec.access.workers[0]",
    ),
    (
        "id-under-prefix",
        {"workers": [w_entry(WORKER_A, prefix="w-"), w_entry(ADMIN_B, ids=["w-9"])]},
        "spec.access.workers[1]",
        "worker id 'w-9'",
    ),
    (
        "nested-prefixes",
        {"workers": [w_entry(WORKER_A, prefix="w-"), w_entry(ADMIN_B, prefix="w-a")]},
        "spec.access.workers[1]",
        "overlaps",
    ),
    # one credential, one identity: the error is at the second place and names the first
    ("twice-in-admins", {"admins": [ADMIN_A, ADMIN_A]}, "spec.access.admins[1]", "spec.access.admins[0]"),
    (
        "admin-and-worker",
        {"admins": [ADMIN_A], "workers": [w_entry(WORKER_A, ADMIN_A)]},
        "spec.access.workers[0].tokens[1]",
        "spec.access.admins[0]",
    ),
    ("admin-and-tenant", {"admins": [TOKEN_A]}, "spec.access.admins[0]", "spec.tenants[1].tokens[0]"),
    (
        "worker-and-tenant",
        {"workers": [w_entry(TOKEN_A)]},
        "spec.access.workers[0].tokens[0]",
        "spec.tenants[1].tokens[0]",
    ),
    (
        "identity-twice",
        {
            "admins": [{"identity": "ops.example"}],
            "workers": [{"identities": ["ops.example"], "workerIds": ["a"]}],
        },
        "spec.access.workers[0].identities[0]",
        "spec.access.admins[0].identity",
    ),
]


@pytest.mark.parametrize(
    ("section", "path", "words"), [pytest.param(s, p, w, id=i) for i, s, p, w in ACCESS_BAD]
)
def test_access_section_error_names_its_path(section: object, path: str, words: str) -> None:
    doc = base()
    doc["spec"]["access"] = section
    problems = errors_of(doc)
    assert [p.path for p in problems] == [path], problems
    assert words in problems[0].message, problems[0]


def test_access_duplicate_message_says_one_identity() -> None:
    doc = base()
    doc["spec"]["access"] = {"admins": [TOKEN_A]}
    (problem,) = errors_of(doc)
    assert "already listed at spec.tenants[1].tokens[0]" in problem.message
    assert "one identity" in problem.message


def test_access_plain_token_is_never_echoed() -> None:
    doc = base()
    doc["spec"]["access"] = {"admins": ["s3cr3t-admin-token"], "workers": ["s3cr3t-worker"]}
    text = str(PolicyError(errors_of(doc)))
    assert "s3cr3t" not in text
    doc["spec"]["access"] = {"workers": [{"tokens": ["s3cr3t-worker"], "workerIds": ["a"]}]}
    assert "s3cr3t" not in str(PolicyError(errors_of(doc)))


def test_access_round_trips_through_yaml_and_dict() -> None:
    doc = base()
    admins = [ADMIN_A, {"identity": "spiffe://example.org/ops"}]
    workers = [w_entry(WORKER_A), {"identities": ["w.example"], "workerIdPrefix": "sts-", "maxSlots": 3}]
    doc["spec"]["access"] = {"admins": admins, "workers": workers}
    policy, _ = policy_from_dict(doc)
    assert policy_to_dict(policy)["spec"]["access"] == {"admins": admins, "workers": workers}
    round_trips(policy)
    assert parse_policy(policy_to_yaml(policy))[0].access == policy.access


def test_worker_scope_allows_its_ids_only() -> None:
    ids = WorkerAccess(tokens=(WORKER_A,), worker_ids=("w-0", "w-1"))
    assert ids.allows("w-0") and ids.allows("w-1")
    assert not ids.allows("w-2") and not ids.allows("w-") and not ids.allows("")
    sts = WorkerAccess(tokens=(WORKER_A,), worker_id_prefix="slotsched-worker-")
    assert sts.allows("slotsched-worker-0") and sts.allows("slotsched-worker-7c9d-x2")
    assert not sts.allows("slotsched-worker-")  # the prefix alone is no pod's name
    assert not sts.allows("other-worker-0") and not sts.allows("slotsched-workers")


# --- identities: a credential -> a tenant or a role (with its worker scope) -------------------


def test_identity_for_token_and_names() -> None:
    doc = base()
    doc["spec"]["tenants"][0]["identities"] = ["spiffe://example.org/sre"]
    doc["spec"]["access"] = {
        "admins": [ADMIN_A, {"identity": "ops.example.org"}],
        "workers": [w_entry(WORKER_A), {"identities": ["spiffe://example.org/w"], "workerIdPrefix": "p-"}],
    }
    policy, _ = policy_from_dict(doc)
    w = identity_for_token(policy, "worker-a")
    assert (w.role, w.key, w.worker) == ("worker", "spec.access.workers[0]", policy.access.workers[0])
    assert w.may_act_as("w-0") and not w.may_act_as("w-1")
    a = identity_for_token(policy, "admin-a")
    assert (a.role, a.key) == ("admin", "spec.access.admins") and a.may_act_as("anything")
    t = identity_for_token(policy, "token-a")
    assert (t.tenant, t.key) == ("product", "spec.tenants[1]") and not t.may_act_as("w-0")
    assert identity_for_token(policy, "nobody") == NOBODY
    uri, dns = (lambda v: CertName(SanType.URI, v)), (lambda v: CertName(SanType.DNS, v))
    assert identities_for_names(policy, [uri("spiffe://example.org/sre"), dns("other")]) == [
        Identity(tenant="sre", key="spec.tenants[0]")
    ]
    (wc,) = identities_for_names(policy, [uri("spiffe://example.org/w")])
    assert wc.role == "worker" and wc.may_act_as("p-3") and not wc.may_act_as("w-0")
    assert [i.role for i in identities_for_names(policy, [dns("ops.example.org")])] == ["admin"]
    # A name matches only an identity of its own SAN type.
    assert identities_for_names(policy, [dns("spiffe://example.org/sre"), uri("ops.example.org")]) == []
    # A certificate naming two identities matches both: the authenticator refuses it.
    assert len(identities_for_names(policy, [dns("ops.example.org"), uri("spiffe://example.org/sre")])) == 2
    assert identities_for_names(policy, []) == []


TENANT_IDENTITY_BAD: list[tuple[str, object, str, str]] = [
    ("not-a-list", "spiffe://a/b", "spec.tenants[0].identities", "expected a list of certificate names"),
    ("wildcard", ["*.example.org"], "spec.tenants[0].identities[0]", "without wildcards"),
    ("uppercase", ["Sre.Example.org"], "spec.tenants[0].identities[0]", "lowercase"),
    ("other-uri", ["https://example.org/sre"], "spec.tenants[0].identities[0]", "SPIFFE ID"),
    ("empty-spiffe", ["spiffe://"], "spec.tenants[0].identities[0]", "SPIFFE ID"),
    ("too-long", ["spiffe://a/" + "b" * 3000], "spec.tenants[0].identities[0]", "longer than 2048"),
    ("twice", ["a.example", "a.example"], "spec.tenants[0].identities[1]", "spec.tenants[0].identities[0]"),
]


@pytest.mark.parametrize(
    ("value", "path", "words"), [pytest.param(v, p, w, id=i) for i, v, p, w in TENANT_IDENTITY_BAD]
)
def test_tenant_identities_errors(value: object, path: str, words: str) -> None:
    doc = base()
    doc["spec"]["tenants"][0]["identities"] = value
    problems = errors_of(doc)
    assert [p.path for p in problems] == [path], problems
    assert words in problems[0].message, problems[0]


# --- spec.rateLimits and tenants[].rateLimit ---------------------------------------------------


def test_rate_limits_valid_and_round_trip() -> None:
    doc = base()
    doc["spec"]["rateLimits"] = {
        "tenant": {"qps": 50, "burst": 100},
        "renewals": {"qps": 200},  # burst: one second's worth
        "admin": {"qps": 0.5},  # burst at least 1
    }
    doc["spec"]["tenants"][1]["rateLimit"] = {"qps": 5, "burst": 10}
    policy, warnings = policy_from_dict(doc)
    assert warnings == []
    assert policy.rate_limits == RateLimitsSpec(
        tenant=RateLimit(50.0, 100), renewals=RateLimit(200.0, 200), admin=RateLimit(0.5, 1)
    )
    assert policy.tenants[1].rate_limit == RateLimit(5.0, 10)
    round_trips(policy)
    assert "rateLimits" not in policy_to_dict(policy_from_dict(base())[0])["spec"]  # absent: unlimited


RATE_BAD: list[tuple[str, object, str, str]] = [
    ("not-a-mapping", 50, "spec.rateLimits", "expected a mapping"),
    ("unknown-flow", {"tenants": {"qps": 1}}, "spec.rateLimits.tenants", "did you mean tenant?"),
    ("no-qps", {"tenant": {"burst": 5}}, "spec.rateLimits.tenant.qps", "required"),
    ("empty-bucket", {"admin": {}}, "spec.rateLimits.admin.qps", "required"),
    ("zero-qps", {"worker": {"qps": 0}}, "spec.rateLimits.worker.qps", "must be > 0"),
    ("zero-burst", {"tenant": {"qps": 1, "burst": 0}}, "spec.rateLimits.tenant.burst", ">= 1"),
    ("float-burst", {"tenant": {"qps": 1, "burst": 1.5}}, "spec.rateLimits.tenant.burst", "integer"),
]


@pytest.mark.parametrize(("value", "path", "words"), [pytest.param(v, p, w, id=i) for i, v, p, w in RATE_BAD])
def test_rate_limits_errors(value: object, path: str, words: str) -> None:
    doc = base()
    doc["spec"]["rateLimits"] = value
    problems = errors_of(doc)
    assert [p.path for p in problems] == [path], problems
    assert words in problems[0].message, problems[0]


def test_renewals_bucket_too_small_for_a_quota_warns_with_numbers() -> None:
    doc = base()  # product may hold 0 + 6 + 16 (uncapped BestEffort: 8 workers x 2) = 22 leases
    doc["spec"]["rateLimits"] = {"renewals": {"qps": 2}}
    _, warnings = policy_from_dict(doc)
    (w,) = [w for w in warnings if "'product'" in w.message]
    assert w.path == "spec.rateLimits.renewals.qps"
    assert (
        "up to 22 leases" in w.message and "leaseTTLSeconds 30" in w.message and "2.2 a second" in w.message
    )
    doc["spec"]["rateLimits"] = {"renewals": {"qps": 10}}
    assert policy_from_dict(doc)[1] == []


@pytest.mark.parametrize(
    ("token", "role", "tenant"),
    [
        pytest.param("admin-a", "admin", None, id="admin"),
        pytest.param("admin-b", "admin", None, id="second-admin"),
        pytest.param("worker-a", "worker", None, id="worker"),
        pytest.param("token-a", None, "product", id="tenant-token-has-no-role"),
        pytest.param("nobody", None, None, id="unknown"),
        pytest.param("", None, None, id="empty"),
        pytest.param(ADMIN_A, None, None, id="the-hash-is-not-the-token"),
    ],
)
def test_role_for_token(token: str, role: str | None, tenant: str | None) -> None:
    doc = base()
    doc["spec"]["access"] = {"admins": [ADMIN_A, ADMIN_B], "workers": [w_entry(WORKER_A)]}
    policy, _ = policy_from_dict(doc)
    assert role_for_token(policy, token) == role
    assert tenant_for_token(policy, token) == tenant  # a role token names no tenant


def test_validate_main_counts_role_tokens(tmp_path: pathlib.Path) -> None:
    doc = base()
    doc["spec"]["access"] = {"admins": [ADMIN_A, ADMIN_B], "workers": [w_entry(WORKER_A)]}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = io.StringIO()
    assert validate_main(str(path), out) == 0
    assert out.getvalue() == (
        "policy test is valid: 3 tenants, capacity 8 slots, floor 2, 2 admin tokens, 1 worker token\n"
    )


def test_example_file_has_roles() -> None:
    policy, _ = load_policy(EXAMPLE)
    assert policy.access.admins and policy.access.workers
