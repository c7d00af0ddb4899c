import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from scheduler.api.gen.slotsched.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_ACTIVE: _ClassVar[WorkerState]
    WORKER_STATE_DRAINING: _ClassVar[WorkerState]
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_ACTIVE: WorkerState
WORKER_STATE_DRAINING: WorkerState

class GetPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPolicyResponse(_message.Message):
    __slots__ = ("yaml", "name")
    YAML_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    yaml: str
    name: str
    def __init__(self, yaml: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ApplyPolicyRequest(_message.Message):
    __slots__ = ("yaml", "dry_run")
    YAML_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    yaml: str
    dry_run: bool
    def __init__(self, yaml: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ApplyPolicyResponse(_message.Message):
    __slots__ = ("warnings", "applied")
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    applied: bool
    def __init__(self, warnings: _Optional[_Iterable[str]] = ..., applied: _Optional[bool] = ...) -> None: ...

class DescribePoolRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "address", "slots", "busy", "state", "labels", "last_heartbeat")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    slots: int
    busy: int
    state: WorkerState
    labels: _containers.ScalarMap[str, str]
    last_heartbeat: _timestamp_pb2.Timestamp
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., slots: _Optional[int] = ..., busy: _Optional[int] = ..., state: _Optional[_Union[WorkerState, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., last_heartbeat: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ClassStats(_message.Message):
    __slots__ = ("qos", "held", "pending", "yielding")
    QOS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    YIELDING_FIELD_NUMBER: _ClassVar[int]
    qos: _common_pb2.QosClass
    held: int
    pending: int
    yielding: int
    def __init__(self, qos: _Optional[_Union[_common_pb2.QosClass, str]] = ..., held: _Optional[int] = ..., pending: _Optional[int] = ..., yielding: _Optional[int] = ...) -> None: ...

class ClassCounts(_message.Message):
    __slots__ = ("guaranteed", "burstable", "best_effort")
    GUARANTEED_FIELD_NUMBER: _ClassVar[int]
    BURSTABLE_FIELD_NUMBER: _ClassVar[int]
    BEST_EFFORT_FIELD_NUMBER: _ClassVar[int]
    guaranteed: int
    burstable: int
    best_effort: int
    def __init__(self, guaranteed: _Optional[int] = ..., burstable: _Optional[int] = ..., best_effort: _Optional[int] = ...) -> None: ...

class TenantStats(_message.Message):
    __slots__ = ("tenant", "weight", "held", "pending", "borrowed", "fair_share", "guaranteed_quota", "burstable_nominal", "burstable_limit", "best_effort_limit")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARE_FIELD_NUMBER: _ClassVar[int]
    GUARANTEED_QUOTA_FIELD_NUMBER: _ClassVar[int]
    BURSTABLE_NOMINAL_FIELD_NUMBER: _ClassVar[int]
    BURSTABLE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    BEST_EFFORT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    weight: float
    held: ClassCounts
    pending: ClassCounts
    borrowed: int
    fair_share: float
    guaranteed_quota: int
    burstable_nominal: int
    burstable_limit: int
    best_effort_limit: int
    def __init__(self, tenant: _Optional[str] = ..., weight: _Optional[float] = ..., held: _Optional[_Union[ClassCounts, _Mapping]] = ..., pending: _Optional[_Union[ClassCounts, _Mapping]] = ..., borrowed: _Optional[int] = ..., fair_share: _Optional[float] = ..., guaranteed_quota: _Optional[int] = ..., burstable_nominal: _Optional[int] = ..., burstable_limit: _Optional[int] = ..., best_effort_limit: _Optional[int] = ...) -> None: ...

class DescribePoolResponse(_message.Message):
    __slots__ = ("capacity", "free", "floor", "workers", "classes", "tenants", "at", "pool", "pools", "labels", "leader", "budgets")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    free: int
    floor: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    classes: _containers.RepeatedCompositeFieldContainer[ClassStats]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantStats]
    at: _timestamp_pb2.Timestamp
    pool: str
    pools: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    leader: PoolLeader
    budgets: _containers.RepeatedCompositeFieldContainer[BudgetStatus]
    def __init__(self, capacity: _Optional[int] = ..., free: _Optional[int] = ..., floor: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ..., classes: _Optional[_Iterable[_Union[ClassStats, _Mapping]]] = ..., tenants: _Optional[_Iterable[_Union[TenantStats, _Mapping]]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pool: _Optional[str] = ..., pools: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., leader: _Optional[_Union[PoolLeader, _Mapping]] = ..., budgets: _Optional[_Iterable[_Union[BudgetStatus, _Mapping]]] = ...) -> None: ...

class BudgetStatus(_message.Message):
    __slots__ = ("name", "factor", "limits_per_minute", "available", "waiting", "open")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    LIMITS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    factor: float
    limits_per_minute: _containers.RepeatedScalarFieldContainer[float]
    available: _containers.RepeatedScalarFieldContainer[float]
    waiting: int
    open: int
    def __init__(self, name: _Optional[str] = ..., factor: _Optional[float] = ..., limits_per_minute: _Optional[_Iterable[float]] = ..., available: _Optional[_Iterable[float]] = ..., waiting: _Optional[int] = ..., open: _Optional[int] = ...) -> None: ...

class PoolLeader(_message.Message):
    __slots__ = ("replica_id", "address", "term")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    term: str
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., term: _Optional[str] = ...) -> None: ...

class ListLeasesRequest(_message.Message):
    __slots__ = ("tenant", "qos", "page_size", "page_token", "pool")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    qos: _common_pb2.QosClass
    page_size: int
    page_token: str
    pool: str
    def __init__(self, tenant: _Optional[str] = ..., qos: _Optional[_Union[_common_pb2.QosClass, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class ListLeasesResponse(_message.Message):
    __slots__ = ("leases", "next_page_token")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[_common_pb2.Lease]
    next_page_token: str
    def __init__(self, leases: _Optional[_Iterable[_Union[_common_pb2.Lease, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListQueueRequest(_message.Message):
    __slots__ = ("tenant", "qos", "page_size", "page_token", "pool")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    qos: _common_pb2.QosClass
    page_size: int
    page_token: str
    pool: str
    def __init__(self, tenant: _Optional[str] = ..., qos: _Optional[_Union[_common_pb2.QosClass, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class QueuedEntry(_message.Message):
    __slots__ = ("session_id", "tenant", "qos", "position", "waited", "resume_from", "estimated_wait", "pool", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    WAITED_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_WAIT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant: str
    qos: _common_pb2.QosClass
    position: int
    waited: _duration_pb2.Duration
    resume_from: _common_pb2.SnapshotRef
    estimated_wait: _duration_pb2.Duration
    pool: str
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., tenant: _Optional[str] = ..., qos: _Optional[_Union[_common_pb2.QosClass, str]] = ..., position: _Optional[int] = ..., waited: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., resume_from: _Optional[_Union[_common_pb2.SnapshotRef, _Mapping]] = ..., estimated_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., pool: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ListQueueResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[QueuedEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[QueuedEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
