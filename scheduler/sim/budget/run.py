"""The budget comparison: every limiter on the same sessions, pool and provider, on a static pool
and with the autoscaler (`simulate --compare` runs it when the workload carries LLM calls and the
policy a budget).

Every contender sees the configured limit (what the platform believes); the provider enforces the
real one (`--provider-limit`, its fraction of the configured). slotsched drives its budget core
(`slotsched.py`); with the autoscaler it also caps the pool by what the budget can feed
(`pool.budget_cap`, the server autoscaler's cap); the others' autoscaler does not know the budget.
One more run, `slotsched+autoscaler-nocap`, is slotsched's budgets with the autoscaler but without
the cap: what the cap saves in worker-seconds, and what it costs in session completion stretch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduler.policy.model import Policy
from scheduler.sim.budget.engine import BudgetSim, Limiter
from scheduler.sim.budget.figures import BudgetFigures, budget_figures
from scheduler.sim.budget.limiters import Gateway, NoLimiter, PerWorker, SlidingWindow
from scheduler.sim.budget.pool import PoolConfig
from scheduler.sim.budget.setup import BudgetSetup, setup_of
from scheduler.sim.budget.slotsched import Slotsched
from scheduler.sim.workload import SessionPlan

SLOTSCHED = "slotsched"
AUTOSCALER = "+autoscaler"
NOCAP = "-nocap"  # slotsched with the autoscaler, its budget cap off


@dataclass(frozen=True)
class BudgetContender:
    name: str
    make: Callable[[Policy, str], Limiter]
    knows_classes: bool
    note: str


ROSTER: tuple[BudgetContender, ...] = (
    BudgetContender(
        "no-limiter",
        lambda p, b: NoLimiter(),
        False,
        "every call to the provider; 429 retried with backoff and jitter",
    ),
    BudgetContender(
        "per-worker",
        lambda p, b: PerWorker(),
        False,
        "the budget split statically among the workers, FIFO each",
    ),
    BudgetContender(
        "sliding-window",
        lambda p, b: SlidingWindow(),
        False,
        "one fleet-wide sliding minute, first come first served",
    ),
    BudgetContender(
        "gateway",
        lambda p, b: Gateway(),
        True,
        "LiteLLM-style dynamic limiter: idle capacity free below 80% of the minute, then each class "
        "held to its reserved share, 429 past it",
    ),
    BudgetContender(
        SLOTSCHED, Slotsched, True, "the budget core: class, quota, fair share, permits settled, AIMD on 429s"
    ),
)


@dataclass(frozen=True)
class BudgetResult:
    name: str
    contender: BudgetContender
    autoscaler: bool
    figures: BudgetFigures
    capped: bool = True  # False: slotsched's autoscaler without its budget cap (NOCAP)


def pool_config(policy: Policy, autoscale: bool, cap: bool, workers: int | None = None) -> PoolConfig:
    pool = policy.pool
    return PoolConfig(
        workers=workers if workers is not None else pool.workers,
        slots_per_worker=pool.slots_per_worker,
        min_workers=max(1, pool.min_workers),
        max_workers=pool.max_workers,
        autoscale=autoscale,
        cap=cap,
        start_delay_s=policy.autoscaler.start_delay_s,
        stabilization_s=policy.autoscaler.scale_down_stabilization_s,
        drain_timeout_s=policy.autoscaler.drain_timeout_s,
        quotas=tuple((t.name, t.guaranteed, t.burstable_nominal, t.weight) for t in policy.tenants),
    )


def run_one(
    c: BudgetContender,
    policy: Policy,
    plans: Sequence[SessionPlan],
    setup: BudgetSetup,
    autoscale: bool,
    until_s: float | None,
    seed: int = 0,
    pool: PoolConfig | None = None,
    cap: bool = True,
) -> BudgetFigures:
    """`cap`: slotsched's autoscaler applies its budget cap (False: the NOCAP run)."""
    limiter = c.make(policy, setup.name)
    capped = cap and autoscale and c.name == SLOTSCHED
    cfg = pool or pool_config(policy, autoscale, cap=capped)
    rec = BudgetSim(plans, setup, limiter, cfg, until_s, seed).run()
    name = c.name + (AUTOSCALER if autoscale else "") + ("" if cap or not autoscale else NOCAP)
    f = budget_figures(name, rec, setup)
    if isinstance(limiter, Slotsched):
        f.limit_changes = len(limiter.limit_changes)
    return f


def has_budget_run(policy: Policy, plans: Sequence[SessionPlan]) -> bool:
    return bool(policy.budgets) and any(per.calls for p in plans for per in p.periods)


def run_budgets(
    policy: Policy,
    plans: Sequence[SessionPlan],
    until_s: float | None,
    real_fraction: float = 1.0,
    budget: str | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    headers: bool = True,
) -> list[BudgetResult]:
    """`headers`: the provider states its limit in its answers (False: only its 429s say it)."""
    setup = setup_of(policy, budget, real_fraction, headers=headers)
    out = []
    for autoscale in (False, True):
        for c in ROSTER:
            name = c.name + (AUTOSCALER if autoscale else "")
            if progress:
                progress(name)
            out.append(
                BudgetResult(name, c, autoscale, run_one(c, policy, plans, setup, autoscale, until_s, seed))
            )
    me = next(c for c in ROSTER if c.name == SLOTSCHED)
    name = SLOTSCHED + AUTOSCALER + NOCAP
    if progress:
        progress(name)
    f = run_one(me, policy, plans, setup, True, until_s, seed, cap=False)
    out.append(BudgetResult(name, me, True, f, capped=False))
    return out
