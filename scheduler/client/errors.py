"""Typed SDK exceptions, mapped from gRPC status codes in one place (`from_rpc_error`).

Why: a runtime must react differently to "the queue is full, retry in 3 s" (back off), "your
tenant has no quota for this class" (a configuration bug, never retry), "your lease is stale"
(stop the actor, it was fenced off) and "the scheduler is down" (retry elsewhere). Matching on
`grpc.StatusCode` and parsing trailing metadata at every call site would scatter that knowledge;
here it is done once, and callers `raise from_rpc_error(err) from err` so the original gRPC
error stays attached as `__cause__`.

Exceptions raised for client-side conditions (the session ended while the caller waited for a
grant, re-attach gave up) derive from the same base, with `code` set to the closest status.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc


class SlotschedError(Exception):
    """Base of every SDK error. `code` is the gRPC status (None for purely client-side errors)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class QueueFull(SlotschedError):
    """RESOURCE_EXHAUSTED: a queue cap was reached. Retry after `retry_after_s` (None = unknown);
    the wait would have been about `estimated_wait_s` (None = unknown)."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = grpc.StatusCode.RESOURCE_EXHAUSTED,
        *,
        retry_after_s: float | None = None,
        estimated_wait_s: float | None = None,
    ) -> None:
        super().__init__(message, code)
        self.retry_after_s = retry_after_s
        self.estimated_wait_s = estimated_wait_s


class NoQuota(SlotschedError):
    """PERMISSION_DENIED: the tenant's quota for the class is zero (the request could never be
    served), or the credential is not valid / names an unknown tenant."""


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
    """UNAUTHENTICATED: no credential was sent."""


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
    grpc.StatusCode.PERMISSION_DENIED: NoQuota,
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


def from_rpc_error(err: grpc.RpcError) -> SlotschedError:
    """The typed exception for a failed call (sync `grpc.RpcError` or `grpc.aio.AioRpcError`).

    Use as `raise from_rpc_error(err) from err`. Codes without a dedicated class (ABORTED,
    CANCELLED, INTERNAL, ...) map to the `SlotschedError` base, with `code` set.
    """
    code_fn = getattr(err, "code", None)
    code: grpc.StatusCode | None = code_fn() if callable(code_fn) else None
    details_fn = getattr(err, "details", None)
    details = (details_fn() if callable(details_fn) else None) or str(err)
    name = code.name if code is not None else "UNKNOWN"
    message = f"{name}: {details}"
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        trailing_fn = getattr(err, "trailing_metadata", None)
        trailing = trailing_fn() if callable(trailing_fn) else None
        return QueueFull(
            message,
            code,
            retry_after_s=_metadata_ms(trailing, "retry-after-ms"),
            estimated_wait_s=_metadata_ms(trailing, "estimated-wait-ms"),
        )
    cls = _BY_CODE.get(code, SlotschedError) if code is not None else SlotschedError
    return cls(message, code)
