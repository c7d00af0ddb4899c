"""The autoscaler's alerts, checked by `promtool test rules` on series that should and should
not fire them (drain time above its SLO, flapping, blocked at the ceiling); the drain estimate
and the oldest waits exported without the built-in loop (KEDA, a static pool); the dashboard's
scale annotations."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from slots.autoscaler.decision import Reason, ScaleDecision, ScaleHistory
from slots.autoscaler.metrics import AutoscalerMetrics
from tests import test_deploy_overlays as overlays

ROOT = Path(__file__).resolve().parents[1]
RULES = {
    "base": ROOT / "deploy" / "base" / "prometheus-rules.yaml",
    "autoscaler": ROOT / "deploy" / "components" / "autoscaler" / "prometheus-rules.yaml",
}


def groups(name: str) -> list[dict[str, Any]]:
    """The rules of a PrometheusRule, without their annotations: promtool test compares alerts'
    annotations exactly, and what is tested here is when they fire (expr, for, labels); the
    templates are checked by `promtool check rules` (tests/test_deploy_overlays.py)."""
    doc = yaml.safe_load(RULES[name].read_text())
    out: list[dict[str, Any]] = doc["spec"]["groups"]
    for g in out:
        for r in g["rules"]:
            r.pop("annotations", None)
    return out


# Session fixture of tests/test_deploy_overlays.py: finds or installs promtool, and under CI fails
# rather than skips when it cannot (this module runs first, alphabetically).
promtool = overlays.promtool


def run_promtool_test(
    promtool: str, tmp_path: Path, rules: str, tests: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups(rules)}, sort_keys=False))
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return subprocess.run(
        [promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


def alert_case(
    series: list[tuple[str, str]], name: str, at: str, fires: list[dict[str, str]]
) -> dict[str, Any]:
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "alert_rule_test": [
            {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": labels} for labels in fires]}
        ],
    }


DRAIN = 'slotsched_autoscaler_estimated_drain_seconds{pool="cpu"}'
CHANGES = 'slotsched_autoscaler_direction_changes_total{pool="cpu"}'
CEILING = 'slotsched_autoscaler_at_ceiling{pool="cpu"}'

CASES = [
    # Drain estimate 10 min over the 5 min SLO: fires; at the SLO, or only briefly over: not.
    ("base", [(DRAIN, "400x30")], "SlotschedDrainTimeHigh", "20m", [{"severity": "warning", "pool": "cpu"}]),
    ("base", [(DRAIN, "300x30")], "SlotschedDrainTimeHigh", "20m", []),
    ("base", [(DRAIN, "400x5 60x25")], "SlotschedDrainTimeHigh", "20m", []),
    # Flapping: a reversal every 3 minutes fires after its 15 m; one every 10 minutes does not.
    (
        "autoscaler",
        [(CHANGES, "0+0.34x60")],
        "SlotschedAutoscalerFlapping",
        "50m",
        [{"severity": "warning", "pool": "cpu"}],
    ),
    ("autoscaler", [(CHANGES, "0+0.1x60")], "SlotschedAutoscalerFlapping", "50m", []),
    # Blocked at the ceiling (the existing alert): 10 minutes at max fires, 5 do not.
    ("autoscaler", [(CEILING, "1x20")], "SlotschedAtCeiling", "15m", [{"severity": "warning"}]),
    ("autoscaler", [(CEILING, "1x5 0x15")], "SlotschedAtCeiling", "15m", []),
]


@pytest.mark.parametrize(("rules", "series", "alert", "at", "fires"), CASES)
def test_promtool_test_rules(
    promtool: str,
    tmp_path: Path,
    rules: str,
    series: list[tuple[str, str]],
    alert: str,
    at: str,
    fires: list[dict[str, str]],
) -> None:
    done = run_promtool_test(promtool, tmp_path, rules, [alert_case(series, alert, at, fires)])
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"


def test_promtool_test_rules_catches_a_wrong_expectation(promtool: str, tmp_path: Path) -> None:
    """The harness can fail: an expectation the rule does not meet is reported."""
    done = run_promtool_test(
        promtool,
        tmp_path,
        "base",
        [
            alert_case(
                [(DRAIN, "60x30")], "SlotschedDrainTimeHigh", "20m", [{"severity": "warning", "pool": "cpu"}]
            )
        ],
    )
    assert done.returncode != 0


def decision(desired: int) -> ScaleDecision:
    return ScaleDecision(desired, (), Reason.SCALE_UP, 0.0, False, 0.0, ScaleHistory())


def test_direction_changes_count_reversals_only() -> None:
    reg = CollectorRegistry()
    m = AutoscalerMetrics(reg)
    for direction in ["up", "up", "none", "down", "none", "down", "up", "down"]:
        m.observe(decision(1), direction)
    assert reg.get_sample_value("slotsched_autoscaler_direction_changes_total") == 3


def test_without_the_built_in_loop_the_drain_estimate_and_oldest_waits_are_exported() -> None:
    from tests.grpc_fixtures import running_server

    with running_server(None) as server, urllib.request.urlopen(server.metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    assert server.running is not None and server.running.autoscalers is None
    assert 'slotsched_autoscaler_estimated_drain_seconds{pool="default"}' in text
    assert 'slotsched_autoscaler_oldest_wait_seconds{class="guaranteed",pool="default"}' in text


def test_the_dashboard_annotates_scale_events_and_recycles() -> None:
    d = json.loads((ROOT / "deploy" / "base" / "dashboards" / "slotsched.json").read_text())
    exprs = {a["name"]: a["expr"] for a in d["annotations"]["list"]}
    assert "slotsched_autoscaler_desired_workers" in exprs["Scale events"]
    assert "slotsched_autoscaler_recycles_total" in exprs["Recycled workers"]
