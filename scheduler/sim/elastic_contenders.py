"""The elastic group of a comparison: slotsched's autoscaler and the baseline autoscalers.

Why a separate roster: these need `scheduler.sim.elastic` (the elastic pool and its worker-second
accounting); `contenders.roster()` adds them only when it is present. Every elastic contender
drives the same slotsched core and starts from the policy's `workers`, within `minWorkers` and
`maxWorkers` (KEDA: down to zero), so the group compares only how the pool is sized and how
workers leave; static contenders are not compared with them.
"""

from __future__ import annotations

from scheduler.core.engine import Core
from scheduler.sim.autoscalers import Demo, Hpa, Keda, Polling, WeightedFormula
from scheduler.sim.contenders import SLOTSCHED, Contender
from scheduler.sim.elastic import ElasticPool
from scheduler.sim.scaler_pool import factory

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
            "demo",
            Core,
            "autoscaler",
            "+1 after 2 busy 3-s samples (12 s cooldown), -1 after 12 idle (45 s cooldown)",
            GROUP,
            factory(Demo),
        ),
    ]
