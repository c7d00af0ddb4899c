"""Every status the server returns is decided here, and nowhere else.

The core says *why* something did not happen (a `Refused` reason, a `Rejected` code, a policy
problem); this module says what the caller should *do* about it: which gRPC code, which message,
which trailing metadata (`retry-after-ms`) and which google.rpc rich detail (BadRequest,
QuotaFailure, and an ErrorInfo on PERMISSION_DENIED, FAILED_PRECONDITION and RESOURCE_EXHAUSTED
whose `reason` tells a program what happened, e.g. NO_QUOTA from CREDENTIAL_DENIED). Servicers
raise `RpcFailure`; the `unary` wrapper (or `abort`, in the Acquire stream) turns it into the
call's status, so a handler never builds a status by hand.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from scheduler.api import reasons, wire
from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.api.wire import Reason
from scheduler.core.types import Decision, ErrorCode, Refused, Rejected
from scheduler.policy.errors import PolicyError
from scheduler.policy.model import DEFAULT_POOL
from scheduler.ports import NOT_LEADER as NOT_LEADER_MESSAGE
from scheduler.ports import StateUnavailable
from scheduler.server.stream import StreamClosed

# The metadata keys and ErrorInfo reasons are the wire's (scheduler/api/wire.py: defined once
# there, for the SDK as well); this module only chooses which failure carries which. Named here
# too, as the builders' callers (and tests/test_wire_polish.py) read them.
DETAILS_KEY = wire.DETAILS  # "grpc-status-details-bin"
RETRY_AFTER_KEY = wire.RETRY_AFTER_MS
ESTIMATED_WAIT_KEY = wire.ESTIMATED_WAIT_MS
LEADER_KEY = wire.LEADER  # a NOT_LEADER refusal's leader HOST:PORT (when known): the SDK follows it
DOMAIN = wire.DOMAIN
CREDENTIAL_DENIED = Reason.CREDENTIAL_DENIED
WORKER_OUT_OF_SCOPE = Reason.WORKER_OUT_OF_SCOPE
WORKER_SLOTS_OVER_BOUND = Reason.WORKER_SLOTS_OVER_BOUND
NO_QUOTA = Reason.NO_QUOTA
UNKNOWN_TENANT = Reason.UNKNOWN_TENANT
QUEUE_FULL = Reason.QUEUE_FULL
TENANT_QUEUE_FULL = Reason.TENANT_QUEUE_FULL
STALE_EPOCH = Reason.STALE_EPOCH
NOT_HOLDER = Reason.NOT_HOLDER
INVALID_EVENT = Reason.INVALID_EVENT
PRECONDITION = Reason.PRECONDITION
RATE_LIMITED = Reason.RATE_LIMITED
CHANNEL_FULL = Reason.CHANNEL_FULL
NOT_LEADER = Reason.NOT_LEADER
NO_ELIGIBLE_POOL = Reason.NO_ELIGIBLE_POOL
WORKER_POOL_DENIED = Reason.WORKER_POOL_DENIED
UNKNOWN_BUDGET = Reason.UNKNOWN_BUDGET
NO_BUDGET_SHARE = Reason.NO_BUDGET_SHARE
BUDGET_QUEUE_FULL = Reason.BUDGET_QUEUE_FULL
BUDGET_TENANT_QUEUE_FULL = Reason.BUDGET_TENANT_QUEUE_FULL
PERMIT_POLICY_CHANGED = Reason.PERMIT_POLICY_CHANGED
PERMIT_NOT_OWNER = Reason.PERMIT_NOT_OWNER
PERMIT_CLOSED = Reason.PERMIT_CLOSED
# Every failure with one of these codes carries an ErrorInfo; a builder without a reason gets these.
DEFAULT_REASONS = wire.DEFAULT_REASONS


class RpcFailure(Exception):
    """A call that ends with a non-OK status; raised by servicers, turned into an abort."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        details: Sequence[Message] = (),
        metadata: Sequence[tuple[str, str]] = (),
        reason: str = "",
        info: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = tuple(details)
        self.metadata = tuple(metadata)
        self.reason = reason or DEFAULT_REASONS.get(code, "")
        self.info = dict(info or {})
        self._session_error: scheduler_pb2.SessionError | None = None

    def status(self) -> status_pb2.Status:
        """The google.rpc.Status of this failure: code, message and rich details."""
        details = self.details
        if self.reason:
            info = error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN, metadata=self.info)
            details = (*details, info)  # after the others: clients that read details[0] keep working
        status = status_pb2.Status(code=self.code.value[0], message=self.message)
        for d in details:
            packed = any_pb2.Any()
            packed.Pack(d)
            status.details.append(packed)
        return status

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        md: list[tuple[str, str | bytes]] = list(self.metadata)
        if self.details or self.reason:
            md.append((DETAILS_KEY, self.status().SerializeToString()))
        return tuple(md)

    def session_error(self) -> scheduler_pb2.SessionError:
        """This failure as a Channel's per-session error event: the same status and details the
        per-session rpc ends with, and its trailing metadata (retry-after-ms, ...). Built once: a
        refusal answering many commands (a flood's excess) costs one build."""
        if self._session_error is None:
            error = scheduler_pb2.SessionError(status=self.status(), trailers=dict(self.metadata))
            self._session_error = error
        return self._session_error


# ---------------------------------------------------------------- builders


def invalid_argument(field: str, description: str) -> RpcFailure:
    """INVALID_ARGUMENT naming the field, in the message and as a BadRequest FieldViolation."""
    bad = error_details_pb2.BadRequest(
        field_violations=[error_details_pb2.BadRequest.FieldViolation(field=field, description=description)]
    )
    return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {description}", [bad])


def policy_too_large(limit: int, size: int) -> RpcFailure:
    """An ApplyPolicy whose YAML is over the size limit (refused before parsing)."""
    return invalid_argument("yaml", f"longer than {limit} bytes (got {size}): the policy size limit")


def policy_limit(description: str) -> RpcFailure:
    """An ApplyPolicy whose YAML nests too deep or expands too far (aliases): refused unparsed."""
    return invalid_argument("yaml", description)


async def refuse_request(context: Any, field: str, description: str) -> None:
    """The wire guard's refusal (scheduler/api/guard.py): an undecodable or over-long request."""
    await abort(context, invalid_argument(field, description))


def policy_invalid(err: PolicyError) -> RpcFailure:
    """An ApplyPolicy that does not validate: one FieldViolation per problem, at its key path."""
    bad = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=p.path, description=p.message)
            for p in err.problems
        ]
    )
    n = len(err.problems)
    first = f": {err.problems[0]}" if err.problems else ""
    more = f" (and {n - 1} more)" if n > 1 else ""
    return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"invalid policy{first}{more}", [bad])


def unauthenticated(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.UNAUTHENTICATED, message)


def permission_denied(message: str, reason: str = CREDENTIAL_DENIED, **info: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.PERMISSION_DENIED, message, reason=reason, info=info)


def not_found(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.NOT_FOUND, message)


def failed_precondition(message: str, reason: str = PRECONDITION, **info: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, message, reason=reason, info=info)


SHUTTING_DOWN = "server is shutting down: retry against another replica or later"


def unavailable(message: str = SHUTTING_DOWN) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.UNAVAILABLE, message)


def from_state(e: StateUnavailable) -> RpcFailure:
    """The state store could not make the call's effects durable (or this replica does not lead)."""
    retry = ((RETRY_AFTER_KEY, str(round(e.retry_after_s * 1000))),)
    reason = NOT_LEADER if e.message == NOT_LEADER_MESSAGE else ""
    return RpcFailure(grpc.StatusCode.UNAVAILABLE, e.message, metadata=retry, reason=reason)


def not_leader(leader: str | None = None, store_down: str | None = None) -> RpcFailure:
    """A call to a replica that does not serve (a standby, or a leader that stepped down):
    UNAVAILABLE with reason NOT_LEADER, naming the leader (ErrorInfo metadata `leader` and
    trailing metadata `x-slotsched-leader`) when this replica knows it. Retry there at once;
    without an address, retry shortly (a take-over is under way).

    `store_down` (the state store this replica cannot reach, and why) is said instead of
    "standby", with ErrorInfo metadata `state_store: unreachable`: this replica cannot lead until
    the store answers, which waiting for an election does not fix."""
    if store_down:
        message = f"{store_down}; this replica cannot lead until it answers"
        info = {"state_store": "unreachable"}
        trailers: tuple[tuple[str, str], ...] = ((RETRY_AFTER_KEY, "1000"),)
        if leader:  # as last seen: another replica may well reach the store
            message += f" (the leader was last at {leader})"
            trailers, info = (
                ((RETRY_AFTER_KEY, "0"), (LEADER_KEY, leader)),
                {**info, wire.LEADER_INFO: leader},
            )
        return RpcFailure(
            grpc.StatusCode.UNAVAILABLE, message, metadata=trailers, reason=NOT_LEADER, info=info
        )
    if leader:
        message = f"not the leader: this replica is a standby; the leader is at {leader}"
        md: tuple[tuple[str, str], ...] = ((RETRY_AFTER_KEY, "0"), (LEADER_KEY, leader))
        info = {wire.LEADER_INFO: leader}
    else:
        message, md, info = NOT_LEADER_MESSAGE, ((RETRY_AFTER_KEY, "200"),), {}
    return RpcFailure(grpc.StatusCode.UNAVAILABLE, message, metadata=md, reason=NOT_LEADER, info=info)


def pool_not_led(pool: str, leader: str | None, budget: str = "") -> RpcFailure:
    """Per-pool leadership (`serve --leadership pool`): this replica does not lead `pool`.
    UNAVAILABLE NOT_LEADER as above, naming the pool (ErrorInfo `pool`, trailing
    `x-slotsched-pool`) beside its leader, so a client follows that leader for that pool's
    sessions only; without a leader known (a take-over under way), retry shortly. A permit's
    refusal also names its `budget` (`x-slotsched-budget`): `pool` is the budget's home, where
    its permits go, not the session's pool (docs/design.md, "Token budgets")."""
    if leader:
        message = f"not the leader of pool {pool!r}: its leader is at {leader}"
        md: tuple[tuple[str, str], ...] = ((RETRY_AFTER_KEY, "0"), (LEADER_KEY, leader), (wire.POOL, pool))
        info = {wire.LEADER_INFO: leader, wire.POOL_INFO: pool}
    else:
        message = f"not the leader of pool {pool!r}: its leader is being elected"
        md, info = ((RETRY_AFTER_KEY, "200"), (wire.POOL, pool)), {wire.POOL_INFO: pool}
    if budget:
        message = f"budget {budget!r} is counted in pool {pool!r}, " + message
        md, info = (*md, (wire.BUDGET, budget)), {**info, wire.BUDGET_INFO: budget}
    return RpcFailure(grpc.StatusCode.UNAVAILABLE, message, metadata=md, reason=NOT_LEADER, info=info)


def not_held_here(held: int, pools: int) -> RpcFailure:
    """Per-pool leadership: a session or worker none of the pools held here (led or followed
    hot) knows, on a replica that holds others cold. It may live in one of those, so this is not
    NOT_FOUND (a renewal refused so reads as a lost lease): UNAVAILABLE NOT_LEADER, to be asked
    again at its pool's leader, which answers NOT_FOUND if it is indeed unknown."""
    message = (
        f"not known here: this replica holds {held} of {pools} pools (each pool is held by its "
        "leader and its successor only); ask the leader of its pool"
    )
    md = ((RETRY_AFTER_KEY, "200"),)
    return RpcFailure(grpc.StatusCode.UNAVAILABLE, message, metadata=md, reason=NOT_LEADER, info={})


_CLOSED = {
    StreamClosed.SUPERSEDED: (grpc.StatusCode.ABORTED, "a newer Acquire stream attached to this session"),
    StreamClosed.SHUTTING_DOWN: (
        grpc.StatusCode.UNAVAILABLE,
        "server is shutting down: re-attach to another replica",
    ),
}


def from_closed(reason: StreamClosed) -> RpcFailure:
    """An Acquire stream the loop closed: superseded by a newer one, or the server stops serving."""
    code, message = _CLOSED[reason]
    return RpcFailure(code, message)


def channel_slow_reader(buffered: int) -> RpcFailure:
    """A Channel whose reader fell too far behind (session_channel.py: flow control)."""
    return RpcFailure(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"channel reader too slow: more than {buffered} events waiting to be written; "
        "re-open the channel and re-acquire its sessions (they are kept)",
        metadata=((RETRY_AFTER_KEY, "100"),),
    )


def channel_full(limit: int) -> RpcFailure:
    """An acquire that would attach more sessions to one Channel than it may hold: open another
    channel (the SDK's pool does), or retry on this one once a session has ended."""
    return RpcFailure(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"this channel already carries {limit} sessions: open another channel, or retry in 1000 ms",
        metadata=((RETRY_AFTER_KEY, "1000"),),
        reason=CHANNEL_FULL,
    )


def deadline_exceeded(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, message)


def withdrawn(why: str) -> RpcFailure:
    """A queued request withdrawn as `why` passed (`LeaseStream.withdrawn`: its wait_timeout, or
    a per-session Acquire's deadline), after its `Ended{WITHDRAWN}`."""
    return deadline_exceeded(f"still queued when {why} passed: the request was withdrawn")


def aborted(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.ABORTED, message)


def from_refused(r: Refused, tenant: str) -> RpcFailure:
    """An Acquire the core would not queue: its status, ErrorInfo reason and metadata, and when
    to retry, from the reason's row (`scheduler/api/reasons.py`); the shape of each status
    (a BadRequest for INVALID_ARGUMENT, a QuotaFailure naming the cap) is this module's."""
    return _from_row(
        reasons.of(r.reason),
        tenant,
        r.message,
        r.field or "pool",
        r.pool,
        r.retry_after_s,
        r.estimated_wait_s,
    )


def from_budget_refused(
    reason: str, message: str, tenant: str, field: str = "", retry_after_s: float | None = None
) -> RpcFailure:
    """A permit or a settle the budget core refused (its `PermitRefuseReason` or
    `SettleRefuseReason` value), by the reason's row, as `from_refused`."""
    row = reasons.BUDGET.get(reason)
    if row is None:
        raise KeyError(f"no row for the budget refusal {reason!r} in scheduler/api/reasons.py")
    return _from_row(row, tenant, message, field or "estimate", "", retry_after_s or 0.0, None)


def _from_row(
    row: reasons.Row, tenant: str, message: str, field: str, pool: str,
    retry_after_s: float, estimated_wait_s: float | None,
) -> RpcFailure:  # fmt: skip
    code = grpc.StatusCode[row.status]
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        # INVALID_ARGUMENT carries the field (BadRequest), as every malformed request does.
        return invalid_argument(field, message)
    if code is grpc.StatusCode.UNAVAILABLE:
        return unavailable()
    if row.info is None:
        # DUPLICATE_SESSION is answered by re-attaching; reaching here is a server bug.
        return RpcFailure(grpc.StatusCode.INTERNAL, f"unexpected refusal {row.name}: {message}")
    info: dict[str, str] = {}
    if "tenant" in row.info_keys:
        info["tenant"] = tenant
    if "pool" in row.info_keys and pool and pool != DEFAULT_POOL:
        info["pool"] = pool  # named when there are several (a policy of one pool names `default`)
    details: tuple[Message, ...] = ()
    md: tuple[tuple[str, str], ...] = ()
    if row.policy_key:  # a cap: which one, and whose (QuotaFailure)
        subject = f"tenant:{tenant}" if "tenant" in row.info_keys else "pool"
        violation = error_details_pb2.QuotaFailure.Violation(
            subject=subject, description=f"{row.policy_key}: {message}"
        )
        details = (error_details_pb2.QuotaFailure(violations=[violation]),)
    if row.retry_after is reasons.RetryAfter.CORE:
        md = ((RETRY_AFTER_KEY, str(round(retry_after_s * 1000))),)
        if estimated_wait_s is not None:  # absent until a hold has been observed
            md += ((ESTIMATED_WAIT_KEY, str(round(estimated_wait_s * 1000))),)
    return RpcFailure(code, message, details, md, row.info, info)


_REJECT_CODES = {
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.STALE_EPOCH: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.NOT_HOLDER: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.INVALID: grpc.StatusCode.FAILED_PRECONDITION,  # e.g. a worker id already taken
}


def rate_limited(
    subject: str, rpc: str, key: str, qps: float, burst: int, retry_after_s: float
) -> RpcFailure:
    """A call past its flow's token bucket (`subject`: a tenant's name, or role:admin /
    role:worker): RESOURCE_EXHAUSTED, when to retry, and which policy key sized the bucket."""
    who = f"tenant:{subject}" if ":" not in subject else subject
    limit = f"{key}: {qps:g} calls a second, burst {burst}"
    quota = error_details_pb2.QuotaFailure(
        violations=[error_details_pb2.QuotaFailure.Violation(subject=who, description=limit)]
    )
    ms = max(1, math.ceil(retry_after_s * 1000))
    return RpcFailure(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"rate limited: {rpc} by {who} is past {limit}; retry in {ms} ms",
        [quota],
        ((RETRY_AFTER_KEY, str(ms)),),
    )


def flow_queue_full(flow: str, bound: int, retry_after_s: float) -> RpcFailure:
    """A work item of `flow` (a tenant, or role:admin / role:worker / role:keda) refused by the
    fair admission gate: its flow already has `bound` items waiting (spec.limits.queuedPerFlow)."""
    who = f"tenant:{flow}" if ":" not in flow else flow
    limit = f"spec.limits.queuedPerFlow: {bound} work items waiting"
    quota = error_details_pb2.QuotaFailure(
        violations=[error_details_pb2.QuotaFailure.Violation(subject=who, description=limit)]
    )
    ms = max(1, math.ceil(retry_after_s * 1000))
    return RpcFailure(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"rate limited: the flow {who} is past {limit} for the server's time; retry in {ms} ms",
        [quota],
        ((RETRY_AFTER_KEY, str(ms)),),
    )


def streams_over_bound(what: str, whose: str, key: str, bound: int) -> RpcFailure:
    """A stream open refused: `whose` (a tenant, or this connection) holds `bound` open `what`
    already (`key`, e.g. spec.limits.channelsPerTenant). Retry once one has closed."""
    limit = f"{key}: at most {bound} open {what}"
    quota = error_details_pb2.QuotaFailure(
        violations=[error_details_pb2.QuotaFailure.Violation(subject=whose, description=limit)]
    )
    return RpcFailure(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"rate limited: {whose} holds {bound} open {what} ({limit}); close one, or retry in 1000 ms",
        [quota],
        ((RETRY_AFTER_KEY, "1000"),),
    )


def worker_out_of_scope(worker_id: str, key: str, scope: str) -> RpcFailure:
    """A worker credential naming a worker id outside its entry's scope (`key`, e.g.
    spec.access.workers[1].workerIds)."""
    return permission_denied(
        f"worker id {_quote(worker_id)} is outside this credential's scope: {key} allows {scope} only",
        WORKER_OUT_OF_SCOPE,
    )


def worker_slots_over_bound(slots: int, key: str, max_slots: int) -> RpcFailure:
    """A Register claiming more slots than the credential's entry may (an authority limit, not a
    malformed request: the same call with an admin credential would pass)."""
    return permission_denied(
        f"slots {slots} is more than this credential may register: {key} is {max_slots}",
        WORKER_SLOTS_OVER_BOUND,
    )


def unknown_pool(name: str, pools: Sequence[str]) -> RpcFailure:
    """A Register (or an Admin call) naming a pool the policy lacks, or none of several."""
    known = ", ".join(repr(p) for p in pools)
    if name:
        return invalid_argument("pool", f"unknown pool {_quote(name)}; the policy's pools are {known}")
    return invalid_argument("pool", f"required: the policy has pools {known} and none named 'default'")


def worker_pool_denied(pool: str, key: str, allowed: Sequence[str]) -> RpcFailure:
    """A worker joining a pool its credential's entry does not list."""
    listed = ", ".join(repr(p) for p in allowed) or "only the policy's one pool (it lists none)"
    return permission_denied(
        f"this credential may not join pool {pool!r}: {key}.pools is {listed}", WORKER_POOL_DENIED, pool=pool
    )


def _quote(value: str, limit: int = 64) -> str:
    """A caller's string in a message: quoted, at most `limit` characters of it."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} characters)"


_REJECT_REASONS = {
    ErrorCode.STALE_EPOCH: STALE_EPOCH,
    ErrorCode.NOT_HOLDER: NOT_HOLDER,
    ErrorCode.INVALID: INVALID_EVENT,
}


def from_rejected(r: Rejected) -> RpcFailure:
    return RpcFailure(_REJECT_CODES[r.code], r.message, reason=_REJECT_REASONS.get(r.code, ""))


def raise_for(decisions: Iterable[Decision], tenant: str = "") -> None:
    """Raise the failure for the first Rejected or Refused among `decisions`, if any."""
    for d in decisions:
        if isinstance(d, Rejected):
            raise from_rejected(d)
        if isinstance(d, Refused):
            raise from_refused(d, tenant)


# ---------------------------------------------------------------- handler wrappers

S = TypeVar("S")
Q = TypeVar("Q")
R = TypeVar("R")


async def abort(context: Any, failure: RpcFailure) -> None:
    await context.abort(failure.code, failure.message, trailing_metadata=failure.trailing_metadata())


def unary(fn: Callable[[S, Q, Any], Awaitable[R]]) -> Callable[[S, Q, Any], Awaitable[R]]:
    """Wrap a unary handler: an RpcFailure it raises becomes the call's status."""

    @functools.wraps(fn)
    async def wrapper(self: S, request: Q, context: Any) -> R:
        try:
            return await fn(self, request, context)
        except RpcFailure as f:
            await abort(context, f)
            raise  # abort() raises; keeps the type checker honest
        except StateUnavailable as e:
            await abort(context, from_state(e))
            raise

    return wrapper


__all__ = [
    "DETAILS_KEY",
    "ESTIMATED_WAIT_KEY",
    "LEADER_KEY",
    "NOT_LEADER",
    "RETRY_AFTER_KEY",
    "RpcFailure",
    "aborted",
    "channel_full",
    "channel_slow_reader",
    "deadline_exceeded",
    "failed_precondition",
    "flow_queue_full",
    "from_closed",
    "from_refused",
    "from_state",
    "from_rejected",
    "invalid_argument",
    "not_found",
    "not_leader",
    "permission_denied",
    "policy_invalid",
    "policy_limit",
    "policy_too_large",
    "pool_not_led",
    "raise_for",
    "rate_limited",
    "refuse_request",
    "streams_over_bound",
    "unauthenticated",
    "unavailable",
    "worker_out_of_scope",
    "withdrawn",
    "worker_slots_over_bound",
]
