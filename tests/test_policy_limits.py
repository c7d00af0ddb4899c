"""spec.limits (the fair admission gate's seats and queue bound, the open-stream bounds): defaults,
round trip, errors naming the key path, the CRD's schema for it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from scheduler.policy.crd import policy_schema
from scheduler.policy.errors import PolicyError
from scheduler.policy.model import LimitsSpec
from scheduler.policy.validate import policy_from_dict
from scheduler.policy.yaml_io import parse_policy, policy_to_dict, policy_to_yaml

BASE: dict[str, Any] = {
    "apiVersion": "slotsched.dev/v1alpha1",
    "kind": "SchedulingPolicy",
    "metadata": {"name": "p"},
    "spec": {"tenants": [{"name": "a", "burstable": {"nominal": 1}}]},
}


def _with(limits: object) -> dict[str, Any]:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    doc["spec"]["limits"] = limits
    return doc


def test_defaults_and_not_written_when_default() -> None:
    policy, _ = policy_from_dict(BASE)
    assert policy.limits == LimitsSpec()
    assert (policy.limits.seats, policy.limits.queued_per_flow) == (32, 64)
    assert (policy.limits.channels_per_tenant, policy.limits.channels_per_connection) == (64, 64)
    assert "limits" not in policy_to_dict(policy)["spec"]


def test_round_trip() -> None:
    keys = {
        "seats": 4,
        "queuedPerFlow": 8,
        "channelsPerTenant": 3,
        "channelsPerConnection": 2,
        "streamsPerTenant": 100,
        "streamsPerConnection": 50,
        "turnMillis": 0.5,
    }
    policy, warnings = policy_from_dict(_with(keys))
    assert not warnings
    assert policy.limits == LimitsSpec(4, 8, 3, 2, 100, 50, 0.5)
    assert policy_to_dict(policy)["spec"]["limits"] == keys
    assert parse_policy(policy_to_yaml(policy))[0] == policy
    partial, _ = policy_from_dict(_with({"seats": 2}))
    assert partial.limits == LimitsSpec(seats=2)


@pytest.mark.parametrize(
    ("limits", "path"),
    [
        ({"seats": 0}, "spec.limits.seats"),
        ({"queuedPerFlow": -1}, "spec.limits.queuedPerFlow"),
        ({"channelsPerTenant": 1.5}, "spec.limits.channelsPerTenant"),
        ({"streamsPerConnection": "many"}, "spec.limits.streamsPerConnection"),
        ({"turnMillis": -0.1}, "spec.limits.turnMillis"),
        ({"chanelsPerTenant": 3}, "spec.limits.chanelsPerTenant"),
        ("lots", "spec.limits"),
    ],
)
def test_errors_name_the_key(limits: object, path: str) -> None:
    with pytest.raises(PolicyError) as e:
        policy_from_dict(_with(limits))
    assert any(p.path == path for p in e.value.problems), e.value


def test_the_crd_knows_every_key() -> None:
    props = policy_schema()["properties"]["spec"]["properties"]["limits"]["properties"]
    assert set(props) == {
        "seats",
        "queuedPerFlow",
        "channelsPerTenant",
        "channelsPerConnection",
        "streamsPerTenant",
        "streamsPerConnection",
        "turnMillis",
    }
    counts = {k: p for k, p in props.items() if k != "turnMillis"}
    assert all(p["type"] == "integer" and p["minimum"] == 1 for p in counts.values())
    assert props["turnMillis"]["type"] == "number" and props["turnMillis"]["minimum"] == 0
