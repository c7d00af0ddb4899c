"""Vocabulary of the policy core: ids, classes, events in and decisions out.

Every event carries the time it happens at (`now`, seconds on any monotonic scale); the core
never reads a clock. Decisions are frozen dataclasses, so a replay can compare them with `==`.
"""

from __future__ import annotations

import enum
from dataclasses import MISSING, dataclass, field, fields
from typing import NamedTuple, NewType, TypeVar

# Defined with the stores (which import nothing of scheduler/); re-exported here.
from snapshots.ref import SnapshotRef as SnapshotRef

SessionId = NewType("SessionId", str)
TenantName = NewType("TenantName", str)
WorkerId = NewType("WorkerId", str)
LeaseId = NewType("LeaseId", str)

_T = TypeVar("_T")


def quick(cls: type[_T]) -> type[_T]:
    """A frozen dataclass built in one step: its generated `__init__` sets each field with its
    own `object.__setattr__` (about 110 ns a field), this one sets the instance's `__dict__` at
    once. Same fields, defaults, equality and immutability. Used where objects are built per
    request: a permit builds eight (core/budget/types.py); every Acquire, Release, Renew and
    Yield is built twice, by the leader from its call and by its follower from the journal, and
    a Renewed answers every renewal."""
    assert not hasattr(cls, "__post_init__"), "quick: no __post_init__ (this __init__ calls none)"
    params, items, env = [], [], {"_set": object.__setattr__}
    for f in fields(cls):  # type: ignore[arg-type]
        assert f.default_factory is MISSING, "quick: no default factories"
        if f.default is MISSING:
            params.append(f.name)
        else:
            env[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        items.append(f"{f.name!r}: {f.name}")
    src = f"def __init__(self, {', '.join(params)}):\n    _set(self, '__dict__', {{{', '.join(items)}}})\n"
    ns: dict[str, object] = {}
    exec(src, env, ns)  # as dataclasses builds its own __init__
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    cls.__init__ = init  # type: ignore[method-assign, assignment]
    return cls


class QoS(enum.StrEnum):
    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BEST_EFFORT = "besteffort"

    @classmethod
    def parse(cls, text: str) -> QoS:
        key = text.strip().lower().replace("_", "").replace("-", "")
        for q in cls:
            if q.value == key:
                return q
        raise ValueError(f"qos_class must be guaranteed, burstable or besteffort, not {text!r}")


@dataclass(frozen=True, order=True)
class SlotId:
    worker: WorkerId
    index: int

    def __str__(self) -> str:
        return f"{self.worker}/{self.index}"


class RefuseReason(enum.StrEnum):
    NO_QUOTA = "no_quota"  # the tenant's quota for this class is zero: it could never be served
    UNKNOWN_TENANT = "unknown_tenant"
    QUEUE_FULL = "queue_full"  # pool-wide pending cap
    TENANT_QUEUE_FULL = "tenant_queue_full"  # per-tenant pending cap
    DUPLICATE_SESSION = "duplicate_session"  # the session already holds a lease or waits
    SHUTTING_DOWN = "shutting_down"
    UNKNOWN_POOL = "unknown_pool"  # the request names a pool the policy does not have
    NO_ELIGIBLE_POOL = "no_eligible_pool"  # no pool matches its selector (or its snapshot)
    NO_POOL_NAMED = "no_pool_named"  # several pools, none named `default`, and none asked for


class BlockedReason(enum.StrEnum):
    """Why a queued request waits (`Queued.reason`, `SessionView.reason`)."""

    TENANT_LIMIT = "tenant_limit"  # the tenant holds its limit for the class (its own must end)
    YIELD_PENDING = "yield_pending"  # a lease is yielding for it
    TENANT_QUOTA = "tenant_quota"  # beyond the tenant's quota: waits for a free slot or its share
    POOL_EXHAUSTED = "pool_exhausted"  # within quota, but no slot is free in its pool yet


class RevokeReason(enum.StrEnum):
    YIELD_DEADLINE = "yield_deadline"  # asked to yield, did not within grace
    WORKER_REMOVED = "worker_removed"


class YieldCause(enum.StrEnum):
    GUARANTEED = "guaranteed"  # reclaiming the floor / a Guaranteed request within quota
    NOMINAL = "nominal"  # a Burstable request below its nominal
    FAIR_SHARE = "fair_share"  # a tenant below its weighted share
    DRAIN = "drain"  # the worker is being drained


class EndReason(enum.StrEnum):
    RELEASED = "released"
    YIELDED = "yielded"
    EXPIRED = "expired"
    REVOKED = "revoked"
    WITHDRAWN = "withdrawn"  # a queued request cancelled by its caller or its deadline


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class WorkerAdded:
    worker: WorkerId
    slots: int
    address: str = ""
    # (slot index, the highest epoch the worker has seen on it): each slot's next grant is above
    # it, so a core that lost its state (a restart in memory) never fences backwards.
    epochs: tuple[tuple[int, int], ...] = ()
    pool: str = ""  # the pool it joins; "": the policy's only pool (or the one named default)


@dataclass(frozen=True)
class WorkerDraining:
    worker: WorkerId
    # Leases on it are asked to yield with this deadline from now (None: let them finish).
    yield_within_s: float | None = None


@dataclass(frozen=True)
class WorkerRemoved:
    worker: WorkerId


@quick
@dataclass(frozen=True)
class Acquire:
    """A session asks for a slot. Where: `pool` by name, or every pool `selector` matches (in the
    policy's order), then the `fallback` pools in their order; none of them: the only pool, or
    the one named `default` (docs/design.md, "Pools": granted in the first of them with a slot
    free for it, otherwise queued in the first)."""

    session: SessionId
    tenant: TenantName
    qos: QoS
    resume_from: SnapshotRef | None = None
    pool: str = ""
    selector: tuple[tuple[str, str], ...] = ()
    fallback: tuple[str, ...] = ()


@quick
@dataclass(frozen=True)
class Release:
    """Ends a lease (lease_id + epoch) or, with lease_id None, withdraws the queued request."""

    session: SessionId
    lease_id: LeaseId | None = None
    epoch: int = 0


@quick
@dataclass(frozen=True)
class Renew:
    """Keeps a lease alive. `until` is None from a caller (the core's rule: a renewal that would
    move the expiry moves it a step past a TTL, `Core._renew`); a journaled renewal carries the
    expiry its leader set, which its replay sets again (0.0: a record of before steps, now + TTL)."""

    session: SessionId
    lease_id: LeaseId
    epoch: int
    until: float | None = None


@quick
@dataclass(frozen=True)
class Yield:
    session: SessionId
    lease_id: LeaseId
    epoch: int
    snapshot: SnapshotRef | None = None


@dataclass(frozen=True)
class Tick:
    pass


@dataclass(frozen=True)
class Resumed:
    """A scheduler took over after an outage that began at `since` (the last event it applied).

    Holders could neither renew nor yield while no scheduler was up, so the outage does not count
    against them: every live lease expires no sooner than its old expiry plus the outage, nor
    sooner than now + TTL; a pending yield deadline moves out by the outage. Applied before the
    timers due at `now` fire."""

    since: float


#: A session's commands on its lease (or queued request): routed to the pool that holds the
#: session (core/pools.py). A new such command is its event here and its step in the engine.
LeaseCommand = Release | Renew | Yield

Event = WorkerAdded | WorkerDraining | WorkerRemoved | Acquire | LeaseCommand | Tick | Resumed


# ---------------------------------------------------------------- decisions
# The four decisions of every grant/release churn are NamedTuples: as immutable as frozen
# dataclasses and about five times cheaper to build, which the core's hot path feels.


class Lease(NamedTuple):
    lease_id: LeaseId
    session: SessionId
    tenant: TenantName
    qos: QoS
    slot: SlotId
    epoch: int
    granted_at: float
    expires_at: float
    resume_from: SnapshotRef | None = None
    pool: str = "default"


class Granted(NamedTuple):
    lease: Lease
    waited_s: float  # since this request (or re-queue after a yield) entered the queue


class Queued(NamedTuple):
    session: SessionId
    position: int  # 0 = next to be served in its class
    estimated_wait_s: float | None  # None until a hold has been observed: no basis for a guess
    pool: str = "default"
    reason: BlockedReason = BlockedReason.POOL_EXHAUSTED


@dataclass(frozen=True)
class YieldRequested:
    lease: Lease
    deadline: float
    cause: YieldCause
    for_session: SessionId | None = None


@dataclass(frozen=True)
class YieldCancelled:
    """A yield no waiter needs any more: the waiter it was for left (withdrawn, granted another
    slot, its right gone with a policy change) and no other waiter has the same right to this
    lease. The lease is ACTIVE again (same epoch, expiry and slot); its holder keeps running."""

    lease: Lease


@dataclass(frozen=True)
class Revoked:
    lease: Lease
    reason: RevokeReason
    lost_slot_seconds: float  # work since the lease's grant, which no snapshot saved


@dataclass(frozen=True)
class LateSnapshot:
    """A Yield that came after its lease was revoked at the yield deadline, quoting that lease
    (same id and epoch) with a snapshot, while the session is still queued: the snapshot is the
    one the session resumes from. The deadline protects the waiter's latency, not the snapshot's
    validity: lateness cost the holder its slot, not its work."""

    session: SessionId
    lease_id: LeaseId
    epoch: int
    snapshot: SnapshotRef


@dataclass(frozen=True)
class Expired:
    lease: Lease
    lost_slot_seconds: float


class Ended(NamedTuple):
    """A lease or queued request ended normally (release, yield, withdrawal)."""

    session: SessionId
    reason: EndReason
    lease: Lease | None = None


@quick  # one per renewal, most of the calls at scale
@dataclass(frozen=True)
class Renewed:
    """`quiet`: the renewal changed nothing of the state (the lease's expiry was already past
    now + TTL and no timer was due), so replaying it would change nothing: the journal skips it."""

    lease: Lease
    quiet: bool = field(default=False, compare=False)  # a hint to the journal, not a decision


@dataclass(frozen=True)
class Refused:
    session: SessionId
    reason: RefuseReason
    message: str
    retry_after_s: float = 0.0
    estimated_wait_s: float | None = None
    pool: str = ""  # the pool it names, when the refusal is one pool's
    field: str = ""  # the request field it is about, when it is one (INVALID_ARGUMENT's BadRequest)


class ErrorCode(enum.StrEnum):
    NOT_FOUND = "not_found"  # no such session / lease
    STALE_EPOCH = "stale_epoch"  # the lease moved on (revoked, expired, re-granted)
    NOT_HOLDER = "not_holder"  # lease id does not belong to that session
    INVALID = "invalid"  # the event itself is malformed (unknown worker, bad slots)


@dataclass(frozen=True)
class Rejected:
    """A call that changed nothing because it was wrong; adapters map `code` to a status."""

    session: SessionId | None
    code: ErrorCode
    message: str


Decision = (
    Granted
    | Queued
    | YieldRequested
    | YieldCancelled
    | Revoked
    | LateSnapshot
    | Expired
    | Ended
    | Renewed
    | Refused
    | Rejected
)
