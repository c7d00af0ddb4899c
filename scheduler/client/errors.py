"""Typed SDK exceptions, mapped from gRPC status codes in one place (`from_rpc_error`).

Why: a runtime must react differently to "the queue is full, retry in 3 s" (back off), "your
tenant has no quota for this class" (a configuration bug, never retry), "your lease is stale"
(stop the actor, it was fenced off) and "the scheduler is down" (retry elsewhere). Matching on
`grpc.StatusCode` and parsing trailing metadata at every call site would scatter that knowledge;
here it is done once, and callers `raise from_rpc_error(err) from err` so the original gRPC
error stays attached as `__cause__`. Where one status covers refusals that call for different
reactions (a bad credential and a zero quota are both PERMISSION_DENIED; a full queue and a rate
limit both RESOURCE_EXHAUSTED), the reason of the server's google.rpc.ErrorInfo picks the class.

Exceptions raised for client-side conditions (the session ended while the caller waited for a
grant, re-attach gave up) derive from the same base, with `code` set to the closest status.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

#: Trailing metadata holding the call's google.rpc.Status, with its rich details.
DETAILS_KEY = "grpc-status-details-bin"
#: The ErrorInfo domain and the reasons read here (the server's scheduler/server/errors.py;
#: listed in proto/slotsched/v1/common.proto).
DOMAIN = "slotsched.dev"
NO_QUOTA = "NO_QUOTA"
RATE_LIMITED = "RATE_LIMITED"


class SlotschedError(Exception):
    """Base of every SDK error. `code` is the gRPC status (None for purely client-side errors)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ResourceExhausted(SlotschedError):
    """RESOURCE_EXHAUSTED: the server has no room for the call now; `QueueFull` or
    `RateLimited` tell which. Retry after `retry_after_s` (None = unknown); a queued wait would
    have been about `estimated_wait_s` (None = unknown). `reason` is the server's ErrorInfo
    reason ("" if it sent none)."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = grpc.StatusCode.RESOURCE_EXHAUSTED,
        *,
        retry_after_s: float | None = None,
        estimated_wait_s: float | None = None,
        reason: str = "",
    ) -> None:
        super().__init__(message, code)
        self.retry_after_s = retry_after_s
        self.estimated_wait_s = estimated_wait_s
        self.reason = reason


class QueueFull(ResourceExhausted):
    """RESOURCE_EXHAUSTED, a queue cap was reached (reason QUEUE_FULL: the pool's,
    TENANT_QUEUE_FULL: the tenant's): the request was not queued. Retry after `retry_after_s`."""


class RateLimited(ResourceExhausted):
    """RESOURCE_EXHAUSTED, reason RATE_LIMITED: the tenant's (or role's) calls are past their
    rate limit (`spec.rateLimits`). Nothing was done; retry after `retry_after_s`, which the
    server sends with every such refusal."""


class PermissionDenied(SlotschedError):
    """PERMISSION_DENIED: the credential may not make this call: a token or certificate the
    policy does not list (reason CREDENTIAL_DENIED), a role without the service, or a tenant not
    in the policy (UNKNOWN_TENANT). Sending it again will not help. `reason` is the server's
    ErrorInfo reason ("" if it sent none)."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = grpc.StatusCode.PERMISSION_DENIED,
        *,
        reason: str = "",
    ) -> None:
        super().__init__(message, code)
        self.reason = reason


class NoQuota(PermissionDenied):
    """PERMISSION_DENIED, reason NO_QUOTA: the tenant's quota for the class is zero, so the
    request could never be served (a configuration matter: never retry)."""


class StaleLease(SlotschedError):
    """FAILED_PRECONDITION: a stale epoch (the lease was revoked or re-granted), a lease that is
    not this session's, or a session id live under another tenant."""


class NotFound(SlotschedError):
    """NOT_FOUND: no such session or lease (e.g. it already expired)."""


class AcquireTimeout(SlotschedError):
    """DEADLINE_EXCEEDED: still queued when `wait_timeout_s` (or the deadline) passed; the
    request was withdrawn."""


class Unavailable(SlotschedError):
    """UNAVAILABLE: the scheduler is unreachable or shutting down (also raised when re-attaching
    a broken stream gave up)."""


class Unauthenticated(SlotschedError):
    """UNAUTHENTICATED: no credential was sent (no token and no client certificate; in the
    server's insecure dev mode, no tenant), or an `authorization` header that is not
    `Bearer <token>`. A token the server does not know is `PermissionDenied`."""


class InvalidArgument(SlotschedError):
    """INVALID_ARGUMENT: a request field is missing or malformed (the message names it)."""


class SessionEnded(SlotschedError):
    """The session ended (released, withdrawn, expired, revoked) while the caller waited for a
    lease. `reason` is the end reason in lower case, e.g. "expired"."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, None)
        self.reason = reason


class GrantFailed(SlotschedError):
    """`on_grant` raised for a re-grant (after a yield or a revocation): the actor did not start
    on its new slot, so the session gave the lease back and ended rather than pin a slot that
    runs nothing. `.resume_from` of the session still names the snapshot to start over from."""


_BY_CODE: dict[grpc.StatusCode, type[SlotschedError]] = {
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.FAILED_PRECONDITION: StaleLease,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.DEADLINE_EXCEEDED: AcquireTimeout,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
}


def _metadata_ms(metadata: Iterable[Any] | None, key: str) -> float | None:
    """The value of `key` in trailing metadata, read as milliseconds and returned in seconds."""
    if not metadata:
        return None
    for item in metadata:
        k, v = (item.key, item.value) if hasattr(item, "key") else item
        if k.lower() != key:
            continue
        if isinstance(v, bytes):
            v = v.decode("ascii", "replace")
        try:
            return max(0.0, float(v) / 1000.0)
        except (TypeError, ValueError):
            return None
    return None


def _error_reason(metadata: Iterable[Any] | None) -> str:
    """The ErrorInfo reason in the google.rpc.Status the server sends as trailing metadata
    (grpc-status-details-bin), or "" when there is none."""
    for item in metadata or ():
        k, v = (item.key, item.value) if hasattr(item, "key") else item
        if k.lower() != DETAILS_KEY or not isinstance(v, bytes):
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(v)
        except DecodeError:
            return ""
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain in (DOMAIN, ""):
                    return str(info.reason)
    return ""


def from_rpc_error(err: grpc.RpcError) -> SlotschedError:
    """The typed exception for a failed call (sync `grpc.RpcError` or `grpc.aio.AioRpcError`).

    Use as `raise from_rpc_error(err) from err`. Codes without a dedicated class (ABORTED,
    CANCELLED, INTERNAL, ...) map to the `SlotschedError` base, with `code` set. Where one code
    covers refusals a caller treats differently, the ErrorInfo reason picks the class:
    PERMISSION_DENIED is `NoQuota` for NO_QUOTA, else `PermissionDenied`; RESOURCE_EXHAUSTED is
    `RateLimited` for RATE_LIMITED, else `QueueFull`.
    """
    code_fn = getattr(err, "code", None)
    code: grpc.StatusCode | None = code_fn() if callable(code_fn) else None
    details_fn = getattr(err, "details", None)
    details = (details_fn() if callable(details_fn) else None) or str(err)
    name = code.name if code is not None else "UNKNOWN"
    message = f"{name}: {details}"
    if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.PERMISSION_DENIED):
        trailing_fn = getattr(err, "trailing_metadata", None)
        trailing = trailing_fn() if callable(trailing_fn) else None
        reason = _error_reason(trailing)
        if code is grpc.StatusCode.PERMISSION_DENIED:
            denied = NoQuota if reason == NO_QUOTA else PermissionDenied
            return denied(message, code, reason=reason)
        exhausted = RateLimited if reason == RATE_LIMITED else QueueFull
        return exhausted(
            message,
            code,
            retry_after_s=_metadata_ms(trailing, "retry-after-ms"),
            estimated_wait_s=_metadata_ms(trailing, "estimated-wait-ms"),
            reason=reason,
        )
    cls = _BY_CODE.get(code, SlotschedError) if code is not None else SlotschedError
    return cls(message, code)
