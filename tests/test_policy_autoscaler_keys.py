"""spec.autoscaler's new keys (scaleUp.oldestWaitSeconds, scaleDown, recycle, schedule,
forecast): read, written back, refused with the key named, by the validator and by the CRD."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.policy.model import ForecastSpec, ScheduleSpec, ScheduleWindow
from scheduler.policy.validate import policy_from_dict
from scheduler.policy.yaml_io import parse_policy, policy_to_yaml
from tests.test_policy_crd import api_server_errors, edit, validator_errors

GOOD: dict[str, Any] = {
    "scaleUp": {"oldestWaitSeconds": 90},
    "scaleDown": {"pods": 2, "percent": 50, "periodSeconds": 60},
    "recycle": {"memoryBytes": 2_000_000_000, "maxAgeSeconds": 86400},
    "schedule": {
        "timeZone": "Europe/Berlin",
        "windows": [
            {"days": ["mon", "tue", "wed", "thu", "fri"], "start": "08:30", "end": "18:00", "minWorkers": 4},
            {"start": "22:00", "end": "02:00", "minWorkers": 1},
        ],
    },
    "forecast": {"lookbackDays": 3, "leadSeconds": 180, "bucketSeconds": 600},
}


def test_the_keys_are_read_into_the_model_and_written_back() -> None:
    policy, _ = policy_from_dict(edit("spec.autoscaler", GOOD))
    a = policy.autoscaler
    assert a.scale_up_oldest_wait_s == 90
    assert (a.scale_down_pods, a.scale_down_percent, a.scale_down_period_s) == (2, 50, 60)
    assert (a.recycle_memory_bytes, a.recycle_max_age_s) == (2_000_000_000, 86400)
    assert a.schedule == ScheduleSpec(
        "Europe/Berlin",
        (ScheduleWindow(510, 1080, 4, (0, 1, 2, 3, 4)), ScheduleWindow(1320, 120, 1)),
    )
    assert a.forecast == ForecastSpec(3, 180.0, 600.0)
    again, _ = parse_policy(policy_to_yaml(policy))
    assert again == policy
    assert api_server_errors(edit("spec.autoscaler", GOOD)) == []


def test_a_pool_overrides_them() -> None:
    doc = edit("spec.autoscaler", GOOD)
    pool = {"name": "cpu", "slotsPerWorker": 2, "workers": 2, "minWorkers": 1, "maxWorkers": 4, "floor": 2}
    pool["autoscaler"] = {"forecast": {"lookbackDays": 1}}
    doc["spec"].pop("pool")
    doc["spec"]["pools"] = [pool]
    policy, _ = policy_from_dict(doc)
    spec = policy.for_pool("cpu").autoscaler
    assert spec.forecast.lookback_days == 1 and spec.scale_down_pods == 2  # the rest: spec.autoscaler's


BAD = [
    ("spec.autoscaler.scaleDown.percent", {"scaleDown": {"percent": 150}}, "must be <= 100"),
    ("spec.autoscaler.scaleDown.pods", {"scaleDown": {"pods": -1}}, "must not be negative"),
    ("spec.autoscaler.recycle.memoryBytes", {"recycle": {"memoryBytes": 1.5}}, "expected an integer"),
    (
        "spec.autoscaler.scaleUp.oldestWaitSeconds",
        {"scaleUp": {"oldestWaitSeconds": -5}},
        "must not be negative",
    ),
    ("spec.autoscaler.forecast.lookbackDays", {"forecast": {"lookbackDays": 60}}, "must be <= 28"),
    ("spec.autoscaler.schedule.timeZone", {"schedule": {"timeZone": "Mars/Olympus"}}, "unknown time zone"),
    (
        "spec.autoscaler.schedule.windows[0].start",
        {"schedule": {"windows": [{"start": "8:30", "end": "18:00", "minWorkers": 1}]}},
        "HH:MM",
    ),
    (
        "spec.autoscaler.schedule.windows[0].days[1]",
        {
            "schedule": {
                "windows": [{"days": ["mon", "funday"], "start": "08:00", "end": "18:00", "minWorkers": 1}]
            }
        },
        "expected one of mon",
    ),
    (
        "spec.autoscaler.schedule.windows[0].minWorkers",
        {"schedule": {"windows": [{"start": "08:00", "end": "18:00"}]}},
        "required",
    ),
    (
        "spec.autoscaler.schedule.windows[0].end",
        {"schedule": {"windows": [{"start": "08:00", "end": "08:00", "minWorkers": 1}]}},
        "a window must last",
    ),
    ("spec.autoscaler.recycle.maxAge", {"recycle": {"maxAge": 5}}, "did you mean maxAgeSeconds"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD, ids=[k for k, _, _ in BAD])
def test_a_bad_value_is_refused_naming_its_key(key: str, value: dict[str, Any], message: str) -> None:
    errors = validator_errors(edit("spec.autoscaler", value))
    assert any(e.startswith(key) and message in e for e in errors), errors


@pytest.mark.parametrize(
    "value",
    [
        {"scaleDown": {"percent": 150}},
        {"forecast": {"lookbackDays": 60}},
        {"schedule": {"windows": [{"start": "8:30", "end": "18:00", "minWorkers": 1}]}},
        {"schedule": {"windows": [{"days": ["funday"], "start": "08:00", "end": "18:00", "minWorkers": 1}]}},
        {"schedule": {"windows": [{"start": "08:00", "end": "18:00"}]}},
    ],
)
def test_the_crd_refuses_them_too(value: dict[str, Any]) -> None:
    assert api_server_errors(edit("spec.autoscaler", value)) != []


def test_a_policy_without_them_is_written_as_before() -> None:
    """Defaults are not written: a policy that does not use the new keys keeps its text."""
    text = policy_to_yaml(policy_from_dict(edit("spec.autoscaler", {}))[0])
    for key in ("scaleDown:", "recycle:", "schedule:", "forecast:", "oldestWaitSeconds:"):
        assert key not in text
