"""The SchedulingPolicy model: what a platform team declares (pool, timing, queue caps, tenants,
and which credentials act as operators or worker agents).

Plain frozen dataclasses with defaults; parsing and validation live in `validate.py` and `yaml_io.py`
(same package) so the core can depend on this model without depending on YAML.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final, Literal

# A role is a credential that speaks for no tenant. Admin: the Admin service (and Workers, so an
# operator can drain by hand); worker: the Workers service only.
Role = Literal["admin", "worker"]
ADMIN: Final = "admin"
WORKER: Final = "worker"


@dataclass(frozen=True)
class PoolSpec:
    slots_per_worker: int = 2
    workers: int = 4
    min_workers: int = 1
    max_workers: int = 8
    # Absolute slot count, or a percent of capacity when floor_percent is set.
    floor: int = 2
    floor_percent: float | None = None

    def floor_slots(self, capacity: int) -> int:
        """The reserved floor in slots for a pool of `capacity` slots (never above capacity)."""
        if self.floor_percent is not None:
            return min(capacity, math.ceil(capacity * self.floor_percent / 100.0))
        return min(capacity, self.floor)


@dataclass(frozen=True)
class TimingSpec:
    yield_grace_s: float = 10.0
    lease_ttl_s: float = 30.0
    min_runtime_s: float = 30.0


@dataclass(frozen=True)
class QueueSpec:
    max_pending: int = 10000
    max_pending_per_tenant: int = 1000
    # BestEffort is refused past this fraction of a cap, so batch floods leave room for others.
    best_effort_fraction: float = 0.8


@dataclass(frozen=True)
class AutoscalerSpec:
    weight_guaranteed: float = 3.0
    weight_burstable: float = 1.0
    weight_best_effort: float = 0.5
    tolerance: float = 0.1
    scale_up_pods: int = 4
    scale_up_percent: float = 100.0
    scale_up_period_s: float = 15.0
    scale_down_stabilization_s: float = 300.0
    scale_up_cooldown_s: float = 0.0
    scale_down_cooldown_s: float = 60.0
    drain_timeout_s: float = 120.0
    start_delay_s: float = 5.0


@dataclass(frozen=True)
class TenantSpec:
    name: str
    weight: float = 1.0
    guaranteed: int = 0
    burstable_nominal: int = 0
    burstable_limit: int = 0
    # None: no cap on held BestEffort leases. 0: BestEffort refused for this tenant.
    best_effort_limit: int | None = None
    # "sha256:<hex>" of bearer tokens that authenticate as this tenant.
    tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class AccessSpec:
    """Roles bound to credentials: "sha256:<hex>" of bearer tokens, like tenant tokens.

    Separate from tenants so that no tenant can change the policy or the pool it is judged by:
    a token is one identity, either a tenant or a role, never both (the loader enforces it)."""

    admins: tuple[str, ...] = ()
    workers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Policy:
    name: str = "default"
    pool: PoolSpec = field(default_factory=PoolSpec)
    timing: TimingSpec = field(default_factory=TimingSpec)
    queue: QueueSpec = field(default_factory=QueueSpec)
    autoscaler: AutoscalerSpec = field(default_factory=AutoscalerSpec)
    tenants: tuple[TenantSpec, ...] = ()
    access: AccessSpec = field(default_factory=AccessSpec)

    def tenant(self, name: str) -> TenantSpec | None:
        for t in self.tenants:
            if t.name == name:
                return t
        return None
