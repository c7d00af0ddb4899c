"""spec.autoscaler (and spec.pools[].autoscaler) from YAML: the tuning numbers, the HPA-like
scale-up and scale-down policies, recycling, the schedule and the forecast. Apart from validate.py
so that each file stays readable; errors name the key path, as everywhere in the policy."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from scheduler.policy.checker import Checker, describe, join, keys_text
from scheduler.policy.model import AutoscalerSpec, ForecastSpec, ScheduleSpec, ScheduleWindow
from scheduler.policy.schema import (
    AUTOSCALER_FIELDS,
    AUTOSCALER_KEYS,
    CLOCK_RE,
    FORECAST_FIELDS,
    RECYCLE_FIELDS,
    SCALE_DOWN_FIELDS,
    SCALE_UP_FIELDS,
    SCHEDULE_KEYS,
    SCHEDULE_WINDOW_KEYS,
    WEEKDAYS,
    WEIGHT_FIELDS,
    Num,
)


def parse_autoscaler(
    c: Checker, value: object, path: str, base: AutoscalerSpec | None = None
) -> AutoscalerSpec:
    m = c.section(value, path, AUTOSCALER_KEYS)
    base = base or AutoscalerSpec()
    changes = c.numbers(m, AUTOSCALER_FIELDS, path)
    for key, fields in (
        ("weights", WEIGHT_FIELDS),
        ("scaleUp", SCALE_UP_FIELDS),
        ("scaleDown", SCALE_DOWN_FIELDS),
        ("recycle", RECYCLE_FIELDS),
    ):
        sub = join(path, key)
        changes |= c.numbers(c.section(m.get(key), sub, [f.key for f in fields]), fields, sub)
    if "schedule" in m:
        changes["schedule"] = _schedule(c, m["schedule"], join(path, "schedule"))
    if "forecast" in m:
        fp = join(path, "forecast")
        fm = c.section(m["forecast"], fp, [f.key for f in FORECAST_FIELDS])
        changes["forecast"] = dataclasses.replace(ForecastSpec(), **c.numbers(fm, FORECAST_FIELDS, fp))
    return dataclasses.replace(base, **changes)


def _schedule(c: Checker, value: object, path: str) -> ScheduleSpec:
    m = c.section(value, path, SCHEDULE_KEYS)
    zone = c.string(m, "timeZone", path) or "UTC"
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        c.error(
            join(path, "timeZone"), f"unknown time zone {zone!r}: expected an IANA name like Europe/Berlin"
        )
    raw = m.get("windows", [])
    wp = join(path, "windows")
    if not isinstance(raw, list):
        c.error(wp, f"expected a list of windows, got {describe(raw)}")
        raw = []
    windows = [w for i, item in enumerate(raw) if (w := _window(c, item, f"{wp}[{i}]")) is not None]
    return ScheduleSpec(time_zone=zone, windows=tuple(windows))


def _window(c: Checker, value: object, path: str) -> ScheduleWindow | None:
    if not isinstance(value, Mapping):
        c.error(
            path, f"expected a mapping with keys {keys_text(SCHEDULE_WINDOW_KEYS)}, got {describe(value)}"
        )
        return None
    m = c.section(value, path, SCHEDULE_WINDOW_KEYS)
    start, end = _clock(c, m, "start", path), _clock(c, m, "end", path)
    mw = c.number(m, Num("minWorkers", "min_workers", True), path)
    if "minWorkers" not in m:
        c.error(join(path, "minWorkers"), "required: the fewest workers during the window")
    days = _days(c, m.get("days"), join(path, "days")) if "days" in m else tuple(range(7))
    if start is None or end is None or mw is None or days is None:
        return None
    if start == end:
        c.error(join(path, "end"), "equal to start: a window must last")
        return None
    return ScheduleWindow(start_min=start, end_min=end, min_workers=int(mw), days=days)


def _clock(c: Checker, m: Mapping[str, object], key: str, path: str) -> int | None:
    text = c.string(m, key, path)
    if text is None:
        if key not in m:
            c.error(join(path, key), 'required: a local time like "08:30"')
        return None
    match = CLOCK_RE.match(text)
    if match is None:
        c.error(join(path, key), f'expected a local time HH:MM like "08:30", got {text!r}')
        return None
    return int(match.group(1)) * 60 + int(match.group(2))


def _days(c: Checker, value: object, path: str) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not value:
        c.error(path, f"expected a non-empty list of days ({', '.join(WEEKDAYS)}), got {describe(value)}")
        return None
    out: list[int] = []
    for i, d in enumerate(value):
        if not isinstance(d, str) or d.lower() not in WEEKDAYS:
            c.error(f"{path}[{i}]", f"expected one of {', '.join(WEEKDAYS)}, got {describe(d)}")
            return None
        out.append(WEEKDAYS.index(d.lower()))
    return tuple(sorted(set(out)))


def autoscaler_to_dict(a: AutoscalerSpec) -> dict[str, Any]:
    """The inverse of parse_autoscaler (yaml_io writes it back)."""

    def nums(spec: object, fields: tuple[Num, ...]) -> dict[str, Any]:
        return {f.key: getattr(spec, f.attr) for f in fields if getattr(spec, f.attr) is not None}

    # Keys added after the first release are written only when set, so a policy that does not
    # use them is written as before (the shipped samples' policies, byte for byte).
    scale_up = nums(a, SCALE_UP_FIELDS)
    if not a.scale_up_oldest_wait_s:
        scale_up.pop("oldestWaitSeconds")
    out: dict[str, Any] = {"weights": nums(a, WEIGHT_FIELDS), "scaleUp": scale_up}
    base = AutoscalerSpec()
    for key, fields in (("scaleDown", SCALE_DOWN_FIELDS), ("recycle", RECYCLE_FIELDS)):
        if any(getattr(a, f.attr) != getattr(base, f.attr) for f in fields):
            out[key] = nums(a, fields)
    out |= nums(a, AUTOSCALER_FIELDS)
    if a.schedule != ScheduleSpec():
        out["schedule"] = {
            "timeZone": a.schedule.time_zone,
            "windows": [
                {
                    "days": [WEEKDAYS[d] for d in w.days],
                    "start": f"{w.start_min // 60:02d}:{w.start_min % 60:02d}",
                    "end": f"{w.end_min // 60:02d}:{w.end_min % 60:02d}",
                    "minWorkers": w.min_workers,
                }
                for w in a.schedule.windows
            ],
        }
    if a.forecast != ForecastSpec():
        out["forecast"] = nums(a.forecast, FORECAST_FIELDS)
    return out
