import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QosClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QOS_CLASS_UNSPECIFIED: _ClassVar[QosClass]
    QOS_CLASS_GUARANTEED: _ClassVar[QosClass]
    QOS_CLASS_BURSTABLE: _ClassVar[QosClass]
    QOS_CLASS_BEST_EFFORT: _ClassVar[QosClass]

class LeaseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_STATE_UNSPECIFIED: _ClassVar[LeaseState]
    LEASE_STATE_ACTIVE: _ClassVar[LeaseState]
    LEASE_STATE_YIELDING: _ClassVar[LeaseState]
QOS_CLASS_UNSPECIFIED: QosClass
QOS_CLASS_GUARANTEED: QosClass
QOS_CLASS_BURSTABLE: QosClass
QOS_CLASS_BEST_EFFORT: QosClass
LEASE_STATE_UNSPECIFIED: LeaseState
LEASE_STATE_ACTIVE: LeaseState
LEASE_STATE_YIELDING: LeaseState

class SnapshotRef(_message.Message):
    __slots__ = ("uri", "size_bytes", "sha256", "created", "pool", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    URI_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    uri: str
    size_bytes: int
    sha256: str
    created: _timestamp_pb2.Timestamp
    pool: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, uri: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., created: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pool: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Slot(_message.Message):
    __slots__ = ("worker_id", "index")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    index: int
    def __init__(self, worker_id: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "session_id", "slot", "worker_address", "epoch", "expires_at", "resume_from", "qos", "tenant", "granted_at", "state", "yield_deadline", "pool")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    YIELD_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    session_id: str
    slot: Slot
    worker_address: str
    epoch: int
    expires_at: _timestamp_pb2.Timestamp
    resume_from: SnapshotRef
    qos: QosClass
    tenant: str
    granted_at: _timestamp_pb2.Timestamp
    state: LeaseState
    yield_deadline: _timestamp_pb2.Timestamp
    pool: str
    def __init__(self, lease_id: _Optional[str] = ..., session_id: _Optional[str] = ..., slot: _Optional[_Union[Slot, _Mapping]] = ..., worker_address: _Optional[str] = ..., epoch: _Optional[int] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resume_from: _Optional[_Union[SnapshotRef, _Mapping]] = ..., qos: _Optional[_Union[QosClass, str]] = ..., tenant: _Optional[str] = ..., granted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[LeaseState, str]] = ..., yield_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pool: _Optional[str] = ...) -> None: ...
