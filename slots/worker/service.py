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

Authentication: with `accept_token_hashes` (the `sha256:<hex>` form used in policies), a caller
must send `authorization: Bearer <token>` matching one of them; without, every caller is accepted
(development only, like the scheduler's insecure mode; the worker warns at start).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Collection
from typing import Any, NoReturn

import grpc

from scheduler.api.gen.slotsched.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from scheduler.core.types import SnapshotRef
from scheduler.policy.identities import hash_token
from slots.worker.host import ActorHost, HostError
from slots.worker.leases import (
    Accepted,
    LeaseCheckFailed,
    LeaseSource,
    RefusalReason,
    StartClaim,
    check_start,
)

log = logging.getLogger("slotsched.worker")

_CODES: dict[str, grpc.StatusCode] = {
    "invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "data_loss": grpc.StatusCode.DATA_LOSS,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "permission_denied": grpc.StatusCode.PERMISSION_DENIED,
}


async def refuse_request(context: Any, field: str, description: str) -> None:
    """The wire guard's refusal (scheduler/api/guard.py): an undecodable or over-long request."""
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {description}")


def ref_from_pb(pb: common_pb2.SnapshotRef) -> SnapshotRef:
    created = pb.created.ToNanoseconds() / 1e9 if pb.HasField("created") else 0.0
    return SnapshotRef(pb.uri, pb.size_bytes, pb.sha256, created)


def ref_to_pb(ref: SnapshotRef) -> common_pb2.SnapshotRef:
    pb = common_pb2.SnapshotRef(uri=ref.uri, size_bytes=ref.size_bytes, sha256=ref.sha256)
    if ref.created:
        pb.created.FromNanoseconds(round(ref.created * 1e9))
    return pb


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(
        self, host: ActorHost, accept_token_hashes: Collection[str] = (), leases: LeaseSource | None = None
    ) -> None:
        self.host = host
        #: The scheduler's leases to verify Starts against; None = no verification (standalone).
        self.leases = leases
        self._hashes = tuple(h.encode("ascii") for h in accept_token_hashes)
        self.shutting_down = False

    async def _abort(self, context: Any, code: grpc.StatusCode, message: str) -> NoReturn:
        await context.abort(code, message)
        raise AssertionError("unreachable")  # context.abort raises

    async def _guard(self, context: Any) -> None:
        if self.shutting_down:
            await self._abort(context, grpc.StatusCode.UNAVAILABLE, "worker is shutting down")
        if not self._hashes:
            return
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                text = value if isinstance(value, str) else value.decode()
                scheme, _, token = text.partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    await self._abort(
                        context, grpc.StatusCode.UNAUTHENTICATED, "authorization must be 'Bearer <token>'"
                    )
                digest = hash_token(token.strip()).encode("ascii")
                ok = False
                for stored in self._hashes:
                    ok |= hmac.compare_digest(digest, stored)
                if ok:
                    return
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

    async def Start(self, request: worker_pb2.StartRequest, context: Any) -> worker_pb2.StartResponse:
        await self._guard(context)
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
        if self.leases is not None:
            try:
                self.host.validate_start(
                    request.session_id, request.tenant, request.slot.index, request.lease_id,
                    request.slot.worker_id,
                )  # fmt: skip
            except HostError as e:
                await self._fail(context, e)
            verdict = await self._verify(
                StartClaim(
                    request.session_id,
                    request.tenant,
                    request.slot.worker_id,
                    request.slot.index,
                    request.lease_id,
                    request.epoch,
                    resume,
                )
            )
            if isinstance(verdict, LeaseCheckFailed):
                await self._abort(context, _CODES[verdict.code], verdict.message)
            resume = verdict.resume_from
        try:
            result = await self.host.start(
                request.session_id,
                request.tenant,
                request.slot.index,
                request.lease_id,
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

    async def _owner(self, context: Any, session_id: str, tenant: str, lease_id: str) -> str | None:
        """The tenant to look the session up under; with verification, tenant and lease are required."""
        if self.leases is not None:
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
        return tenant or None

    async def Checkpoint(self, request: worker_pb2.CheckpointRequest, context: Any) -> common_pb2.SnapshotRef:
        await self._guard(context)
        tenant = await self._owner(context, request.session_id, request.tenant, request.lease_id)
        try:
            ref = await self.host.checkpoint(request.session_id, tenant, request.lease_id, request.epoch)
        except HostError as e:
            await self._fail(context, e)
        return ref_to_pb(ref)

    async def Stop(self, request: worker_pb2.StopRequest, context: Any) -> worker_pb2.StopResponse:
        await self._guard(context)
        tenant = await self._owner(context, request.session_id, request.tenant, request.lease_id)
        try:
            stopped = await self.host.stop(request.session_id, tenant, request.lease_id, request.epoch)
        except HostError as e:
            await self._fail(context, e)
        return worker_pb2.StopResponse(stopped=stopped)

    async def Status(self, request: worker_pb2.StatusRequest, context: Any) -> worker_pb2.StatusResponse:
        await self._guard(context)
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
            for s in self.host.status()
        ]
        return worker_pb2.StatusResponse(worker_id=self.host.worker_id, slots=slots)
