"""Lease verification: does the scheduler's view of this worker's leases back a Start?

Why: a runtime token lets a caller reach the Worker service, but says nothing about which lease it
holds. Without a check, a caller could start an actor under another tenant's name (and restore
that tenant's snapshot) or on a slot it holds no lease for. The scheduler tells the worker the
truth in every `Workers.Heartbeat` answer (`HeartbeatResponse.leases`: the live leases on its
slots); the agent keeps that as a `LeaseView`, and `check_start` — a pure function, table-tested —
decides whether a Start matches one of them:

* the lease_id must be live on this worker (else PERMISSION_DENIED, `unknown_lease`; or
  FAILED_PRECONDITION, `stale_epoch`, when the slot named is live at a higher epoch: a lease that
  was superseded);
* its tenant, session_id and slot must be the request's (PERMISSION_DENIED: `tenant_mismatch`,
  `session_mismatch`, `slot_mismatch`);
* its epoch must be the request's (older: FAILED_PRECONDITION `stale_epoch`; newer:
  PERMISSION_DENIED `epoch_mismatch`);
* `resume_from`, if given, must be the lease's (same uri; same sha256 when the lease has one),
  else PERMISSION_DENIED `snapshot_mismatch`. The accepted Start restores with the lease's sha256,
  so a caller cannot skip verification by leaving it out.

`Lease.session_id` in a heartbeat is the tenant-local id, as the runtime sends it: compared as is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

from scheduler.api.gen.slotsched.v1 import common_pb2
from snapshots.ref import SnapshotRef


class RefusalReason(StrEnum):
    """Why a Start was refused (the `reason` label of the refused-starts counter)."""

    UNKNOWN_LEASE = "unknown_lease"
    TENANT_MISMATCH = "tenant_mismatch"
    SESSION_MISMATCH = "session_mismatch"
    SLOT_MISMATCH = "slot_mismatch"
    STALE_EPOCH = "stale_epoch"
    EPOCH_MISMATCH = "epoch_mismatch"
    SNAPSHOT_MISMATCH = "snapshot_mismatch"
    #: The scheduler could not be asked (not a decision of `check_start`; counted all the same).
    UNVERIFIED = "unverified"


#: The gRPC status (by `HostError.code` name) each refusal is returned with.
REFUSAL_CODES: dict[RefusalReason, str] = {
    RefusalReason.UNKNOWN_LEASE: "permission_denied",
    RefusalReason.TENANT_MISMATCH: "permission_denied",
    RefusalReason.SESSION_MISMATCH: "permission_denied",
    RefusalReason.SLOT_MISMATCH: "permission_denied",
    RefusalReason.STALE_EPOCH: "failed_precondition",
    RefusalReason.EPOCH_MISMATCH: "permission_denied",
    RefusalReason.SNAPSHOT_MISMATCH: "permission_denied",
    RefusalReason.UNVERIFIED: "unavailable",
}


@dataclass(frozen=True)
class Grant:
    """One live lease on this worker, as the scheduler reported it."""

    lease_id: str
    session_id: str
    tenant: str
    worker_id: str
    slot: int
    epoch: int
    resume_uri: str = ""
    resume_sha256: str = ""
    # The pool and compatibility labels the scheduler recorded for the snapshot: a caller's
    # Start must not drop them to get past the worker's resume check.
    resume_pool: str = ""
    resume_labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_pb(cls, pb: common_pb2.Lease) -> Grant:
        return cls(
            pb.lease_id,
            pb.session_id,
            pb.tenant,
            pb.slot.worker_id,
            pb.slot.index,
            pb.epoch,
            pb.resume_from.uri if pb.HasField("resume_from") else "",
            pb.resume_from.sha256 if pb.HasField("resume_from") else "",
            pb.resume_from.pool if pb.HasField("resume_from") else "",
            tuple(sorted(pb.resume_from.labels.items())) if pb.HasField("resume_from") else (),
        )


@dataclass(frozen=True)
class LeaseView:
    """The scheduler's leases on this worker, from a heartbeat sent at monotonic time `as_of`."""

    grants: Mapping[str, Grant] = field(default_factory=dict)
    #: When the heartbeat that produced it was sent (monotonic); -inf = never (empty view).
    as_of: float = float("-inf")

    @classmethod
    def of(cls, grants: Iterable[Grant], as_of: float) -> LeaseView:
        return cls({g.lease_id: g for g in grants}, as_of)


@dataclass(frozen=True)
class StartClaim:
    """What a Start asserts about its lease."""

    session_id: str
    tenant: str
    worker_id: str
    slot: int
    lease_id: str
    epoch: int
    resume_from: SnapshotRef | None = None


@dataclass(frozen=True)
class Accepted:
    grant: Grant
    #: The snapshot to restore (the request's, with the lease's sha256), or None: start fresh.
    resume_from: SnapshotRef | None


@dataclass(frozen=True)
class LeaseCheckFailed:
    reason: RefusalReason
    message: str

    @property
    def code(self) -> str:
        return REFUSAL_CODES[self.reason]


def check_start(view: LeaseView, claim: StartClaim) -> Accepted | LeaseCheckFailed:
    """Accept `claim` only if a lease in `view` matches it exactly (see the module docstring)."""
    g = view.grants.get(claim.lease_id)
    where = f"{claim.worker_id}/{claim.slot}"
    if g is None:
        # A lease that is gone while its slot was granted again is stale, not forged: say so.
        newer = [x.epoch for x in view.grants.values() if x.slot == claim.slot and x.epoch > claim.epoch]
        if newer:
            return LeaseCheckFailed(
                RefusalReason.STALE_EPOCH,
                f"lease {claim.lease_id!r} is no longer live: slot {where} is held at epoch {max(newer)} "
                f"(> {claim.epoch})",
            )
        return LeaseCheckFailed(
            RefusalReason.UNKNOWN_LEASE,
            f"lease {claim.lease_id!r} is unknown to the scheduler on this worker's slots",
        )
    if g.tenant != claim.tenant:
        return LeaseCheckFailed(
            RefusalReason.TENANT_MISMATCH,
            f"tenant {claim.tenant!r} does not match lease {g.lease_id!r} (granted to another tenant)",
        )
    if g.session_id != claim.session_id:
        return LeaseCheckFailed(
            RefusalReason.SESSION_MISMATCH,
            f"session_id {claim.session_id!r} does not match lease {g.lease_id!r} "
            "(granted to another session)",
        )
    if (g.worker_id, g.slot) != (claim.worker_id, claim.slot):
        return LeaseCheckFailed(
            RefusalReason.SLOT_MISMATCH,
            f"slot {where} does not match lease {g.lease_id!r} (granted slot {g.worker_id}/{g.slot})",
        )
    if claim.epoch < g.epoch:
        return LeaseCheckFailed(
            RefusalReason.STALE_EPOCH,
            f"epoch {claim.epoch} is stale: lease {g.lease_id!r} is at epoch {g.epoch}",
        )
    if claim.epoch != g.epoch:
        return LeaseCheckFailed(
            RefusalReason.EPOCH_MISMATCH,
            f"epoch {claim.epoch} does not match lease {g.lease_id!r} (epoch {g.epoch})",
        )
    ref = claim.resume_from
    if ref is None:
        return Accepted(g, None)
    if not g.resume_uri:
        return LeaseCheckFailed(
            RefusalReason.SNAPSHOT_MISMATCH,
            f"resume_from {ref.uri!r} does not match lease {g.lease_id!r}, which resumes from no snapshot",
        )
    if ref.uri != g.resume_uri:
        return LeaseCheckFailed(
            RefusalReason.SNAPSHOT_MISMATCH,
            f"resume_from {ref.uri!r} does not match lease {g.lease_id!r} (resume_from {g.resume_uri!r})",
        )
    if g.resume_sha256:
        if ref.sha256 and ref.sha256 != g.resume_sha256:
            return LeaseCheckFailed(
                RefusalReason.SNAPSHOT_MISMATCH,
                f"resume_from.sha256 {ref.sha256!r} does not match lease {g.lease_id!r} "
                f"(sha256 {g.resume_sha256!r})",
            )
        ref = replace(ref, sha256=g.resume_sha256)  # keeps its pool and labels
    if g.resume_pool or g.resume_labels:
        ref = replace(ref, pool=g.resume_pool, labels=g.resume_labels)  # the scheduler's record
    return Accepted(g, ref)


class LeaseSource(Protocol):
    """Where the Worker service gets the scheduler's view (the agent, or a test double)."""

    @property
    def view(self) -> LeaseView: ...

    async def refresh(self, after: float) -> LeaseView | None:
        """A view from a heartbeat sent at or after monotonic time `after`; None if the scheduler
        could not be reached."""
        ...
