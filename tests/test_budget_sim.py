"""Token budgets in the simulator (scheduler/sim/budget): calls in the workload, the provider, the
limiters, slotsched's budget core in virtual time, the figures, `--compare`'s budget entries and
`--advise`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.core.types import QoS
from scheduler.core.views import BudgetFeed
from scheduler.policy.yaml_io import load_policy
from scheduler.sim.budget.advise import parse_target, scale_budget
from scheduler.sim.budget.engine import BudgetSim
from scheduler.sim.budget.figures import budget_figures
from scheduler.sim.budget.limiters import Gateway, NoLimiter, PerWorker, SlidingWindow
from scheduler.sim.budget.pool import DRAINING, GONE, READY, STARTING, PoolConfig, SlotGate, budget_cap
from scheduler.sim.budget.provider import Provider, cost
from scheduler.sim.budget.run import ROSTER, SLOTSCHED, run_one
from scheduler.sim.budget.setup import BudgetSetup, TenantShare, setup_of
from scheduler.sim.traces.convert import ImportConfig, import_files, read_sessions, samples_dir
from scheduler.sim.workload import LlmCall, Period, SessionPlan, WorkloadError, load_workload, write_workload

S = samples_dir()
POLICY = S / "claude-budget-policy.yaml"
WORKLOAD = S / "claude-budget.csv.xz"


# ---------------------------------------------------------------- calls in the workload


def test_calls_round_trip_through_the_workload_file(tmp_path: Path) -> None:
    calls = (LlmCall(0.0, 1000, 20, 3.5), LlmCall(12.25, 2000, 40, 1.0))
    plan = SessionPlan("s1", "t1", QoS.BURSTABLE, [Period(20.0, None, 1.0, calls=calls)])
    later = Period(5.0, 30.0, 0.0, calls=(LlmCall(60.0, 3000, 0, 2.0),))
    plan.periods.append(later)
    write_workload(tmp_path / "w.csv", [plan])
    (back,) = load_workload(tmp_path / "w.csv")
    assert back.calls == [*calls, LlmCall(60.0, 3000, 0, 2.0)]
    assert [p.calls for p in back.periods] == [calls, later.calls]


@pytest.mark.parametrize(
    ("cell", "error"),
    [
        ("1/2/3", "is not offset/input/output/api"),
        ("1/x/3/4", "not a number"),
        ("1/-2/3/4", "negative"),
        ("inf/2/3/4", "negative or infinite"),
    ],
)
def test_a_bad_calls_cell_is_refused_naming_the_column(tmp_path: Path, cell: str, error: str) -> None:
    f = tmp_path / "w.csv"
    f.write_text(f"arrival_s,session_id,tenant,qos_class,hold_s,calls\n0,s,t,burstable,1,{cell}\n")
    with pytest.raises(WorkloadError, match="line 2: column calls") as e:
        load_workload(f)
    assert error in str(e.value)


def test_trace_import_keeps_every_call_of_the_trace() -> None:
    """Every call of the shipped 60-session sample, once, in the period it falls in, its offset
    from the session's first call (so the calls' and the periods' timelines agree)."""
    src = S / "claude_code_agent_sessions_sample.csv"
    trace = read_sessions(src)
    plans = import_files(src, None, ImportConfig(tenants=3, calls=True, seed=4))
    assert sum(len(p.calls) for p in plans) == sum(len(s.calls) for s in trace.values())
    for p in plans:
        calls = trace[p.session_id].calls
        assert sum(c.input_tokens for c in p.calls) == sum(c.context_tokens for c in calls)
        assert sum(c.output_tokens for c in p.calls) == sum(c.output_tokens for c in calls)
        assert p.calls[0].offset_s == 0.0
    without = import_files(src, None, ImportConfig(tenants=3, seed=4))
    assert all(not p.calls for p in without)


# ---------------------------------------------------------------- the provider and the pool


def test_the_provider_answers_429_with_whole_seconds_past_its_real_limit() -> None:
    p = Provider((0.0, 600.0, 0.0, 0.0))  # 600 input tokens a minute: 10 a second
    assert p.admit(cost(500, 0), 0.0) is None
    assert p.admit(cost(250, 0), 0.0) == 15.0  # 100 left: 150 more take 15 s
    assert p.admit(cost(205, 0), 0.0) == 11.0  # 10.5 s, in whole seconds
    assert p.admit(cost(200, 0), 9.0) == 1.0
    assert p.admit(cost(200, 0), 10.0) is None


@pytest.mark.parametrize(
    ("effective", "per_session", "spw", "cap"),
    [(600.0, 100.0, 2, 3), (601.0, 100.0, 2, 4), (600.0, 0.0, 2, None), (10.0, 100.0, 2, 1)],
)
def test_the_budget_cap_on_workers(effective: float, per_session: float, spw: int, cap: int | None) -> None:
    feed = BudgetFeed("b", (0.0, effective, 0.0, 0.0), (0.0, per_session, 0.0, 0.0))
    assert budget_cap(feed, spw) == cap


def test_the_slot_gate_serves_classes_in_order() -> None:
    gate = SlotGate(PoolConfig(workers=1, slots_per_worker=1))
    for cls, who in ((2, "be"), (1, "b"), (0, "g")):
        gate.ask(cls, who)
    assert [w for w, _ in gate.grant()] == ["g"]
    gate.release(0, 1.0)
    assert [w for w, _ in gate.grant()] == ["b"]


def test_the_slot_gate_counts_quota_claims() -> None:
    """Waiters with a quota claim (the cap never withholds their workers): a's Guaranteed up to
    its guaranteed (1), its Burstable up to its nominal (1); BestEffort and a tenant with no
    quota have none."""
    gate = SlotGate(PoolConfig(workers=1, slots_per_worker=1, quotas=(("a", 1, 1, 1.0),)))
    for cls, who, tenant in ((0, "g1", "a"), (0, "g2", "a"), (1, "b1", "a"), (2, "e1", "a"), (1, "x", "z")):
        gate.ask(cls, who, tenant)
    assert gate.claimed() == 2
    assert [w for w, _ in gate.grant()] == ["g1"]  # a holds its guaranteed: g2 claims nothing
    assert gate.claimed() == 1
    assert budget_cap(BudgetFeed("b", (0, 600, 0, 0), (0, 100, 0, 0)), 1) == 6
    assert budget_cap(BudgetFeed("b", (0, 600, 0, 0), (0, 100, 0, 0)), 1, held=5, claimed=3) == 8


def test_a_draining_worker_past_the_drain_timeout_moves_its_sessions() -> None:
    gate = SlotGate(PoolConfig(workers=2, slots_per_worker=2, drain_timeout_s=120.0))
    gate.ask(1, "s", "t")
    assert gate.grant() == [("s", 0)]
    gate.workers[0].state, gate.workers[0].drain_at = DRAINING, 0.0
    assert gate.moves(119.0) == []
    assert gate.moves(120.0) == [(0, 1)]
    assert (gate.workers[0].state, gate.workers[1].held, gate.paid()) == (GONE, 1, 1)


@pytest.mark.parametrize(
    ("cap", "desired"),
    [
        (None, 6),  # no rate observed yet: no cap
        (8, 6),  # the budget feeds more than demand asks
        (3, 3),  # a scale-up stops where the budget can feed no more
        (1, 2),  # ... never below the active workers (the cap drains none)
    ],
)
def test_the_budget_cap_bounds_a_scale_up_and_drains_nothing(cap: int | None, desired: int) -> None:
    gate = SlotGate(PoolConfig(workers=2, slots_per_worker=2, max_workers=10, autoscale=True, cap=True))
    for i in range(12):  # demand for 6 workers
        gate.ask(1, i)
    gate.grant()
    gate.scale(0.0, cap)
    assert sum(1 for w in gate.workers if w.state in (STARTING, READY)) == desired


# ---------------------------------------------------------------- limiters on a small workload


def _plans(n: int = 12) -> list[SessionPlan]:
    """n sessions at once, each 10 calls of 100 input tokens, 1 s apart, 1 s each."""
    out = []
    for i in range(n):
        calls = tuple(LlmCall(2.0 * k, 100, 10, 1.0) for k in range(10))
        qos = (QoS.GUARANTEED, QoS.BURSTABLE, QoS.BEST_EFFORT)[i % 3]
        out.append(SessionPlan(f"s{i:02d}", f"t{i % 2}", qos, [Period(20.0, None, 0.0, calls=calls)]))
    return out


def _setup(real: float) -> BudgetSetup:
    shares = {t: TenantShare(1.0, 600.0, 600.0, 6000.0, None, (0, 600.0, 0, 0)) for t in ("t0", "t1")}
    return BudgetSetup("b", (0.0, 6000.0, 0.0, 0.0), real, shares, max_tokens=10)


@pytest.mark.parametrize("limiter", [SlidingWindow, PerWorker])
def test_a_limiter_at_the_real_limit_never_meets_a_429(limiter: type) -> None:
    """A window (or per-worker buckets summing to it) of the provider's own limit never overruns
    its bucket; the same demand with no limiter does."""
    setup = _setup(1.0)
    rec = BudgetSim(_plans(), setup, limiter(), PoolConfig(4, 3)).run()
    assert not rec.throttles and all(c.accepted is not None for c in rec.calls)
    loose = BudgetSim(_plans(), setup, NoLimiter(), PoolConfig(4, 3)).run()
    assert loose.throttles


def test_below_the_configured_limit_the_class_blind_limiters_meet_429s() -> None:
    for limiter in (NoLimiter, SlidingWindow, Gateway):
        rec = BudgetSim(_plans(), _setup(0.5), limiter(), PoolConfig(4, 3)).run()
        assert rec.throttles, limiter.name
        assert all(c.accepted is not None for c in rec.calls), limiter.name  # retried until served


# ---------------------------------------------------------------- slotsched on the shipped sample


@pytest.fixture(scope="module")
def sample() -> tuple[object, list[SessionPlan]]:
    return load_policy(POLICY)[0], load_workload(WORKLOAD)


def test_the_shipped_sample_has_calls_and_a_budget(sample: tuple[object, list[SessionPlan]]) -> None:
    policy, plans = sample
    setup = setup_of(policy, real_fraction=0.8333)  # type: ignore[arg-type]
    assert "budget" in POLICY.name and "budget" in WORKLOAD.name
    assert sum(len(p.calls) for p in plans) > 5000
    assert {p.qos for p in plans} == set(QoS)
    assert all(p.tenant in setup.shares for p in plans)  # every tenant has a share: none refused


def test_slotsched_in_virtual_time_against_no_limiter(sample: tuple[object, list[SessionPlan]]) -> None:
    """The provider states no limit in its answers: only its 429s say the configured one is 20%
    too high, and the feedback finds it."""
    policy, plans = sample
    setup = setup_of(policy, real_fraction=0.8333, headers=False)  # type: ignore[arg-type]
    by = {c.name: c for c in ROSTER}
    mine = run_one(by["slotsched"], policy, plans, setup, False, 1500.0)  # type: ignore[arg-type]
    blind = run_one(by["no-limiter"], policy, plans, setup, False, 1500.0)  # type: ignore[arg-type]
    assert blind.provider_429s > 50 * max(1, mine.provider_429s)
    assert (mine.p99("within_reserved") or 0.0) <= 1.0 < (blind.p99("within_reserved") or 0.0)
    assert mine.utilization is not None and mine.utilization >= 0.85
    assert mine.provider_429s > 0 and mine.limit_changes > 0  # the 429s moved the effective limit


def test_slotsched_adopts_the_limit_the_provider_states(sample: tuple[object, list[SessionPlan]]) -> None:
    """The provider states its limit in every answer (rate-limit headers): the first settle
    carries it, and slotsched meets no 429 at all, at full use of the real limit."""
    policy, plans = sample
    setup = setup_of(policy, real_fraction=0.8333)  # type: ignore[arg-type]
    me = next(c for c in ROSTER if c.name == SLOTSCHED)
    mine = run_one(me, policy, plans, setup, False, 1500.0)  # type: ignore[arg-type]
    assert mine.provider_429s == 0
    assert mine.utilization is not None and mine.utilization >= 0.9


def _arriving(
    n: int = 24, tenants: tuple[str, ...] = ("t01", "t02"), qos: tuple[QoS, ...] = tuple(QoS)
) -> list[SessionPlan]:
    """n sessions arriving 10 s apart (the autoscaler sees their rate before the next come), each
    40 calls of 1,000 input tokens, 4 s apart, 1 s each."""
    calls = tuple(LlmCall(4.0 * k, 1000, 10, 1.0) for k in range(40))
    return [
        SessionPlan(
            f"s{i:02d}",
            tenants[i % len(tenants)],
            qos[i % len(qos)],
            [Period(400.0, None, 10.0 * i, calls=calls)],
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("k", [0.02, 0.05, 0.1])
def test_the_budget_cap_never_adds_worker_seconds(sample: tuple[object, list[SessionPlan]], k: float) -> None:
    """slotsched with the autoscaler, with its budget cap and without (the NOCAP run), on a small
    workload the sample's budget (k times as large) binds: the cap never costs workers. The
    sessions borrow (t06 has no slot quota): the cap may withhold their workers."""
    policy = scale_budget(sample[0], "claude", k)  # type: ignore[arg-type]
    policy = dataclasses.replace(policy, pool=dataclasses.replace(policy.pool, workers=1))
    setup, plans = setup_of(policy), _arriving(tenants=("t06",), qos=(QoS.BURSTABLE, QoS.BEST_EFFORT))
    me = next(c for c in ROSTER if c.name == SLOTSCHED)
    capped = run_one(me, policy, plans, setup, True, 900.0)
    nocap = run_one(me, policy, plans, setup, True, 900.0, cap=False)
    assert (capped.name, nocap.name) == ("slotsched+autoscaler", "slotsched+autoscaler-nocap")
    assert capped.worker_seconds <= nocap.worker_seconds
    if k <= 0.05:  # the budget binds hard: the cap saves workers, and the sessions finish no later
        assert capped.worker_seconds < 0.8 * nocap.worker_seconds
        assert capped.finished >= nocap.finished


def test_figures_count_a_held_call_until_the_end() -> None:
    rec = BudgetSim(_plans(3), _setup(0.01), NoLimiter(), PoolConfig(4, 3), until_s=30.0).run()
    f = budget_figures("x", rec, _setup(0.01))
    assert f.contended_minutes == 1 and max(f.waits["guaranteed"]) > 0


# ---------------------------------------------------------------- the CLI


@pytest.mark.parametrize("headers", [True, False], ids=["stated", "no-provider-headers"])
def test_compare_json_carries_a_budget_entry_per_contender(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, headers: bool
) -> None:
    if not headers:
        # The same workload's plots were drawn by the other case (half of a run's time): this one
        # checks what the missing headers change, the JSON and the report's tables.
        from scheduler.sim.budget import plots as budget_plots
        from scheduler.sim.compare import run as compare_run

        monkeypatch.setattr(compare_run, "draw_plots", lambda results, out: ([], ""))
        monkeypatch.setattr(budget_plots, "draw", lambda results, out: [])
    rc = main(
        ["simulate", "--compare", "--policy", str(POLICY), "--workload", str(WORKLOAD), "--until", "900",
         "--provider-limit", "0.8333", "--out", str(tmp_path), "--json"]
        + ([] if headers else ["--no-provider-headers"])
    )  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    doc = out["policies"]
    # The provider's stated limit is adopted from the first settle; without it, a 429 teaches it.
    assert (doc["slotsched"]["budget"]["provider_429s"] == 0) == headers
    names = [c.name + s for s in ("", "+autoscaler") for c in ROSTER] + ["slotsched+autoscaler-nocap"]
    for name in names:
        b = doc[name]["budget"]
        assert {"provider_429s", "utilization", "attainment_min", "time_to_permit"} <= set(b)
        assert set(b["time_to_permit"]) == {"guaranteed", "burstable", "besteffort"}
        assert "p99" in b["time_to_permit"]["guaranteed"]
    assert "classes" in doc["slotsched"] and "worker_seconds" in doc["slotsched"]  # the slot figures too
    cap = out["budget_cap"]  # slotsched's autoscaler with its budget cap and without, side by side
    assert cap["with_cap"]["contender"] == "slotsched+autoscaler"
    assert cap["without_cap"]["contender"] == "slotsched+autoscaler-nocap"
    assert cap["with_cap"]["worker_seconds"] == doc["slotsched+autoscaler"]["budget"]["worker_seconds"]
    assert {"mean", "p90"} <= set(cap["without_cap"]["stretch"])
    report = (tmp_path / "report.md").read_text()
    assert "## Token budgets" in report and "| **slotsched** |" in report
    assert "| **slotsched+autoscaler-nocap** |" in report and "- the budget cap against none" in report


def test_advise_targets_and_scaling(sample: tuple[object, list[SessionPlan]]) -> None:
    assert parse_target("guaranteed=2,burstable=30") == {"guaranteed": 2.0, "burstable": 30.0}
    for bad in ("gold=2", "guaranteed=x", "guaranteed=0"):
        with pytest.raises(ValueError, match="--target"):
            parse_target(bad)
    policy, _ = sample
    bigger = scale_budget(policy, "claude", 2.0)  # type: ignore[arg-type]
    a, b = setup_of(policy), setup_of(bigger)  # type: ignore[arg-type]
    assert b.limits[1] == 2 * a.limits[1]
    assert b.shares["t01"].reserved == pytest.approx(2 * a.shares["t01"].reserved, rel=1e-6)
