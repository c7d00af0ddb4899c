"""Every reason a call is refused, in one table: per reason its status, whether and when to try
again, the SDK's error class, the metric label and what an operator does about it.

Why one table: a refusal reason used to be listed in five places (the core's `RefuseReason`, the
wire's `Reason` with its status, the server's `from_refused` chain and cap names, the SDK's error
classes and reactions, the simulator's `RETRYABLE`), and a reason forgotten in one was found by a
user. Each reader now takes its column from here: the server (`scheduler/server/errors.py`
builds a core refusal's status from its row), the wire (`wire.Reason.code`), the SDK
(`client/reactions.py` picks the error class by the row's `error`), the metrics (the label) and
the simulator (`RETRYABLE`: the core's reasons whose row says retry after a pause).

Why here, and with no import at all: every reader may import `scheduler.api` except the core
and the simulator, which must not reach the wire (grpc, the stubs); this module is plain data
(a status is its name, a class its name), so the simulator's room contract allows this one
module. The core keeps its own `RefuseReason` enum (it may import nothing of ours): a row whose
`core` is set is keyed by that enum's value, and `tests/test_reasons.py` fails when the enum,
this table, the ErrorInfo reasons documented in `proto/slotsched/v1/common.proto` and the SDK's
classes disagree. A new reason is its row here (and its `Reason` member when it goes on the
wire as an ErrorInfo reason), plus the core rule that raises it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final


class Retry(StrEnum):
    """Whether sending the same call again can succeed, and how."""

    NEVER = "never"  # a verdict on the request, the credential or the policy: it would fail again
    AFTER = "after retry-after-ms"  # room may appear: wait as long as the server says, then again
    ELSEWHERE = "elsewhere"  # at the leader, another replica, or on another Channel
    RECHECK = "recheck"  # the lease moved on: read what the server holds, then decide


class RetryAfter(StrEnum):
    """Where a refusal's `retry-after-ms` comes from."""

    NONE = "none"  # not sent
    CORE = "the core's Refused.retry_after_s"  # and estimated-wait-ms once a hold was observed
    BUILDER = "the refusal's builder"  # a bucket's refill, a fixed pause (server/errors.py)


@dataclass(frozen=True, slots=True)
class Row:
    """One reason."""

    name: str  # snake case: the metric label; the core's `RefuseReason` value when `core`
    info: str | None  # the ErrorInfo reason on the wire (a `wire.Reason`); None: the status carries none
    status: str  # the grpc.StatusCode's name
    retry: Retry
    retry_after: RetryAfter
    error: str  # the SDK's error class (scheduler/client/errors.py)
    hint: str  # what an operator (or the caller's owner) does about it
    core: bool = False  # the policy core refuses an Acquire so (`Refused.reason`)
    info_keys: tuple[str, ...] = ()  # the ErrorInfo metadata it carries (when known)
    policy_key: str = ""  # the policy key that bounds it (a queue cap's QuotaFailure names it)
    #: The budget core refuses a permit, or a settle, so: its `PermitRefuseReason` or
    #: `SettleRefuseReason` value (scheduler/core/budget/types.py), which may differ from `name`
    #: where a slot reason has that name already.
    budget: str = ""

    @property
    def metric(self) -> str:
        """The `reason` label of its refusals in `slotsched_refusals_total` (the core's reasons)."""
        return self.name


_PD, _RE, _FP = "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION"
_N, _AFTER, _ELSE, _RECHECK = Retry.NEVER, Retry.AFTER, Retry.ELSEWHERE, Retry.RECHECK
_NO, _CORE, _BUILDER = RetryAfter.NONE, RetryAfter.CORE, RetryAfter.BUILDER

# fmt: off
REASONS: Final[tuple[Row, ...]] = (
    # Refused by the policy core (an Acquire):
    Row("no_quota", "NO_QUOTA", _PD, _N, _NO, "NoQuota",
        "the tenant's quota for the class is zero: give it a quota (spec.tenants[i]), or ask for "
        "another class", core=True, info_keys=("tenant", "pool")),
    Row("unknown_tenant", "UNKNOWN_TENANT", _PD, _N, _NO, "PermissionDenied",
        "the policy in force no longer lists the tenant: add it back, or retire its credential",
        core=True, info_keys=("tenant",), budget="unknown_tenant"),
    Row("queue_full", "QUEUE_FULL", _RE, _AFTER, _CORE, "QueueFull",
        "the pool's queue is at its cap: add slots, or raise the cap if waits are acceptable",
        core=True, policy_key="queue.maxPending"),
    Row("tenant_queue_full", "TENANT_QUEUE_FULL", _RE, _AFTER, _CORE, "QueueFull",
        "the tenant's queue is at its cap: the tenant asks for more than its share serves",
        core=True, info_keys=("tenant",), policy_key="queue.maxPendingPerTenant"),
    Row("duplicate_session", None, "INTERNAL", _N, _NO, "SlotschedError",
        "answered by re-attaching the live session: seen on the wire, it is a server bug",
        core=True),
    Row("shutting_down", None, "UNAVAILABLE", _ELSE, _NO, "Unavailable",
        "the replica is stopping: clients go to another (a rollout, or a crash loop to look at)",
        core=True),
    Row("unknown_pool", None, "INVALID_ARGUMENT", _N, _NO, "InvalidArgument",
        "the request names a pool the policy lacks: fix the caller, or add the pool", core=True),
    Row("no_eligible_pool", "NO_ELIGIBLE_POOL", _FP, _N, _NO, "NoEligiblePool",
        "no pool matches the selector, or can resume the snapshot: fix the labels on either side",
        core=True),
    Row("no_pool_named", None, "INVALID_ARGUMENT", _N, _NO, "InvalidArgument",
        "several pools and none named 'default': the caller must name one", core=True),
    # Refused by the budget core (a permit, or its settle):
    Row("unknown_budget", "UNKNOWN_BUDGET", _FP, _N, _NO, "UnknownBudget",
        "a permit names a budget the policy lacks: fix the caller, or add spec.budgets[]",
        budget="unknown_budget"),
    Row("no_budget_share", "NO_BUDGET_SHARE", _PD, _N, _NO, "NoQuota",
        "the tenant has no share of the budget in the session's class: give it one "
        "(spec.tenants[i].budgets), or run the session in another class",
        info_keys=("tenant",), budget="no_share"),
    Row("invalid_estimate", None, "INVALID_ARGUMENT", _N, _NO, "InvalidArgument",
        "an estimate no call could have (negative, NaN, infinite, above 10^9): fix the caller",
        budget="invalid_estimate"),
    Row("estimate_too_large", None, "INVALID_ARGUMENT", _N, _NO, "InvalidArgument",
        "an estimate above what the budget (or the tenant's class rate) holds in a minute: lower "
        "the call's max tokens, or raise the budget or the share", budget="estimate_too_large"),
    Row("duplicate_permit", None, "INTERNAL", _N, _NO, "SlotschedError",
        "the scheduler names permits, so two never share an id: seen on the wire, it is a bug",
        budget="duplicate_permit"),
    Row("budget_queue_full", "BUDGET_QUEUE_FULL", _RE, _AFTER, _CORE, "QueueFull",
        "the budget's waiting permits are at their cap: the fleet asks for more than the provider "
        "gives; raise the limit if the provider allows, or the cap if waits are acceptable",
        policy_key="budgets[].maxPending", budget="queue_full"),
    Row("budget_tenant_queue_full", "BUDGET_TENANT_QUEUE_FULL", _RE, _AFTER, _CORE, "QueueFull",
        "the tenant's waiting permits on the budget are at their cap: it asks for more than its "
        "share serves", info_keys=("tenant",), policy_key="budgets[].maxPendingPerTenant",
        budget="tenant_queue_full"),
    Row("permit_policy_changed", "PERMIT_POLICY_CHANGED", _FP, _N, _NO, "PermitRefused",
        "a waiting permit the new policy could never serve (its share or budget removed)",
        budget="policy_changed"),
    Row("permit_not_owner", "PERMIT_NOT_OWNER", _FP, _N, _NO, "PermitRefused",
        "a settle of another session's permit: a caller mixing up its permits",
        budget="not_owner"),
    Row("permit_closed", "PERMIT_CLOSED", _FP, _N, _NO, "PermitRefused",
        "a settle of a permit already settled, expired (past permitTTLSeconds: charged its "
        "estimate) or withdrawn; settle sooner if it expired", budget="not_open"),
    Row("invalid_usage", None, "INVALID_ARGUMENT", _N, _NO, "InvalidArgument",
        "a usage no call could have (negative, NaN, infinite, above 10^9): fix the caller",
        budget="invalid_usage"),
    # Refused by the shell (auth, limits, leadership, the lease's fence):
    Row("credential_denied", "CREDENTIAL_DENIED", _PD, _N, _NO, "PermissionDenied",
        "the credential's identity may not make this call: check spec.access and spec.admins"),
    Row("worker_out_of_scope", "WORKER_OUT_OF_SCOPE", _PD, _N, _NO, "PermissionDenied",
        "a worker credential names a worker id outside its entry: fix workerIds / workerIdPrefix"),
    Row("worker_slots_over_bound", "WORKER_SLOTS_OVER_BOUND", _PD, _N, _NO, "PermissionDenied",
        "a worker registers more slots than its entry's maxSlots"),
    Row("worker_pool_denied", "WORKER_POOL_DENIED", _PD, _N, _NO, "PermissionDenied",
        "a worker joins a pool its entry does not list (spec.access.workers[i].pools)",
        info_keys=("pool",)),
    Row("rate_limited", "RATE_LIMITED", _RE, _AFTER, _BUILDER, "RateLimited",
        "a flow is past its rate limit or fair share: raise spec.rateLimits, or find the flood"),
    Row("channel_full", "CHANNEL_FULL", _RE, _ELSE, _BUILDER, "QueueFull",
        "a Channel carries all the sessions it may: the SDK opens another (nothing to do)"),
    Row("stale_epoch", "STALE_EPOCH", _FP, _RECHECK, _NO, "StaleLease",
        "the lease moved on (revoked, expired, re-granted): the holder was fenced off"),
    Row("not_holder", "NOT_HOLDER", _FP, _RECHECK, _NO, "StaleLease",
        "the lease id is not this session's: a caller mixing up its leases"),
    Row("invalid_event", "INVALID_EVENT", _FP, _N, _NO, "StaleLease",
        "the state refuses the call (e.g. a worker id taken)"),
    Row("precondition", "PRECONDITION", _FP, _N, _NO, "StaleLease",
        "any other precondition: the message says which"),
    Row("not_leader", "NOT_LEADER", "UNAVAILABLE", _ELSE, _BUILDER, "Unavailable",
        "a standby, or a replica not leading the pool: clients follow the leader it names; "
        "persistent, check the state store and the leader's health",
        info_keys=("leader", "pool", "state_store")),
)
# fmt: on

#: By name (the core's `RefuseReason` value for its rows; the metric label).
BY_NAME: Final = MappingProxyType({r.name: r for r in REASONS})
#: By ErrorInfo reason.
BY_INFO: Final = MappingProxyType({r.info: r for r in REASONS if r.info is not None})
#: The core's refusals (their names are `RefuseReason`'s values).
CORE: Final = MappingProxyType({r.name: r for r in REASONS if r.core})
#: The budget core's refusals, by its `PermitRefuseReason` / `SettleRefuseReason` value.
BUDGET: Final = MappingProxyType({r.budget: r for r in REASONS if r.budget})
#: The core's refusals a client sends again after the server's pause (the simulator's `RETRYABLE`).
RETRYABLE: Final = frozenset(r.name for r in CORE.values() if r.retry is Retry.AFTER)


def of(name: str) -> Row:
    """The row of a reason by name (a core `RefuseReason` is a str of its value)."""
    row = BY_NAME.get(name)
    if row is None:
        raise KeyError(f"no row for the refusal reason {name!r} in scheduler/api/reasons.py")
    return row


__all__ = ["BUDGET", "BY_INFO", "BY_NAME", "CORE", "REASONS", "RETRYABLE", "Retry", "RetryAfter", "Row", "of"]
