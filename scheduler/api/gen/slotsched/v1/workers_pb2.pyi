import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from scheduler.api.gen.slotsched.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("worker_id", "address", "slots", "labels", "slot_epochs", "pool")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SlotEpochsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SLOT_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    slots: int
    labels: _containers.ScalarMap[str, str]
    slot_epochs: _containers.ScalarMap[int, int]
    pool: str
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., slots: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., slot_epochs: _Optional[_Mapping[int, int]] = ..., pool: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("heartbeat_interval", "grant_keys", "pool", "compatibility_labels", "labels")
    class CompatibilityLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    GRANT_KEYS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_LABELS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval: _duration_pb2.Duration
    grant_keys: _containers.RepeatedCompositeFieldContainer[GrantKey]
    pool: str
    compatibility_labels: _containers.ScalarMap[str, str]
    labels: _containers.ScalarMap[str, str]
    def __init__(self, heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., grant_keys: _Optional[_Iterable[_Union[GrantKey, _Mapping]]] = ..., pool: _Optional[str] = ..., compatibility_labels: _Optional[_Mapping[str, str]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GrantKey(_message.Message):
    __slots__ = ("key_id", "key")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    key: bytes
    def __init__(self, key_id: _Optional[str] = ..., key: _Optional[bytes] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "rss_bytes", "uptime_seconds")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    rss_bytes: int
    uptime_seconds: float
    def __init__(self, worker_id: _Optional[str] = ..., rss_bytes: _Optional[int] = ..., uptime_seconds: _Optional[float] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("draining", "leases", "grant_keys")
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    GRANT_KEYS_FIELD_NUMBER: _ClassVar[int]
    draining: bool
    leases: _containers.RepeatedCompositeFieldContainer[_common_pb2.Lease]
    grant_keys: _containers.RepeatedCompositeFieldContainer[GrantKey]
    def __init__(self, draining: _Optional[bool] = ..., leases: _Optional[_Iterable[_Union[_common_pb2.Lease, _Mapping]]] = ..., grant_keys: _Optional[_Iterable[_Union[GrantKey, _Mapping]]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("worker_id", "yield_within")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    YIELD_WITHIN_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    yield_within: _duration_pb2.Duration
    def __init__(self, worker_id: _Optional[str] = ..., yield_within: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("leases", "estimated_drain")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_DRAIN_FIELD_NUMBER: _ClassVar[int]
    leases: int
    estimated_drain: _duration_pb2.Duration
    def __init__(self, leases: _Optional[int] = ..., estimated_drain: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = ("revoked",)
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    revoked: int
    def __init__(self, revoked: _Optional[int] = ...) -> None: ...
