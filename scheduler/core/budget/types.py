"""Vocabulary of the budget core: permits, events in and decisions out (docs/design.md, "Token
budgets"). As the slot core's (`scheduler/core/types.py`): time is passed in with each event,
decisions are frozen, so a replay compares them with `==`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType

from scheduler.core.types import QoS, TenantName, quick

PermitId = NewType("PermitId", str)
BudgetName = NewType("BudgetName", str)

# A vector of the dimensions a budget counts, in scheduler.policy.model.BUDGET_DIMENSIONS' order.
Vec = tuple[float, float, float, float]
REQUESTS, INPUT, OUTPUT, TOKENS = 0, 1, 2, 3
DIMENSION_NAMES: tuple[str, str, str, str] = ("requests", "input tokens", "output tokens", "tokens")

# An estimate or a usage above this is not a call anyone makes (the largest context windows are
# around 10^6 tokens): refused naming the field, before any arithmetic meets it.
MAX_TOKENS_PER_CALL = 10**9


@quick
@dataclass(frozen=True)
class Usage:
    """What a call costs: its input tokens, its output tokens (an estimate: the call's max
    tokens) and its requests (1 per call)."""

    input_tokens: float = 0.0
    output_tokens: float = 0.0
    requests: float = 1.0

    def vector(self) -> Vec:
        return (self.requests, self.input_tokens, self.output_tokens, self.input_tokens + self.output_tokens)


class PermitRefuseReason(enum.StrEnum):
    UNKNOWN_BUDGET = "unknown_budget"
    UNKNOWN_TENANT = "unknown_tenant"
    NO_SHARE = "no_share"  # the tenant has no share of the budget in this class: never served
    INVALID_ESTIMATE = "invalid_estimate"  # negative, NaN, infinite or absurd (the field is named)
    ESTIMATE_TOO_LARGE = "estimate_too_large"  # above a bucket's capacity: it could never fit
    DUPLICATE_PERMIT = "duplicate_permit"  # the permit id is open or waiting already
    QUEUE_FULL = "queue_full"  # the budget's waiting cap (RESOURCE_EXHAUSTED, retry-after)
    TENANT_QUEUE_FULL = "tenant_queue_full"  # the tenant's waiting cap on this budget
    POLICY_CHANGED = "policy_changed"  # a waiting permit the new policy could never serve


class PermitWaitReason(enum.StrEnum):
    """Why a permit waits (`PermitQueued.reason`)."""

    BUDGET_EXHAUSTED = "budget_exhausted"  # the budget's shared bucket (others ahead, or refilling)
    TENANT_BUDGET = "tenant_budget"  # the tenant's own rate in its class (reserved, or its limit)
    PROVIDER_THROTTLED = "provider_throttled"  # no grant until the provider's retry-after passes


class SettleRefuseReason(enum.StrEnum):
    NOT_OPEN = "not_open"  # unknown, still waiting, already settled or expired
    NOT_OWNER = "not_owner"  # another session's permit
    INVALID_USAGE = "invalid_usage"  # negative, NaN, infinite or absurd (the field is named)


class LimitChangeReason(enum.StrEnum):
    THROTTLED = "throttled"  # the provider throttled a call: multiplicative decrease
    RECOVERED = "recovered"  # a minute without a throttle: additive increase
    REPORTED = "reported"  # the provider reported its limit (response headers): adopted at once


class PermitEndReason(enum.StrEnum):
    SETTLED = "settled"
    EXPIRED = "expired"  # not settled within the budget's permitTTLSeconds: charged its estimate
    # Its session ended (released, expired, withdrawn) before settling it: charged its estimate
    # (the call may still be in flight at the provider; refunding it could overrun the window).
    SESSION_ENDED = "session_ended"
    WITHDRAWN = "withdrawn"  # a waiting permit its caller (or its deadline) gave up


# ---------------------------------------------------------------- events


@quick
@dataclass(frozen=True)
class PermitRequest:
    """A session asks for a permit on `budget` for one call. `owner` is the key the settle must
    show (the shell passes the session id); `qos` the class it is served in (its session's)."""

    permit: PermitId
    owner: str
    tenant: TenantName
    budget: BudgetName
    qos: QoS
    estimate: Usage


@quick
@dataclass(frozen=True)
class ReportedLimits:
    """The provider's own limit per minute, as its response headers state it (Anthropic's
    `anthropic-ratelimit-{requests,input-tokens,output-tokens}-limit`, OpenAI's
    `x-ratelimit-limit-{requests,tokens}`); None where it stated none. Only the limit is read,
    not `-remaining`: see docs/decisions/0016-provider-reported-limits.md."""

    requests: float | None = None
    input_tokens: float | None = None
    output_tokens: float | None = None
    tokens: float | None = None

    def vector(self) -> tuple[float | None, float | None, float | None, float | None]:
        return (self.requests, self.input_tokens, self.output_tokens, self.tokens)


@quick
@dataclass(frozen=True)
class Settle:
    """The call is over: `usage` as the provider reported it. `throttled_retry_after_s` (not
    None): the provider answered 429 with that retry-after (0 when it gave none). `reported`: the
    limits the provider's response stated, if any (the budget adopts them at once)."""

    permit: PermitId
    owner: str
    usage: Usage
    throttled_retry_after_s: float | None = None
    reported: ReportedLimits | None = None


@quick
@dataclass(frozen=True)
class Withdraw:
    """A waiting permit is given up (its caller, its deadline, its session ending)."""

    permit: PermitId
    owner: str


@quick
@dataclass(frozen=True)
class Charge:
    """A settle of a permit this core never granted (one a leader granted before a failover):
    its usage is charged to the tenant's share in `qos` as a debt (a permit granted now with a
    zero estimate, settled at once), so usage is never lost from the count. It says nothing of
    the provider's limit now, so it carries no throttle."""

    permit: PermitId
    owner: str
    tenant: TenantName
    budget: BudgetName
    qos: QoS
    usage: Usage


@quick
@dataclass(frozen=True)
class OwnerGone:
    """The owner's session ended: its waiting permits are withdrawn, its open ones closed at
    their estimate (PermitEndReason.SESSION_ENDED)."""

    owner: str


@quick
@dataclass(frozen=True)
class BudgetTick:
    """Time passes: refills, TTLs, recovery, and the grants they allow."""


BudgetEvent = PermitRequest | Settle | Withdraw | Charge | OwnerGone | BudgetTick


# ---------------------------------------------------------------- decisions


@quick
@dataclass(frozen=True)
class PermitGranted:
    permit: PermitId
    owner: str
    tenant: TenantName
    budget: BudgetName
    qos: QoS
    estimate: Usage
    expires_at: float  # settle before this, or it is charged its estimate
    waited_s: float
    borrowed: bool  # drawn from the budget's shared bucket (not the tenant's reserved rate)


@quick
@dataclass(frozen=True)
class PermitQueued:
    permit: PermitId
    budget: BudgetName
    position: int  # permits ahead of it in the order of service of what it waits on
    estimated_wait_s: float | None  # None: no refill in sight (e.g. the shared rate is all reserved)
    reason: PermitWaitReason


@quick
@dataclass(frozen=True)
class PermitRefused:
    permit: PermitId
    budget: BudgetName
    reason: PermitRefuseReason
    message: str  # names the field or key, and the numbers
    field: str = ""  # the request field at fault (INVALID_ESTIMATE, ESTIMATE_TOO_LARGE)
    retry_after_s: float | None = None  # the queue caps: when to try again


@quick
@dataclass(frozen=True)
class PermitEnded:
    """A granted permit closed: `charged` is what its budget counts for it (the usage settled,
    or its estimate when it expired), `refunded` the estimate minus that, per dimension."""

    permit: PermitId
    owner: str
    tenant: TenantName
    budget: BudgetName
    qos: QoS
    reason: PermitEndReason
    charged: Vec
    refunded: Vec
    throttled: bool = False


@quick
@dataclass(frozen=True)
class PermitWithdrawn:
    permit: PermitId
    budget: BudgetName
    waited_s: float


@quick
@dataclass(frozen=True)
class SettleRefused:
    permit: PermitId
    reason: SettleRefuseReason
    message: str
    field: str = ""


@quick
@dataclass(frozen=True)
class LimitChanged:
    """A budget's effective limit moved (the shell logs it and exports the gauge)."""

    budget: BudgetName
    reason: LimitChangeReason
    factor: float  # effective / configured, the same in every dimension
    limits_per_minute: Vec  # effective, per dimension (0 where the budget has no limit)
    blocked_until: float | None  # no grant before this (the provider's retry-after)


BudgetDecision = (
    PermitGranted
    | PermitQueued
    | PermitRefused
    | PermitEnded
    | PermitWithdrawn
    | SettleRefused
    | LimitChanged
)


@quick
@dataclass(frozen=True)
class Outcome:
    """What one event decided, and when the core next needs a BudgetTick (None: nothing is
    waiting on time): the shell arms one timer for it."""

    decisions: tuple[BudgetDecision, ...]
    wake_at: float | None


@quick
@dataclass(frozen=True)
class BudgetView:
    """One budget as `slotsched status` and the metrics read it."""

    name: BudgetName
    factor: float
    limits_per_minute: Vec  # effective
    configured_per_minute: Vec
    shared_available: Vec  # tokens in the shared bucket now (negative: a debt being waited out)
    waiting: int
    open: int
    blocked_until: float | None
