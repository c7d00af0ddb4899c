"""The simulator over several pools (issue 24 item 6): placement, fallback, figures, baselines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scheduler.core.types import Decision, Granted, QoS
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import load_policy, parse_policy
from scheduler.sim.baselines.fifo import Fifo
from scheduler.sim.baselines.per_pool import PerPool, per_pool
from scheduler.sim.baselines.strict_priority import StrictPriority
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.traces.pools import PoolRule, spread
from scheduler.sim.workload import Period, SessionPlan, load_workload, parse_rows

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "scheduler" / "sim" / "samples"

POLICY = """
apiVersion: slotsched.dev/v1alpha1
kind: SchedulingPolicy
metadata: {name: two}
spec:
  pools:
    - {name: busy, slotsPerWorker: 1, workers: 2, minWorkers: 1, maxWorkers: 2, floor: 0}
    - {name: idle, slotsPerWorker: 2, workers: 2, minWorkers: 1, maxWorkers: 2, floor: 0}
  tenants:
    - {name: a, weight: 1, guaranteed: 0, burstable: {nominal: 4, limit: 20}}
"""


def policy() -> Policy:
    return parse_policy(POLICY)[0]


def plan(sid: str, at: float, hold: float, pool: str, fallback: tuple[str, ...] = ()) -> SessionPlan:
    return SessionPlan(sid, "a", QoS.BURSTABLE, [Period(hold, None, at)], pool=pool, fallback=fallback)


class Recording(Simulator):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.granted: list[Granted] = []

    def _on_decision(self, d: Decision) -> None:
        if isinstance(d, Granted):
            self.granted.append(d)
        super()._on_decision(d)


def run(plans: list[SessionPlan], decider=None) -> Recording:  # type: ignore[no-untyped-def]
    kw = {} if decider is None else {"decider": decider}
    sim = Recording(policy(), plans, SimConfig(), **kw)
    sim.run()
    return sim


def saturated() -> list[SessionPlan]:
    busy = [plan(f"b{i}", i * 0.1, 100.0, "busy") for i in range(10)]
    idle = [plan(f"i{i}", 1.0 + i, 10.0, "idle") for i in range(3)]
    return busy + idle


def test_idle_pool_unaffected_and_no_session_leaves_its_pool() -> None:
    sim = run(saturated())
    asked: dict[str, set[str]] = {p.session_id: set(p.pools) for p in sim.plans}
    assert sim.granted
    for g in sim.granted:
        assert g.lease.pool in asked[g.lease.session], g
    idle = [g for g in sim.granted if g.lease.session.startswith("i")]
    assert len(idle) == 3 and all(g.waited_s == 0 for g in idle)
    busy_waits = [g.waited_s for g in sim.granted if g.lease.session.startswith("b")]
    assert max(busy_waits) > 100
    doc = sim.stats.to_json()
    assert set(doc["pools"]) == {"busy", "idle"}
    for key in ("sessions", "grants", "waits", "utilization", "preemptions", "capacity"):
        assert key in doc["pools"]["busy"]
    assert doc["pools"]["idle"]["sessions"] == 3 and doc["pools"]["busy"]["sessions"] == 10
    assert doc["pools"]["busy"]["capacity"]["peak"] == 2 and doc["pools"]["idle"]["capacity"]["peak"] == 4
    assert doc["pools"]["idle"]["waits"]["burstable"]["p99"] == 0
    assert doc["completed"] == 13


def test_fallback_used_when_the_first_pool_is_full() -> None:
    plans = [plan(f"b{i}", 0.0, 100.0, "busy") for i in range(2)]
    plans.append(plan("f", 1.0, 10.0, "busy", ("idle",)))
    plans.append(plan("n", 1.5, 10.0, "busy"))  # no fallback: waits in busy
    sim = run(plans)
    where: dict[str, str] = {g.lease.session: g.lease.pool for g in sim.granted}
    assert where["f"] == "idle" and where["n"] == "busy"
    assert next(g for g in sim.granted if g.lease.session == "f").waited_s == 0


def test_workload_pool_columns() -> None:
    rows = [
        {
            "arrival_s": "0",
            "session_id": "s",
            "tenant": "a",
            "qos_class": "burstable",
            "hold_s": "1",
            "pool": "gpu|cpu",
        },
        {
            "arrival_s": "0",
            "session_id": "t",
            "tenant": "a",
            "qos_class": "burstable",
            "hold_s": "1",
            "pool": "gpu",
            "fallback": "cpu|x",
        },
    ]
    plans = parse_rows(rows, ["arrival_s", "session_id", "tenant", "qos_class", "hold_s", "pool", "fallback"])
    assert [(p.pool, p.fallback) for p in plans] == [("gpu", ("cpu",)), ("gpu", ("cpu", "x"))]


def test_baselines_run_per_pool() -> None:
    for make in (Fifo, StrictPriority):
        built = per_pool(make)(policy())
        assert isinstance(built, PerPool) and set(built.cores) == {"busy", "idle"}
        sim = run(saturated(), per_pool(make))
        asked: dict[str, str] = {p.session_id: p.pool for p in sim.plans}
        assert all(g.lease.pool == asked[g.lease.session] for g in sim.granted)
        idle = [g for g in sim.granted if g.lease.session.startswith("i")]
        assert len(idle) == 3 and all(g.waited_s == 0 for g in idle)
        assert set(sim.stats.to_json()["pools"]) == {"busy", "idle"}
    single = parse_policy(POLICY.split("  pools:")[0] + "  tenants: [{name: a}]\n")[0]
    assert isinstance(per_pool(Fifo)(single), Fifo)  # one pool: today's baseline itself


def test_pool_rule_spreads_by_hash() -> None:
    plans = [plan(f"s{i}", 0.0, 1.0, "") for i in range(400)]
    out = spread(plans, PoolRule.parse("gpu|cpu:25%,cpu"))
    gpu = [p for p in out if p.pool == "gpu"]
    assert 60 < len(gpu) < 140 and all(p.fallback == ("cpu",) for p in gpu)
    assert spread(plans, PoolRule.parse("gpu|cpu:25%,cpu")) == out  # deterministic


def test_the_pool_sample_runs() -> None:
    pol, _ = load_policy(SAMPLES / "pools-cpu-gpu-policy.yaml")
    assert pol.pool_names() == ("cpu", "gpu")
    assert {p.pool for p in load_workload(SAMPLES / "pools-cpu-gpu.csv")} == {"cpu", "gpu"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.cli",
            "simulate",
            "--policy",
            str(SAMPLES / "pools-cpu-gpu-policy.yaml"),
            "--workload",
            str(SAMPLES / "pools-cpu-gpu.csv"),
            "--until",
            "3600",
            "--json",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    doc = json.loads(out)
    assert set(doc["pools"]) == {"cpu", "gpu"} and doc["completed"] > 0
    assert all(doc["pools"][n]["sessions"] > 0 for n in ("cpu", "gpu"))
    listed = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "trace", "samples"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "pools-cpu-gpu.csv" in listed and "pools-cpu-gpu-policy.yaml" in listed


def test_compare_report_has_a_per_pool_table(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.cli",
            "simulate",
            "--compare",
            "--policy",
            str(SAMPLES / "pools-cpu-gpu-policy.yaml"),
            "--workload",
            str(SAMPLES / "pools-cpu-gpu.csv"),
            "--until",
            "1200",
            "--out",
            str(out),
            "--json",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    report = (out / "report.md").read_text()
    assert "## Per pool" in report
    assert "| fifo | gpu |" in report and "| slotsched | cpu |" in report


def test_trace_import_pool_rule(tmp_path: Path) -> None:
    wl = tmp_path / "w.csv"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.cli",
            "trace",
            "import",
            "--sessions",
            str(SAMPLES / "claude_code_agent_sessions_sample.csv"),
            "--arrivals",
            str(SAMPLES / "azure_llm_conv_2023_sample.csv"),
            "--limit",
            "40",
            "--pool-rule",
            "gpu|cpu:30%,cpu",
            "--out",
            str(wl),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    plans = load_workload(wl)
    assert {p.pool for p in plans} == {"gpu", "cpu"}
    assert all(p.fallback == (("cpu",) if p.pool == "gpu" else ()) for p in plans)


def test_the_text_report_has_a_line_per_pool() -> None:
    """Plain `simulate` prints each pool's figures (one pool's are the totals: no table)."""
    from scheduler.sim.render import render_text

    waits = {"guaranteed": {"p50": 0.0, "p99": 2.0}, "burstable": {"p50": 1.0, "p99": 40.5}}
    pool = {
        "sessions": 3,
        "utilization": 0.5,
        "preemptions": 4,
        "waits": waits,
        "capacity": {"end": 8, "peak": 9},
    }
    base = {
        "classes": {},
        "tenants": {},
        "preemptions": 4,
        "revocations": 0,
        "expiries": 0,
        "refusals": 0,
        "work_lost_slot_seconds": 0.0,
        "utilization": 0.5,
        "completed": 1,
        "unfinished": 0,
    }
    text = render_text({**base, "pools": {"cpu": pool, "gpu": {**pool, "sessions": 7}}})
    rows = [
        line.split() for line in text.splitlines() if line.startswith("  cpu") or line.startswith("  gpu")
    ]
    assert [r[0] for r in rows] == ["cpu", "gpu"] and [r[1] for r in rows] == ["3", "7"]
    assert rows[0][4:9] == ["2.0", "/", "40.5", "/", "—"] and rows[0][-1] == "8/9"
    assert "by pool" not in render_text({**base, "pools": {"default": pool}})
