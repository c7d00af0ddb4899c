"""spec.fairness (usage over time, BestEffort's minimum share, the share window): defaults,
round trip, errors naming the key path, the CRD's schema for it, a live change."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from scheduler.policy.crd import policy_schema
from scheduler.policy.diff import diff_policies
from scheduler.policy.errors import PolicyError
from scheduler.policy.model import FairnessSpec
from scheduler.policy.validate import policy_from_dict
from scheduler.policy.yaml_io import parse_policy, policy_to_dict, policy_to_yaml

BASE: dict[str, Any] = {
    "apiVersion": "slotsched.dev/v1alpha1",
    "kind": "SchedulingPolicy",
    "metadata": {"name": "p"},
    "spec": {"tenants": [{"name": "a", "burstable": {"nominal": 1}}]},
}


def _with(fairness: object) -> dict[str, Any]:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    doc["spec"]["fairness"] = fairness
    return doc


def test_defaults_and_not_written_when_default() -> None:
    policy, _ = policy_from_dict(BASE)
    assert policy.fairness == FairnessSpec(
        usage_half_life_s=600.0, usage_sampling_s=10.0, best_effort_min_share=0.1, share_window_s=0.0
    )
    assert "fairness" not in policy_to_dict(policy)["spec"]


def test_round_trip_and_diff() -> None:
    keys = {
        "usageHalfLifeSeconds": 0,
        "usageSamplingSeconds": 5,
        "bestEffortMinShare": 0.25,
        "shareWindowSeconds": 900,
    }
    policy, warnings = policy_from_dict(_with(keys))
    assert not warnings
    assert policy.fairness == FairnessSpec(0.0, 5.0, 0.25, 900.0)
    assert policy_to_dict(policy)["spec"]["fairness"] == keys
    assert parse_policy(policy_to_yaml(policy))[0] == policy
    before, _ = policy_from_dict(BASE)
    paths = {c.path for c in diff_policies(before, policy).changes}
    assert {
        "fairness.usageHalfLifeSeconds",
        "fairness.bestEffortMinShare",
        "fairness.shareWindowSeconds",
    } <= paths


@pytest.mark.parametrize(
    ("fairness", "path"),
    [
        ({"usageHalfLifeSeconds": -1}, "spec.fairness.usageHalfLifeSeconds"),
        ({"usageSamplingSeconds": 0}, "spec.fairness.usageSamplingSeconds"),
        ({"bestEffortMinShare": 1.5}, "spec.fairness.bestEffortMinShare"),
        ({"bestEffortMinShare": "some"}, "spec.fairness.bestEffortMinShare"),
        ({"shareWindowSeconds": -1}, "spec.fairness.shareWindowSeconds"),
        ({"shareWindowSeconds": "5m"}, "spec.fairness.shareWindowSeconds"),
        ({"shareWindowSeconds": float("inf")}, "spec.fairness.shareWindowSeconds"),
        ({"halfLife": 3}, "spec.fairness.halfLife"),
        ("fair", "spec.fairness"),
    ],
)
def test_errors_name_the_key(fairness: object, path: str) -> None:
    with pytest.raises(PolicyError) as e:
        policy_from_dict(_with(fairness))
    assert any(p.path == path for p in e.value.problems), e.value


def test_the_crd_knows_every_key() -> None:
    props = policy_schema()["properties"]["spec"]["properties"]["fairness"]["properties"]
    assert set(props) == {
        "usageHalfLifeSeconds",
        "usageSamplingSeconds",
        "bestEffortMinShare",
        "shareWindowSeconds",
    }
    assert props["bestEffortMinShare"]["maximum"] == 1.0
    assert props["shareWindowSeconds"]["minimum"] == 0
