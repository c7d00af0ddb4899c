"""The SchedulingPolicy model: what a platform team declares (pool, timing, queue caps, tenants,
and which credentials act as operators or worker agents).

Plain frozen dataclasses with defaults; parsing and validation live in `validate.py` and `yaml_io.py`
(same package) so the core can depend on this model without depending on YAML.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Final, Literal

# A role is a credential that speaks for no tenant. Admin: the Admin service (and Workers, so an
# operator can drain by hand); worker: the Workers service only.
Role = Literal["admin", "worker"]
ADMIN: Final = "admin"
WORKER: Final = "worker"


@dataclass(frozen=True)
class ScheduleWindow:
    """spec.autoscaler.schedule.windows[i]: at least `min_workers` from `start` to `end` (minutes
    after local midnight; an `end` before `start` runs past midnight) on `days` (0 = Monday)."""

    start_min: int
    end_min: int
    min_workers: int
    days: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6)


@dataclass(frozen=True)
class ScheduleSpec:
    """spec.autoscaler.schedule: minimum workers by time of day, in `time_zone` (IANA name)."""

    time_zone: str = "UTC"
    windows: tuple[ScheduleWindow, ...] = ()


@dataclass(frozen=True)
class ForecastSpec:
    """spec.autoscaler.forecast: raise the minimum to the highest demand recorded at the same
    time of day over the last `lookback_days` days (0: off), `lead_s` ahead (None: the worker
    start-up time plus one decision period), in buckets of `bucket_s`."""

    lookback_days: int = 0
    lead_s: float | None = None
    bucket_s: float = 300.0


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
    scale_up_oldest_wait_s: float = 0.0  # scaleUp.oldestWaitSeconds; 0: off
    scale_down_pods: int = 0  # scaleDown.pods; 0: no pods policy
    scale_down_percent: float = 100.0  # scaleDown.percent; 100: no percent limit
    scale_down_period_s: float = 15.0  # scaleDown.periodSeconds
    recycle_memory_bytes: int = 0  # recycle.memoryBytes; 0: off
    recycle_max_age_s: float = 0.0  # recycle.maxAgeSeconds; 0: off
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    forecast: ForecastSpec = field(default_factory=ForecastSpec)


DEFAULT_POOL: Final = "default"


@dataclass(frozen=True)
class PoolSpec:
    """One pool of warm slots, a scheduling domain of its own (spec.pools[i], or spec.pool for a
    policy of one pool named `default`): its floor, quotas, order of service, fair share,
    preemption, queue caps and autoscaler are its own (docs/design.md, "Pools").

    `labels` are free-form (template, cpuModel, gpu, tier, region…), for a request's selector;
    `compatibility` names the label keys a snapshot taken here must find equal in the pool it
    resumes on (a microVM snapshot cannot resume on another CPU model). `autoscaler` overrides
    spec.autoscaler for this pool; `target` is what the actuator scales (a Deployment, a
    StatefulSet, a KEDA ScaledObject's metadata), empty for the actuator's own default."""

    name: str = DEFAULT_POOL
    labels: tuple[tuple[str, str], ...] = ()
    compatibility: tuple[str, ...] = ()
    slots_per_worker: int = 2
    workers: int = 4
    min_workers: int = 1
    max_workers: int = 8
    # Absolute slot count, or a percent of capacity when floor_percent is set.
    floor: int = 2
    floor_percent: float | None = None

    autoscaler: AutoscalerSpec | None = None
    target: str = ""
    # The token budgets its sessions draw on (spec.budgets names).
    budgets: tuple[str, ...] = ()

    def floor_slots(self, capacity: int) -> int:
        """The reserved floor in slots for a pool of `capacity` slots (never above capacity)."""
        if self.floor_percent is not None:
            return min(capacity, math.ceil(capacity * self.floor_percent / 100.0))
        return min(capacity, self.floor)

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None

    def matches(self, selector: tuple[tuple[str, str], ...]) -> bool:
        """Whether every key=value of `selector` is among this pool's labels (as a Kubernetes
        equality selector; an empty selector matches every pool)."""
        return all(self.label(k) == v for k, v in selector)

    def compat_labels(self) -> tuple[tuple[str, str], ...]:
        """The labels a snapshot taken on this pool records (its `compatibility` keys)."""
        return tuple((k, self.label(k) or "") for k in self.compatibility)


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
class FairnessSpec:
    """How the shared remainder is split over time (spec.fairness; docs/design.md, "Who gets the
    next free slot"). `usage_half_life_s`: a tenant's share counts the borrowed slot-seconds it
    has recently held, decaying with this half-life (0: only what it holds now), sampled every
    `usage_sampling_s` (as Kueue's admission fair sharing and Slurm's fair-share factor do).
    `best_effort_min_share`: while BestEffort waits and holds less than this fraction of the
    borrowed slots (those beyond Guaranteed and Burstable nominals), a BestEffort waiter's
    fairness preemption may take borrowing Burstable leases (otherwise only BestEffort ones).
    `share_window_s`: in the shared tier a lower share goes ahead of an older request only if it
    arrived less than this many seconds after it (an age factor, as Slurm's multifactor
    priority has: the heaviest tenant's tail, paid by light tenants' waits); 0 (the default):
    share order alone, each tenant served by its share."""

    usage_half_life_s: float = 600.0
    usage_sampling_s: float = 10.0
    best_effort_min_share: float = 0.1
    share_window_s: float = 0.0


@dataclass(frozen=True)
class LimitsSpec:
    """Bounds on the server's own work per flow (spec.limits), as Kubernetes API Priority and
    Fairness bounds the API server's: how much work the fair admission gate starts per turn of
    the event loop (`seats`: a Channel message takes as many as it has commands, a wider one is
    applied in chunks of `seats`, an rpc one), how many work items a flow may have waiting
    (`queued_per_flow`; past it that flow is refused, on its side), and how many Channel and
    per-session Acquire streams a tenant, and one connection, may hold open. While two
    tenants or more have work (within a second), a Channel chunk is also bounded by measured time
    (`turn_ms`: what fits that many milliseconds at its tenant's measured cost per command, at
    least one command, and charged that time in seats), so another tenant's next item waits
    about that long, whatever the commands cost; 0: seats only."""

    seats: int = 32
    queued_per_flow: int = 64
    channels_per_tenant: int = 64
    # As many as a tenant may hold: gRPC shares one connection among a process's channels to
    # one target, so a lower default would refuse a runtime process that runs several clients.
    channels_per_connection: int = 64
    streams_per_tenant: int = 4096
    streams_per_connection: int = 1024
    # Off by default: on an idle machine it cut a quiet tenant's median under a churn flood
    # (2.0 -> 1.4 ms) but not its p99, which rose (3.7-4.0 -> 4.8-5.0 ms; bench/README.md).
    turn_ms: float = 0.0


@dataclass(frozen=True)
class RateLimit:
    """A token bucket: `qps` tokens a second, at most `burst` saved up (one call costs one)."""

    qps: float
    burst: int


@dataclass(frozen=True)
class RateLimitsSpec:
    """Buckets per flow, as API Priority and Fairness limits per flow; None: that flow is unlimited.

    tenant: per tenant, Acquire and GetSession (a tenant's own `rateLimit` overrides it).
    renewals: per tenant, Renew, Release and Yield: a bucket of their own, so that a tenant's
      Acquire flood never makes its own renewals fail (and giving a slot back is never refused
      for the sake of an Acquire).
    admin: every admin credential together, on the Admin and Workers services.
    worker: per spec.access.workers entry, on the Workers service.
    """

    tenant: RateLimit | None = None
    renewals: RateLimit | None = None
    admin: RateLimit | None = None
    worker: RateLimit | None = None


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


@dataclass(frozen=True)
class TenantPoolQuota:
    """A tenant's quotas in one pool (spec.tenants[i].pools[j]); a field left None keeps the
    tenant-wide value, which applies to every pool no entry names."""

    pool: str
    guaranteed: int | None = None
    burstable_nominal: int | None = None
    burstable_limit: int | None = None
    best_effort_limit: int | None = None
    # best_effort_limit given as 0 differs from "not given": a separate flag, as the field's None
    # already means "no cap" at the tenant level.
    best_effort_limit_set: bool = False


# --- token budgets (spec.budgets; docs/design.md, "Token budgets") ------------------------------

# The dimensions a budget counts, in the one order every vector of the budget core uses: requests,
# input tokens, output tokens, total tokens (a provider limits some of them, apart or together).
BUDGET_DIMENSIONS: Final = ("requests", "input_tokens", "output_tokens", "tokens")


@dataclass(frozen=True)
class BudgetFeedback:
    """How a budget's effective limit follows the provider's throttling (spec.budgets[i].feedback):
    a reported throttle multiplies it by `decrease` (once per episode), never below `minimum` of
    the configured limit; each minute without one adds `recovery_per_minute` of the configured
    limit back, up to a plateau below the last throttled level (then slower: core/budget/book.py)."""

    decrease: float = 0.7
    recovery_per_minute: float = 0.05
    minimum: float = 0.05


@dataclass(frozen=True)
class BudgetSpec:
    """A named upstream limit the fleet shares (spec.budgets[i]), per minute in each dimension it
    limits (None: not limited in that one; at least one is set)."""

    name: str
    tokens_per_minute: int | None = None
    input_tokens_per_minute: int | None = None
    output_tokens_per_minute: int | None = None
    requests_per_minute: int | None = None
    # A permit not settled within this is charged its estimate and closed.
    permit_ttl_s: float = 600.0
    max_pending: int = 10000
    max_pending_per_tenant: int = 1000
    feedback: BudgetFeedback = field(default_factory=BudgetFeedback)

    def limits(self) -> tuple[int | None, int | None, int | None, int | None]:
        """Per minute, in BUDGET_DIMENSIONS' order."""
        return (
            self.requests_per_minute,
            self.input_tokens_per_minute,
            self.output_tokens_per_minute,
            self.tokens_per_minute,
        )


@dataclass(frozen=True)
class BudgetRate:
    """A rate within a budget (a tenant's reserved, nominal or limit rate): per minute in each
    dimension, and/or `percent` of the budget's limit in every dimension not given."""

    percent: float | None = None
    tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    requests: int | None = None

    def given(self) -> tuple[int | None, int | None, int | None, int | None]:
        return (self.requests, self.input_tokens, self.output_tokens, self.tokens)

    def resolve(self, budget: BudgetSpec) -> tuple[float | None, ...]:
        """Per minute in BUDGET_DIMENSIONS' order: the value given, else the percent of the
        budget's limit, else None (the caller's default: 0 for a reserved or nominal rate, the
        budget's limit for a class limit); None too where the budget has no limit."""
        out: list[float | None] = []
        for own, limit in zip(self.given(), budget.limits(), strict=True):
            if limit is None:
                out.append(None)
            elif own is not None:
                out.append(float(own))
            elif self.percent is not None:
                out.append(limit * self.percent / 100.0)
            else:
                out.append(None)
        return tuple(out)


@dataclass(frozen=True)
class TenantBudgetQuota:
    """A tenant's share of one budget (spec.tenants[i].budgets[j]), the shapes of its slot quotas:
    Guaranteed `reserved` (a rate of its own, also its ceiling), Burstable `nominal` and `limit`
    (absent: the nominal), BestEffort `limit` (None: up to the budget), and `weight` for fair share
    (None: the tenant's slot weight). A class with no rate given has no share: refused."""

    budget: str
    weight: float | None = None
    reserved: BudgetRate | None = None
    burstable_nominal: BudgetRate | None = None
    burstable_limit: BudgetRate | None = None
    best_effort_limit: BudgetRate | None = None


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
    # Names of verified mTLS client certificates (a SAN: "spiffe://…" or a DNS name) that do too.
    identities: tuple[str, ...] = ()
    # The tenant's own bucket for Acquire and GetSession; None: spec.rateLimits.tenant applies.
    rate_limit: RateLimit | None = None
    # Quotas per pool, overriding the fields above in that pool.
    pools: tuple[TenantPoolQuota, ...] = ()
    # Its shares of token budgets (spec.tenants[i].budgets); a budget not named: no share of it.
    budgets: tuple[TenantBudgetQuota, ...] = ()

    def budget(self, name: str) -> TenantBudgetQuota | None:
        for q in self.budgets:
            if q.budget == name:
                return q
        return None

    def in_pool(self, pool: str) -> TenantSpec:
        """This tenant as one pool sees it: its overrides for `pool` applied, no others."""
        for q in self.pools:
            if q.pool == pool:
                return replace(
                    self,
                    guaranteed=_or(q.guaranteed, self.guaranteed),
                    burstable_nominal=_or(q.burstable_nominal, self.burstable_nominal),
                    burstable_limit=_or(q.burstable_limit, self.burstable_limit),
                    best_effort_limit=(
                        q.best_effort_limit if q.best_effort_limit_set else self.best_effort_limit
                    ),
                    pools=(),
                )
        return replace(self, pools=()) if self.pools else self


@dataclass(frozen=True)
class WorkerAccess:
    """One worker credential (spec.access.workers[i]): who it is, which worker ids it may act as,
    and how many slots one of its workers may claim.

    The credentials are bearer-token hashes (`tokens`) and/or client-certificate names
    (`identities`); every credential of an entry is the same identity (several tokens let one
    rotate without downtime). The scope is `worker_ids` or, for a StatefulSet's or a
    Deployment's pods, `worker_id_prefix`; scopes of two entries never overlap (the loader
    enforces it), so a worker id belongs to one entry."""

    tokens: tuple[str, ...] = ()
    identities: tuple[str, ...] = ()
    worker_ids: tuple[str, ...] = ()
    worker_id_prefix: str | None = None
    max_slots: int = 1
    # The pools its workers may join; empty: the policy's only pool (a policy of several pools
    # requires every entry to name its pools).
    pools: tuple[str, ...] = ()

    def may_join(self, pool: str, policy_pools: tuple[str, ...]) -> bool:
        if self.pools:
            return pool in self.pools
        return len(policy_pools) == 1 and pool == policy_pools[0]

    def allows(self, worker_id: str) -> bool:
        """Whether `worker_id` is in this entry's scope (a prefix needs a non-empty rest)."""
        if self.worker_id_prefix is not None:
            return worker_id.startswith(self.worker_id_prefix) and len(worker_id) > len(self.worker_id_prefix)
        return worker_id in self.worker_ids

    def scope_text(self) -> str:
        if self.worker_id_prefix is not None:
            return f"worker ids starting with {self.worker_id_prefix!r} (and longer than it)"
        return "worker ids " + ", ".join(repr(w) for w in self.worker_ids)


@dataclass(frozen=True)
class AccessSpec:
    """Roles bound to credentials: "sha256:<hex>" of bearer tokens, like tenant tokens, or the
    names of verified client certificates.

    Separate from tenants so that no tenant can change the policy or the pool it is judged by:
    a credential is one identity, either a tenant or a role, never both (the loader enforces it).
    Admins have no scope; each worker entry is bound to its worker ids and a slot bound."""

    admins: tuple[str, ...] = ()
    admin_identities: tuple[str, ...] = ()
    workers: tuple[WorkerAccess, ...] = ()


@dataclass(frozen=True)
class Policy:
    name: str = "default"
    pool: PoolSpec = field(default_factory=PoolSpec)
    timing: TimingSpec = field(default_factory=TimingSpec)
    queue: QueueSpec = field(default_factory=QueueSpec)
    autoscaler: AutoscalerSpec = field(default_factory=AutoscalerSpec)
    tenants: tuple[TenantSpec, ...] = ()
    access: AccessSpec = field(default_factory=AccessSpec)
    rate_limits: RateLimitsSpec = field(default_factory=RateLimitsSpec)
    limits: LimitsSpec = field(default_factory=LimitsSpec)
    fairness: FairnessSpec = field(default_factory=FairnessSpec)
    # spec.pools; empty: the one pool `pool` (named `default`). When set, `pool` is pools[0].
    pools: tuple[PoolSpec, ...] = ()
    # spec.budgets: upstream limits (an LLM provider's) the fleet shares; see BudgetSpec.
    budgets: tuple[BudgetSpec, ...] = ()

    def budget(self, name: str) -> BudgetSpec | None:
        for b in self.budgets:
            if b.name == name:
                return b
        return None

    def pool_specs(self) -> tuple[PoolSpec, ...]:
        """Every pool, in the policy's order (the order a selector's matches are tried in)."""
        return self.pools or (self.pool,)

    def pool_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pool_specs())

    def pool_spec(self, name: str) -> PoolSpec | None:
        for p in self.pool_specs():
            if p.name == name:
                return p
        return None

    def for_pool(self, name: str) -> Policy:
        """The policy one pool's core runs under: `pool` is that pool, each tenant's quotas
        are its quotas there, the autoscaler is the pool's own if it has one. KeyError: no
        such pool."""
        spec = self.pool_spec(name)
        if spec is None:
            raise KeyError(name)
        if not self.pools and not any(t.pools for t in self.tenants):
            return self
        return replace(
            self,
            pool=spec,
            pools=(),
            tenants=tuple(t.in_pool(name) for t in self.tenants),
            autoscaler=spec.autoscaler or self.autoscaler,
        )

    def only_pool(self, name: str) -> Policy:
        """This policy with one pool only, for a replica's unit of that pool under per-pool
        leadership: still a whole policy (it is journaled and snapshotted as YAML and must load
        back as the same pool), unlike `for_pool`'s projection. Each tenant keeps its overrides
        for that pool only; worker entries that may not join it are dropped (authorization
        reads the whole policy, not this). KeyError: no such pool."""
        spec = self.pool_spec(name)
        if spec is None:
            raise KeyError(name)
        if not self.pools:
            return self
        tenants = tuple(replace(t, pools=tuple(q for q in t.pools if q.pool == name)) for t in self.tenants)
        workers = tuple(replace(w, pools=(name,)) for w in self.access.workers if name in w.pools)
        return replace(
            self, pool=spec, pools=(spec,), tenants=tenants, access=replace(self.access, workers=workers)
        )

    def tenant(self, name: str) -> TenantSpec | None:
        for t in self.tenants:
            if t.name == name:
                return t
        return None
