"""How the SDK meets each gRPC status: one table, (status, ErrorInfo reason) -> the typed error a
caller sees and, per kind of call, what the SDK does about it (retry, re-attach, follow the
leader, fail ...), as kopf's `TemporaryError` / `PermanentError` tell a handler's failures apart.

Why one table: the reaction to a status used to be decided in six places (the stream, the
renewals, the yield path, the release, the channel multiplexer, the error mapping), each with
its own list of codes. Here a row says it all; the parts look their reaction up (`react`) and do
it, and `from_rpc_error` builds the error class: a reason's own (its row in
`scheduler/api/reasons.py`, the one table of refusal reasons), else the status row's here. A
reason needs a row here only where it is met differently from its status's other reasons. The
retry waits are `retry.py`'s; whether a command may be sent again at all is its row in
`scheduler/api/commands.py` (`resend`); the metadata keys are `scheduler/api/wire.py`'s.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from scheduler.api import reasons, wire
from scheduler.api.wire import Reason
from scheduler.client.errors import (
    BY_NAME,
    AcquireTimeout,
    InvalidArgument,
    NoEligiblePool,
    NotFound,
    PermissionDenied,
    QueueFull,
    ResourceExhausted,
    SlotschedError,
    StaleLease,
    Unauthenticated,
    Unavailable,
)


class Call(enum.Enum):
    """The kinds of call whose failures the SDK reacts to."""

    CHANNEL = "channel"  # the client's Scheduler.Channel stream (mux.py), or a session's error on it
    ATTACH = "attach"  # a session's Acquire stream, or its place on a channel (attach.py)
    RENEW = "renew"  # renewer.py
    YIELD = "yield"  # yielder.py
    RELEASE = "release"  # release.py


class Reaction(enum.Enum):
    #: Lost the replica, or it does not lead: send again to the leader after 50-100 ms, within
    #: `failover_timeout_s` (calls.py); past it, as RETRY. On a channel: leave it (mux.py).
    FOLLOW_LEADER = "follow the leader"
    #: Transient: send the same again after backoff, while the call's policy allows a try.
    RETRY = "retry"
    #: The stream broke: open it again with backoff, within `reattach_timeout_s`; the server
    #: keeps the session meanwhile. On a channel: its sessions re-attach (told UNAVAILABLE).
    REATTACH = "re-attach"
    #: Refused for now with a retry-after: re-attach after that long, jittered. Only for a
    #: session the server knew (one that had an event); a new session's refusal is its answer.
    WAIT_REATTACH = "wait, then re-attach"
    #: The acquire's channel carries all it may: place the session on another channel.
    PLACE_ELSEWHERE = "place elsewhere"
    #: The server has no Channel: the client's sessions use the per-session rpcs from now on.
    FALL_BACK = "per-session rpcs"
    #: A renewal that did not get through: the next one is due before the lease expires.
    SKIP = "skip"
    #: The lease is not ours any more (expired, fenced): drop it; the stream says why.
    LEASE_LOST = "lease lost"
    #: Refused as stale: read what the server holds now, then decide (calls.py `recheck`).
    RECHECK = "recheck"
    #: What the call was for holds already (a release of a session that is over).
    SETTLED = "settled"
    #: The typed error is the answer: raised, recorded, or the session's end.
    FAIL = "fail"


class Rule(NamedTuple):
    """One row: the error a caller sees (unless the reason's row in `scheduler/api/reasons.py`
    names its own), and the reaction for each kind of call."""

    error: type[SlotschedError]
    channel: Reaction
    attach: Reaction
    renew: Reaction
    yield_: Reaction
    release: Reaction

    def on(self, call: Call) -> Reaction:
        reaction: Reaction = getattr(self, _COLUMN[call])
        return reaction


#: Each kind of call's column in a `Rule`.
_COLUMN: dict[Call, str] = {
    Call.CHANNEL: "channel",
    Call.ATTACH: "attach",
    Call.RENEW: "renew",
    Call.YIELD: "yield_",
    Call.RELEASE: "release",
}

_S = grpc.StatusCode
FOLLOW, RETRY, REATTACH = Reaction.FOLLOW_LEADER, Reaction.RETRY, Reaction.REATTACH
WAIT, PLACE, FALL_BACK = Reaction.WAIT_REATTACH, Reaction.PLACE_ELSEWHERE, Reaction.FALL_BACK
SKIP, LOST, RECHECK = Reaction.SKIP, Reaction.LEASE_LOST, Reaction.RECHECK
SETTLED, FAIL = Reaction.SETTLED, Reaction.FAIL
ANY = ""  # the row for every reason of its status the table does not name

# fmt: off
STATUS_TABLE: Mapping[tuple[grpc.StatusCode, str], Rule] = {
    # (status, ErrorInfo reason):
    #    Rule(error,            CHANNEL,   ATTACH,    RENEW,   YIELD,    RELEASE)
    (_S.UNAVAILABLE, Reason.NOT_LEADER):
         Rule(Unavailable,      FOLLOW,    REATTACH,  FOLLOW,  FOLLOW,   FOLLOW),
    (_S.UNAVAILABLE, ANY):
         Rule(Unavailable,      REATTACH,  REATTACH,  FOLLOW,  FOLLOW,   FOLLOW),
    (_S.DEADLINE_EXCEEDED, ANY):
         Rule(AcquireTimeout,   REATTACH,  FAIL,      SKIP,    RETRY,    RETRY),
    (_S.INTERNAL, ANY):
         Rule(SlotschedError,   REATTACH,  REATTACH,  SKIP,    FAIL,     FAIL),
    (_S.UNKNOWN, ANY):
         Rule(SlotschedError,   REATTACH,  REATTACH,  SKIP,    FAIL,     FAIL),
    (_S.CANCELLED, ANY):
         Rule(SlotschedError,   REATTACH,  REATTACH,  SKIP,    FAIL,     FAIL),
    (_S.RESOURCE_EXHAUSTED, Reason.CHANNEL_FULL):
         Rule(QueueFull,        PLACE,     WAIT,      SKIP,    FAIL,     FAIL),
    # A Yield or Release refused for load (a bucket, the fair gate: RATE_LIMITED) is sent again
    # once the server's retry-after has passed (calls.py): given up, the slot would stay held
    # until the lease's TTL.
    (_S.RESOURCE_EXHAUSTED, ANY):
         Rule(QueueFull,        REATTACH,  WAIT,      SKIP,    RETRY,    RETRY),
    (_S.FAILED_PRECONDITION, Reason.NO_ELIGIBLE_POOL):
         Rule(NoEligiblePool,   FAIL,      FAIL,      SKIP,    FAIL,     FAIL),
    (_S.FAILED_PRECONDITION, ANY):
         Rule(StaleLease,       REATTACH,  FAIL,      LOST,    RECHECK,  RECHECK),
    (_S.NOT_FOUND, ANY):
         Rule(NotFound,         REATTACH,  FAIL,      LOST,    FAIL,     SETTLED),
    # Verdicts on what the client sent: sending the same again would fail again.
    (_S.PERMISSION_DENIED, ANY):
         Rule(PermissionDenied, FAIL,      FAIL,      SKIP,    FAIL,     FAIL),
    (_S.UNAUTHENTICATED, ANY):
         Rule(Unauthenticated,  FAIL,      FAIL,      SKIP,    FAIL,     FAIL),
    (_S.INVALID_ARGUMENT, ANY):
         Rule(InvalidArgument,  FAIL,      FAIL,      SKIP,    FAIL,     FAIL),
    (_S.UNIMPLEMENTED, ANY):
         Rule(SlotschedError,   FALL_BACK, FAIL,      SKIP,    FAIL,     FAIL),
}
#: Every other status (ABORTED, ALREADY_EXISTS, OUT_OF_RANGE, DATA_LOSS, ...).
OTHER =  Rule(SlotschedError,   REATTACH,  FAIL,      SKIP,    FAIL,     FAIL)
# fmt: on


def rule(code: grpc.StatusCode | None, reason: str = "") -> Rule:
    """The row for a status and its ErrorInfo reason."""
    if code is None:
        return OTHER
    return STATUS_TABLE.get((code, reason)) or STATUS_TABLE.get((code, ANY)) or OTHER


def error_class(code: grpc.StatusCode | None, reason: str = "") -> type[SlotschedError]:
    """The class a caller sees: the reason's (`reasons.py`), when it goes with this status;
    else the status row's."""
    row = reasons.BY_INFO.get(reason) if reason else None
    if row is not None and code is not None and row.status == code.name:
        return BY_NAME[row.error]
    return rule(code, reason).error


def codes(call: Call, reaction: Reaction) -> frozenset[grpc.StatusCode]:
    """The statuses (whatever their reason) met with `reaction` on `call`."""
    return frozenset(
        code for (code, reason), r in STATUS_TABLE.items() if reason == ANY and r.on(call) is reaction
    )


def _entries(metadata: Iterable[Any] | None) -> Iterable[tuple[str, Any]]:
    for item in metadata or ():
        k, v = (item.key, item.value) if hasattr(item, "key") else item
        yield k.lower(), v


def retry_after_of(err: grpc.aio.AioRpcError) -> float:
    """The server's `retry-after-ms` on a refusal, in seconds (0 without one)."""
    trailing = getattr(err, "trailing_metadata", None)
    return (_metadata_ms(trailing(), wire.RETRY_AFTER_MS) if callable(trailing) else None) or 0.0


def _metadata_ms(metadata: Iterable[Any] | None, key: str) -> float | None:
    """The value of `key` in trailing metadata, read as milliseconds and returned in seconds."""
    for k, v in _entries(metadata):
        if k != key:
            continue
        if isinstance(v, bytes):
            v = v.decode("ascii", "replace")
        try:
            return max(0.0, float(v) / 1000.0)
        except (TypeError, ValueError):
            return None
    return None


def reason_in(metadata: Iterable[Any] | None) -> str:
    """The ErrorInfo reason in the google.rpc.Status the server sends as trailing metadata
    (grpc-status-details-bin), or "" when there is none."""
    for k, v in _entries(metadata):
        if k != wire.DETAILS or not isinstance(v, bytes):
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(v)
        except DecodeError:
            return ""
        return reason_of_status(status)
    return ""


def reason_of_status(status: status_pb2.Status) -> str:
    """The ErrorInfo reason among a google.rpc.Status's details ("" if none)."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain in (wire.DOMAIN, ""):
                return str(info.reason)
    return ""


def _code(err: grpc.RpcError) -> grpc.StatusCode | None:
    code_fn = getattr(err, "code", None)
    return code_fn() if callable(code_fn) else None


def _trailers(err: grpc.RpcError) -> Any:
    trailing_fn = getattr(err, "trailing_metadata", None)
    return trailing_fn() if callable(trailing_fn) else None


def rule_of(err: grpc.RpcError) -> Rule:
    """The row for a failed call."""
    return rule(_code(err), reason_in(_trailers(err)))


def react(call: Call, err: grpc.RpcError) -> Reaction:
    """What to do about `err`, a failure of `call`."""
    return rule_of(err).on(call)


def from_rpc_error(err: grpc.RpcError) -> SlotschedError:
    """The typed exception for a failed call (sync `grpc.RpcError` or `grpc.aio.AioRpcError`).

    Use as `raise from_rpc_error(err) from err`. The class is the ErrorInfo reason's (its row in
    `scheduler/api/reasons.py`): where one status covers refusals a caller treats differently,
    the reason picks (PERMISSION_DENIED is `NoQuota` for NO_QUOTA, else `PermissionDenied`;
    RESOURCE_EXHAUSTED is `RateLimited` for RATE_LIMITED, else `QueueFull`); without a reason,
    `STATUS_TABLE`'s for the status. Statuses without a class of their own (ABORTED, CANCELLED,
    INTERNAL, ...) give the `SlotschedError` base, with `code` set. Every error carries the
    reason (`.reason`, "" without one).
    """
    code = _code(err)
    details_fn = getattr(err, "details", None)
    details = (details_fn() if callable(details_fn) else None) or str(err)
    message = f"{code.name if code is not None else 'UNKNOWN'}: {details}"
    trailing = _trailers(err)
    reason = reason_in(trailing)
    cls = error_class(code, reason)
    if issubclass(cls, ResourceExhausted):
        return cls(
            message,
            code,
            retry_after_s=_metadata_ms(trailing, wire.RETRY_AFTER_MS),
            estimated_wait_s=_metadata_ms(trailing, wire.ESTIMATED_WAIT_MS),
            reason=reason,
        )
    return cls(message, code, reason=reason)
