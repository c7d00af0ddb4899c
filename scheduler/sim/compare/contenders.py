"""The roster of a comparison: slotsched and every baseline, each with what it stands for.

Why a roster: the report, the plots and the verdicts ("where slotsched does not win, and why")
need to know what a contender *is* — its family (no queue, FIFO, priority, kill preemption,
autoscaler) — not only its name. Static contenders share one fixed pool; elastic ones grow and
shrink it and are compared among themselves: slotsched's autoscaler and the baseline autoscalers.
Every elastic contender drives the same slotsched core and starts from the policy's `workers`,
within `minWorkers` and `maxWorkers` (KEDA: down to zero), so the group compares only how the pool
is sized and how workers leave; static contenders are not compared with them.

With several pools slotsched runs `Pools` and each baseline one instance per pool
(`baselines/per_pool.py`), each session in the pool it asked for first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.core.pools import Pools as Core  # one Core per pool; with one pool, that core
from scheduler.policy.model import Policy
from scheduler.sim.autoscalers import Hpa, Keda, Polling, QueueStep, WeightedFormula
from scheduler.sim.baselines.fifo import Fifo
from scheduler.sim.baselines.kueue_classic import KueueClassic
from scheduler.sim.baselines.per_pool import per_pool
from scheduler.sim.baselines.priority_kill import PriorityKill
from scheduler.sim.baselines.reject_retry import RejectRetry
from scheduler.sim.baselines.strict_priority import StrictPriority
from scheduler.sim.decider import Decider
from scheduler.sim.elastic import ElasticPool
from scheduler.sim.scaler_pool import factory
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
        "reject-retry",
        per_pool(RejectRetry),
        "no-queue",
        "no queue: refused when full, clients retry after 1.5-3 s",
    ),
    Contender("fifo", per_pool(Fifo), "fifo", "one FIFO queue, no classes, no preemption"),
    Contender(
        "strict-priority", per_pool(StrictPriority), "priority", "G > B > BE, FIFO within, no preemption"
    ),
    Contender(
        "priority-kill", per_pool(PriorityKill), "kill", "strict priority, kills the newest lower-class lease"
    ),
    Contender(
        "kueue-classic",
        per_pool(KueueClassic),
        "kill",
        "per-tenant nominal quotas, priority, evicts without checkpoint",
    ),
)


GROUP = "elastic"


def elastic_contenders() -> list[Contender]:
    return [
        Contender(
            f"{SLOTSCHED}+autoscaler",
            Core,
            "slotsched",
            "busy + weighted pending + floor headroom, HPA damping; drains by checkpoint-and-yield",
            GROUP,
            lambda: ElasticPool(15.0),
        ),
        Contender(
            "hpa-queue",
            Core,
            "autoscaler",
            "HPA defaults on queue depth per worker; Deployment scale-down kills newest pods",
            GROUP,
            factory(Hpa),
        ),
        Contender(
            "keda-redis",
            Core,
            "autoscaler",
            "KEDA Redis list (listLength 5, poll 30 s, cooldown 300 s to zero) over the HPA",
            GROUP,
            factory(Keda),
        ),
        Contender(
            "weighted-formula",
            Core,
            "autoscaler",
            "int(weighted depth / slots) + 1, weights 3/1/0.5, 30 s cooldown; removes idle workers",
            GROUP,
            factory(WeightedFormula),
        ),
        Contender(
            "polling",
            Core,
            "autoscaler",
            "pending > 5/worker or oldest > 30 s; steps min(5, 50%); 60/120 s cooldowns",
            GROUP,
            factory(Polling),
        ),
        Contender(
            "queue-step",
            Core,
            "autoscaler",
            "+1 after 2 busy 3-s samples (12 s cooldown), -1 after 12 idle (45 s cooldown)",
            GROUP,
            factory(QueueStep),
        ),
    ]


def roster() -> list[Contender]:
    """Every contender: the static group, then the elastic one."""
    return list(STATIC) + elastic_contenders()


def reference(group: str) -> str:
    """The slotsched contender the others of a group are compared with."""
    return SLOTSCHED if group == "static" else f"{SLOTSCHED}+autoscaler"
