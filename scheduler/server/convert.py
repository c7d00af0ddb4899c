"""Domain <-> proto translation, shared by the loop (stream events) and the servicers.

Kept apart so every servicer speaks the same wire dialect: times are wall-clock Timestamps,
spans Durations, sessions travel without the `tenant/` prefix the loop namespaces them with.
These functions sit on the hot path of every grant, so they build messages directly.
"""

from __future__ import annotations

import math

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.core.types import (
    EndReason,
    Lease,
    QoS,
    RevokeReason,
    SessionId,
    SnapshotRef,
    TenantName,
    YieldCause,
    YieldRequested,
)

QOS_TO_PB: dict[QoS, common_pb2.QosClass] = {
    QoS.GUARANTEED: common_pb2.QOS_CLASS_GUARANTEED,
    QoS.BURSTABLE: common_pb2.QOS_CLASS_BURSTABLE,
    QoS.BEST_EFFORT: common_pb2.QOS_CLASS_BEST_EFFORT,
}
PB_TO_QOS: dict[int, QoS] = {int(v): k for k, v in QOS_TO_PB.items()}

END_TO_PB: dict[EndReason, scheduler_pb2.EndReason] = {
    EndReason.RELEASED: scheduler_pb2.END_REASON_RELEASED,
    EndReason.YIELDED: scheduler_pb2.END_REASON_YIELDED,
    EndReason.EXPIRED: scheduler_pb2.END_REASON_EXPIRED,
    EndReason.WITHDRAWN: scheduler_pb2.END_REASON_WITHDRAWN,
    EndReason.REVOKED: scheduler_pb2.END_REASON_REVOKED,
}
REVOKE_TO_PB: dict[RevokeReason, scheduler_pb2.RevokeReason] = {
    RevokeReason.YIELD_DEADLINE: scheduler_pb2.REVOKE_REASON_YIELD_DEADLINE,
    RevokeReason.WORKER_REMOVED: scheduler_pb2.REVOKE_REASON_WORKER_REMOVED,
}
CAUSE_TO_PB: dict[YieldCause, scheduler_pb2.YieldCause] = {
    YieldCause.GUARANTEED: scheduler_pb2.YIELD_CAUSE_GUARANTEED,
    YieldCause.NOMINAL: scheduler_pb2.YIELD_CAUSE_NOMINAL,
    YieldCause.FAIR_SHARE: scheduler_pb2.YIELD_CAUSE_FAIR_SHARE,
    YieldCause.DRAIN: scheduler_pb2.YIELD_CAUSE_DRAIN,
}


def session_key(tenant: str, session_id: str) -> SessionId:
    """The core's id for a session: namespaced by tenant, so tenants never collide."""
    return SessionId(f"{tenant}/{session_id}")


def split_key(key: str) -> tuple[TenantName, str]:
    tenant, _, sid = key.partition("/")  # tenant names never contain "/"
    return TenantName(tenant), sid


def ts(t: float) -> Timestamp:
    s = math.floor(t)
    return Timestamp(seconds=s, nanos=int((t - s) * 1e9))


def from_ts(t: Timestamp) -> float:
    return t.seconds + t.nanos / 1e9


def dur(d: float) -> Duration:
    d = max(0.0, d)
    s = math.floor(d)
    return Duration(seconds=s, nanos=int((d - s) * 1e9))


def from_dur(d: Duration) -> float:
    return d.seconds + d.nanos / 1e9


def snapshot_to_pb(ref: SnapshotRef) -> common_pb2.SnapshotRef:
    pb = common_pb2.SnapshotRef(uri=ref.uri, size_bytes=ref.size_bytes, sha256=ref.sha256)
    if ref.created:
        pb.created.CopyFrom(ts(ref.created))
    return pb


def snapshot_from_pb(pb: common_pb2.SnapshotRef) -> SnapshotRef:
    created = from_ts(pb.created) if pb.HasField("created") else 0.0
    return SnapshotRef(pb.uri, pb.size_bytes, pb.sha256, created)


def lease_to_pb(lease: Lease, address: str, yielding: YieldRequested | None) -> common_pb2.Lease:
    pb = common_pb2.Lease(
        lease_id=lease.lease_id,
        session_id=split_key(lease.session)[1],
        slot=common_pb2.Slot(worker_id=lease.slot.worker, index=lease.slot.index),
        worker_address=address,
        epoch=lease.epoch,
        expires_at=ts(lease.expires_at),
        qos=QOS_TO_PB[lease.qos],
        tenant=lease.tenant,
        granted_at=ts(lease.granted_at),
        state=common_pb2.LEASE_STATE_ACTIVE if yielding is None else common_pb2.LEASE_STATE_YIELDING,
    )
    if lease.resume_from is not None:
        pb.resume_from.CopyFrom(snapshot_to_pb(lease.resume_from))
    if yielding is not None:
        pb.yield_deadline.CopyFrom(ts(yielding.deadline))
    return pb


# ---------------------------------------------------------------- stream events


def queued_event(position: int, estimate_s: float, at: float) -> scheduler_pb2.LeaseEvent:
    return scheduler_pb2.LeaseEvent(
        queued=scheduler_pb2.Queued(position=position, estimated_wait=dur(estimate_s)), at=ts(at)
    )


def granted_event(lease: common_pb2.Lease, waited_s: float, at: float) -> scheduler_pb2.LeaseEvent:
    return scheduler_pb2.LeaseEvent(
        granted=scheduler_pb2.Granted(lease=lease, waited=dur(waited_s)), at=ts(at)
    )


def yield_event(y: YieldRequested, at: float) -> scheduler_pb2.LeaseEvent:
    return scheduler_pb2.LeaseEvent(
        yield_requested=scheduler_pb2.YieldRequested(
            lease_id=y.lease.lease_id,
            epoch=y.lease.epoch,
            deadline=ts(y.deadline),
            cause=CAUSE_TO_PB[y.cause],
        ),
        at=ts(at),
    )


def revoked_event(
    lease: Lease, reason: scheduler_pb2.RevokeReason, lost_s: float, at: float
) -> scheduler_pb2.LeaseEvent:
    pb = scheduler_pb2.Revoked(
        lease_id=lease.lease_id, epoch=lease.epoch, reason=reason, lost_slot_seconds=lost_s
    )
    if lease.resume_from is not None:
        pb.resume_from.CopyFrom(snapshot_to_pb(lease.resume_from))
    return scheduler_pb2.LeaseEvent(revoked=pb, at=ts(at))


def ended_event(reason: EndReason, lease: Lease | None, final: bool, at: float) -> scheduler_pb2.LeaseEvent:
    return scheduler_pb2.LeaseEvent(
        ended=scheduler_pb2.Ended(
            reason=END_TO_PB[reason],
            lease_id=lease.lease_id if lease is not None else "",
            epoch=lease.epoch if lease is not None else 0,
            session_over=final,
        ),
        at=ts(at),
    )
