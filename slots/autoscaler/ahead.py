"""Scaling ahead of a known peak: a minimum of workers raised before demand arrives.

Why: agent load is diurnal (people start work at 9). Scaling only on observed demand meets every
morning ramp late by the start-up time of a worker, and the queue of that ramp is what the users
see. Two sources of a higher minimum, both pure (time and what was recorded are passed in, so a
table test, the simulator and the loop compute the very same numbers) and both bounded by
maxWorkers where the decision applies them (`ScaleConfig.ahead_workers`):

- the **schedule**: windows of local time (in an IANA time zone) with a minimum each; a window
  counts from `lead_s` before its start, so its workers are ready when it opens;
- the **forecast**: the highest demand recorded at the same time of day over the last days,
  looking `lead_s` ahead (by default the worker start-up time plus one decision period: a worker
  asked for now serves from then on). A day is 86,400 s: across a daylight-saving change the
  forecast is an hour off for `lookbackDays` days (the schedule follows the zone's clock).

`DemandRecord` is the forecast's memory: per time bucket, the most workers demand needed. The
loop keeps it in memory; a restarted scheduler forecasts again after a day of records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from scheduler.policy.model import ForecastSpec, ScheduleSpec, ScheduleWindow

DAY_S = 86400.0


def _open(w: ScheduleWindow, weekday: int, minute: int) -> bool:
    if w.start_min < w.end_min:
        return weekday in w.days and w.start_min <= minute < w.end_min
    # Past midnight: the evening part on a listed day, the morning part on the day after one.
    return (weekday in w.days and minute >= w.start_min) or (
        (weekday - 1) % 7 in w.days and minute < w.end_min
    )


def schedule_min(spec: ScheduleSpec, now: float, lead_s: float = 0.0) -> int:
    """The highest minWorkers of the windows open at `now + lead_s` (0: none open)."""
    if not spec.windows:
        return 0
    local = datetime.fromtimestamp(now + lead_s, tz=UTC).astimezone(ZoneInfo(spec.time_zone))
    minute = local.hour * 60 + local.minute
    return max((w.min_workers for w in spec.windows if _open(w, local.weekday(), minute)), default=0)


def bucket_of(t: float, bucket_s: float) -> int:
    return math.floor(t / bucket_s)


def forecast_min(record: Mapping[int, int], now: float, spec: ForecastSpec, lead_s: float) -> int:
    """The most workers demand needed, on any of the last `lookback_days` days, between this time
    of day and `lead_s` later (0 when off or nothing is recorded)."""
    if spec.lookback_days <= 0:
        return 0
    best = 0
    for k in range(1, spec.lookback_days + 1):
        first = bucket_of(now - k * DAY_S, spec.bucket_s)
        last = bucket_of(now + lead_s - k * DAY_S, spec.bucket_s)
        for b in range(first, last + 1):
            best = max(best, record.get(b, 0))
    return best


class DemandRecord:
    """Per bucket of time, the most workers demand needed; older than the lookback is dropped."""

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}

    def observe(self, now: float, workers: int, spec: ForecastSpec, lead_s: float) -> None:
        if spec.lookback_days <= 0:
            return
        b = bucket_of(now, spec.bucket_s)
        if workers > self.buckets.get(b, -1):
            self.buckets[b] = workers
        keep_from = bucket_of(now - spec.lookback_days * DAY_S - lead_s, spec.bucket_s) - 1
        if next(iter(self.buckets)) < keep_from:  # dicts keep insertion order: oldest first
            self.buckets = {k: v for k, v in self.buckets.items() if k >= keep_from}


def lead_seconds(spec: ForecastSpec, start_delay_s: float, period_s: float) -> float:
    """How far ahead to look: the spec's, else a worker's start-up time plus one decision period."""
    return spec.lead_s if spec.lead_s is not None else start_delay_s + period_s
