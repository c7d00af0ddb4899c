"""The `slotsched.v1.Worker` gRPC servicer: a thin translation around `ActorHost`.

Why thin: everything a worker guarantees (fencing, consistent checkpoints, verified resumes,
counted losses) is in `host.py`, testable without a network; this module only authenticates,
converts protos and maps the host's refusals to the status codes worker.proto promises
(INVALID_ARGUMENT naming the field, NOT_FOUND, FAILED_PRECONDITION, DATA_LOSS, UNAVAILABLE).

Lease verification (with a `leases` source, i.e. the agent of a worker registered with a
scheduler): a token only says the caller may talk to this worker, not which lease it holds, so
every Start is checked against the scheduler's view of the leases on this worker
(`leases.check_start`): unknown lease, another tenant, session, slot or snapshot is
PERMISSION_DENIED; a superseded epoch FAILED_PRECONDITION. A lease missing from the view may
have been granted after the last heartbeat, so the view is refreshed once (an immediate
heartbeat sent after the Start arrived) before refusing; if the scheduler cannot be reached,
Start fails UNAVAILABLE (retryable) rather than run unverified. Each refusal is logged and
counted by reason. Checkpoint and Stop must then name the tenant and lease (`lease_id`, and
`epoch` if known) and reach only the actor started under them. Without a source (standalone,
`--no-verify-leases`) only the epoch fencing of the host applies.

Grants (with a `grants` verifier): a lease id is not a capability (it can be guessed or read off
a heartbeat); the scheduler's grant is. Start, Checkpoint and Stop must carry the grant of exactly
that tenant, session, lease, epoch, this worker and slot (scheduler/grants.py), checked with the
keys the scheduler hands this worker in its Register and Heartbeat answers (`install_grant_keys`,
called by the agent): missing, malformed, forged, unknown-key or another actor's or worker's
grant is PERMISSION_DENIED, an expired one FAILED_PRECONDITION. A grant under a key id this
worker does not know yet (the scheduler rotated to it since the last heartbeat) makes one
immediate heartbeat (`refresher`, the agent; at most one a second) before it is refused. The
heartbeat check above stays as a second check on Start: a grant proves who was granted, not that
the lease is still live (a revoked lease's grant is valid until it expires); the slot's epoch
fencing and the heartbeat check refuse it. Checkpoint and Stop then reach only the actor started
under the grant's lease (host.py), so a grant of a previous epoch is FAILED_PRECONDITION.
Lease ids may come tagged (`worker/slot#epoch.TAG`, as the Scheduler service shows them): the
worker keys actors by the untagged id, the form its heartbeats list.

Authentication: with `accept_token_hashes` (the `sha256:<hex>` form used in policies), a caller
must send `authorization: Bearer <token>` matching one of them; without, every caller is accepted
(development only, like the scheduler's insecure mode; the worker warns at start). An entry
`TENANT=sha256:<hex>` binds the token to a tenant: its caller may Start, Checkpoint and Stop only
that tenant's actors, and Status shows it only those (plus the actors its grants name). Tokens
in `admin_token_hashes` see every actor in Status (operators; they start nothing without a grant).
A token bound to no tenant sees, with grants verified, only the actors its Status grants name;
without grant keys, everything (as before).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import grpc

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from scheduler.grants import GrantClaim, GrantRefused, GrantVerifier, core_lease_id, parse_token
from scheduler.policy.identities import hash_token
from scheduler.policy.schema import TENANT_NAME_RE, TOKEN_HASH_RE
from slots.worker.host import ActorHost, HostError, SlotState
from slots.worker.leases import (
    Accepted,
    LeaseCheckFailed,
    LeaseSource,
    RefusalReason,
    StartClaim,
    check_start,
)
from snapshots.ref import SnapshotRef

log = logging.getLogger("slotsched.worker")

_CODES: dict[str, grpc.StatusCode] = {
    "invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "data_loss": grpc.StatusCode.DATA_LOSS,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "permission_denied": grpc.StatusCode.PERMISSION_DENIED,
}


#: At most one heartbeat per this many seconds for grants under unknown key ids: a caller sending
#: made-up key ids must not spend the worker's rate limit on the scheduler (its real heartbeats).
KEY_REFRESH_MIN_S = 1.0

MAX_STATUS_GRANTS = wire.MAX_STATUS_GRANTS


@dataclass(frozen=True)
class Caller:
    """Who called, by token: an admin, a tenant's runtime, or unbound (a shared token, or anyone
    when the worker accepts every caller)."""

    admin: bool = False
    tenant: str | None = None


def parse_token_hashes(entries: Collection[str], flag: str = "--accept-token-hash") -> dict[str, str | None]:
    """`sha256:<hex>` or `TENANT=sha256:<hex>` entries -> {hash: tenant or None}; ValueError names
    the bad entry."""
    out: dict[str, str | None] = {}
    for entry in entries:
        tenant, sep, digest = entry.rpartition("=")
        if not TOKEN_HASH_RE.match(digest):
            raise ValueError(f"{flag} {entry[:80]!r}: expected sha256:<64 hex> or TENANT=sha256:<64 hex>")
        if sep and not TENANT_NAME_RE.match(tenant):
            raise ValueError(f"{flag} {entry[:80]!r}: {tenant!r} is not a tenant name")
        if digest in out and out[digest] != (tenant or None):
            raise ValueError(f"{flag}: the same token hash is bound to two tenants")
        out[digest] = tenant or None
    return out


async def refuse_request(context: Any, field: str, description: str) -> None:
    """The wire guard's refusal (scheduler/api/guard.py): an undecodable or over-long request."""
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {description}")


def ref_from_pb(pb: common_pb2.SnapshotRef) -> SnapshotRef:
    created = pb.created.ToNanoseconds() / 1e9 if pb.HasField("created") else 0.0
    labels = tuple(sorted(pb.labels.items()))
    return SnapshotRef(pb.uri, pb.size_bytes, pb.sha256, created, pb.pool, labels)


def ref_to_pb(ref: SnapshotRef) -> common_pb2.SnapshotRef:
    pb = common_pb2.SnapshotRef(
        uri=ref.uri, size_bytes=ref.size_bytes, sha256=ref.sha256, pool=ref.pool, labels=dict(ref.labels)
    )
    if ref.created:
        pb.created.FromNanoseconds(round(ref.created * 1e9))
    return pb


def _labels_text(labels: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{k}={v}" for k, v in labels) or "no compatibility labels"


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(
        self,
        host: ActorHost,
        accept_token_hashes: Collection[str] = (),
        leases: LeaseSource | None = None,
        *,
        grants: GrantVerifier | None = None,
        admin_token_hashes: Collection[str] = (),
    ) -> None:
        self.host = host
        #: The scheduler's leases to verify Starts against; None = no verification (standalone).
        self.leases = leases
        #: Checks grants (this worker's keys, from the scheduler); None = grants are not required
        #: (dev, standalone). Replaced, never changed, by `install_grant_keys`.
        self.grants = grants
        #: Heartbeats on demand (the agent), when a grant names a key id not installed yet.
        self.refresher: LeaseSource | None = None
        self._key_refresh_at = float("-inf")
        callers = {h: Caller(tenant=t) for h, t in parse_token_hashes(accept_token_hashes).items()}
        for h in parse_token_hashes(admin_token_hashes, "--admin-token-hash"):
            callers[h] = Caller(admin=True)
        self._callers = tuple((h.encode("ascii"), c) for h, c in callers.items())
        self.shutting_down = False
        #: The pool this worker registered into and that pool's compatibility labels (from the
        #: scheduler's RegisterResponse, `join_pool`): stamped into every snapshot it takes, and
        #: checked against every snapshot it is asked to resume ("" and (): not registered).
        self.pool = ""
        self.pool_labels: tuple[tuple[str, str], ...] = ()
        self.pool_all_labels: tuple[tuple[str, str], ...] = ()  # every label of the pool

    def join_pool(
        self, pool: str, labels: tuple[tuple[str, str], ...], all_labels: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """The pool the scheduler registered this worker into (again after a failover)."""
        if (pool, labels) != (self.pool, self.pool_labels):
            log.info("worker %s is in pool %s (%s)", self.host.worker_id, pool or "-", _labels_text(labels))
        self.pool, self.pool_labels, self.pool_all_labels = pool, labels, all_labels

    def incompatible(self, ref: SnapshotRef) -> str | None:
        """Why this worker must not resume `ref` (a compatibility label of the snapshot's that
        this pool has with another value), or None. The scheduler places by the same rule; this
        is the worker's own check, so a misrouted resume fails here, not inside the actor."""
        if self.pool_all_labels:  # the scheduler's rule: each of the snapshot's labels is the pool's
            have = dict(self.pool_all_labels)
            bad = [(k, v) for k, v in ref.labels if have.get(k) != v]
        else:  # only the compatibility keys are known here
            mine = dict(self.pool_labels)
            bad = [(k, v) for k, v in ref.labels if k in mine and mine[k] != v]
        if not bad:
            return None
        return (
            f"resume_from {ref.uri!r} was taken on pool {ref.pool or '?'!r} ({_labels_text(ref.labels)}); "
            f"this worker is in pool {self.pool!r} ({_labels_text(self.pool_labels)})"
        )

    def install_grant_keys(self, keys: tuple[tuple[str, bytes], ...]) -> None:
        """This worker's grant keys (kid, key), from a Register or Heartbeat answer."""
        g = self.grants
        if g is not None and not g.same_keys(self.host.worker_id, keys):
            self.grants = g.with_keys(self.host.worker_id, keys)
            log.info("worker %s grant keys: %s", self.host.worker_id, ", ".join(kid for kid, _ in keys))

    async def _abort(self, context: Any, code: grpc.StatusCode, message: str) -> NoReturn:
        await context.abort(code, message)
        raise AssertionError("unreachable")  # context.abort raises

    async def _guard(self, context: Any) -> Caller:
        if self.shutting_down:
            await self._abort(context, grpc.StatusCode.UNAVAILABLE, "worker is shutting down")
        if not self._callers:
            return Caller()
        for key, value in context.invocation_metadata() or ():
            if key == wire.AUTHORIZATION:
                text = value if isinstance(value, str) else value.decode()
                scheme, _, token = text.partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    await self._abort(
                        context, grpc.StatusCode.UNAUTHENTICATED, "authorization must be 'Bearer <token>'"
                    )
                digest = hash_token(token.strip()).encode("ascii")
                found: Caller | None = None
                for stored, caller in self._callers:
                    if hmac.compare_digest(digest, stored):
                        found = caller
                if found is not None:
                    return found
                await self._abort(
                    context, grpc.StatusCode.PERMISSION_DENIED, "the bearer token is not accepted"
                )
        await self._abort(
            context,
            grpc.StatusCode.UNAUTHENTICATED,
            "missing credential: send 'authorization: Bearer <token>'",
        )

    async def _fail(self, context: Any, e: HostError) -> NoReturn:
        await self._abort(context, _CODES.get(e.code, grpc.StatusCode.UNKNOWN), e.message)

    async def _authorize(self, context: Any, caller: Caller, grant: str, claim: GrantClaim | None) -> None:
        """The caller may act on `claim`'s actor: its token's tenant, and the grant, match it.

        `claim.slot` < 0: take the slot from the grant (Checkpoint and Stop name no slot)."""
        if claim is None:
            return
        if caller.tenant is not None and caller.tenant != claim.tenant:
            await self._abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"tenant {claim.tenant!r}: this token may act only for tenant {caller.tenant!r}",
            )
        if self.grants is None:
            return
        try:
            if claim.slot < 0:
                claim = GrantClaim(
                    claim.tenant, claim.session_id, claim.lease_id, claim.epoch, claim.worker_id,
                    parse_token(grant).slot,
                )  # fmt: skip
            await self._verify_grant(grant, claim)
        except GrantRefused as e:
            log.warning(
                "refused a grant for session %r (tenant %r) lease %r epoch %d on %s: %s",
                claim.session_id, claim.tenant, claim.lease_id, claim.epoch, claim.worker_id, e.message,
            )  # fmt: skip
            await self._abort(context, _CODES[e.code], e.message)

    async def _verify_grant(self, grant: str, claim: GrantClaim) -> None:
        """`grants.verify`, after one immediate heartbeat if the grant's key id is not known yet."""
        assert self.grants is not None
        arrived = time.monotonic()
        try:
            self.grants.verify(grant, claim, time.time())
        except GrantRefused as e:
            if (
                not e.unknown_key
                or self.refresher is None
                or arrived - self._key_refresh_at < KEY_REFRESH_MIN_S
            ):
                raise
            self._key_refresh_at = arrived
            await self.refresher.refresh(arrived)  # its answer installs the scheduler's keys
            self.grants.verify(grant, claim, time.time())

    async def Start(self, request: worker_pb2.StartRequest, context: Any) -> worker_pb2.StartResponse:
        caller = await self._guard(context)
        lease_id = core_lease_id(request.lease_id)
        if not request.HasField("slot"):
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, "slot: required")
        resume = None
        if request.HasField("resume_from"):
            if not request.resume_from.uri:
                await self._abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "resume_from.uri: required when a snapshot is given",
                )
            resume = ref_from_pb(request.resume_from)
        if self.leases is not None or self.grants is not None or caller.tenant is not None:
            try:
                self.host.validate_start(
                    request.session_id, request.tenant, request.slot.index, lease_id, request.slot.worker_id
                )
            except HostError as e:
                await self._fail(context, e)
            claim = GrantClaim(
                request.tenant,
                request.session_id,
                lease_id,
                request.epoch,
                self.host.worker_id,
                request.slot.index,
            )
            await self._authorize(context, caller, request.grant, claim)
        if self.leases is not None:
            verdict = await self._verify(
                StartClaim(
                    request.session_id,
                    request.tenant,
                    request.slot.worker_id,
                    request.slot.index,
                    lease_id,
                    request.epoch,
                    resume,
                )
            )
            if isinstance(verdict, LeaseCheckFailed):
                await self._abort(context, _CODES[verdict.code], verdict.message)
            resume = verdict.resume_from  # with the pool and labels the scheduler recorded
        why = None if resume is None else self.incompatible(resume)
        if why is not None:
            await self._abort(context, grpc.StatusCode.FAILED_PRECONDITION, why)
        try:
            result = await self.host.start(
                request.session_id,
                request.tenant,
                request.slot.index,
                lease_id,
                request.epoch,
                resume,
                worker_id=request.slot.worker_id,
            )
        except HostError as e:
            await self._fail(context, e)
        if result.refused:
            # The caller asked for one snapshot and got an older one (or none): say so.
            context.set_trailing_metadata(
                (("slotsched-restored-from", result.restored_from.uri if result.restored_from else ""),)
                + tuple(("slotsched-refused-snapshot", uri) for uri, _ in result.refused)
            )
        return worker_pb2.StartResponse(turns=result.turns, state_sha256=result.state_sha256)

    async def _verify(self, claim: StartClaim) -> Accepted | LeaseCheckFailed:
        """Check `claim` against the scheduler's view, refreshed once if it lacks the lease."""
        assert self.leases is not None
        arrived = time.monotonic()
        view = self.leases.view
        verdict = check_start(view, claim)
        if (
            isinstance(verdict, LeaseCheckFailed)
            and claim.lease_id not in view.grants
            and view.as_of < arrived
        ):
            # The grant may be newer than the last heartbeat: ask the scheduler now, then decide.
            # (A lease the view lists does not change: no refresh, so refusals cost no heartbeat.)
            fresh = await self.leases.refresh(arrived)
            if fresh is None:
                verdict = LeaseCheckFailed(
                    RefusalReason.UNVERIFIED,
                    f"cannot verify lease {claim.lease_id!r}: the scheduler is not reachable; retry",
                )
            else:
                verdict = check_start(fresh, claim)
        if isinstance(verdict, LeaseCheckFailed):
            self.host.metrics.starts_refused.labels(verdict.reason.value).inc()
            log.warning(
                "refused Start of session %r (tenant %r) on %s/%d lease %r epoch %d: %s: %s",
                claim.session_id, claim.tenant, claim.worker_id, claim.slot, claim.lease_id, claim.epoch,
                verdict.reason.value, verdict.message,
            )  # fmt: skip
        return verdict

    async def _owner(
        self, context: Any, caller: Caller, request: worker_pb2.CheckpointRequest | worker_pb2.StopRequest
    ) -> tuple[str | None, str]:
        """The tenant to look the session up under and the (untagged) lease id, once the caller is
        authorized for them; with verification, tenant and lease are required."""
        session_id, tenant, lease_id = request.session_id, request.tenant, core_lease_id(request.lease_id)
        if self.leases is not None or self.grants is not None or caller.tenant is not None:
            if not session_id:
                await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, "session_id: required")
            if not tenant:
                await self._abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "tenant: required (this worker verifies leases)",
                )
            if not lease_id:
                await self._abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "lease_id: required (this worker verifies leases)",
                )
            claim = GrantClaim(tenant, session_id, lease_id, request.epoch, self.host.worker_id, -1)
            await self._authorize(context, caller, request.grant, claim)
        return tenant or None, lease_id

    async def Checkpoint(self, request: worker_pb2.CheckpointRequest, context: Any) -> common_pb2.SnapshotRef:
        caller = await self._guard(context)
        tenant, lease_id = await self._owner(context, caller, request)
        try:
            ref = await self.host.checkpoint(request.session_id, tenant, lease_id, request.epoch)
        except HostError as e:
            await self._fail(context, e)
        if self.pool:  # where it was taken: it resumes only where these labels match
            ref = replace(ref, pool=self.pool, labels=self.pool_labels)
        return ref_to_pb(ref)

    async def Stop(self, request: worker_pb2.StopRequest, context: Any) -> worker_pb2.StopResponse:
        caller = await self._guard(context)
        tenant, lease_id = await self._owner(context, caller, request)
        try:
            stopped = await self.host.stop(request.session_id, tenant, lease_id, request.epoch)
        except HostError as e:
            await self._fail(context, e)
        return worker_pb2.StopResponse(stopped=stopped)

    async def Status(self, request: worker_pb2.StatusRequest, context: Any) -> worker_pb2.StatusResponse:
        caller = await self._guard(context)
        if len(request.grants) > MAX_STATUS_GRANTS:
            await self._abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"grants: at most {MAX_STATUS_GRANTS} per call"
            )
        states = self.host.status()
        see_all = caller.admin or (caller.tenant is None and self.grants is None)
        shown = {s.index for s in states if see_all or (s.session_id and s.tenant == caller.tenant)}
        if not see_all and self.grants is not None:
            shown |= self._granted_slots(request.grants, states)
        slots = [
            worker_pb2.SlotStatus(
                index=s.index,
                session_id=s.session_id,
                tenant=s.tenant,
                lease_id=s.lease_id,
                epoch=s.epoch,
                turns=s.turns,
                state_bytes=s.state_bytes,
                state_sha256=s.state_sha256,
            )
            if s.index in shown or not s.session_id
            else worker_pb2.SlotStatus(index=s.index, other=True)
            for s in states
        ]
        return worker_pb2.StatusResponse(worker_id=self.host.worker_id, slots=slots)

    def _granted_slots(self, grants: Collection[str], states: list[SlotState]) -> set[int]:
        """Slots whose actor one of `grants` names (MAC checked; expiry not: seeing an actor
        one was granted, while it still runs under that lease, reveals nothing new)."""
        assert self.grants is not None
        by_slot = {s.index: s for s in states if s.session_id}
        out: set[int] = set()
        for token in grants:
            try:
                slot = parse_token(token).slot
                s = by_slot.get(slot)
                if s is None:
                    continue
                claim = GrantClaim(s.tenant, s.session_id, s.lease_id, s.epoch, self.host.worker_id, slot)
                self.grants.verify(token, claim, now=0.0)
            except GrantRefused:
                continue
            out.add(slot)
        return out
