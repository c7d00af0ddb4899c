"""The wire's vocabulary outside the messages: metadata keys, ErrorInfo reasons, limits.

Why here: the server (scheduler/server/errors.py, auth.py, policy_log.py), the SDK
(scheduler/client/*) and the reference worker (slots/worker/*) each kept their own copy of
these strings; a rename on one side broke the other silently. Defined once here, imported by
all (the SDK may import scheduler/api only). Documented in the proto files: the reasons in
proto/slotsched/v1/common.proto (tests/test_wire_polish.py keeps the two lists equal), the
metadata in scheduler.proto's service comment.

Which status a failure gets is still chosen by the server, in scheduler/server/errors.py only,
by the reason's row in `reasons.py`; `Reason.code` says which status each reason goes with (what
a client may rely on).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final

import grpc

from scheduler.api import reasons

# ---------------------------------------------------------------- metadata keys

#: Request: the credential, `authorization: Bearer <token>`.
AUTHORIZATION: Final = "authorization"
BEARER: Final = "Bearer "
#: Request, the server's insecure dev mode only: the tenant the caller says it is.
TENANT: Final = "x-slotsched-tenant"
#: Trailing: how long to wait before retrying (milliseconds, decimal).
RETRY_AFTER_MS: Final = "retry-after-ms"
#: Trailing, on a full queue: how long a queued wait would have been (milliseconds, decimal).
ESTIMATED_WAIT_MS: Final = "estimated-wait-ms"
#: Trailing, on NOT_LEADER: the leader's HOST:PORT, when the replica knows it (the SDK follows it).
LEADER: Final = "x-slotsched-leader"
#: Trailing, on NOT_LEADER with per-pool leadership (`serve --leadership pool`): the pool whose
#: leader `LEADER` names; the SDK follows that leader for that pool's sessions only.
POOL: Final = "x-slotsched-pool"
#: Trailing, on a per-pool NOT_LEADER refusing a permit (RequestPermit, SettlePermit): the budget
#: whose home pool `POOL` names; the SDK sends that budget's permits to that pool's leader, and
#: moves nothing else (its session's own pool may be led right here).
BUDGET: Final = "x-slotsched-budget"
#: Trailing: the call's google.rpc.Status with its rich details (grpc_status's key).
DETAILS: Final = "grpc-status-details-bin"
#: Trailing on Admin.GetPolicy / ApplyPolicy: the policy generation, the state store
#: (`memory` | `redis`) and where the policy at start came from.
POLICY_GENERATION: Final = "x-slotsched-policy-generation"
STATE: Final = "x-slotsched-state"
POLICY_ORIGIN: Final = "x-slotsched-policy-origin"

# ---------------------------------------------------------------- ErrorInfo reasons

#: The ErrorInfo domain of every reason below.
DOMAIN: Final = "slotsched.dev"


class Reason(StrEnum):
    """An ErrorInfo reason: what happened, for a program (the message is for a person). A str,
    so it compares equal to the reason read off the wire. Its row in `scheduler/api/reasons.py`
    (the one table of refusal reasons) says the rest: `code` is the status it goes with."""

    CREDENTIAL_DENIED = "CREDENTIAL_DENIED"
    WORKER_OUT_OF_SCOPE = "WORKER_OUT_OF_SCOPE"
    WORKER_SLOTS_OVER_BOUND = "WORKER_SLOTS_OVER_BOUND"
    NO_QUOTA = "NO_QUOTA"
    UNKNOWN_TENANT = "UNKNOWN_TENANT"
    QUEUE_FULL = "QUEUE_FULL"
    TENANT_QUEUE_FULL = "TENANT_QUEUE_FULL"
    RATE_LIMITED = "RATE_LIMITED"
    CHANNEL_FULL = "CHANNEL_FULL"
    STALE_EPOCH = "STALE_EPOCH"
    NOT_HOLDER = "NOT_HOLDER"
    INVALID_EVENT = "INVALID_EVENT"
    PRECONDITION = "PRECONDITION"
    NOT_LEADER = "NOT_LEADER"
    NO_ELIGIBLE_POOL = "NO_ELIGIBLE_POOL"
    WORKER_POOL_DENIED = "WORKER_POOL_DENIED"
    UNKNOWN_BUDGET = "UNKNOWN_BUDGET"
    NO_BUDGET_SHARE = "NO_BUDGET_SHARE"
    BUDGET_QUEUE_FULL = "BUDGET_QUEUE_FULL"
    BUDGET_TENANT_QUEUE_FULL = "BUDGET_TENANT_QUEUE_FULL"
    PERMIT_POLICY_CHANGED = "PERMIT_POLICY_CHANGED"
    PERMIT_NOT_OWNER = "PERMIT_NOT_OWNER"
    PERMIT_CLOSED = "PERMIT_CLOSED"

    @property
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode[reasons.BY_INFO[self].status]


#: ErrorInfo metadata key naming the leader on NOT_LEADER (the same address as `LEADER`).
LEADER_INFO: Final = "leader"
#: ErrorInfo metadata key naming the pool on a per-pool NOT_LEADER (the same name as `POOL`).
POOL_INFO: Final = "pool"
#: ErrorInfo metadata key naming the budget on a permit's NOT_LEADER (the same name as `BUDGET`).
BUDGET_INFO: Final = "budget"
#: The codes every failure carries an ErrorInfo with, and the reason when none more specific.
DEFAULT_REASONS: Final[Mapping[grpc.StatusCode, Reason]] = MappingProxyType(
    {
        grpc.StatusCode.PERMISSION_DENIED: Reason.CREDENTIAL_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION: Reason.PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED: Reason.RATE_LIMITED,
    }
)

# ---------------------------------------------------------------- limits

#: A request string field (ids, names, tenants), in bytes; scheduler/api/guard.py enforces these.
MAX_STRING_BYTES: Final = 256
#: A snapshot `uri`, a `page_token`, KEDA's `scalerMetadata` values.
MAX_LONG_STRING_BYTES: Final = 2048
#: ApplyPolicy's `yaml`.
MAX_POLICY_BYTES: Final = 256 * 1024
#: A map or repeated field of a request.
MAX_ENTRIES: Final = 64
#: Commands in one ChannelRequest (more ends the channel INVALID_ARGUMENT).
MAX_CHANNEL_COMMANDS: Final = 1024
#: Sessions attached to one Channel (one more is refused CHANNEL_FULL).
MAX_CHANNEL_SESSIONS: Final = 10_000
#: Grants one Worker.Status call may carry (the worker refuses more; the runtime sends its newest).
MAX_STATUS_GRANTS: Final = 64
#: Characters of an offending value an error message quotes.
QUOTE_CHARS: Final = 64

__all__ = [
    "AUTHORIZATION",
    "BEARER",
    "BUDGET",
    "BUDGET_INFO",
    "DEFAULT_REASONS",
    "DETAILS",
    "DOMAIN",
    "ESTIMATED_WAIT_MS",
    "LEADER",
    "LEADER_INFO",
    "POOL",
    "POOL_INFO",
    "MAX_CHANNEL_COMMANDS",
    "MAX_CHANNEL_SESSIONS",
    "MAX_STATUS_GRANTS",
    "MAX_ENTRIES",
    "MAX_LONG_STRING_BYTES",
    "MAX_POLICY_BYTES",
    "MAX_STRING_BYTES",
    "POLICY_GENERATION",
    "POLICY_ORIGIN",
    "QUOTE_CHARS",
    "RETRY_AFTER_MS",
    "STATE",
    "TENANT",
    "Reason",
]
