"""One session request, handled once for both wire shapes: the per-session rpcs
(scheduler_service.py) and the multiplexed Channel (session_channel.py) call these, each found
in `UNARY_OPS` by its command (scheduler/api/commands.py: the one table of session commands;
Acquire, the streaming one, is `SessionOps.open`).

Each operation validates (INVALID_ARGUMENT naming the field), submits one event to the loop and
builds its answer from that event's decisions, synchronously. A failure found before the event
is submitted is raised; one the core decided (NOT_FOUND, a stale epoch, ...) is returned as an
`RpcFailure`, because the caller must first `await loop.durable()` and only then tell anything:
the per-session rpc per call, the channel once per batch of commands.
The caller authenticates and charges the rate limits: the tenant is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from scheduler.api import commands
from scheduler.api.commands import Command
from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.api.wire import MAX_STRING_BYTES
from scheduler.core.budget.types import INPUT as _IN
from scheduler.core.budget.types import OUTPUT as _OUT
from scheduler.core.budget.types import REQUESTS as _REQ
from scheduler.core.budget.types import (
    BudgetName,
    Charge,
    PermitEnded,
    PermitGranted,
    PermitId,
    PermitQueued,
    PermitRefused,
    PermitRequest,
    PermitWithdrawn,
    ReportedLimits,
    Settle,
    SettleRefused,
    Usage,
    Vec,
    Withdraw,
)
from scheduler.core.types import (
    EndReason,
    ErrorCode,
    LeaseId,
    QoS,
    Queued,
    Rejected,
    Release,
    Renew,
    Renewed,
    SessionId,
    SnapshotRef,
    TenantName,
    Yield,
)
from scheduler.grants import GrantKeyring
from scheduler.server import convert, errors
from scheduler.server.loop import NO_PLACEMENT, Placement, SchedulerLoop
from scheduler.server.stream import LeaseStream

MAX_SESSION_ID_BYTES = MAX_STRING_BYTES

_PHASES = {
    "queued": scheduler_pb2.SESSION_PHASE_QUEUED,
    "active": scheduler_pb2.SESSION_PHASE_HOLDING,
    "yielding": scheduler_pb2.SESSION_PHASE_YIELDING,
}

#: What an operation answers once its event is durable: the reply, or the failure to report.
Outcome = Any  # a response message | errors.RpcFailure


def require(value: str, field: str) -> None:
    if not value:
        raise errors.invalid_argument(field, "required")


def check_session_id(value: str) -> None:
    require(value, "session_id")
    if len(value.encode()) > MAX_SESSION_ID_BYTES:
        raise errors.invalid_argument("session_id", f"longer than {MAX_SESSION_ID_BYTES} bytes")


def qos_of(request: scheduler_pb2.AcquireRequest) -> QoS:
    qos = convert.PB_TO_QOS.get(request.qos)
    if qos is None:
        raise errors.invalid_argument("qos", "must be GUARANTEED, BURSTABLE or BEST_EFFORT")
    return qos


def snapshot_of(msg: Any, field: str) -> SnapshotRef | None:
    if not msg.HasField(field):
        return None
    ref = getattr(msg, field)
    if not ref.uri:
        raise errors.invalid_argument(f"{field}.uri", "required when a snapshot is given")
    return convert.snapshot_from_pb(ref)


def placement_of(request: scheduler_pb2.AcquireRequest) -> Placement:
    """The request's pool, selector and fallback (their sizes are the wire guard's to bound)."""
    if not (request.pool or request.selector or request.fallback_pools):
        return NO_PLACEMENT
    if request.pool and request.selector:
        raise errors.invalid_argument("selector", "give a pool or a selector, not both")
    if "" in request.selector:
        raise errors.invalid_argument("selector", "a label key must not be empty")
    fallback = tuple(request.fallback_pools)
    if "" in fallback:
        raise errors.invalid_argument(
            "fallback_pools", f"entry {fallback.index('')}: a pool name must not be empty"
        )
    if len(set(fallback)) < len(fallback):
        raise errors.invalid_argument("fallback_pools", "a pool is listed twice")
    return request.pool, tuple(sorted(request.selector.items())), tuple(request.fallback_pools)


class SessionOps:
    """The Scheduler service's per-session requests against one loop, signed with `keys`."""

    def __init__(self, loop: SchedulerLoop, keys: GrantKeyring) -> None:
        self.loop = loop
        self.keys = keys
        #: The class a permit of (tenant, session id, declared class) draws in, or the failure
        #: to answer: this loop's session; under per-pool leadership the replica's router sets
        #: it (pool_routes.py: a budget's home unit may not hold the session's pool).
        self.permit_class: Callable[[SessionId, str, int], QoS | errors.RpcFailure] = self._own_class

    def lease_id(self, wire_id: str, tenant: str) -> LeaseId:
        """The core id of a lease id as quoted (tag verified), checked to be the caller's."""
        require(wire_id, "lease_id")
        core = self.keys.core_of(wire_id)
        if core is None:
            # An untagged, mistagged or guessed id names no lease this caller was given.
            raise errors.not_found(f"no lease {wire_id[:80]!r}: quote lease_id as granted (with its tag)")
        lease = self.loop.core.lease(LeaseId(core))
        if lease is not None and lease.tenant != tenant:
            raise errors.failed_precondition(f"lease {wire_id} belongs to another tenant")
        return LeaseId(core)

    # ------------------------------------------------------------------ Acquire

    def open(
        self,
        tenant: str,
        request: scheduler_pb2.AcquireRequest,
        make: Callable[[SessionId], LeaseStream] = LeaseStream,
    ) -> LeaseStream:
        """Validate, then re-attach to a live session or ask the core for a new one; the stream
        is `make(key)` (the channel's streams feed its shared outbox)."""
        check_session_id(request.session_id)
        qos = qos_of(request)
        resume = snapshot_of(request, "resume_from")
        wait_timeout = None
        if request.HasField("wait_timeout"):
            wait_timeout = convert.from_dur(request.wait_timeout)
            if wait_timeout < 0:
                raise errors.invalid_argument("wait_timeout", "must not be negative")
        key = convert.session_key(tenant, request.session_id)
        stream = self.loop.reattach(key, make)
        if stream is not None:
            return stream
        where = placement_of(request)
        stream, refusal = self.loop.acquire(key, tenant, qos, resume, wait_timeout, make, where)
        if refusal is not None or stream is None:
            raise errors.from_refused(refusal, tenant) if refusal else errors.unavailable()
        return stream

    # ------------------------------------------------------------------ Release, Renew, Yield

    def release(self, tenant: str, request: scheduler_pb2.ReleaseRequest) -> Outcome:
        check_session_id(request.session_id)
        key = convert.session_key(tenant, request.session_id)
        if request.lease_id:
            lease_id = self.lease_id(request.lease_id, tenant)
            decisions = self.loop.submit(Release(key, lease_id, request.epoch))
            released = scheduler_pb2.ReleaseResponse(reason=scheduler_pb2.END_REASON_RELEASED)
            failure = _failure(decisions)
            if failure is not None and self._already_released(key, decisions):
                # A retry whose first attempt was applied (its answer lost to a failover or a
                # broken channel): the session holds nothing and its last end was a release.
                return released
            return failure or released
        return self.withdraw(tenant, request)

    def _already_released(self, key: SessionId, decisions: list[Any]) -> bool:
        not_found = any(isinstance(d, Rejected) and d.code is ErrorCode.NOT_FOUND for d in decisions)
        ended = self.loop.ended(key)
        return (
            not_found
            and self.loop.session(key) is None
            and ended is not None
            and ended.reason is EndReason.RELEASED
        )

    def withdraw(
        self, tenant: str, request: scheduler_pb2.WithdrawRequest | scheduler_pb2.ReleaseRequest
    ) -> Outcome:
        """Release with an empty lease id: withdraw the session's queued request."""
        session_id = request.session_id
        check_session_id(session_id)
        key = convert.session_key(tenant, session_id)
        view = self.loop.session(key)
        if view is not None and view.lease is not None:
            raise errors.failed_precondition(
                f"session {session_id} holds lease {self.keys.wire_lease_id(view.lease.lease_id)}: "
                "quote lease_id and epoch"
            )
        decisions = self.loop.submit(Release(key, None))
        return _failure(decisions) or scheduler_pb2.ReleaseResponse(reason=scheduler_pb2.END_REASON_WITHDRAWN)

    def renew(self, tenant: str, request: scheduler_pb2.RenewRequest) -> Outcome:
        check_session_id(request.session_id)
        lease_id = self.lease_id(request.lease_id, tenant)
        key = convert.session_key(tenant, request.session_id)
        decisions = self.loop.submit(Renew(key, lease_id, request.epoch))
        # The reply is built now, from this event's state, and sent once that state is durable
        # (reading after the wait could report later events that are not).
        failure = _failure(decisions)
        if failure is not None:
            return failure
        for d in decisions:
            if isinstance(d, Renewed) and d.lease.session == key:
                resp = scheduler_pb2.RenewResponse(
                    expires_at=convert.ts(d.lease.expires_at),
                    state=common_pb2.LEASE_STATE_ACTIVE,
                    grant=convert.grant_for_lease(self.keys, d.lease),
                )
                y = self.loop.yielding(d.lease.lease_id)
                if y is not None:
                    resp.state = common_pb2.LEASE_STATE_YIELDING
                    resp.yield_deadline.CopyFrom(convert.ts(y.deadline))
                return resp
        return errors.not_found(f"lease {request.lease_id} expired")  # expired by this very tick

    def yield_(self, tenant: str, request: scheduler_pb2.YieldRequest) -> Outcome:
        check_session_id(request.session_id)
        require(request.lease_id, "lease_id")
        snap = snapshot_of(request, "snapshot")
        lease_id = self.lease_id(request.lease_id, tenant)
        key = convert.session_key(tenant, request.session_id)
        decisions = self.loop.submit(Yield(key, lease_id, request.epoch, snap))
        failure = _failure(decisions)
        if failure is not None:
            return failure
        position = 0  # re-granted at once if no Queued follows
        for d in decisions:
            if isinstance(d, Queued) and d.session == key:
                position = d.position
        return scheduler_pb2.YieldResponse(position=position)

    # ------------------------------------------------------------------ GetSession

    def get_session(self, tenant: str, request: scheduler_pb2.GetSessionRequest) -> Outcome:
        """The session's state, read now (the caller answers once what was read is durable)."""
        check_session_id(request.session_id)
        key = convert.session_key(tenant, request.session_id)
        out = scheduler_pb2.SessionState(session_id=request.session_id, tenant=tenant)
        loop = self.loop
        view = loop.session(key)
        if view is not None:
            out.state = _PHASES[view.phase]
            out.qos = convert.QOS_TO_PB[QoS(view.qos)]
            out.pool = view.pool
            out.wait_reason = view.reason
            if view.resume_from is not None:
                out.last_snapshot.CopyFrom(convert.snapshot_to_pb(view.resume_from))
            if view.lease is not None:
                lease, y = view.lease, loop.yielding(view.lease.lease_id)
                out.lease.CopyFrom(convert.lease_to_pb(lease, loop.address(lease.slot.worker), y))
                out.grant = convert.grant_for(self.keys, out.lease)
                convert.tag_lease(self.keys, out.lease)
            else:
                out.position = view.position
                if view.estimated_wait_s is not None:
                    out.estimated_wait.CopyFrom(convert.dur(view.estimated_wait_s))
                out.queued_since.CopyFrom(convert.ts(view.waiting_since))
            return out
        ended = loop.ended(key)
        if ended is None:
            return errors.not_found(f"no session {request.session_id}")
        out.state = scheduler_pb2.SESSION_PHASE_ENDED
        out.qos = convert.QOS_TO_PB[ended.qos]
        out.end_reason = convert.END_TO_PB[ended.reason]
        if ended.last_snapshot is not None:
            out.last_snapshot.CopyFrom(convert.snapshot_to_pb(ended.last_snapshot))
        return out

    # ------------------------------------------------------------------ token budgets

    def _own_class(self, key: SessionId, session_id: str, declared: int) -> QoS | errors.RpcFailure:
        qos = self.loop.live_qos(key)  # (not the session's view: a lookup, on the hot path)
        if qos is None:
            return errors.not_found(f"no live session {session_id}: a permit is for a session")
        return qos

    def request_permit(self, tenant: str, request: scheduler_pb2.RequestPermitRequest) -> Outcome:
        """A permit for one call of the session on `budget`, in the session's class."""
        check_session_id(request.session_id)
        require(request.budget, "budget")
        if not request.HasField("estimate"):
            raise errors.invalid_argument("estimate", "required")
        key = convert.session_key(tenant, request.session_id)
        qos = self.permit_class(key, request.session_id, request.qos)
        if isinstance(qos, errors.RpcFailure):
            return qos
        desk = self.loop.permits
        permit = desk.new_id()
        est = _usage(request.estimate)
        ev = PermitRequest(permit, key, TenantName(tenant), BudgetName(request.budget), qos, est)
        for d in desk.handle(ev, tenant):
            if getattr(d, "permit", None) == permit:  # (a LimitChanged names none)
                return self.permit_answer(d, tenant)
        return errors.unavailable()  # pragma: no cover - the core answers every request

    def permit_answer(self, d: object, tenant: str) -> Outcome:
        """A permit decision on the wire: a PermitEvent, or the refusal's failure."""
        if isinstance(d, PermitGranted):  # (the common answer first)
            ev = scheduler_pb2.PermitEvent(permit_id=d.permit, budget=d.budget)
            granted = ev.granted
            # Field by field: a Timestamp or Duration built and copied cost more than the rest.
            convert.set_ts(granted.expires_at, d.expires_at)
            convert.set_dur(granted.waited, d.waited_s)
            return ev
        if isinstance(d, PermitRefused):
            return errors.from_budget_refused(d.reason.value, d.message, tenant, d.field, d.retry_after_s)
        if isinstance(d, SettleRefused):  # its session ended while it waited (PERMIT_CLOSED)
            return errors.from_budget_refused(d.reason.value, d.message, tenant)
        assert isinstance(d, PermitQueued)
        ev = scheduler_pb2.PermitEvent(permit_id=d.permit, budget=d.budget)
        ev.queued.position = d.position
        ev.queued.reason = d.reason.value
        if d.estimated_wait_s is not None:
            ev.queued.estimated_wait.CopyFrom(convert.dur(d.estimated_wait_s))
        return ev

    def follow_permit(
        self, tenant: str, outcome: Outcome, tell: Callable[[Outcome], None]
    ) -> Callable[[], None] | None:
        """A queued permit's later answer (its grant or refusal) goes to `tell`; the function
        returned gives up on it (withdraws it if it still waits). None: nothing to follow."""
        if not isinstance(outcome, scheduler_pb2.PermitEvent) or not outcome.HasField("queued"):
            return None
        return self.loop.permits.watch(
            PermitId(outcome.permit_id), lambda d: tell(self.permit_answer(d, tenant))
        )

    def settle_permit(self, tenant: str, request: scheduler_pb2.SettlePermitRequest) -> Outcome:
        """Settle, report a throttle on, or withdraw the session's permit."""
        check_session_id(request.session_id)
        require(request.permit_id, "permit_id")
        key = convert.session_key(tenant, request.session_id)
        desk, permit = self.loop.permits, PermitId(request.permit_id)
        if request.withdraw:
            return self._settled(desk.handle(Withdraw(permit, key), tenant), permit, tenant)
        usage = _usage(request.usage) if request.HasField("usage") else Usage(0.0, 0.0, 1.0)
        if not request.HasField("usage") and not request.throttled:
            raise errors.invalid_argument("usage", "required (unless throttled or withdraw)")
        retry = None
        if request.throttled:
            retry = convert.from_dur(request.retry_after) if request.HasField("retry_after") else 0.0
        if desk.budgets.permit_owner(permit) is None and not desk.issued_here(permit):
            return self._orphan(tenant, key, request, usage)
        stated = _stated(request.provider_limits) if request.HasField("provider_limits") else None
        return self._settled(desk.handle(Settle(permit, key, usage, retry, stated), tenant), permit, tenant)

    def _orphan(
        self, tenant: str, key: SessionId, request: scheduler_pb2.SettlePermitRequest, usage: Usage
    ) -> Outcome:
        """A permit of a former leader: its usage charged as a debt, so it is never lost."""
        require(request.budget, "budget")
        qos = self.permit_class(key, request.session_id, request.qos)
        if isinstance(qos, errors.RpcFailure):
            return errors.not_found(
                f"no live session {request.session_id} to charge permit {request.permit_id!r} to"
            )
        permit = PermitId(request.permit_id)
        ev = Charge(permit, key, TenantName(tenant), BudgetName(request.budget), qos, usage)
        out = self._settled(self.loop.permits.handle(ev, tenant), permit, tenant)
        if isinstance(out, scheduler_pb2.SettlePermitResponse):
            out.orphan = True
        return out

    @staticmethod
    def _settled(decisions: tuple[object, ...], permit: PermitId, tenant: str) -> Outcome:
        for d in decisions:
            if isinstance(d, PermitEnded) and d.permit == permit:  # (the common answer first)
                out = scheduler_pb2.SettlePermitResponse()
                _fill(out.charged, d.charged)  # filled in place: no messages built and copied
                _fill(out.refunded, d.refunded)
                return out
            if isinstance(d, SettleRefused) and d.permit == permit:
                return errors.from_budget_refused(d.reason.value, d.message, tenant, d.field or "usage")
            if isinstance(d, PermitWithdrawn) and d.permit == permit:
                return scheduler_pb2.SettlePermitResponse(withdrawn=True)
        return errors.unavailable()  # pragma: no cover - the core answers every settle


def _usage(u: scheduler_pb2.TokenUsage) -> Usage:
    return Usage(u.input_tokens, u.output_tokens, u.requests if u.HasField("requests") else 1.0)


def _stated(p: scheduler_pb2.ProviderLimits) -> ReportedLimits:
    """The provider's stated limit (a field unset: not stated; the core ignores nonsense)."""
    return ReportedLimits(
        p.requests_per_minute if p.HasField("requests_per_minute") else None,
        p.input_tokens_per_minute if p.HasField("input_tokens_per_minute") else None,
        p.output_tokens_per_minute if p.HasField("output_tokens_per_minute") else None,
        p.tokens_per_minute if p.HasField("tokens_per_minute") else None,
    )


def _fill(u: scheduler_pb2.TokenUsage, v: Vec) -> None:
    u.input_tokens, u.output_tokens, u.requests = v[_IN], v[_OUT], v[_REQ]


#: A unary command's operation: (ops, tenant, request) -> its Outcome (or raises a failure found
#: before any event was submitted).
UnaryOp = Callable[[SessionOps, str, Any], Outcome]

#: The server's binding of the command table: each unary command's one operation, for the
#: per-session rpc and the Channel command alike (tests/test_server_commands.py checks it covers every
#: command that is not streaming).
UNARY_OPS: Final[Mapping[Command, UnaryOp]] = MappingProxyType(
    {
        commands.RENEW: SessionOps.renew,
        commands.YIELD: SessionOps.yield_,
        commands.RELEASE: SessionOps.release,
        commands.WITHDRAW: SessionOps.withdraw,
        commands.REQUEST_PERMIT: SessionOps.request_permit,
        commands.SETTLE_PERMIT: SessionOps.settle_permit,
        commands.GET_SESSION: SessionOps.get_session,
    }
)

#: A following command's (`Command.follows`) later answers: (ops, tenant, first answer, tell)
#: -> give-up function, or None when the first answer was the last.
FollowOp = Callable[[SessionOps, str, Outcome, Callable[[Outcome], None]], Callable[[], None] | None]
FOLLOW_OPS: Final[Mapping[Command, FollowOp]] = MappingProxyType(
    {commands.REQUEST_PERMIT: SessionOps.follow_permit}
)


def _failure(decisions: list[Any]) -> errors.RpcFailure | None:
    try:
        errors.raise_for(decisions)
    except errors.RpcFailure as f:
        return f
    return None
