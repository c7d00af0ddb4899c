"""The trace converter on the shipped samples of the real public traces: periods, seeds, mixes."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from scheduler.core.types import QoS
from scheduler.policy.yaml_io import load_policy
from scheduler.sim.traces.convert import (
    SAMPLE_ARRIVALS,
    SAMPLE_SESSIONS,
    Call,
    ImportConfig,
    TraceError,
    bursts,
    exact_counts,
    import_files,
    periods,
    read_arrivals,
    read_sessions,
    samples_dir,
    zipf_weights,
)
from scheduler.sim.traces.policy import intervals, peak_concurrency, policy_for
from scheduler.sim.workload import Period, SessionPlan, load_workload

SESSIONS = samples_dir() / SAMPLE_SESSIONS
ARRIVALS = samples_dir() / SAMPLE_ARRIVALS
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def slices() -> tuple[Path, Path]:
    # The shipped samples (scripts/make_samples.py): the first 60 sessions, sub-agents
    # (trace_0003) and empty api_time_s (trace_0033) included; every 10th arrival of the trace.
    return SESSIONS, ARRIVALS


def test_first_session_becomes_closed_loop_periods_with_the_idle_timeout(slices: tuple[Path, Path]) -> None:
    s = read_sessions(slices[0])["trace_0001"]
    ps = periods(s, 30.0, arrival_s=5.0)
    # Calls 0-3 end at 62 + 21.12 = 83.12; the next starts at 195: a 111.88 s gap, longer than 30 s.
    assert ps[0].think_s is None and ps[0].arrival_s == 5.0
    assert ps[0].hold_s == pytest.approx(83.12 + 30.0)
    assert ps[1].think_s == pytest.approx(111.88 - 30.0)
    assert all(p.think_s is not None and p.think_s >= 0 for p in ps[1:])
    # Nothing of the timeline is added or lost: holds + thinks span first call to last call's end.
    end = max(c.end for c in s.calls)
    assert sum(p.hold_s for p in ps) + sum(p.think_s or 0 for p in ps) == pytest.approx(end, abs=0.01)
    last = bursts(s.calls, 30.0)[-1]
    assert ps[-1].hold_s == pytest.approx(last[1] - last[0], abs=0.001)  # the session is over: no timeout


def test_a_larger_gap_threshold_gives_fewer_longer_periods(slices: tuple[Path, Path]) -> None:
    s = read_sessions(slices[0])["trace_0002"]
    counts = [len(periods(s, g, 0.0)) for g in (5.0, 30.0, 300.0, 1e9)]
    assert counts == sorted(counts, reverse=True) and counts[-1] == 1 and counts[0] > counts[-1]


def test_sub_agents_are_flattened_into_the_session(slices: tuple[Path, Path]) -> None:
    sessions = read_sessions(slices[0])
    assert "trace_0003" in sessions and all(not k.startswith("agent") for k in sessions)
    # Overlapping calls of a parent and its sub-agent make one burst, never a negative gap.
    calls = [Call(0, 10, 1), Call(2, 4, 2), Call(5, 30, 3), Call(100, 101, 4)]
    assert bursts(calls, 30.0) == [(0, 30, 3), (100, 101, 4)]
    ps = periods(sessions["trace_0003"], 30.0, 0.0)
    assert all((p.think_s or 0) >= 0 for p in ps)


def test_an_empty_api_time_is_recovered_from_the_next_call_or_zero(slices: tuple[Path, Path]) -> None:
    s = read_sessions(slices[0])["trace_0033"]
    call = next(c for c in s.calls if c.start == 56.0)
    # The next call says think 81 s at t=130: 130 - 81 - 56 < 0, so the duration is taken as 0.
    assert call.end == call.start


def test_arrivals_start_at_zero_and_scale_onto_the_window(slices: tuple[Path, Path]) -> None:
    times = read_arrivals(slices[1])
    assert times[0] == 0.0 and times == sorted(times) and 0 < times[-1] < 3600
    plans = import_files(slices[0], slices[1], ImportConfig(limit=20, duration_s=600.0, seed=3))
    starts = [p.arrival_s for p in plans]
    assert min(starts) >= 0 and max(starts) <= 600.0


def test_the_same_seed_gives_the_same_workload_and_another_seed_does_not(slices: tuple[Path, Path]) -> None:
    def load(seed: int) -> list[tuple[str, str, str, float, list[float]]]:
        plans = import_files(slices[0], slices[1], ImportConfig(limit=25, tenants=5, seed=seed))
        return [
            (p.session_id, p.tenant, p.qos.value, p.arrival_s, [x.hold_s for x in p.periods]) for p in plans
        ]

    assert load(7) == load(7)
    assert load(7) != load(8)


def test_class_mix_and_tenant_sizes_are_exact_and_zipf_like(slices: tuple[Path, Path]) -> None:
    n = 200  # more than the slice holds: sessions are reused with a ~k suffix
    cfg = ImportConfig(limit=n, tenants=8, mix=(0.1, 0.5, 0.4), seed=11)
    plans = import_files(slices[0], None, cfg)
    assert len(plans) == n and len({p.session_id for p in plans}) == n
    classes = Counter(p.qos for p in plans)
    assert (classes[QoS.GUARANTEED], classes[QoS.BURSTABLE], classes[QoS.BEST_EFFORT]) == (20, 100, 80)
    sizes = Counter(p.tenant for p in plans)
    expected = exact_counts(n, zipf_weights(8, 1.1))
    assert [sizes[f"t{k:02d}"] for k in range(1, 9)] == expected
    assert expected == sorted(expected, reverse=True) and expected[0] > 3 * expected[-1]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(TraceError):
        ImportConfig(mix=(0, 0, 0))
    with pytest.raises(TraceError):
        ImportConfig(tenants=0)


def test_sized_policy_covers_peak_guaranteed_demand() -> None:
    plans = [
        _plan("a", "t01", QoS.GUARANTEED, 0, [(10, None), (10, 5)]),
        _plan("b", "t01", QoS.GUARANTEED, 5, [(10, None)]),
        _plan("c", "t02", QoS.GUARANTEED, 100, [(10, None)]),
        _plan("d", "t02", QoS.BURSTABLE, 0, [(100, None)]),
    ]
    assert list(intervals(plans[0])) == [(0, 10), (15, 25)]
    assert peak_concurrency([(0, 10), (10, 20)]) == 1  # an end and a start at once do not overlap
    pol = policy_for(plans, workers=5, slots_per_worker=2)
    quotas = {t.name: t.guaranteed for t in pol.tenants}
    assert quotas == {"t01": 2, "t02": 1} and pol.pool.floor == 2
    t02 = pol.tenant("t02")
    assert t02 is not None and t02.burstable_nominal == 3 and t02.burstable_limit == 10


def _plan(sid: str, tenant: str, qos: QoS, at: float, spec: list[tuple[float, float | None]]) -> SessionPlan:
    return SessionPlan(sid, tenant, qos, [Period(h, t, at) for h, t in spec])


def test_cli_writes_a_workload_the_simulator_reads_and_a_valid_policy(
    slices: tuple[Path, Path], tmp_path: Path
) -> None:
    out, pol = tmp_path / "w.csv", tmp_path / "p.yaml"
    cmd = [sys.executable, "-m", "scheduler.cli", "trace", "import", "--sessions", str(slices[0])]
    cmd += ["--arrivals", str(slices[1]), "--tenants", "4", "--mix", "0.2,0.5,0.3", "--limit", "10"]
    cmd += ["--gap-threshold", "45", "--seed", "2", "--out", str(out), "--policy-out", str(pol)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    assert "10 sessions" in r.stdout
    plans = load_workload(out)
    assert len(plans) == 10 and any(len(p.periods) > 1 for p in plans)
    policy, _warnings = load_policy(pol)  # raises on any error
    assert {t.name for t in policy.tenants} == {p.tenant for p in plans}


@pytest.mark.parametrize(
    ("flag", "what"), [("--sessions", "sessions trace"), ("--arrivals", "arrivals trace")]
)
def test_cli_names_a_missing_trace_file_instead_of_a_bare_errno(
    flag: str, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scheduler.cli import main

    missing = tmp_path / "nowhere.csv"
    args = {"--sessions": str(SESSIONS), "--arrivals": str(ARRIVALS), flag: str(missing)}
    argv = ["trace", "import", "--out", str(tmp_path / "w.csv")]
    argv += [x for kv in args.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"error: {what} not found: {missing}\n"
    assert not (tmp_path / "w.csv").exists()


def test_cli_creates_the_output_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.cli import main

    out = tmp_path / "new" / "w.csv"
    argv = ["trace", "import", "--sessions", str(SESSIONS), "--limit", "3", "--out", str(out)]
    assert main(argv + ["--policy-out", str(tmp_path / "other" / "p.yaml")]) == 0
    assert len(load_workload(out)) == 3 and (tmp_path / "other" / "p.yaml").exists()
