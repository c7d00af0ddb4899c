"""The figures of one budget run: what the report, the plots and `--json`'s `budget` read, each
computed once, here.

- **provider 429s**: calls the provider answered 429 (its real limit), in all and after
  `converge_s` (a feedback loop needs some throttles to find a limit it was not told).
- **utilization**: tokens the provider accepted ÷ its real limit, per minute, averaged over the
  contended minutes (a minute in which some ready call was held back: by a limiter, a 429's
  backoff, a permit): whether the scarce thing was used while someone wanted it.
- **time to permit**: per call, from ready to go (slot held) to accepted by the provider, per class
  (a call still held at the end counts with what it has waited); Guaranteed also apart for calls
  within the tenant's reserved rate (its Guaranteed demand in the trailing minute, the call
  included, at most that rate).
- **time to call** (the sizing advice's): from the moment the session wanted to make the call,
  its slot's wait included, to accepted.
- **token attainment** per tenant: `scheduler/sim/attainment.py`'s weighted max-min entitlement
  with tokens for slots: at each contended minute, the capacity is the real limit, a tenant's
  demand what it received plus what it still had waiting at the minute's end, its quotas its share
  of the budget; `attainment_min` the lowest over tenants.
- **stretch**: per finished session, time to finish ÷ time alone (its calls' own timeline).
- **worker-seconds**: what the pool cost (the autoscaler's workers, starting and draining ones too).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from scheduler.sim.attainment import Point, Quotas, attainment
from scheduler.sim.budget.engine import Record, stretch
from scheduler.sim.budget.setup import CLASS_KEYS, BudgetSetup
from scheduler.sim.stats import percentile, waits_json


@dataclass
class BudgetFigures:
    name: str
    provider_429s: int
    provider_429s_late: int
    utilization: float | None
    contended_minutes: int
    waits: dict[str, list[float]]  # per class key, and "within_reserved"
    call_waits: dict[str, list[float]]  # per class key: from wanted (slot or not) to accepted
    attainment: dict[str, float | None]
    attainment_min: float | None
    stretches: dict[str, list[float]]  # per class key, and "all"
    worker_seconds: float
    sessions: int
    finished: int
    limit_changes: int = 0
    # Per minute, for the plots: accepted tokens by class, 429s, the effective limit (the limiter's).
    minutes: list[tuple[float, float, float]] = field(default_factory=list)
    throttles_per_minute: list[int] = field(default_factory=list)
    limit_line: list[tuple[float, float]] = field(default_factory=list)
    real_limit: float = 0.0

    def p99(self, key: str) -> float | None:
        w = self.waits.get(key, [])
        return round(percentile(w, 99), 3) if w else None


def _minute_count(rec: Record) -> int:
    return max(1, math.ceil(rec.end / 60.0))


def budget_figures(name: str, rec: Record, setup: BudgetSetup, settle_s: float = 300.0) -> BudgetFigures:
    """`settle_s`: 429s later than this after the first one count as after convergence."""
    dim = setup.dim
    converge_s = (rec.throttles[0] + settle_s) if rec.throttles else 0.0
    n = _minute_count(rec)
    real = setup.real_limits[dim]
    by_class = [[0.0, 0.0, 0.0] for _ in range(n)]
    received: list[dict[str, list[float]]] = [defaultdict(lambda: [0.0, 0.0, 0.0]) for _ in range(n)]
    backlog: list[dict[str, list[float]]] = [defaultdict(lambda: [0.0, 0.0, 0.0]) for _ in range(n)]
    contended = [False] * n
    waits: dict[str, list[float]] = {k: [] for k in (*CLASS_KEYS, "within_reserved")}
    call_waits: dict[str, list[float]] = {k: [] for k in CLASS_KEYS}
    for c in rec.calls:
        s = c.session
        key = CLASS_KEYS[s.cls]
        until = c.accepted if c.accepted is not None else rec.end
        wait = max(0.0, until - c.ready)
        waits[key].append(wait)
        call_waits[key].append(max(0.0, until - c.wanted))
        if s.cls == 0 and c.within_reserved:
            waits["within_reserved"].append(wait)
        tokens = c.used[dim]
        if c.accepted is not None and c.accepted < rec.end:
            m = min(n - 1, int(c.accepted // 60))
            by_class[m][s.cls] += tokens
            received[m][s.plan.tenant][s.cls] += tokens
        if wait > 1e-6:
            first, last = int(c.ready // 60), min(n - 1, int(until // 60))
            for m in range(first, last + 1):
                contended[m] = True
            for m in range(first, last):  # still waiting at the end of minute m
                backlog[m][s.plan.tenant][s.cls] += tokens
    busy = [m for m in range(n) if contended[m]]
    util = sum(sum(by_class[m]) for m in busy) / (real * len(busy)) if busy and real > 0 else None
    quotas = {
        t: Quotas(
            sh.weight,
            round(sh.reserved),
            round(sh.nominal),
            round(sh.burstable_limit),
            None if sh.best_effort_limit is None else round(sh.best_effort_limit),
        )
        for t, sh in setup.shares.items()
    }
    points = []
    for m in busy:
        tenants = set(received[m]) | set(backlog[m])
        points.append(
            Point(
                round(real),
                {
                    t: (
                        tuple(round(x) for x in received[m][t]),  # type: ignore[misc]
                        tuple(round(x) for x in backlog[m][t]),
                    )
                    for t in tenants
                },
            )
        )
    att = attainment(points, quotas)
    names = sorted({s.plan.tenant for s in rec.sessions})
    stretches: dict[str, list[float]] = {k: [] for k in (*CLASS_KEYS, "all")}
    for s in rec.sessions:
        x = stretch(s)
        if x is not None:
            stretches[CLASS_KEYS[s.cls]].append(x)
            stretches["all"].append(x)
    per_minute_429 = [0] * n
    for t in rec.throttles:
        per_minute_429[min(n - 1, int(t // 60))] += 1
    lowest = att.minimum(names)
    return BudgetFigures(
        name=name,
        provider_429s=len(rec.throttles),
        provider_429s_late=sum(1 for t in rec.throttles if t >= converge_s),
        utilization=util,
        contended_minutes=len(busy),
        waits=waits,
        call_waits=call_waits,
        attainment={t: att.ratio(t, "all") for t in names if t in att.received},
        attainment_min=lowest,
        stretches=stretches,
        worker_seconds=rec.worker_seconds,
        sessions=len(rec.sessions),
        finished=len(stretches["all"]),
        minutes=[(a, b, c) for a, b, c in by_class],
        throttles_per_minute=per_minute_429,
        limit_line=list(rec.limits),
        real_limit=real,
    )


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def cap_json(capped: BudgetFigures, nocap: BudgetFigures) -> dict[str, Any]:
    """`--json`'s `budget_cap`: slotsched's autoscaler with its budget cap and without, side by
    side (worker-seconds, and the session completion stretch of all classes)."""

    def one(f: BudgetFigures) -> dict[str, Any]:
        v = f.stretches["all"]
        return {
            "contender": f.name,
            "worker_seconds": round(f.worker_seconds, 1),
            "stretch": {
                "mean": _r(sum(v) / len(v) if v else None, 3),
                "p90": _r(percentile(v, 90) if v else None, 3),
            },
            "finished": f.finished,
        }

    return {"with_cap": one(capped), "without_cap": one(nocap)}


def budget_json(f: BudgetFigures) -> dict[str, Any]:
    """The `budget` entry of a contender in `simulate --compare --json`."""
    ttp: dict[str, Any] = {k: waits_json(f.waits[k]) for k in CLASS_KEYS}
    ttp["guaranteed"]["within_reserved"] = waits_json(f.waits["within_reserved"])
    st = f.stretches
    return {
        "provider_429s": f.provider_429s,
        "provider_429s_after_convergence": f.provider_429s_late,
        "utilization": _r(f.utilization),
        "contended_minutes": f.contended_minutes,
        "attainment_min": _r(f.attainment_min),
        "attainment": {t: _r(v) for t, v in sorted(f.attainment.items())},
        "time_to_permit": ttp,
        "stretch": {
            k: {
                "p50": _r(percentile(v, 50) if v else None, 3),
                "mean": _r(sum(v) / len(v) if v else None, 3),
                "p90": _r(percentile(v, 90) if v else None, 3),
            }
            for k, v in st.items()
        },
        "worker_seconds": round(f.worker_seconds, 1),
        "sessions": f.sessions,
        "finished": f.finished,
        "limit_changes": f.limit_changes,
    }
