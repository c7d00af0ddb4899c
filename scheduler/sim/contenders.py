"""The roster of a comparison: slotsched and every baseline, each with what it stands for.

Why a roster: the report, the plots and the verdicts ("where slotsched does not win, and why")
need to know what a contender *is* — its family (no queue, FIFO, priority, kill preemption,
autoscaler) — not only its name. Static contenders share one fixed pool; elastic ones (when
`scheduler.sim.elastic` is present) grow and shrink it and are compared among themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.core.engine import Core
from scheduler.policy.model import Policy
from scheduler.sim.baselines.fifo import Fifo
from scheduler.sim.baselines.kueue_classic import KueueClassic
from scheduler.sim.baselines.priority_kill import PriorityKill
from scheduler.sim.baselines.reject_retry import RejectRetry
from scheduler.sim.baselines.strict_priority import StrictPriority
from scheduler.sim.decider import Decider
from scheduler.sim.simulator import PoolHook

SLOTSCHED = "slotsched"


@dataclass(frozen=True)
class Contender:
    name: str
    decider: Callable[[Policy], Decider]
    family: str  # slotsched | no-queue | fifo | priority | kill | autoscaler
    note: str
    group: str = "static"  # compared with the others of its group
    hook: Callable[[], PoolHook] | None = None  # an elastic pool, built fresh for each run


STATIC: tuple[Contender, ...] = (
    Contender(
        SLOTSCHED, Core, "slotsched", "classes, floor, quotas, weighted fair share, checkpoint-and-yield"
    ),
    Contender(
        "reject-retry", RejectRetry, "no-queue", "no queue: refused when full, clients retry after 1.5-3 s"
    ),
    Contender("fifo", Fifo, "fifo", "one FIFO queue, no classes, no preemption"),
    Contender("strict-priority", StrictPriority, "priority", "G > B > BE, FIFO within, no preemption"),
    Contender("priority-kill", PriorityKill, "kill", "strict priority, kills the newest lower-class lease"),
    Contender(
        "kueue-classic",
        KueueClassic,
        "kill",
        "per-tenant nominal quotas, priority, evicts without checkpoint",
    ),
)


def roster() -> list[Contender]:
    """Every contender available in this checkout (the elastic ones only if their hook exists)."""
    out = list(STATIC)
    try:
        from scheduler.sim.elastic_contenders import elastic_contenders
    except ModuleNotFoundError as e:
        if e.name not in ("scheduler.sim.elastic_contenders", "scheduler.sim.elastic"):
            raise
        return out
    extra: list[Contender] = elastic_contenders()
    return out + extra


def reference(group: str) -> str:
    """The slotsched contender the others of a group are compared with."""
    return SLOTSCHED if group == "static" else f"{SLOTSCHED}+autoscaler"
