import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import status_pb2 as _status_pb2
from scheduler.api.gen.slotsched.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class YieldCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    YIELD_CAUSE_UNSPECIFIED: _ClassVar[YieldCause]
    YIELD_CAUSE_GUARANTEED: _ClassVar[YieldCause]
    YIELD_CAUSE_NOMINAL: _ClassVar[YieldCause]
    YIELD_CAUSE_FAIR_SHARE: _ClassVar[YieldCause]
    YIELD_CAUSE_DRAIN: _ClassVar[YieldCause]

class RevokeReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REVOKE_REASON_UNSPECIFIED: _ClassVar[RevokeReason]
    REVOKE_REASON_YIELD_DEADLINE: _ClassVar[RevokeReason]
    REVOKE_REASON_WORKER_REMOVED: _ClassVar[RevokeReason]
    REVOKE_REASON_EXPIRED: _ClassVar[RevokeReason]

class EndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    END_REASON_UNSPECIFIED: _ClassVar[EndReason]
    END_REASON_RELEASED: _ClassVar[EndReason]
    END_REASON_YIELDED: _ClassVar[EndReason]
    END_REASON_EXPIRED: _ClassVar[EndReason]
    END_REASON_WITHDRAWN: _ClassVar[EndReason]
    END_REASON_REVOKED: _ClassVar[EndReason]

class SessionPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_PHASE_UNSPECIFIED: _ClassVar[SessionPhase]
    SESSION_PHASE_QUEUED: _ClassVar[SessionPhase]
    SESSION_PHASE_HOLDING: _ClassVar[SessionPhase]
    SESSION_PHASE_YIELDING: _ClassVar[SessionPhase]
    SESSION_PHASE_ENDED: _ClassVar[SessionPhase]
YIELD_CAUSE_UNSPECIFIED: YieldCause
YIELD_CAUSE_GUARANTEED: YieldCause
YIELD_CAUSE_NOMINAL: YieldCause
YIELD_CAUSE_FAIR_SHARE: YieldCause
YIELD_CAUSE_DRAIN: YieldCause
REVOKE_REASON_UNSPECIFIED: RevokeReason
REVOKE_REASON_YIELD_DEADLINE: RevokeReason
REVOKE_REASON_WORKER_REMOVED: RevokeReason
REVOKE_REASON_EXPIRED: RevokeReason
END_REASON_UNSPECIFIED: EndReason
END_REASON_RELEASED: EndReason
END_REASON_YIELDED: EndReason
END_REASON_EXPIRED: EndReason
END_REASON_WITHDRAWN: EndReason
END_REASON_REVOKED: EndReason
SESSION_PHASE_UNSPECIFIED: SessionPhase
SESSION_PHASE_QUEUED: SessionPhase
SESSION_PHASE_HOLDING: SessionPhase
SESSION_PHASE_YIELDING: SessionPhase
SESSION_PHASE_ENDED: SessionPhase

class AcquireRequest(_message.Message):
    __slots__ = ("session_id", "qos", "resume_from", "wait_timeout", "pool", "selector", "fallback_pools")
    class SelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_POOLS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    qos: _common_pb2.QosClass
    resume_from: _common_pb2.SnapshotRef
    wait_timeout: _duration_pb2.Duration
    pool: str
    selector: _containers.ScalarMap[str, str]
    fallback_pools: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., qos: _Optional[_Union[_common_pb2.QosClass, str]] = ..., resume_from: _Optional[_Union[_common_pb2.SnapshotRef, _Mapping]] = ..., wait_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., pool: _Optional[str] = ..., selector: _Optional[_Mapping[str, str]] = ..., fallback_pools: _Optional[_Iterable[str]] = ...) -> None: ...

class LeaseEvent(_message.Message):
    __slots__ = ("queued", "granted", "yield_requested", "revoked", "ended", "yield_cancelled", "at")
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    YIELD_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    YIELD_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    queued: Queued
    granted: Granted
    yield_requested: YieldRequested
    revoked: Revoked
    ended: Ended
    yield_cancelled: YieldCancelled
    at: _timestamp_pb2.Timestamp
    def __init__(self, queued: _Optional[_Union[Queued, _Mapping]] = ..., granted: _Optional[_Union[Granted, _Mapping]] = ..., yield_requested: _Optional[_Union[YieldRequested, _Mapping]] = ..., revoked: _Optional[_Union[Revoked, _Mapping]] = ..., ended: _Optional[_Union[Ended, _Mapping]] = ..., yield_cancelled: _Optional[_Union[YieldCancelled, _Mapping]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Queued(_message.Message):
    __slots__ = ("position", "estimated_wait", "pool", "reason")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_WAIT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    position: int
    estimated_wait: _duration_pb2.Duration
    pool: str
    reason: str
    def __init__(self, position: _Optional[int] = ..., estimated_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., pool: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Granted(_message.Message):
    __slots__ = ("lease", "waited", "grant")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    WAITED_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    lease: _common_pb2.Lease
    waited: _duration_pb2.Duration
    grant: str
    def __init__(self, lease: _Optional[_Union[_common_pb2.Lease, _Mapping]] = ..., waited: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., grant: _Optional[str] = ...) -> None: ...

class YieldRequested(_message.Message):
    __slots__ = ("lease_id", "epoch", "deadline", "cause")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    epoch: int
    deadline: _timestamp_pb2.Timestamp
    cause: YieldCause
    def __init__(self, lease_id: _Optional[str] = ..., epoch: _Optional[int] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cause: _Optional[_Union[YieldCause, str]] = ...) -> None: ...

class YieldCancelled(_message.Message):
    __slots__ = ("lease_id", "epoch")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    epoch: int
    def __init__(self, lease_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class Revoked(_message.Message):
    __slots__ = ("lease_id", "epoch", "reason", "lost_slot_seconds", "resume_from")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LOST_SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    epoch: int
    reason: RevokeReason
    lost_slot_seconds: float
    resume_from: _common_pb2.SnapshotRef
    def __init__(self, lease_id: _Optional[str] = ..., epoch: _Optional[int] = ..., reason: _Optional[_Union[RevokeReason, str]] = ..., lost_slot_seconds: _Optional[float] = ..., resume_from: _Optional[_Union[_common_pb2.SnapshotRef, _Mapping]] = ...) -> None: ...

class Ended(_message.Message):
    __slots__ = ("reason", "lease_id", "epoch", "session_over")
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SESSION_OVER_FIELD_NUMBER: _ClassVar[int]
    reason: EndReason
    lease_id: str
    epoch: int
    session_over: bool
    def __init__(self, reason: _Optional[_Union[EndReason, str]] = ..., lease_id: _Optional[str] = ..., epoch: _Optional[int] = ..., session_over: _Optional[bool] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id", "lease_id", "epoch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    lease_id: str
    epoch: int
    def __init__(self, session_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: EndReason
    def __init__(self, reason: _Optional[_Union[EndReason, str]] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("session_id", "lease_id", "epoch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    lease_id: str
    epoch: int
    def __init__(self, session_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("expires_at", "state", "yield_deadline", "grant")
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    YIELD_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    expires_at: _timestamp_pb2.Timestamp
    state: _common_pb2.LeaseState
    yield_deadline: _timestamp_pb2.Timestamp
    grant: str
    def __init__(self, expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[_common_pb2.LeaseState, str]] = ..., yield_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., grant: _Optional[str] = ...) -> None: ...

class YieldRequest(_message.Message):
    __slots__ = ("session_id", "lease_id", "epoch", "snapshot")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    lease_id: str
    epoch: int
    snapshot: _common_pb2.SnapshotRef
    def __init__(self, session_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., epoch: _Optional[int] = ..., snapshot: _Optional[_Union[_common_pb2.SnapshotRef, _Mapping]] = ...) -> None: ...

class YieldResponse(_message.Message):
    __slots__ = ("position",)
    POSITION_FIELD_NUMBER: _ClassVar[int]
    position: int
    def __init__(self, position: _Optional[int] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class SessionState(_message.Message):
    __slots__ = ("session_id", "state", "lease", "position", "estimated_wait", "last_snapshot", "qos", "tenant", "queued_since", "end_reason", "grant", "pool", "wait_reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_WAIT_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_SINCE_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    WAIT_REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    state: SessionPhase
    lease: _common_pb2.Lease
    position: int
    estimated_wait: _duration_pb2.Duration
    last_snapshot: _common_pb2.SnapshotRef
    qos: _common_pb2.QosClass
    tenant: str
    queued_since: _timestamp_pb2.Timestamp
    end_reason: EndReason
    grant: str
    pool: str
    wait_reason: str
    def __init__(self, session_id: _Optional[str] = ..., state: _Optional[_Union[SessionPhase, str]] = ..., lease: _Optional[_Union[_common_pb2.Lease, _Mapping]] = ..., position: _Optional[int] = ..., estimated_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., last_snapshot: _Optional[_Union[_common_pb2.SnapshotRef, _Mapping]] = ..., qos: _Optional[_Union[_common_pb2.QosClass, str]] = ..., tenant: _Optional[str] = ..., queued_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_reason: _Optional[_Union[EndReason, str]] = ..., grant: _Optional[str] = ..., pool: _Optional[str] = ..., wait_reason: _Optional[str] = ...) -> None: ...

class ChannelRequest(_message.Message):
    __slots__ = ("commands",)
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[ChannelCommand]
    def __init__(self, commands: _Optional[_Iterable[_Union[ChannelCommand, _Mapping]]] = ...) -> None: ...

class ChannelCommand(_message.Message):
    __slots__ = ("ref", "acquire", "renew", "yield_slot", "release", "withdraw", "request_permit", "settle_permit")
    REF_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    YIELD_SLOT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    REQUEST_PERMIT_FIELD_NUMBER: _ClassVar[int]
    SETTLE_PERMIT_FIELD_NUMBER: _ClassVar[int]
    ref: int
    acquire: AcquireRequest
    renew: RenewRequest
    yield_slot: YieldRequest
    release: ReleaseRequest
    withdraw: WithdrawRequest
    request_permit: RequestPermitRequest
    settle_permit: SettlePermitRequest
    def __init__(self, ref: _Optional[int] = ..., acquire: _Optional[_Union[AcquireRequest, _Mapping]] = ..., renew: _Optional[_Union[RenewRequest, _Mapping]] = ..., yield_slot: _Optional[_Union[YieldRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ..., withdraw: _Optional[_Union[WithdrawRequest, _Mapping]] = ..., request_permit: _Optional[_Union[RequestPermitRequest, _Mapping]] = ..., settle_permit: _Optional[_Union[SettlePermitRequest, _Mapping]] = ...) -> None: ...

class WithdrawRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ChannelResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[ChannelEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[ChannelEvent, _Mapping]]] = ...) -> None: ...

class ChannelEvent(_message.Message):
    __slots__ = ("session_id", "ref", "event", "renewed", "yielded", "released", "error", "permit", "settled")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    YIELDED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PERMIT_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    ref: int
    event: LeaseEvent
    renewed: RenewResponse
    yielded: YieldResponse
    released: ReleaseResponse
    error: SessionError
    permit: PermitEvent
    settled: SettlePermitResponse
    def __init__(self, session_id: _Optional[str] = ..., ref: _Optional[int] = ..., event: _Optional[_Union[LeaseEvent, _Mapping]] = ..., renewed: _Optional[_Union[RenewResponse, _Mapping]] = ..., yielded: _Optional[_Union[YieldResponse, _Mapping]] = ..., released: _Optional[_Union[ReleaseResponse, _Mapping]] = ..., error: _Optional[_Union[SessionError, _Mapping]] = ..., permit: _Optional[_Union[PermitEvent, _Mapping]] = ..., settled: _Optional[_Union[SettlePermitResponse, _Mapping]] = ...) -> None: ...

class SessionError(_message.Message):
    __slots__ = ("status", "trailers")
    class TrailersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TRAILERS_FIELD_NUMBER: _ClassVar[int]
    status: _status_pb2.Status
    trailers: _containers.ScalarMap[str, str]
    def __init__(self, status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., trailers: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TokenUsage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "requests")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: float
    output_tokens: float
    requests: float
    def __init__(self, input_tokens: _Optional[float] = ..., output_tokens: _Optional[float] = ..., requests: _Optional[float] = ...) -> None: ...

class RequestPermitRequest(_message.Message):
    __slots__ = ("session_id", "budget", "estimate", "qos")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    budget: str
    estimate: TokenUsage
    qos: _common_pb2.QosClass
    def __init__(self, session_id: _Optional[str] = ..., budget: _Optional[str] = ..., estimate: _Optional[_Union[TokenUsage, _Mapping]] = ..., qos: _Optional[_Union[_common_pb2.QosClass, str]] = ...) -> None: ...

class PermitEvent(_message.Message):
    __slots__ = ("permit_id", "budget", "granted", "queued")
    PERMIT_ID_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    permit_id: str
    budget: str
    granted: PermitGranted
    queued: PermitQueued
    def __init__(self, permit_id: _Optional[str] = ..., budget: _Optional[str] = ..., granted: _Optional[_Union[PermitGranted, _Mapping]] = ..., queued: _Optional[_Union[PermitQueued, _Mapping]] = ...) -> None: ...

class PermitGranted(_message.Message):
    __slots__ = ("expires_at", "waited")
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    WAITED_FIELD_NUMBER: _ClassVar[int]
    expires_at: _timestamp_pb2.Timestamp
    waited: _duration_pb2.Duration
    def __init__(self, expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., waited: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class PermitQueued(_message.Message):
    __slots__ = ("position", "estimated_wait", "reason")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_WAIT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    position: int
    estimated_wait: _duration_pb2.Duration
    reason: str
    def __init__(self, position: _Optional[int] = ..., estimated_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class SettlePermitRequest(_message.Message):
    __slots__ = ("session_id", "permit_id", "budget", "usage", "throttled", "retry_after", "withdraw", "provider_limits", "qos")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PERMIT_ID_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_LIMITS_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    permit_id: str
    budget: str
    usage: TokenUsage
    throttled: bool
    retry_after: _duration_pb2.Duration
    withdraw: bool
    provider_limits: ProviderLimits
    qos: _common_pb2.QosClass
    def __init__(self, session_id: _Optional[str] = ..., permit_id: _Optional[str] = ..., budget: _Optional[str] = ..., usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., throttled: _Optional[bool] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., withdraw: _Optional[bool] = ..., provider_limits: _Optional[_Union[ProviderLimits, _Mapping]] = ..., qos: _Optional[_Union[_common_pb2.QosClass, str]] = ...) -> None: ...

class ProviderLimits(_message.Message):
    __slots__ = ("requests_per_minute", "input_tokens_per_minute", "output_tokens_per_minute", "tokens_per_minute")
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    requests_per_minute: float
    input_tokens_per_minute: float
    output_tokens_per_minute: float
    tokens_per_minute: float
    def __init__(self, requests_per_minute: _Optional[float] = ..., input_tokens_per_minute: _Optional[float] = ..., output_tokens_per_minute: _Optional[float] = ..., tokens_per_minute: _Optional[float] = ...) -> None: ...

class SettlePermitResponse(_message.Message):
    __slots__ = ("charged", "refunded", "withdrawn", "orphan")
    CHARGED_FIELD_NUMBER: _ClassVar[int]
    REFUNDED_FIELD_NUMBER: _ClassVar[int]
    WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    ORPHAN_FIELD_NUMBER: _ClassVar[int]
    charged: TokenUsage
    refunded: TokenUsage
    withdrawn: bool
    orphan: bool
    def __init__(self, charged: _Optional[_Union[TokenUsage, _Mapping]] = ..., refunded: _Optional[_Union[TokenUsage, _Mapping]] = ..., withdrawn: _Optional[bool] = ..., orphan: _Optional[bool] = ...) -> None: ...
