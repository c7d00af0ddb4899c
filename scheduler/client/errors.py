"""Typed SDK exceptions; which status (and ErrorInfo reason) gives which is `reactions.py`'s
table, read by `from_rpc_error` there.

Why: a runtime must react differently to "the queue is full, retry in 3 s" (back off), "your
tenant has no quota for this class" (a configuration bug, never retry), "your lease is stale"
(stop the actor, it was fenced off) and "the scheduler is down" (retry elsewhere). Matching on
`grpc.StatusCode` and parsing trailing metadata at every call site would scatter that knowledge;
it is done once (`reactions.from_rpc_error`), and callers `raise from_rpc_error(err) from err`
so the original gRPC error stays attached as `__cause__`. Where one status covers refusals that
call for different reactions (a bad credential and a zero quota are both PERMISSION_DENIED; a
full queue and a rate limit both RESOURCE_EXHAUSTED), the reason of the server's
google.rpc.ErrorInfo picks the class.

Exceptions raised for client-side conditions (the session ended while the caller waited for a
grant, re-attach gave up) derive from the same base, with `code` set to the closest status.
"""

from __future__ import annotations

import grpc


class SlotschedError(Exception):
    """Base of every SDK error. `code` is the gRPC status (None for purely client-side errors);
    `reason` the server's ErrorInfo reason ("" if it sent none: the reasons, and the class each
    gives, are `scheduler/api/reasons.py`'s table)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None, *, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


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
        super().__init__(message, code, reason=reason)
        self.retry_after_s = retry_after_s
        self.estimated_wait_s = estimated_wait_s


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
        super().__init__(message, code, reason=reason)


class NoQuota(PermissionDenied):
    """PERMISSION_DENIED, reason NO_QUOTA: the tenant's quota for the class is zero, so the
    request could never be served (a configuration matter: never retry)."""


class StaleLease(SlotschedError):
    """FAILED_PRECONDITION: a stale epoch (the lease was revoked or re-granted), a lease that is
    not this session's, or a session id live under another tenant."""


class NoEligiblePool(SlotschedError):
    """FAILED_PRECONDITION, reason NO_ELIGIBLE_POOL: no pool of the policy matches the session's
    selector (or the labels its snapshot must resume on); the message names them. A matter of
    the request or the policy: sending it again will not help."""


class UnknownBudget(SlotschedError):
    """FAILED_PRECONDITION, reason UNKNOWN_BUDGET: a permit names a budget the policy lacks
    (the message lists the policy's budgets). Sending it again will not help."""


class PermitRefused(SlotschedError):
    """FAILED_PRECONDITION about a permit: another session's (PERMIT_NOT_OWNER), already
    settled, expired or withdrawn (PERMIT_CLOSED), or a waiting permit the new policy could
    never serve (PERMIT_POLICY_CHANGED)."""


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
        super().__init__(message, None, reason=reason)


class GrantFailed(SlotschedError):
    """`on_grant` raised for a re-grant (after a yield or a revocation): the actor did not start
    on its new slot, so the session gave the lease back and ended rather than pin a slot that
    runs nothing. `.resume_from` of the session still names the snapshot to start over from."""


#: Every class by name: the `error` column of `scheduler/api/reasons.py` names one of these
#: (tests/test_reasons.py checks each names a class here).
BY_NAME: dict[str, type[SlotschedError]] = {
    cls.__name__: cls
    for cls in (
        SlotschedError,
        ResourceExhausted,
        QueueFull,
        RateLimited,
        PermissionDenied,
        NoQuota,
        StaleLease,
        NoEligiblePool,
        UnknownBudget,
        PermitRefused,
        NotFound,
        AcquireTimeout,
        Unavailable,
        Unauthenticated,
        InvalidArgument,
    )
}
