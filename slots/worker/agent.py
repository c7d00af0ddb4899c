"""The worker agent: joins the pool, stays in it, honours drains, and leaves cleanly.

Why an agent beside the Worker service: the scheduler only grants slots it knows are alive, and
only the worker knows when it is going away. The agent

* registers the worker's slots with the scheduler's Workers service (retrying until the
  scheduler answers: workers may start first), and registers again if a heartbeat says the
  scheduler forgot it (restart, or removal after missed heartbeats), each time with the highest
  epoch each slot has seen (`slot_epochs`): a scheduler restarted without its state then grants
  above them, so its grants pass the host's epoch fencing;
* heartbeats at the interval the scheduler asks for, and applies each answer to the host: actors
  whose lease is no longer listed are stopped (fencing), epochs move forward;
* keeps each answer's leases as `view` (a `LeaseView`), which the Worker service checks every
  Start against (leases.py), and heartbeats at once on demand (`refresh`) when a Start names a
  lease the view does not list yet: the grant may be newer than the last heartbeat. Concurrent
  refreshes share one heartbeat when it was sent late enough for all of them;
* hands the grant keys of each Register and Heartbeat answer (this worker's own, `GrantKey`) to
  `on_grant_keys` (the Worker service's `install_grant_keys`), which checks grants with them;
* honours drain: once a heartbeat says `draining`, the host refuses new actors, and the agent
  exits when the host is empty and the scheduler lists no lease on the worker;
* on its own shutdown (SIGTERM) drains itself first — `Drain(yield_within)` makes the scheduler
  ask every holder to checkpoint and yield — waits (bounded) for the actors to leave, and
  always deregisters on the way out, so the scheduler never grants a slot of a dead worker.

Against a scheduler in secure mode the agent needs a worker token (`token`; its hash listed under
`spec.access.workers`, or `spec.access.admins`): the Workers service refuses tenant tokens, so no
tenant can add, drain or remove workers. A refused credential ends the agent at once instead of
retrying: it does not fix itself (`SchedulerRefused`, one paragraph naming the refusal and its
fix: a wrong token, an id outside the token's entry's scope, more slots than its `maxSlots`).
Refused on a heartbeat (the token was revoked), the agent first stops every actor — the scheduler
will drop this worker and re-grant its leases elsewhere — and then exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import grpc.aio

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import workers_pb2, workers_pb2_grpc
from scheduler.client.follow import Follower, FollowingStub
from scheduler.client.reactions import reason_in
from slots.worker import vitals
from slots.worker.host import ActorHost
from slots.worker.leases import Grant, LeaseView

log = logging.getLogger("slotsched.worker")
Labels = tuple[tuple[str, str], ...]  # (key, value) pairs, sorted by key

DRAINED = "drained"
STOPPED = "stopped"


# Heartbeat failures that mean the scheduler no longer counts us in (not a network blip).
_LOST_MEMBERSHIP = frozenset(
    {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
)
# Register failures worth retrying: the scheduler is not up (yet), or asks us to slow down.
_RETRY_REGISTER = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)

_TOKEN_HINT = (
    "Give the worker a worker token (--token or $SLOTSCHED_TOKEN) whose sha256 hash is listed under "
    "spec.access.workers"
)
# What fixes a refusal: by its ErrorInfo reason where the scheduler sends one of its own (a right
# token used beyond its entry's bounds), else by a phrase of its message.
_HINTS_BY_REASON = {
    wire.Reason.WORKER_OUT_OF_SCOPE: (
        "The token is right but its entry does not cover this id: start the worker with a --worker-id "
        "the entry allows, or give it the token of the entry that covers this id"
    ),
    wire.Reason.WORKER_SLOTS_OVER_BOUND: (
        "The token is right but its entry bounds the slots: start the worker with at most that many "
        "--slots, or raise the entry's maxSlots in the policy"
    ),
}
_HINTS = (
    (
        "Deregister first",
        "Another registration holds this worker id: deregister it, let the scheduler remove it after its "
        "missed heartbeats, or choose another --worker-id",
    ),
    ("needs the worker role", _TOKEN_HINT),
)


class SchedulerRefused(Exception):
    """The scheduler refused this worker for good (a credential, scope or request it will not
    accept): retrying cannot help. The message is one paragraph: the refusal and its fix; `code`
    is the refusal's gRPC status."""

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code


def refusal_hint(code: grpc.StatusCode, details: str, reason: str = "") -> str:
    """What the operator should change for a refusal with `code`, message `details` and ErrorInfo
    `reason` ('' if the message says it all)."""
    by_reason = _HINTS_BY_REASON.get(reason)  # type: ignore[call-overload]  # a str of the wire, or ""
    if by_reason is not None:
        return str(by_reason)
    for phrase, hint in _HINTS:
        if phrase in details:
            return hint
    return _TOKEN_HINT if code is grpc.StatusCode.UNAUTHENTICATED else ""


def _refused(what: str, e: grpc.aio.AioRpcError) -> SchedulerRefused:
    hint = refusal_hint(e.code(), e.details() or "", reason_in(e.trailing_metadata()))
    text = f"{what}: {e.code().name}: {(e.details() or '').rstrip('. ')}."
    return SchedulerRefused(f"{text} {hint}." if hint else text, e.code())


class WorkerAgent:
    def __init__(
        self,
        target: str,
        worker_id: str,
        address: str,
        host: ActorHost,
        *,
        token: str | None = None,
        tenant: str | None = None,
        labels: dict[str, str] | None = None,
        pool: str = "",
        channel_options: Sequence[tuple[str, Any]] = (),
        credentials: grpc.ChannelCredentials | None = None,
        rpc_timeout_s: float = 5.0,
        drain_yield_s: float = 10.0,
        drain_timeout_s: float = 30.0,
        retry_s: float = 0.5,
    ) -> None:
        self.target = target
        self.worker_id = worker_id
        self.address = address
        self.host = host
        self.labels = dict(labels or {})
        self.pool = pool  # the pool it joins ("": the policy's only pool, or default)
        self.rpc_timeout_s = rpc_timeout_s
        self.drain_yield_s = drain_yield_s
        self.drain_timeout_s = drain_timeout_s
        self.retry_s = retry_s
        self.channel_options = list(channel_options)
        self.credentials = credentials  # TLS to the scheduler (None: plaintext)
        md: list[tuple[str, str]] = []
        if token:
            md.append((wire.AUTHORIZATION, f"{wire.BEARER}{token}"))
        if tenant:
            md.append((wire.TENANT, tenant))
        self.metadata = tuple(md)
        self.heartbeat_interval_s = 5.0
        self.draining = False
        self.registered = asyncio.Event()
        self.heartbeats = 0
        #: The scheduler's leases on our slots, as of the newest heartbeat answered.
        self.view = LeaseView()
        self._refresh_lock = asyncio.Lock()
        self._stub: Any = None
        #: Called with (kid, key) pairs, the current key first, from every answer that lists any.
        self.on_grant_keys: Callable[[tuple[tuple[str, bytes], ...]], None] | None = None
        #: Told the pool the scheduler registered this worker into, its compatibility labels
        #: and all its labels (the Worker service's `join_pool`), at every registration.
        self.on_pool: Callable[[str, Labels, Labels], None] | None = None

    def _grant_keys(self, keys: Sequence[workers_pb2.GrantKey]) -> None:
        # An empty list is a scheduler that hands out no keys (an older one): keep what we have.
        if keys and self.on_grant_keys is not None:
            self.on_grant_keys(tuple((k.key_id, k.key) for k in keys))

    # ------------------------------------------------------------------ rpcs

    async def _register(self, stop: asyncio.Event) -> bool:
        delay = self.retry_s
        while not stop.is_set():
            # The epochs our slots have seen: a scheduler that lost its state (restarted in
            # memory) grants above them, rather than epochs our fencing would refuse as old.
            seen = {i: e for i, e in enumerate(self.host.highest_epoch) if e}
            req = workers_pb2.RegisterRequest(
                worker_id=self.worker_id,
                address=self.address,
                slots=self.host.slots,
                labels=self.labels,
                slot_epochs=seen,
                pool=self.pool,
            )
            try:
                resp = await self._stub.Register(req, metadata=self.metadata, timeout=self.rpc_timeout_s)
            except grpc.aio.AioRpcError as e:
                if e.code() in _RETRY_REGISTER:
                    log.info(
                        "scheduler %s not reachable yet (%s); retrying in %.1fs", self.target, e.code(), delay
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    delay = min(delay * 2, 5.0)
                    continue
                what = f"scheduler {self.target} refused to register worker {self.worker_id}"
                raise _refused(what, e) from e
            self._grant_keys(resp.grant_keys)
            if self.on_pool is not None:
                compat = tuple(sorted(resp.compatibility_labels.items()))
                self.on_pool(resp.pool, compat, tuple(sorted(resp.labels.items())))
            if resp.HasField("heartbeat_interval"):
                self.heartbeat_interval_s = max(0.05, resp.heartbeat_interval.ToNanoseconds() / 1e9)
            log.info(
                "worker %s registered with %s: %d slots at %s (heartbeat every %.1fs)",
                self.worker_id, self.target, self.host.slots, self.address, self.heartbeat_interval_s,
            )  # fmt: skip
            self.registered.set()
            return True
        return False

    async def _heartbeat(self) -> workers_pb2.HeartbeatResponse | None:
        """One heartbeat applied to the host; None if the scheduler could not be reached."""
        sent = time.monotonic()
        try:
            resp: workers_pb2.HeartbeatResponse = await self._stub.Heartbeat(
                workers_pb2.HeartbeatRequest(
                    worker_id=self.worker_id, rss_bytes=vitals.rss_bytes(), uptime_seconds=vitals.uptime_s()
                ),
                metadata=self.metadata,
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            if e.code() in _LOST_MEMBERSHIP:
                raise
            log.warning("heartbeat of worker %s failed: %s %s", self.worker_id, e.code(), e.details())
            return None
        self.heartbeats += 1
        if sent >= self.view.as_of:  # an on-demand heartbeat may overtake a periodic one
            self.view = LeaseView.of((Grant.from_pb(lease) for lease in resp.leases), sent)
            self._grant_keys(resp.grant_keys)
        live = [(lease.slot.index, lease.lease_id, lease.epoch) for lease in resp.leases]
        self.host.fence(live, sent)
        if resp.draining and not self.draining:
            log.info("worker %s is draining: no new actors; exiting once empty", self.worker_id)
            self.draining = True
            self.host.accepting = False
        return resp

    async def refresh(self, after: float) -> LeaseView | None:
        """A view from a heartbeat sent at or after monotonic time `after` (one now if the current
        view is older); None if the scheduler cannot be reached or does not know us (yet)."""
        if self.view.as_of >= after:
            return self.view
        async with self._refresh_lock:
            if self.view.as_of >= after:  # a refresh we waited for was recent enough
                return self.view
            if self._stub is None or not self.registered.is_set():
                return None
            try:
                resp = await self._heartbeat()
            except grpc.aio.AioRpcError as e:  # NOT_FOUND: the run loop registers again
                log.warning("lease refresh of worker %s failed: %s %s", self.worker_id, e.code(), e.details())
                return None
            return self.view if resp is not None else None

    async def _wait(self, stop: asyncio.Event, seconds: float) -> None:
        """Sleep `seconds`, waking early on stop or, while draining, when the host empties."""
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
        if self.draining and not self.host.empty:
            waits.append(asyncio.ensure_future(self.host.wait_empty()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    # ------------------------------------------------------------------ life

    async def run(self, stop: asyncio.Event) -> str:
        """Serve until drained by the scheduler (returns DRAINED) or `stop` is set (STOPPED)."""
        # `target` may list every scheduler replica ("a:50051,b:50051"): calls follow the leader
        # (a standby's NOT_LEADER names it), as the SDK's do.
        follower = Follower(self.target, self.channel_options, self.credentials)
        self._stub = FollowingStub(follower, workers_pb2_grpc.WorkersStub)
        reason = STOPPED
        try:
            if not await self._register(stop):
                return STOPPED
            while not stop.is_set():
                try:
                    resp = await self._heartbeat()
                except grpc.aio.AioRpcError as e:
                    if e.code() is not grpc.StatusCode.NOT_FOUND:
                        # Our token was revoked: the scheduler will drop us and re-grant our
                        # leases elsewhere, so stop our actors now rather than run them twice.
                        self.host.accepting = False
                        self.host.fence((), time.monotonic())
                        what = f"scheduler {self.target} refuses worker {self.worker_id} (actors stopped)"
                        raise _refused(what, e) from e
                    # NOT_FOUND: the scheduler forgot us
                    log.warning(
                        "scheduler does not know worker %s any more: registering again", self.worker_id
                    )
                    if self.draining:
                        reason = DRAINED
                        break
                    await self._register(stop)
                    continue
                if resp is not None and self.draining and self.host.empty and not resp.leases:
                    reason = DRAINED
                    break
                await self._wait(stop, self.heartbeat_interval_s)
            if reason == STOPPED:
                await self._drain_self()
            return reason
        finally:
            await self._deregister()
            await follower.close()

    async def _drain_self(self) -> None:
        """Ask the scheduler to move our holders away, and wait (bounded) for them to go."""
        self.draining = True
        self.host.accepting = False
        if self.host.empty:
            return
        req = workers_pb2.DrainRequest(worker_id=self.worker_id)
        req.yield_within.FromNanoseconds(round(self.drain_yield_s * 1e9))
        try:
            await self._stub.Drain(req, metadata=self.metadata, timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as e:
            log.warning("could not drain worker %s before exit: %s %s", self.worker_id, e.code(), e.details())
            return
        log.info("worker %s draining before exit (up to %.0fs)", self.worker_id, self.drain_timeout_s)
        deadline = time.monotonic() + self.drain_timeout_s
        never = asyncio.Event()
        while not self.host.empty and time.monotonic() < deadline:
            try:
                resp = await self._heartbeat()
            except grpc.aio.AioRpcError:
                return
            if resp is not None and not resp.leases:
                break
            await self._wait(never, min(self.heartbeat_interval_s, max(0.0, deadline - time.monotonic())))

    async def _deregister(self) -> None:
        if not self.registered.is_set() or self._stub is None:
            return
        try:
            resp = await self._stub.Deregister(
                workers_pb2.DeregisterRequest(worker_id=self.worker_id),
                metadata=self.metadata,
                timeout=self.rpc_timeout_s,
            )
            log.info("worker %s deregistered (%d leases revoked)", self.worker_id, resp.revoked)
        except grpc.aio.AioRpcError as e:
            if e.code() is not grpc.StatusCode.NOT_FOUND:
                log.warning("could not deregister worker %s: %s %s", self.worker_id, e.code(), e.details())
        self.registered.clear()
