"""Every contender's run ends (issue 10 item 2): when every session is done, or when none can
progress any more — then what is left is unfinished and the run says why.

The loop that started it: KEDA's Redis-list scaler sees only waiting sessions, scales to zero
300 s after the list was last non-empty and kills the running ones; they re-queue without a
checkpoint and are killed again 300 s into their next run. A 900 s session never finished and
`simulate --compare` never ended."""

from __future__ import annotations

import argparse
import json
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.types import QoS
from scheduler.policy.model import AutoscalerSpec, Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec
from scheduler.sim.compare.contenders import Contender, roster
from scheduler.sim.compare.run import run_compare, run_one, sample_every
from scheduler.sim.guard import RunGuard
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.workload import Period, SessionPlan

CONTENDERS = roster()
KEDA = next(c for c in CONTENDERS if c.name == "keda-redis")


def policy(workers: int = 2, slots: int = 2, floor: int = 1) -> Policy:
    return Policy(
        pool=PoolSpec(slots_per_worker=slots, workers=workers, min_workers=1, max_workers=4, floor=floor),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=30, min_runtime_s=30),
        queue=QueueSpec(max_pending=50, max_pending_per_tenant=50),
        autoscaler=AutoscalerSpec(start_delay_s=20.0),
        tenants=(
            TenantSpec("sre", guaranteed=2, burstable_nominal=1, burstable_limit=4),
            TenantSpec("batch", weight=2, burstable_nominal=0, burstable_limit=0),
        ),
    )


def two_incidents() -> list[SessionPlan]:
    return [
        SessionPlan("inc1", "sre", QoS.GUARANTEED, [Period(900.0, None, 0.0)]),
        SessionPlan("inc2", "sre", QoS.GUARANTEED, [Period(900.0, None, 1800.0)]),
    ]


def config(plans: list[SessionPlan]) -> SimConfig:
    return SimConfig(sample_every_s=sample_every(plans, None), retry_refused=True)


class Runaway(AssertionError):
    pass


def bounded_run(c: Contender, pol: Policy, plans: list[SessionPlan], max_events: int) -> Simulator:
    """Run one contender; fail (rather than hang) past `max_events`."""
    sim = Simulator(pol, list(plans), config(plans), hook=c.hook() if c.hook else None, decider=c.decider)
    dispatch = sim._dispatch
    seen = [0]

    def counted(kind: int, payload: object) -> None:
        seen[0] += 1
        if seen[0] > max_events:
            raise Runaway(f"{c.name}: more than {max_events} events by t={sim.now:.0f} s")
        dispatch(kind, payload)

    sim._dispatch = counted  # type: ignore[method-assign]
    sim.run()
    return sim


def event_bound(pol: Policy, plans: list[SessionPlan]) -> tuple[float, int]:
    """(virtual-time bound, event bound) from the workload alone. Events per virtual second are
    at most: a renewal per held slot every TTL/2, a retry per session every 1.5 s, an autoscaler
    reap every second, a sample, a tick and an arrival or completion — 4 per session and 4 more."""
    guard = RunGuard.for_run(pol, plans, 2.0)
    t_max = guard.horizon_s + guard.stall_s
    return t_max, int(10_000 + 4 * (len(plans) + 4) * t_max)


def test_keda_scale_to_zero_loop_stops_and_says_why() -> None:
    pol, plans = policy(), two_incidents()
    t_max, max_events = event_bound(pol, plans)
    sim = bounded_run(KEDA, pol, plans, max_events)
    s = sim.stats
    # The loop is real (killed again and again, no work saved) and the run stopped on it.
    assert s.revocations >= 4 and s.work_lost > 1000
    assert s.completed == 0 and s.unfinished == 2
    assert s.stopped_at_s is not None and s.stopped_at_s <= t_max
    assert "no session made progress" in s.stop_note and "revoked" in s.stop_note
    assert s.to_json()["stopped"] == {"at_s": round(s.stopped_at_s, 3), "reason": s.stop_note}


def test_a_run_that_completes_is_not_stopped() -> None:
    pol, plans = policy(), two_incidents()
    slotsched = CONTENDERS[0]
    sim = run_one(slotsched, pol, plans, config(plans), lambda _: None)
    assert sim.stats.completed == 2 and sim.stats.stopped_at_s is None
    assert sim.stats.to_json()["stopped"] is None


def test_a_long_think_gap_is_not_a_stall() -> None:
    # Nothing happens for 3 hours between two periods: a session still to arrive is progress to come.
    pol = policy()
    plans = [SessionPlan("s", "sre", QoS.BURSTABLE, [Period(10.0, None, 0.0), Period(10.0, 10_800.0, 0.0)])]
    stats = Simulator(pol, plans, SimConfig()).run()
    assert stats.completed == 1 and stats.stopped_at_s is None and stats.end_s > 10_800


def test_compare_report_and_json_say_which_contender_left_work_unfinished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pol, plans = policy(), two_incidents()
    ns = argparse.Namespace(out=str(tmp_path), json=True, checkpoint_seconds=2.0, until=None)
    assert run_compare(pol, plans, ns) == 0
    doc = json.loads(capsys.readouterr().out)["policies"]
    assert doc["keda-redis"]["unfinished"] == 2 and doc["keda-redis"]["stopped"]["at_s"] > 0
    assert doc["slotsched"]["stopped"] is None and doc["slotsched"]["completed"] == 2
    report = (tmp_path / "report.md").read_text()
    section = report.split("## Unfinished work", 1)[1].split("##", 1)[0]
    assert "**keda-redis**" in section and "revoked" in section
    assert "| keda-redis † |" in report
    verdicts = report.split("## Where slotsched does not win", 1)[1].split("## Figures", 1)[0]
    assert "keda-redis" not in verdicts  # a stopped run wins nothing


# ---------------------------------------------------------------- every contender, random workloads

QOS = st.sampled_from([QoS.GUARANTEED, QoS.BURSTABLE, QoS.BEST_EFFORT])


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Policy, list[SessionPlan]]:
    pol = policy(
        workers=draw(st.integers(1, 2)), slots=draw(st.integers(1, 2)), floor=draw(st.integers(0, 1))
    )
    plans = []
    for i in range(draw(st.integers(1, 4))):
        periods = [Period(draw(st.floats(1, 1200)), None, draw(st.floats(0, 600)))]
        for _ in range(draw(st.integers(0, 2))):
            periods.append(Period(draw(st.floats(1, 700)), draw(st.floats(0, 400)), 0.0))
        crash = draw(st.none() | st.floats(1, 300))
        periods[0] = Period(periods[0].hold_s, None, periods[0].arrival_s, 0, crash)
        # "batch" has no Burstable quota: some sessions are refused outright.
        plans.append(SessionPlan(f"s{i}", draw(st.sampled_from(["sre", "batch"])), draw(QOS), periods))
    return pol, sorted(plans, key=lambda p: (p.arrival_s, p.session_id))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_every_contender_terminates_within_bounds_derived_from_the_workload(
    case: tuple[Policy, list[SessionPlan]],
) -> None:
    pol, plans = case
    t_max, max_events = event_bound(pol, plans)
    for c in CONTENDERS:
        tracemalloc.start()
        try:
            sim = bounded_run(c, pol, plans, max_events)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        s = sim.stats
        assert sim.now <= t_max, c.name
        assert peak < 32 * 2**20, (c.name, peak)  # bounded memory: a few MB for a few sessions
        assert len(s.samples) <= t_max / config(plans).sample_every_s + 2  # type: ignore[operator]
        assert s.completed + s.unfinished + sum(1 for lv in sim._live.values() if lv.refused) == len(plans)
        if s.stopped_at_s is not None:  # stopped with work left, and said so
            assert s.unfinished > 0 and s.stop_note
