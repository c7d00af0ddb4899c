"""The SchedulingPolicy CRD: generated from the validator, committed fresh, and it refuses what the
validator refuses.

`api_server_errors` models what the API server does with an object of this CRD, offline: drop
null fields (pruning), refuse unknown fields (kubectl's default strict field validation), check
the OpenAPI schema (jsonschema), the list keys (`x-kubernetes-list-type` map/set) and the CEL
rules (`x-kubernetes-validations`, evaluated with cel-python). A table of bad policies is run
through both the validator and this model; the rows the CRD cannot express say so (`by`).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from scheduler.policy import crd
from scheduler.policy.defaults import DEFAULT_POLICY_YAML
from scheduler.policy.errors import PolicyError
from scheduler.policy.validate import policy_from_dict

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "deploy" / "crd" / "schedulingpolicies.slotsched.dev.yaml"
H = "sha256:" + "a" * 64
H2 = "sha256:" + "b" * 64


def committed_schema() -> dict[str, Any]:
    doc = yaml.safe_load(COMMITTED.read_text())
    return doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


# --- the model of the API server ----------------------------------------------------------------


def _json_schema(s: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    """OpenAPI v3.0 (Kubernetes dialect) -> JSON Schema 2020-12, unknown fields refused."""
    out: dict[str, Any] = {}
    for k, v in s.items():
        if k.startswith("x-kubernetes") or k in ("description", "format"):
            continue
        if k == "properties":
            out[k] = {name: _json_schema(sub) for name, sub in v.items()}
        elif k == "items":
            out[k] = _json_schema(v)
        elif k == "anyOf":
            out[k] = [_json_schema(sub) for sub in v]
        elif k == "exclusiveMinimum":
            out["exclusiveMinimum"] = s["minimum"]
        elif k == "nullable":
            out["type"] = [s["type"], "null"]
        elif k == "type" and s.get("nullable"):
            continue
        else:
            out[k] = v
    if "exclusiveMinimum" in out:
        out.pop("minimum", None)
    if "properties" in out and strict:
        out["additionalProperties"] = False
    if s.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    return out


def _api_server_schema(schema: dict[str, Any]) -> dict[str, Any]:
    js = _json_schema(schema)
    # Routed by apiVersion and kind: another kind never meets this schema.
    js["properties"]["apiVersion"]["enum"] = ["slotsched.dev/v1alpha1"]
    js["properties"]["kind"]["enum"] = ["SchedulingPolicy"]
    # ObjectMeta (the part a policy file may use): labels and annotations are string maps.
    strings = {"type": "object", "additionalProperties": {"type": "string"}}
    js["properties"]["metadata"]["properties"] |= {
        "namespace": {"type": "string"},
        "labels": strings,
        "annotations": strings,
    }
    return js


def _prune_nulls(value: Any, schema: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {
            k: _prune_nulls(v, props.get(k, {}))
            for k, v in value.items()
            if v is not None or props.get(k, {}).get("nullable")
        }
    if isinstance(value, list) and "items" in schema:
        return [_prune_nulls(v, schema["items"]) for v in value]
    return value


_CEL = celpy.Environment()


def _k8s_extras(value: Any, schema: dict[str, Any], path: str, errors: list[str]) -> None:
    """List keys and CEL rules, where the schema itself passed."""
    for rule in schema.get("x-kubernetes-validations", []):
        prog = _CEL.program(_CEL.compile(rule["rule"]))
        if not bool(prog.evaluate({"self": celpy.json_to_cel(value)})):
            errors.append(f"{path}: {rule['message']}")
    if isinstance(value, dict):
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                _k8s_extras(value[k], sub, f"{path}.{k}", errors)
    elif isinstance(value, list):
        keys = schema.get("x-kubernetes-list-map-keys")
        if keys:
            seen = [tuple(item.get(k) for k in keys) for item in value]
            if len(set(seen)) != len(seen):
                errors.append(f"{path}: Duplicate value (list-map keys {keys})")
        for i, item in enumerate(value):
            _k8s_extras(item, schema["items"], f"{path}[{i}]", errors)


def api_server_errors(doc: Any, schema: dict[str, Any] | None = None) -> list[str]:
    schema = schema or committed_schema()
    doc = _prune_nulls(doc, schema)
    validator = jsonschema.Draft202012Validator(_api_server_schema(schema))
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    if not errors:
        _k8s_extras(doc, schema, "", errors)
    return errors


def validator_errors(doc: Any) -> list[str]:
    try:
        policy_from_dict(doc)
    except PolicyError as e:
        return [str(p) for p in e.problems]
    return []


# --- the table ----------------------------------------------------------------------------------


def base() -> dict[str, Any]:
    return {
        "apiVersion": "slotsched.dev/v1alpha1",
        "kind": "SchedulingPolicy",
        "metadata": {"name": "p"},
        "spec": {
            "pool": {"slotsPerWorker": 2, "workers": 2, "minWorkers": 1, "maxWorkers": 4, "floor": 2},
            "tenants": [
                {
                    "name": "a",
                    "weight": 1,
                    "guaranteed": 1,
                    "burstable": {"nominal": 1, "limit": 2},
                    "tokens": [H],
                },
            ],
            "access": {"admins": [H2]},
        },
    }


def edit(path: str, value: Any) -> dict[str, Any]:
    """base() with the value at a dotted path replaced (a trailing [i] indexes a list)."""
    doc = base()
    *parents, last = path.split(".")
    node: Any = doc
    for p in parents:
        name, _, idx = p.partition("[")
        node = node[name] if not idx else node[name][int(idx[:-1])]
    node[last] = value
    return doc


SCHEMA, CEL, LIST_KEYS, SCHEDULER = "schema", "cel", "list-keys", "scheduler only"

BAD: list[tuple[str, dict[str, Any], str]] = [
    ("wrong kind", edit("kind", "Policy"), SCHEMA),
    ("wrong apiVersion", edit("apiVersion", "slotsched.dev/v2"), SCHEMA),
    ("unknown top key", edit("extra", 1), SCHEMA),
    ("unknown spec key", edit("spec.pools", {}), SCHEMA),
    ("unknown pool key (typo)", edit("spec.pool.slotPerWorker", 2), SCHEMA),
    ("unknown tenant key", edit("spec.tenants[0].quota", 1), SCHEMA),
    ("unknown metadata key", edit("metadata.owner", "x"), SCHEMA),
    ("bad metadata name", edit("metadata.name", "Bad_Name"), SCHEMA),
    ("label not a string", edit("metadata.labels", {"a": 1}), SCHEMA),
    ("slotsPerWorker 0", edit("spec.pool.slotsPerWorker", 0), SCHEMA),
    ("workers negative", edit("spec.pool.workers", -1), SCHEMA),
    ("workers a string", edit("spec.pool.workers", "2"), SCHEMA),
    ("workers a boolean", edit("spec.pool.workers", True), SCHEMA),
    ("workers not an integer", edit("spec.pool.workers", 2.5), SCHEMA),
    ("floor negative", edit("spec.pool.floor", -1), SCHEMA),
    ("floor not a percent", edit("spec.pool.floor", "half"), SCHEMA),
    ("floor a list", edit("spec.pool.floor", [1]), SCHEMA),
    ("leaseTTL zero (exclusive)", edit("spec.timing", {"leaseTTLSeconds": 0}), SCHEMA),
    ("yieldGrace negative", edit("spec.timing", {"yieldGraceSeconds": -1}), SCHEMA),
    ("bestEffortFraction above 1", edit("spec.queue", {"bestEffortFraction": 1.5}), SCHEMA),
    ("scaleUp pods 0", edit("spec.autoscaler", {"scaleUp": {"pods": 0}}), SCHEMA),
    ("unknown weight", edit("spec.autoscaler", {"weights": {"gold": 1}}), SCHEMA),
    ("pool not a mapping", edit("spec.pool", [1]), SCHEMA),
    ("tenants not a list", edit("spec.tenants", {"a": 1}), SCHEMA),
    ("tenant not a mapping", edit("spec.tenants", ["a"]), SCHEMA),
    ("tenant without a name", edit("spec.tenants", [{"weight": 1}]), SCHEMA),
    ("tenant name upper case", edit("spec.tenants[0].name", "Team"), SCHEMA),
    ("tenant name too long", edit("spec.tenants[0].name", "a" * 64), SCHEMA),
    ("tenant weight zero", edit("spec.tenants[0].weight", 0), SCHEMA),
    ("guaranteed negative", edit("spec.tenants[0].guaranteed", -1), SCHEMA),
    ("bestEffort limit negative", edit("spec.tenants[0].bestEffort", {"limit": -1}), SCHEMA),
    ("a plain token", edit("spec.tenants[0].tokens", ["hunter2"]), SCHEMA),
    ("an upper-case hash", edit("spec.tenants[0].tokens", ["sha256:" + "A" * 64]), SCHEMA),
    # An admin entry is a hash or {token}/{identity}: no one OpenAPI type, so the scheduler checks it.
    ("an upper-case admin hash", edit("spec.access.admins", ["sha256:" + "A" * 64]), SCHEDULER),
    ("workers not a list", edit("spec.access.workers", H), SCHEMA),
    ("a bare worker token hash", edit("spec.access.workers", [H]), SCHEMA),
    ("unknown access role", edit("spec.access.readers", [H]), SCHEMA),
    (
        "a worker token twice in one entry",
        edit("spec.access.workers", [{"tokens": ["sha256:" + "c" * 64] * 2, "workerIdPrefix": "w-"}]),
        SCHEMA,
    ),
    (
        "a worker entry with ids and a prefix",
        edit(
            "spec.access.workers",
            [{"tokens": ["sha256:" + "c" * 64], "workerIds": ["a"], "workerIdPrefix": "w-"}],
        ),
        CEL,
    ),
    (
        "a worker entry allowed too many slots",
        edit(
            "spec.access.workers",
            [{"tokens": ["sha256:" + "c" * 64], "workerIdPrefix": "w-", "maxSlots": 10_000}],
        ),
        SCHEMA,
    ),
    ("a rate limit of zero qps", edit("spec.tenants[0].rateLimit", {"qps": 0}), SCHEMA),
    ("minWorkers > maxWorkers", edit("spec.pool.minWorkers", 5), CEL),
    ("workers > maxWorkers", edit("spec.pool.workers", 5), CEL),
    ("workers < default minWorkers", edit("spec.pool", {"workers": 0}), CEL),
    ("floor above capacity", edit("spec.pool.floor", 5), CEL),
    ("nominal > limit", edit("spec.tenants[0].burstable", {"nominal": 3, "limit": 2}), CEL),
    ("duplicate tenant names", edit("spec.tenants", [{"name": "a"}, {"name": "a"}]), LIST_KEYS),
    # Not expressible in the CRD: the scheduler refuses it and says so in status (Valid=False).
    ("percent floor above 100%", edit("spec.pool.floor", "150%"), SCHEDULER),
    (
        "one token for two tenants",
        edit("spec.tenants", [{"name": "a", "tokens": [H]}, {"name": "b", "tokens": [H]}]),
        SCHEDULER,
    ),
    ("a tenant token as an admin token", edit("spec.access.admins", [H]), SCHEDULER),
    # Token budgets.
    ("a budget limiting nothing", edit("spec.budgets", [{"name": "llm"}]), CEL),
    ("a budget limit of zero", edit("spec.budgets", [{"name": "llm", "tokensPerMinute": 0}]), SCHEMA),
    ("a misspelt budget key", edit("spec.budgets", [{"name": "llm", "tokenPerMinute": 5}]), SCHEMA),
    ("a bad budget name", edit("spec.budgets", [{"name": "LLM", "tokensPerMinute": 5}]), SCHEMA),
    (
        "two budgets of one name",
        edit(
            "spec.budgets", [{"name": "llm", "tokensPerMinute": 5}, {"name": "llm", "requestsPerMinute": 5}]
        ),
        LIST_KEYS,
    ),
    (
        "a rate above 100 percent",
        edit("spec.tenants[0].budgets", [{"budget": "llm", "guaranteed": {"percent": 120}}]),
        SCHEMA,
    ),
    # Not expressible: which budgets exist, and the sums over tenants.
    ("a share of an unknown budget", edit("spec.tenants[0].budgets", [{"budget": "llm"}]), SCHEDULER),
    ("a pool naming an unknown budget", edit("spec.pool.budgets", ["llm"]), SCHEDULER),
]


@pytest.mark.parametrize(("case", "doc", "by"), BAD, ids=[c for c, _, _ in BAD])
def test_a_bad_policy_is_refused_by_the_validator_and_by_the_crd(case: str, doc: Any, by: str) -> None:
    assert validator_errors(doc), f"{case}: the validator accepted it"
    errors = api_server_errors(doc)
    if by == SCHEDULER:
        assert not errors, f"{case}: now expressible in the CRD ({errors}): move the row"
    else:
        assert errors, f"{case}: the CRD accepted it (expected a {by} error)"
        if by != SCHEMA:
            # It is the extra rule, not the schema, that catches it.
            assert not api_server_errors(doc, _without_extras(committed_schema()))


def _without_extras(s: Any) -> Any:
    if isinstance(s, dict):
        return {
            k: _without_extras(v)
            for k, v in s.items()
            if k not in ("x-kubernetes-validations", "x-kubernetes-list-map-keys")
        }
    if isinstance(s, list):
        return [_without_extras(v) for v in s]
    return s


def _good() -> list[tuple[str, Any]]:
    docs = [("built-in", yaml.safe_load(DEFAULT_POLICY_YAML)), ("minimal", base())]
    for p in (
        ROOT / "deploy" / "base" / "policy" / "policy.yaml",
        ROOT / "deploy" / "policy-example.yaml",
        ROOT / "deploy" / "policy-budgets-example.yaml",
        *sorted((ROOT / "scheduler" / "sim" / "samples").glob("*policy*.yaml")),
    ):
        docs.append((p.relative_to(ROOT).as_posix(), yaml.safe_load(p.read_text())))
    nulls = base()
    nulls["spec"]["timing"] = None  # null sections: absent for both
    nulls["spec"]["tenants"][0]["bestEffort"] = {"limit": None}
    docs += [
        ("null sections", nulls),
        ("percent floor", edit("spec.pool.floor", "12.5%")),
        ("empty", {"apiVersion": "slotsched.dev/v1alpha1", "kind": "SchedulingPolicy"}),
    ]
    return docs


@pytest.mark.parametrize(("name", "doc"), _good(), ids=[n for n, _ in _good()])
def test_a_good_policy_passes_both(name: str, doc: Any) -> None:
    assert validator_errors(doc) == []
    assert api_server_errors(doc) == []


def test_the_committed_crd_is_what_slotsched_policy_crd_prints() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "policy", "crd"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == COMMITTED.read_text(), (
        "deploy/crd/ is stale: slotsched policy crd > deploy/crd/schedulingpolicies.slotsched.dev.yaml"
    )
    assert proc.stdout == crd.crd_yaml()


def test_the_schema_is_structural() -> None:
    """What the API server demands of a CRD schema: a type on every node (or int-or-string),
    no `additionalProperties: false`, list-map keys required in the items."""

    def walk(s: dict[str, Any], path: str) -> None:
        # Structural: a type everywhere, except int-or-string and preserve-unknown-fields nodes.
        assert (
            "type" in s
            or s.get("x-kubernetes-int-or-string")
            or s.get("x-kubernetes-preserve-unknown-fields")
        ), path
        assert "additionalProperties" not in s, path
        for k, sub in s.get("properties", {}).items():
            walk(sub, f"{path}.{k}")
        if "items" in s:
            walk(s["items"], f"{path}[]")
            for key in s.get("x-kubernetes-list-map-keys", []):
                assert key in s["items"].get("required", []), f"{path}: list-map key {key} not required"

    walk(committed_schema(), "")
    # metadata may restrict the name only.
    assert set(committed_schema()["properties"]["metadata"]["properties"]) == {"name"}


def test_every_cel_rule_compiles_and_names_only_its_fields() -> None:
    rules = []

    def walk(s: dict[str, Any]) -> None:
        rules.extend(r["rule"] for r in s.get("x-kubernetes-validations", []))
        for sub in s.get("properties", {}).values():
            walk(sub)
        if "items" in s:
            walk(s["items"])

    walk(committed_schema())
    # pool (2), floor, burstable nominal <= limit, worker ids xor prefix, a budget limits something
    assert len(rules) == 6
    for r in rules:
        _CEL.compile(r)


def test_the_crd_passes_the_kubernetes_schema() -> None:
    import kubernetes_validate

    kubernetes_validate.validate(copy.deepcopy(crd.crd()), "1.30", strict=True)
