"""Client-side value types of the SDK and their conversion to and from the slotsched.v1 protos.

Why separate types from the generated messages: protobuf messages are mutable, carry wire-level
conventions (`_UNSPECIFIED` enums, unset-vs-empty submessages, Timestamp/Duration wrappers) and
are awkward to compare or hash. A runtime holding a lease wants plain frozen values it can pass
to its own code (a worker client, a logger) without touching protobuf. Every conversion lives
here, so the rest of the SDK never reads a proto field directly.

Two of these share a name with a type of the scheduler's own, and are not the same: users import
them as `scheduler.client.QoS` and `scheduler.client.SnapshotRef`, and inside the SDK (and in code
that meets both, like the reference worker) they are `ClientQoS` and `ClientSnapshotRef`:

* `ClientQoS` is the class a runtime asks for, as it travels (`to_proto`, `parse` accepting
  "best_effort"); `scheduler.core.types.QoS` is the policy core's (its member is `BEST_EFFORT`),
  which the SDK may not import (the SDK imports nothing server-side, tests/test_architecture.py).
* `ClientSnapshotRef` is a snapshot as the API shows it: `created` an aware datetime (or None),
  refused at construction when over the wire's limits, converted to and from the proto.
  `snapshots.ref.SnapshotRef` is the domain record the core, the journal and the snapshot stores
  share (`created` in float seconds, no wire limits); the server converts between the two.
  One type for both would change the public type of `created` and put wire limits on the
  stores' records.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from google.protobuf import duration_pb2, timestamp_pb2

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.api.wire import MAX_LONG_STRING_BYTES, MAX_STRING_BYTES
from scheduler.client.phases import Phase
from scheduler.grants import core_lease_id

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The range a Timestamp may hold (0001-01-01 to 9999-12-31), as protobuf checks it.
_MIN_SECONDS, _MAX_SECONDS = -62135596800, 253402300799


def timestamp(ts: timestamp_pb2.Timestamp) -> datetime:
    """`ts.ToDatetime(tzinfo=UTC)`, the same value at a fraction of its cost (every event carries
    a few timestamps); one out of range is left to protobuf, which refuses it."""
    seconds, nanos = ts.seconds, ts.nanos
    if _MIN_SECONDS <= seconds <= _MAX_SECONDS and 0 <= nanos < 1_000_000_000:
        return _EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)
    return ts.ToDatetime(tzinfo=UTC)


def _opt_ts(msg: object, field: str) -> datetime | None:
    """A Timestamp field as an aware UTC datetime, or None when unset."""
    if not msg.HasField(field):  # type: ignore[attr-defined]
        return None
    value: timestamp_pb2.Timestamp = getattr(msg, field)
    return timestamp(value)


def _opt_seconds(msg: object, field: str) -> float | None:
    """A Duration field in seconds, or None when unset."""
    if not msg.HasField(field):  # type: ignore[attr-defined]
        return None
    value: duration_pb2.Duration = getattr(msg, field)
    return value.ToNanoseconds() / 1e9


class ClientQoS(enum.StrEnum):
    """A QoS class (a resource contract, not a rank); see DESIGN.md "QoS classes". Public as
    `scheduler.client.QoS` (not the core's `QoS`: module doc)."""

    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"

    def to_proto(self) -> common_pb2.QosClass:
        return _QOS_TO_PROTO[self]

    @classmethod
    def from_proto(cls, value: int) -> ClientQoS:
        """The class for a wire value; ValueError for QOS_CLASS_UNSPECIFIED or unknown values."""
        try:
            return _QOS_FROM_PROTO[value]
        except KeyError:
            raise ValueError(f"not a valid QoS class on the wire: {value}") from None

    @classmethod
    def parse(cls, value: ClientQoS | str) -> ClientQoS:
        """Accept a QoS, or a case-insensitive name ("guaranteed", "best_effort", "BestEffort")."""
        if isinstance(value, ClientQoS):
            return value
        key = value.strip().lower().replace("_", "").replace("-", "")
        try:
            return cls(key)
        except ValueError:
            raise ValueError(
                f"unknown QoS class {value!r}; expected one of {[q.value for q in cls]}"
            ) from None


#: The name users know it by.
QoS = ClientQoS

_QOS_TO_PROTO: dict[QoS, common_pb2.QosClass] = {
    QoS.GUARANTEED: common_pb2.QOS_CLASS_GUARANTEED,
    QoS.BURSTABLE: common_pb2.QOS_CLASS_BURSTABLE,
    QoS.BESTEFFORT: common_pb2.QOS_CLASS_BEST_EFFORT,
}
_QOS_FROM_PROTO: dict[int, QoS] = {int(v): k for k, v in _QOS_TO_PROTO.items()}


@dataclass(frozen=True)
class ClientSnapshotRef:
    """Where a checkpoint of an actor lives in the snapshot store (uri is required and non-empty).
    Public as `scheduler.client.SnapshotRef` (not `snapshots.ref.SnapshotRef`: module doc)."""

    uri: str
    size_bytes: int = 0
    sha256: str = ""
    created: datetime | None = None
    #: The pool the snapshot was taken on and that pool's compatibility labels (cpuModel, ...):
    #: a session resuming from it goes only to a pool whose labels match. The worker and the
    #: scheduler stamp them; a ref made by hand may leave them empty (no constraint of its own).
    pool: str = ""
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not self.uri:
            raise ValueError("SnapshotRef.uri must not be empty")
        object.__setattr__(self, "labels", dict(self.labels))  # a copy: the ref stays as made
        # The scheduler's wire limits (scheduler/api/wire.py, enforced by its guard.py): over them,
        # the Acquire or Yield that quotes this ref is refused; say so here, where it is made.
        for name, value, limit in (
            ("uri", self.uri, MAX_LONG_STRING_BYTES),
            ("sha256", self.sha256, MAX_STRING_BYTES),
        ):
            if len(value.encode()) > limit:
                raise ValueError(f"SnapshotRef.{name} is {len(value.encode())} bytes: at most {limit}")
        for key, value in self.labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"SnapshotRef.labels: keys and values are strings (got {key!r}: {value!r})")

    def to_proto(self) -> common_pb2.SnapshotRef:
        msg = common_pb2.SnapshotRef(
            uri=self.uri, size_bytes=self.size_bytes, sha256=self.sha256, pool=self.pool, labels=self.labels
        )
        if self.created is not None:
            msg.created.FromDatetime(self.created)
        return msg

    @classmethod
    def from_proto(cls, msg: common_pb2.SnapshotRef) -> ClientSnapshotRef:
        return cls(
            uri=msg.uri,
            size_bytes=msg.size_bytes,
            sha256=msg.sha256,
            created=_opt_ts(msg, "created"),
            pool=msg.pool,
            labels=dict(msg.labels),
        )

    @classmethod
    def from_optional(cls, parent: object, field: str) -> ClientSnapshotRef | None:
        """The SnapshotRef in `parent.field`, or None when the field is unset or has no uri."""
        if not parent.HasField(field):  # type: ignore[attr-defined]
            return None
        msg: common_pb2.SnapshotRef = getattr(parent, field)
        return cls.from_proto(msg) if msg.uri else None


#: The name users know it by.
SnapshotRef = ClientSnapshotRef


@dataclass(frozen=True)
class Slot:
    """One place an actor can run: slot `index` of worker `worker_id` (written `worker_id/index`)."""

    worker_id: str
    index: int

    def __str__(self) -> str:
        return f"{self.worker_id}/{self.index}"

    def to_proto(self) -> common_pb2.Slot:
        return common_pb2.Slot(worker_id=self.worker_id, index=self.index)

    @classmethod
    def from_proto(cls, msg: common_pb2.Slot) -> Slot:
        return cls(worker_id=msg.worker_id, index=msg.index)


def lease_key(lease_id: str, epoch: int) -> tuple[str, int]:
    """What identifies a lease: its id without the scheduler's tag, and its epoch. After a
    signing-key switch the scheduler reports the same lease with a newly tagged id."""
    return core_lease_id(lease_id), epoch


@dataclass(frozen=True)
class LeaseInfo:
    """A session's hold on a slot, as last reported by the server (a snapshot: a re-grant after a
    yield or revocation produces a new LeaseInfo with a new lease_id/epoch)."""

    session_id: str
    lease_id: str
    epoch: int
    slot: Slot
    worker_address: str
    expires_at: datetime | None
    resume_from: SnapshotRef | None
    qos: QoS | None
    tenant: str = ""
    granted_at: datetime | None = None
    #: Set once the server asked this lease to yield: checkpoint and yield before it, or the lease
    #: is revoked and the session resumes from its previous snapshot. In this machine's clock (the
    #: SDK converts the server's deadline with the skew seen on the stream).
    yield_deadline: datetime | None = None
    #: The scheduler's signed grant (`Granted.grant`, refreshed by every Renew): what the Worker
    #: service's Start, Checkpoint and Stop require. Opaque; kept out of repr (it is a credential).
    grant: str = field(default="", repr=False)
    #: The pool the lease is in (the one it named, or the one its selector or fallback chose).
    pool: str = ""

    @property
    def key(self) -> tuple[str, int]:
        """(lease id without its tag, epoch): the same lease whatever key tagged its id."""
        return lease_key(self.lease_id, self.epoch)

    def to_proto(self) -> common_pb2.Lease:
        msg = common_pb2.Lease(
            lease_id=self.lease_id,
            session_id=self.session_id,
            slot=self.slot.to_proto(),
            worker_address=self.worker_address,
            epoch=self.epoch,
            tenant=self.tenant,
            pool=self.pool,
        )
        if self.qos is not None:
            msg.qos = self.qos.to_proto()
        if self.expires_at is not None:
            msg.expires_at.FromDatetime(self.expires_at)
        if self.granted_at is not None:
            msg.granted_at.FromDatetime(self.granted_at)
        if self.yield_deadline is not None:
            msg.yield_deadline.FromDatetime(self.yield_deadline)
            msg.state = common_pb2.LEASE_STATE_YIELDING
        if self.resume_from is not None:
            msg.resume_from.CopyFrom(self.resume_from.to_proto())
        return msg

    @classmethod
    def from_proto(cls, msg: common_pb2.Lease, grant: str = "") -> LeaseInfo:
        qos = _QOS_FROM_PROTO.get(int(msg.qos))
        return cls(
            session_id=msg.session_id,
            lease_id=msg.lease_id,
            epoch=msg.epoch,
            slot=Slot.from_proto(msg.slot),
            worker_address=msg.worker_address,
            expires_at=_opt_ts(msg, "expires_at"),
            resume_from=SnapshotRef.from_optional(msg, "resume_from"),
            qos=qos,
            tenant=msg.tenant,
            granted_at=_opt_ts(msg, "granted_at"),
            yield_deadline=_opt_ts(msg, "yield_deadline"),
            grant=grant,
            pool=msg.pool,
        )


@dataclass(frozen=True)
class QueueInfo:
    """Where a queued request stands: position 0 is next; the estimate is a guess (None = none
    yet); the pool it waits in and why it waits there (`pool_exhausted`, `tenant_quota`,
    `tenant_limit`, `yield_pending`; see the proto's Queued.reason)."""

    position: int
    estimated_wait_s: float | None = None
    pool: str = ""
    reason: str = ""

    def to_proto(self) -> scheduler_pb2.Queued:
        msg = scheduler_pb2.Queued(position=self.position, pool=self.pool, reason=self.reason)
        if self.estimated_wait_s is not None:
            msg.estimated_wait.FromNanoseconds(round(self.estimated_wait_s * 1e9))
        return msg

    @classmethod
    def from_proto(cls, msg: scheduler_pb2.Queued) -> QueueInfo:
        return cls(msg.position, _opt_seconds(msg, "estimated_wait"), msg.pool, msg.reason)


def end_reason_name(value: int) -> str:
    """`END_REASON_RELEASED` -> "released" (and "unspecified" for unknown values)."""
    try:
        name = scheduler_pb2.EndReason.Name(value)
    except ValueError:
        return "unspecified"
    return name.removeprefix("END_REASON_").lower()


@dataclass(frozen=True)
class SessionInfo:
    """A session's state read with GetSession (without attaching to it)."""

    session_id: str
    phase: Phase
    lease: LeaseInfo | None
    queue: QueueInfo | None
    last_snapshot: SnapshotRef | None
    qos: QoS | None
    tenant: str
    end_reason: str | None
    #: The pool the session is in (holding or waiting), and why it waits ("" unless queued).
    pool: str = ""
    wait_reason: str = ""

    @classmethod
    def from_proto(cls, msg: scheduler_pb2.SessionState) -> SessionInfo:
        phase = Phase.from_proto(int(msg.state))
        queue = None
        if phase is Phase.QUEUED:
            wait = _opt_seconds(msg, "estimated_wait")
            queue = QueueInfo(msg.position, wait, msg.pool, msg.wait_reason)
        return cls(
            session_id=msg.session_id,
            phase=phase,
            lease=LeaseInfo.from_proto(msg.lease, msg.grant) if msg.HasField("lease") else None,
            queue=queue,
            last_snapshot=SnapshotRef.from_optional(msg, "last_snapshot"),
            qos=_QOS_FROM_PROTO.get(int(msg.qos)),
            tenant=msg.tenant,
            end_reason=end_reason_name(int(msg.end_reason)) if phase is Phase.ENDED else None,
            pool=msg.pool,
            wait_reason=msg.wait_reason,
        )
