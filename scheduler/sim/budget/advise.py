"""`slotsched simulate --advise`: the smallest budget that meets a target of time to permit (p99
per class) on the workload, and the smallest pool that serves it, with the curves behind both.

How: slotsched with its autoscaler (and the budget cap) on the workload,
1. the budget scaled (every limit and every tenant's rate given in tokens; percent shares scale
   by themselves; the provider's real limit keeps its fraction: a bigger key tier) over
   `BUDGET_STEPS` of the configured one, on the policy's pool: the smallest that meets the target;
2. with that budget, the autoscaler's ceiling (max workers) over `POOL_STEPS` of the policy's:
   the smallest whose sessions finish as fast (mean stretch within `STRETCH_SLACK` of the
   largest pool's) and still meet the target (min workers: the policy's). Time to permit alone
   would pick a tiny pool: fewer sessions at once ask for fewer tokens, and wait for slots instead.
Why both: tokens and slots bind together. A budget too small makes sessions wait for permits
whatever the pool; a pool too small makes them wait for slots whatever the budget; past the
budget's rate, more workers buy idle warm slots.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.policy.model import BudgetRate, Policy, TenantBudgetQuota
from scheduler.sim.budget.figures import BudgetFigures
from scheduler.sim.budget.run import ROSTER, SLOTSCHED, pool_config, run_one
from scheduler.sim.budget.setup import CLASS_KEYS, setup_of
from scheduler.sim.stats import percentile
from scheduler.sim.workload import SessionPlan

BUDGET_STEPS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0)
STRETCH_SLACK = 1.05
POOL_STEPS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
DEFAULT_TARGET = {"guaranteed": 2.0, "burstable": 30.0}


def parse_target(text: str) -> dict[str, float]:
    """`guaranteed=2,burstable=30` (p99 seconds per class) -> {class: seconds}."""
    out: dict[str, float] = {}
    for part in text.split(","):
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or key not in CLASS_KEYS:
            raise ValueError(f"--target: {part.strip()!r} is not <class>=<seconds> ({', '.join(CLASS_KEYS)})")
        try:
            out[key] = float(value)
        except ValueError:
            raise ValueError(f"--target: {key}={value!r}: expected seconds") from None
        if not out[key] > 0:
            raise ValueError(f"--target: {key} must be above 0 s, not {value}")
    return out


def _rate(r: BudgetRate | None, k: float) -> BudgetRate | None:
    if r is None:
        return None

    def s(v: int | None) -> int | None:
        return None if v is None else max(1, round(v * k))

    return dataclasses.replace(
        r,
        tokens=s(r.tokens),
        input_tokens=s(r.input_tokens),
        output_tokens=s(r.output_tokens),
        requests=s(r.requests),
    )


def scale_budget(policy: Policy, name: str, k: float) -> Policy:
    """The policy with budget `name` k times as large, every tenant's rate in tokens with it."""

    def lim(v: int | None) -> int | None:
        return None if v is None else max(1, round(v * k))

    budgets = tuple(
        dataclasses.replace(
            b,
            tokens_per_minute=lim(b.tokens_per_minute),
            input_tokens_per_minute=lim(b.input_tokens_per_minute),
            output_tokens_per_minute=lim(b.output_tokens_per_minute),
            requests_per_minute=lim(b.requests_per_minute),
        )
        if b.name == name
        else b
        for b in policy.budgets
    )

    def quota(q: TenantBudgetQuota) -> TenantBudgetQuota:
        if q.budget != name:
            return q
        return dataclasses.replace(
            q,
            reserved=_rate(q.reserved, k),
            burstable_nominal=_rate(q.burstable_nominal, k),
            burstable_limit=_rate(q.burstable_limit, k),
            best_effort_limit=_rate(q.best_effort_limit, k),
        )

    tenants = tuple(
        dataclasses.replace(t, budgets=tuple(quota(q) for q in t.budgets)) for t in policy.tenants
    )
    return dataclasses.replace(policy, budgets=budgets, tenants=tenants)


@dataclass(frozen=True)
class Step:
    value: float  # the budget's factor, or max workers
    p99: Mapping[str, float | None]  # time to permit, per class
    worker_seconds: float
    stretch_mean: float | None
    meets: bool


def _p99s(f: BudgetFigures) -> dict[str, float | None]:
    return {k: (round(percentile(f.waits[k], 99), 2) if f.waits[k] else None) for k in CLASS_KEYS}


def _stretch(f: BudgetFigures) -> float | None:
    v = f.stretches["all"]
    return round(sum(v) / len(v), 3) if v else None


def _meets(p99: Mapping[str, float | None], target: Mapping[str, float]) -> bool:
    return all(p99.get(k) is None or (p99[k] or 0.0) <= s for k, s in target.items())


def advise(
    policy: Policy,
    plans: Sequence[SessionPlan],
    target: Mapping[str, float],
    until_s: float | None,
    real_fraction: float = 1.0,
    budget: str | None = None,
) -> dict[str, Any]:
    me = next(c for c in ROSTER if c.name == SLOTSCHED)
    name = budget or policy.budgets[0].name
    base = setup_of(policy, name, real_fraction)
    budget_curve: list[Step] = []
    chosen: float | None = None
    for k in BUDGET_STEPS:
        scaled = scale_budget(policy, name, k)
        f = run_one(me, scaled, plans, setup_of(scaled, name, real_fraction), True, until_s)
        step = Step(k, _p99s(f), f.worker_seconds, _stretch(f), _meets(_p99s(f), target))
        budget_curve.append(step)
        if step.meets and chosen is None:
            chosen = k
            break
    k = chosen if chosen is not None else BUDGET_STEPS[-1]
    sized = scale_budget(policy, name, k)
    setup = setup_of(sized, name, real_fraction)
    ceiling = max(policy.pool.workers, policy.pool.max_workers or policy.pool.workers)
    runs = []
    for m in sorted({max(1, math.ceil(ceiling * x)) for x in POOL_STEPS}):
        cfg = dataclasses.replace(
            pool_config(sized, True, True), workers=min(policy.pool.workers, m), max_workers=m
        )
        runs.append((m, run_one(me, sized, plans, setup, True, until_s, pool=cfg)))
    best = _stretch(runs[-1][1])
    pool_curve: list[Step] = []
    smallest: int | None = None
    for m, f in runs:
        st = _stretch(f)
        ok = _meets(_p99s(f), target) and st is not None and best is not None and st <= best * STRETCH_SLACK
        pool_curve.append(Step(m, _p99s(f), f.worker_seconds, st, ok))
        if ok and smallest is None:
            smallest = m
    dim = base.dim
    return {
        "target_p99_s": dict(target),
        "budget": {
            "name": name,
            "factor": chosen,
            "per_minute": None if chosen is None else round(base.limits[dim] * chosen),
            "dimension": "input_tokens" if dim == 1 else "tokens",
        },
        "pool": {"min_workers": max(1, policy.pool.min_workers), "max_workers": smallest},
        "budget_curve": [dataclasses.asdict(s) for s in budget_curve],
        "pool_curve": [dataclasses.asdict(s) for s in pool_curve],
    }


def render(advice: Mapping[str, Any]) -> str:
    b, p = advice["budget"], advice["pool"]
    t = ", ".join(f"{k} p99 <= {v:g} s" for k, v in advice["target_p99_s"].items())
    head = " | ".join(f"{k} p99 (s)" for k in CLASS_KEYS) + " | worker-s | stretch mean | meets"

    def line(s: Mapping[str, Any]) -> str:
        cells = " | ".join(str(s["p99"][k]) for k in CLASS_KEYS)
        return f"{s['value']:g} | {cells} | {s['worker_seconds']:,.0f} | {s['stretch_mean']} | {s['meets']}"

    lines = [f"target (time to permit): {t}", "", "budget x configured | " + head]
    lines += [line(s) for s in advice["budget_curve"]]
    lines += [
        "",
        f"max workers (at that budget; meets: the target, and stretch within {STRETCH_SLACK:g}x "
        "the largest pool's) | " + head,
    ]
    lines += [line(s) for s in advice["pool_curve"]]
    lines.append("")
    if b["factor"] is None:
        lines.append(f"no budget up to {BUDGET_STEPS[-1]:g}x the configured one meets the target")
    else:
        lines.append(
            f"smallest budget: {b['factor']:g}x the configured one = {b['per_minute']:,} {b['dimension']}/min"
        )
    if p["max_workers"] is None:
        lines.append("no pool up to the largest tried meets the target with that budget")
    else:
        lines.append(f"smallest pool: min {p['min_workers']} / max {p['max_workers']} workers")
    return "\n".join(lines)
