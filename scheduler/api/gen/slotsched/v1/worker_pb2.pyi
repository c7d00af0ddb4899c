from scheduler.api.gen.slotsched.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StartRequest(_message.Message):
    __slots__ = ("session_id", "tenant", "slot", "lease_id", "epoch", "resume_from", "grant")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant: str
    slot: _common_pb2.Slot
    lease_id: str
    epoch: int
    resume_from: _common_pb2.SnapshotRef
    grant: str
    def __init__(self, session_id: _Optional[str] = ..., tenant: _Optional[str] = ..., slot: _Optional[_Union[_common_pb2.Slot, _Mapping]] = ..., lease_id: _Optional[str] = ..., epoch: _Optional[int] = ..., resume_from: _Optional[_Union[_common_pb2.SnapshotRef, _Mapping]] = ..., grant: _Optional[str] = ...) -> None: ...

class StartResponse(_message.Message):
    __slots__ = ("turns", "state_sha256")
    TURNS_FIELD_NUMBER: _ClassVar[int]
    STATE_SHA256_FIELD_NUMBER: _ClassVar[int]
    turns: int
    state_sha256: str
    def __init__(self, turns: _Optional[int] = ..., state_sha256: _Optional[str] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("session_id", "tenant", "lease_id", "epoch", "grant")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant: str
    lease_id: str
    epoch: int
    grant: str
    def __init__(self, session_id: _Optional[str] = ..., tenant: _Optional[str] = ..., lease_id: _Optional[str] = ..., epoch: _Optional[int] = ..., grant: _Optional[str] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("session_id", "tenant", "lease_id", "epoch", "grant")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant: str
    lease_id: str
    epoch: int
    grant: str
    def __init__(self, session_id: _Optional[str] = ..., tenant: _Optional[str] = ..., lease_id: _Optional[str] = ..., epoch: _Optional[int] = ..., grant: _Optional[str] = ...) -> None: ...

class StopResponse(_message.Message):
    __slots__ = ("stopped",)
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    stopped: bool
    def __init__(self, stopped: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("grants",)
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, grants: _Optional[_Iterable[str]] = ...) -> None: ...

class SlotStatus(_message.Message):
    __slots__ = ("index", "session_id", "tenant", "lease_id", "epoch", "turns", "state_bytes", "state_sha256", "other")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_SHA256_FIELD_NUMBER: _ClassVar[int]
    OTHER_FIELD_NUMBER: _ClassVar[int]
    index: int
    session_id: str
    tenant: str
    lease_id: str
    epoch: int
    turns: int
    state_bytes: int
    state_sha256: str
    other: bool
    def __init__(self, index: _Optional[int] = ..., session_id: _Optional[str] = ..., tenant: _Optional[str] = ..., lease_id: _Optional[str] = ..., epoch: _Optional[int] = ..., turns: _Optional[int] = ..., state_bytes: _Optional[int] = ..., state_sha256: _Optional[str] = ..., other: _Optional[bool] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("worker_id", "slots")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    slots: _containers.RepeatedCompositeFieldContainer[SlotStatus]
    def __init__(self, worker_id: _Optional[str] = ..., slots: _Optional[_Iterable[_Union[SlotStatus, _Mapping]]] = ...) -> None: ...
