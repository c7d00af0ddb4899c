"""The demo's tenants, policy and multi-tenant workload.

Why this mix: it is the situation slotsched exists for — a pool too small for everything asked
of it. One tenant floods the pool with BestEffort batch sessions (always more waiting than can
run), two product tenants send Burstable traffic of different weights, and an SRE tenant opens
Guaranteed incident sessions that must get a slot within the yield grace period, so something
has to be preempted: checkpointed, yielded, and resumed later from its snapshot.

Every session needs a given amount of *slot time* (work); time spent queued or re-queued after
a preemption does not count, so a preempted session comes back to finish its work. Arrivals and
work sizes come from a seeded RNG: two runs with the same seed ask for the same things.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import yaml

from scheduler.client import QoS
from scheduler.policy.identities import hash_token


@dataclass(frozen=True)
class Stream:
    """One tenant's stream of sessions in one class."""

    tenant: str
    qos: QoS
    #: Closed loop: keep this many sessions in flight (0 = open loop, Poisson arrivals).
    concurrency: int
    #: Open loop: mean seconds between arrivals.
    mean_interarrival_s: float
    #: Slot time each session needs, uniform in [lo, hi] seconds.
    work_s: tuple[float, float]
    #: First arrival (seconds after the start).
    first_at_s: float = 0.0


#: Tenants: name -> (weight, guaranteed quota, burstable nominal, burstable limit, bestEffort limit).
TENANTS: dict[str, tuple[float, int, int, int, int | None]] = {
    "batch": (1.0, 0, 0, 0, None),  # BestEffort only
    "web": (2.0, 0, 1, 4, 0),
    "mobile": (1.0, 0, 1, 4, 0),
    "sre": (1.0, 2, 0, 0, 0),  # Guaranteed only: may hold the whole floor
}

STREAMS: tuple[Stream, ...] = (
    Stream("batch", QoS.BESTEFFORT, concurrency=10, mean_interarrival_s=0.0, work_s=(4.0, 9.0)),
    Stream("web", QoS.BURSTABLE, concurrency=0, mean_interarrival_s=2.0, work_s=(2.0, 5.0), first_at_s=0.5),
    Stream(
        "mobile", QoS.BURSTABLE, concurrency=0, mean_interarrival_s=3.0, work_s=(2.0, 5.0), first_at_s=1.0
    ),
    Stream("sre", QoS.GUARANTEED, concurrency=0, mean_interarrival_s=6.0, work_s=(3.0, 6.0), first_at_s=3.0),
)

WORKERS = 3
SLOTS_PER_WORKER = 2
FLOOR = 2
YIELD_GRACE_S = 5.0
LEASE_TTL_S = 15.0
MIN_RUNTIME_S = 3.0


def tokens(seed: int) -> dict[str, str]:
    """One bearer token per tenant (random per run; the policy holds their hashes)."""
    rng = random.Random(f"demo-tokens-{seed}")
    return {name: f"demo-{name}-{rng.getrandbits(64):016x}" for name in TENANTS}


def worker_token(seed: int) -> str:
    """The workers' bearer token: a worker role of its own, since the Workers service refuses
    tenant tokens (no tenant may add or remove workers)."""
    rng = random.Random(f"demo-worker-token-{seed}")
    return f"demo-worker-{rng.getrandbits(64):016x}"


def _worker_entry(worker: str) -> dict[str, object]:
    # The worker credential is bound to the demo's worker ids (demo-w0, demo-w1, ...).
    return {"tokens": [hash_token(worker)], "workerIdPrefix": "demo-w", "maxSlots": SLOTS_PER_WORKER}


def policy_yaml(tenant_tokens: dict[str, str], worker: str | None = None) -> str:
    tenants = []
    for name, (weight, guaranteed, nominal, limit, be_limit) in TENANTS.items():
        spec: dict[str, object] = {
            "name": name,
            "weight": weight,
            "guaranteed": guaranteed,
            "burstable": {"nominal": nominal, "limit": limit},
            "tokens": [hash_token(tenant_tokens[name])],
        }
        if be_limit is not None:
            spec["bestEffort"] = {"limit": be_limit}
        tenants.append(spec)
    doc = {
        "apiVersion": "slotsched.dev/v1alpha1",
        "kind": "SchedulingPolicy",
        "metadata": {"name": "demo"},
        "spec": {
            "pool": {
                "slotsPerWorker": SLOTS_PER_WORKER,
                "workers": WORKERS,
                "minWorkers": 1,
                "maxWorkers": WORKERS,
                "floor": FLOOR,
            },
            "timing": {
                "yieldGraceSeconds": YIELD_GRACE_S,
                "leaseTTLSeconds": LEASE_TTL_S,
                "minRuntimeSeconds": MIN_RUNTIME_S,
            },
            "queue": {"maxPending": 500, "maxPendingPerTenant": 200},
            "tenants": tenants,
            "access": {"workers": [_worker_entry(worker)] if worker else []},
        },
    }
    return yaml.safe_dump(doc, sort_keys=False)
