"""Token budgets in the policy (spec.budgets, spec.tenants[].budgets, spec.pool(s)[].budgets):
every bad key is an error naming its path, the commitments are checked, the shipped example is
valid, and a policy with budgets round-trips through its YAML."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from scheduler.policy.errors import PolicyError
from scheduler.policy.model import BudgetRate
from scheduler.policy.validate import policy_from_dict
from scheduler.policy.yaml_io import load_policy, parse_policy, policy_to_yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy" / "policy-budgets-example.yaml"


def base() -> dict[str, Any]:
    return {
        "apiVersion": "slotsched.dev/v1alpha1",
        "kind": "SchedulingPolicy",
        "metadata": {"name": "p"},
        "spec": {
            "pool": {"budgets": ["llm"]},
            "budgets": [{"name": "llm", "tokensPerMinute": 1000, "requestsPerMinute": 100}],
            "tenants": [
                {
                    "name": "a",
                    "budgets": [
                        {
                            "budget": "llm",
                            "guaranteed": {"percent": 10},
                            "burstable": {"nominal": {"percent": 20}, "limit": {"percent": 50}},
                        }
                    ],
                },
                {"name": "b", "budgets": [{"budget": "llm", "bestEffort": {"limit": {"percent": 30}}}]},
            ],
        },
    }


def edit(path: str, value: Any) -> dict[str, Any]:
    """base() with the value at a dotted path set (a [i] indexes a list)."""
    doc = copy.deepcopy(base())
    *parents, last = path.split(".")
    node: Any = doc
    for p in parents:
        name, _, idx = p.partition("[")
        node = node[name] if not idx else node[name][int(idx[:-1])]
    node[last] = value
    return doc


T0 = "spec.tenants[0].budgets[0]"
ERRORS: list[tuple[str, dict[str, Any], str, str]] = [
    ("budgets not a list", edit("spec.budgets", {"llm": 1}), "spec.budgets", "expected a list of budgets"),
    ("a budget not a mapping", edit("spec.budgets", ["llm"]), "spec.budgets[0]", "expected a mapping"),
    (
        "a budget without a name",
        edit("spec.budgets", [{"tokensPerMinute": 1}]),
        "spec.budgets[0].name",
        "required",
    ),
    (
        "a bad budget name",
        edit("spec.budgets[0].name", "Bad_Name"),
        "spec.budgets[0].name",
        "not a valid budget name",
    ),
    (
        "two budgets of one name",
        edit("spec.budgets", [{"name": "llm", "tokensPerMinute": 1}, {"name": "llm", "tokensPerMinute": 1}]),
        "spec.budgets[1].name",
        "duplicate budget name 'llm'",
    ),
    (
        "a budget limiting nothing",
        edit("spec.budgets", [{"name": "llm"}]),
        "spec.budgets[0]",
        "limits at least one of",
    ),
    (
        "a limit of zero",
        edit("spec.budgets[0].tokensPerMinute", 0),
        "spec.budgets[0].tokensPerMinute",
        "must be > 0",
    ),
    (
        "a fractional limit",
        edit("spec.budgets[0].tokensPerMinute", 1.5),
        "spec.budgets[0].tokensPerMinute",
        "expected an integer",
    ),
    (
        "an absurd limit",
        edit("spec.budgets[0].tokensPerMinute", 10**13),
        "spec.budgets[0].tokensPerMinute",
        "must be <=",
    ),
    (
        "a limit as a string",
        edit("spec.budgets[0].requestsPerMinute", "100"),
        "spec.budgets[0].requestsPerMinute",
        "expected an integer",
    ),
    (
        "a misspelt limit",
        edit("spec.budgets[0].tokenPerMinute", 5),
        "spec.budgets[0].tokenPerMinute",
        "did you mean tokensPerMinute?",
    ),
    (
        "a decrease of zero",
        edit("spec.budgets[0].feedback", {"decrease": 0}),
        "spec.budgets[0].feedback.decrease",
        "must be > 0",
    ),
    (
        "a decrease above one",
        edit("spec.budgets[0].feedback", {"decrease": 1.5}),
        "spec.budgets[0].feedback.decrease",
        "must be <= 1",
    ),
    (
        "a TTL of zero",
        edit("spec.budgets[0].permitTTLSeconds", 0),
        "spec.budgets[0].permitTTLSeconds",
        "must be > 0",
    ),
    (
        "a negative queue cap",
        edit("spec.budgets[0].maxPending", -1),
        "spec.budgets[0].maxPending",
        "must not be negative",
    ),
    (
        "a tenant's budgets not a list",
        edit("spec.tenants[0].budgets", {"llm": {}}),
        "spec.tenants[0].budgets",
        "expected a list",
    ),
    (
        "a share of an unknown budget",
        edit(f"{T0}.budget", "nope"),
        f"{T0}.budget",
        "unknown budget 'nope': the policy's budgets are 'llm'",
    ),
    (
        "a share naming no budget",
        edit("spec.tenants[0].budgets", [{"guaranteed": {"percent": 1}}]),
        f"{T0}.budget",
        "required",
    ),
    (
        "two shares of one budget",
        edit("spec.tenants[0].budgets", [{"budget": "llm"}, {"budget": "llm"}]),
        "spec.tenants[0].budgets[1].budget",
        "duplicate entry for budget 'llm'",
    ),
    ("an unknown key in a share", edit(f"{T0}.reserved", {"percent": 1}), f"{T0}.reserved", "unknown key"),
    ("a weight of zero", edit(f"{T0}.weight", 0), f"{T0}.weight", "must be > 0"),
    (
        "a rate in a dimension the budget does not limit",
        edit(f"{T0}.guaranteed", {"percent": 1, "inputTokensPerMinute": 5}),
        f"{T0}.guaranteed.inputTokensPerMinute",
        "does not limit inputTokensPerMinute",
    ),
    (
        "a Guaranteed rate missing a dimension the budget limits",
        edit(f"{T0}.guaranteed", {"tokensPerMinute": 50}),
        f"{T0}.guaranteed.requestsPerMinute",
        "required: budget 'llm' limits requestsPerMinute",
    ),
    (
        "a nominal rate missing one",
        edit(f"{T0}.burstable", {"nominal": {"requestsPerMinute": 5}}),
        f"{T0}.burstable.nominal.tokensPerMinute",
        "required",
    ),
    (
        "nominal above limit",
        edit(f"{T0}.burstable", {"nominal": {"percent": 60}, "limit": {"tokensPerMinute": 500}}),
        f"{T0}.burstable.nominal.tokensPerMinute",
        "nominal 600 a minute is greater than limit 500",
    ),
    (
        "a percent above 100",
        edit(f"{T0}.guaranteed", {"percent": 120}),
        f"{T0}.guaranteed.percent",
        "must be <= 100",
    ),
    ("an empty rate", edit(f"{T0}.guaranteed", {}), f"{T0}.guaranteed", "empty: give percent or a rate"),
    ("a rate as a string", edit(f"{T0}.guaranteed", "10%"), f"{T0}.guaranteed", "expected a rate"),
    (
        "Guaranteed rates above the budget",
        edit(f"{T0}.guaranteed", {"tokensPerMinute": 1001, "requestsPerMinute": 10}),
        "spec.budgets[0].tokensPerMinute",
        "Guaranteed rates of budget 'llm' add up to 1001 a minute, above its limit 1000",
    ),
    (
        "a pool naming an unknown budget",
        edit("spec.pool.budgets", ["nope"]),
        "spec.pool.budgets[0]",
        "unknown budget 'nope'",
    ),
    (
        "a pool naming a budget twice",
        edit("spec.pool.budgets", ["llm", "llm"]),
        "spec.pool.budgets[1]",
        "duplicate budget",
    ),
    (
        "a pool's budgets not a list",
        edit("spec.pool.budgets", "llm"),
        "spec.pool.budgets",
        "expected a list of budget names",
    ),
]


@pytest.mark.parametrize(("case", "doc", "path", "fragment"), ERRORS, ids=[e[0] for e in ERRORS])
def test_a_bad_budget_key_is_an_error_naming_its_path(
    case: str, doc: dict[str, Any], path: str, fragment: str
) -> None:
    with pytest.raises(PolicyError) as err:
        policy_from_dict(doc)
    found = [p for p in err.value.problems if p.path == path]
    assert found, f"{case}: no error at {path}: {err.value}"
    assert any(fragment in p.message for p in found), f"{case}: {[p.message for p in found]}"


def test_spec_pools_entries_name_their_budgets() -> None:
    doc = base()
    del doc["spec"]["pool"]
    doc["spec"]["pools"] = [{"name": "cpu", "budgets": ["llm"]}, {"name": "gpu", "budgets": ["nope"]}]
    with pytest.raises(PolicyError) as err:
        policy_from_dict(doc)
    assert [str(p) for p in err.value.problems] == [
        "spec.pools[1].budgets[0]: unknown budget 'nope': the policy's budgets are 'llm'"
    ]
    doc["spec"]["pools"][1]["budgets"] = []
    policy, _ = policy_from_dict(doc)
    assert [p.budgets for p in policy.pools] == [("llm",), ()]
    assert parse_policy(policy_to_yaml(policy))[0] == policy


def test_no_shared_remainder_is_a_warning_with_the_numbers() -> None:
    doc = edit(f"{T0}.burstable", {"nominal": {"percent": 90}})
    _, warnings = policy_from_dict(doc)
    tail = "a minute or more: no shared remainder is left, so BestEffort can starve"
    assert [str(w) for w in warnings] == [
        "spec.budgets[0].requestsPerMinute: budget 'llm': Guaranteed (10) and Burstable nominal (90) rates "
        f"add up to its limit 100 {tail}",
        "spec.budgets[0].tokensPerMinute: budget 'llm': Guaranteed (100) and Burstable nominal (900) rates "
        f"add up to its limit 1000 {tail}",
    ]


def test_a_share_reads_as_rates_per_dimension() -> None:
    policy, warnings = policy_from_dict(edit(f"{T0}.guaranteed", {"percent": 10, "requestsPerMinute": 3}))
    assert warnings == []
    budget = policy.budgets[0]
    share = policy.tenants[0].budget("llm")
    assert share is not None and share.reserved == BudgetRate(percent=10.0, requests=3)
    # requests, input, output, tokens: the value given, else the percent; None where not limited.
    assert share.reserved.resolve(budget) == (3.0, None, None, 100.0)
    assert policy.tenants[1].budget("llm") is not None and policy.tenants[0].budget("nope") is None
    assert policy.pool.budgets == ("llm",)


@pytest.mark.parametrize(
    "doc",
    [base(), edit("spec.tenants[1].budgets[0].bestEffort", {"limit": None})],
    ids=["base", "null limit"],
)
def test_a_policy_with_budgets_round_trips_through_yaml(doc: dict[str, Any]) -> None:
    policy, _ = policy_from_dict(doc)
    assert parse_policy(policy_to_yaml(policy))[0] == policy


def test_the_shipped_example_is_valid_and_names_every_budget_key() -> None:
    policy, warnings = load_policy(EXAMPLE)
    assert warnings == []
    assert [b.name for b in policy.budgets] == ["anthropic-sonnet"]
    assert policy.pool.budgets == ("anthropic-sonnet",)
    assert all(t.budget("anthropic-sonnet") is not None for t in policy.tenants)
    text = EXAMPLE.read_text()
    keys = ["inputTokensPerMinute", "outputTokensPerMinute", "requestsPerMinute", "permitTTLSeconds"]
    keys += ["maxPendingPerTenant", "feedback", "guaranteed", "burstable", "bestEffort", "percent"]
    for key in keys:
        assert key in text, key
    assert parse_policy(policy_to_yaml(policy))[0] == policy


def test_a_policy_without_budgets_writes_no_budget_keys() -> None:
    doc = base()
    del doc["spec"]["budgets"], doc["spec"]["pool"]
    for t in doc["spec"]["tenants"]:
        del t["budgets"]
    assert "budgets" not in policy_to_yaml(policy_from_dict(doc)[0])


def test_the_platform_teams_guide_shows_a_valid_budget_policy() -> None:
    import yaml

    guide = (ROOT / "docs" / "platform-teams.md").read_text(encoding="utf-8")
    snippet = guide.split("## Token budgets", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    doc = {"apiVersion": "slotsched.dev/v1alpha1", "kind": "SchedulingPolicy", **yaml.safe_load(snippet)}
    policy, warnings = policy_from_dict(doc)
    assert warnings == [] and policy.tenants[0].budget("anthropic-sonnet") is not None
