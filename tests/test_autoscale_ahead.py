"""Scaling ahead of a known peak: the schedule and the forecast (pure), the decision bounding
them by maxWorkers, and the diurnal sample where the forecast meets the morning wave."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from scheduler.policy.model import ForecastSpec, Policy, ScheduleSpec, ScheduleWindow
from slots.autoscaler.ahead import DAY_S, DemandRecord, bucket_of, forecast_min, schedule_min
from slots.autoscaler.decision import (
    Reason,
    ScaleConfig,
    ScaleHistory,
    ScaleInput,
    ScaleWorker,
    ScaleWorkerState,
    decide,
)

BERLIN = "Europe/Berlin"


def at(text: str, zone: str = BERLIN) -> float:
    """Epoch seconds of a local time, e.g. '2026-03-02 08:59' (a Monday)."""
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()


WORKDAY = ScheduleWindow(start_min=9 * 60, end_min=18 * 60, min_workers=8, days=(0, 1, 2, 3, 4))
NIGHT = ScheduleWindow(start_min=22 * 60, end_min=2 * 60, min_workers=3, days=(4,))  # Friday night
SPEC = ScheduleSpec(BERLIN, (WORKDAY, NIGHT))


@pytest.mark.parametrize(
    ("local", "lead_s", "want"),
    [
        ("2026-03-02 08:59", 0.0, 0),  # Monday, before the window
        ("2026-03-02 09:00", 0.0, 8),  # opens
        ("2026-03-02 08:58", 120.0, 8),  # opens within the lead: its workers start now
        ("2026-03-02 17:59", 0.0, 8),
        ("2026-03-02 18:00", 0.0, 0),  # the end is not in the window
        ("2026-03-07 10:00", 0.0, 0),  # Saturday: not a listed day
        ("2026-03-06 23:00", 0.0, 3),  # Friday night
        ("2026-03-07 01:30", 0.0, 3),  # past midnight: the morning part, on the day after Friday
        ("2026-03-08 01:30", 0.0, 0),  # Sunday morning follows Saturday: not listed
        # Summer time in Berlin (UTC+2 from 29 March): still 9:00 local.
        ("2026-03-30 09:00", 0.0, 8),
        ("2026-03-30 08:59", 0.0, 0),
    ],
)
def test_the_schedule_is_local_time_in_its_zone(local: str, lead_s: float, want: int) -> None:
    assert schedule_min(SPEC, at(local), lead_s) == want


def test_no_windows_no_minimum() -> None:
    assert schedule_min(ScheduleSpec(), at("2026-03-02 10:00")) == 0


FORECAST = ForecastSpec(lookback_days=2, bucket_s=300.0)


def recorded(points: dict[float, int]) -> dict[int, int]:
    return {bucket_of(t, FORECAST.bucket_s): n for t, n in points.items()}


@pytest.mark.parametrize(
    ("now", "lead_s", "want"),
    [
        (DAY_S * 2 + 9 * 3600 - 300, 135.0, 3),  # 8:55: yesterday's 8:55 bucket
        (DAY_S * 2 + 9 * 3600 - 120, 135.0, 20),  # 8:58 + 135 s reaches yesterday's 9:00 bucket
        (DAY_S * 2 + 9 * 3600 - 120, 0.0, 3),  # no lead: still before the wave
        (DAY_S * 2 + 12 * 3600, 135.0, 25),  # 12:00: the higher of the last two days
        (DAY_S * 4 + 12 * 3600, 135.0, 0),  # nothing recorded within the lookback
    ],
)
def test_the_forecast_is_the_highest_recorded_demand_at_this_time_of_day_ahead_by_the_lead(
    now: float, lead_s: float, want: int
) -> None:
    rec = recorded(
        {
            DAY_S + 9 * 3600 - 300: 3,
            DAY_S + 9 * 3600: 20,
            DAY_S + 12 * 3600: 25,
            12 * 3600: 18,  # two days back at noon
        }
    )
    assert forecast_min(rec, now, FORECAST, lead_s) == want


def test_the_forecast_is_off_at_zero_days() -> None:
    assert forecast_min({0: 9}, DAY_S, ForecastSpec(lookback_days=0), 0.0) == 0


def test_the_record_keeps_the_highest_per_bucket_and_forgets_past_the_lookback() -> None:
    r = DemandRecord()
    for t, n in [(0.0, 2), (100.0, 5), (200.0, 4)]:
        r.observe(t, n, FORECAST, 135.0)
    assert r.buckets == {0: 5}
    r.observe(3 * DAY_S, 1, FORECAST, 135.0)
    assert 0 not in r.buckets and r.buckets[bucket_of(3 * DAY_S, 300.0)] == 1


@pytest.mark.parametrize(
    ("ahead", "why", "want_desired", "want_reason"),
    [
        (0, Reason.SCHEDULED, 2, Reason.AT_MIN),  # nothing raised: minWorkers
        (6, Reason.SCHEDULED, 6, Reason.SCHEDULED),
        (6, Reason.FORECAST, 6, Reason.FORECAST),
        (50, Reason.FORECAST, 10, Reason.FORECAST),  # bounded by maxWorkers
    ],
)
def test_the_decision_applies_a_raised_minimum_bounded_by_max(
    ahead: int, why: Reason, want_desired: int, want_reason: Reason
) -> None:
    cfg = replace(
        ScaleConfig.from_policy(Policy()),
        min_workers=2,
        max_workers=10,
        ahead_workers=ahead,
        ahead_reason=why,
    )
    workers = tuple(ScaleWorker(f"w{i}", ScaleWorkerState.READY, 0, 0.0, 0.0) for i in range(2))
    d = decide(ScaleInput(0.0, workers, 2, {}, {}, {}, 0, 60.0), cfg, ScaleHistory())
    assert (d.desired, d.reason) == (want_desired, want_reason)
