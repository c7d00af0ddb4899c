"""The lease holder's side of checkpoint-and-yield: the SDK's callbacks, wired to the Worker service.

It lives beside the SDK, not in `slots/worker/`, because it is runtime-side code: it imports only
the SDK and the Worker stubs, so an agent runtime using it installs and imports no worker.

Why this exists: the SDK (`scheduler.client`) asks a runtime for two things — what to do when a
slot is granted (`on_grant`) and how to checkpoint when asked to yield (`on_yield`, which returns
the SnapshotRef the SDK passes to Yield). For actors hosted by slotsched workers both answers are
always the same gRPC calls at the lease's `worker_address`, so a runtime should not write them:

    workers = WorkerClients(token=RUNTIME_TOKEN)          # the only thing a runtime names
    async with client.session("sess-42", QoS.BESTEFFORT, **actor_callbacks(workers)) as s:
        ...                                               # grants, yields, resumes: handled

or, to also stop the actor when the session ends (recommended; see below),

    async with actor_session(client, "sess-42", QoS.BESTEFFORT, workers) as s:
        ...

`RUNTIME_TOKEN` is the runtime's own token for the workers' Worker service (its hash is in each
worker's `--accept-token-hash`), not the workers' token for the scheduler (`spec.access.workers`)
nor the tenant's token for the Scheduler service (the `client`'s).

* on grant: `Worker.Start(session, tenant, slot, lease_id, epoch, resume_from)` on the granted
  worker (retried while the worker is UNAVAILABLE). If the worker restored an older snapshot than
  the lease named (the named one was refused), a warning says so; the worker counted the loss.
* on YieldRequested: `Worker.Checkpoint(session)` -> SnapshotRef, then `Worker.Stop(session)` so
  the actor takes no turn the snapshot does not hold. If the checkpoint fails or times out, the
  callback raises: the SDK then does NOT yield, the scheduler revokes the lease at the deadline
  and re-queues the session from its last good snapshot. Yielding with a snapshot that was not
  written would be worse than losing the work since the last one. A checkpoint that completes
  after the deadline is not cut: the lease is revoked (its slot goes to the waiter) and the SDK
  sends the snapshot late; the session still waiting resumes from it.
* on YieldCancelled (the waiter left): a checkpoint in progress finishes, the actor is NOT
  stopped and keeps running on its lease. Once the Stop has begun it is too late: the SDK is
  told so and yields with the checkpoint (a voluntary yield; the session is re-granted).
* at the end of `actor_session`, `Worker.Stop(session)` before the lease is released: the
  worker counts an actor whose lease vanishes without a Stop as lost work (it cannot tell a
  release from a revocation), so plain `actor_callbacks` users should call `runtime.stop(lease)`
  themselves before leaving the session.

Checkpoint and Stop name the session's tenant and the lease (id and epoch) it holds: a worker that
verifies leases requires them, and touches only the actor started under that lease. Start,
Checkpoint and Stop also carry the lease's signed grant (`LeaseInfo.grant`, from Granted and
refreshed by every Renew): a worker holding the scheduler's public keys accepts nothing else. The
runtime never handles grants itself; a `WorkerClient` also remembers the grants it sent to its
worker and shows them in `status()`, which then reports those actors in full.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import grpc
import grpc.aio

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import worker_pb2, worker_pb2_grpc
from scheduler.client.aio import AsyncClient, AsyncSession, OnGrant, OnYield, OnYieldCancelled
from scheduler.client.channel import PemSource, tls_credentials
from scheduler.client.types import LeaseInfo, QoS, SnapshotRef

log = logging.getLogger("slotsched.runtime")

_RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})
#: Grants a WorkerClient remembers for `status()` (the oldest are dropped first).
MAX_REMEMBERED_GRANTS = 1024
MAX_STATUS_GRANTS = wire.MAX_STATUS_GRANTS  # the Worker service's limit per Status call


class WorkerCallError(Exception):
    """A Worker rpc failed; `code` is its gRPC status, `address` the worker."""

    def __init__(self, message: str, code: grpc.StatusCode | None, address: str) -> None:
        super().__init__(message)
        self.code = code
        self.address = address


@dataclass(frozen=True)
class StartReply:
    turns: int
    state_sha256: str
    #: Set when the worker restored an older snapshot than asked (or none): the one it used.
    restored_from_uri: str | None = None
    #: URIs of snapshots the worker refused (checksum mismatch, inconsistent, missing).
    refused: tuple[str, ...] = ()


class WorkerClient:
    """A client of one worker's `slotsched.v1.Worker` service (at a lease's `worker_address`)."""

    def __init__(
        self,
        address: str,
        token: str | None = None,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        tls_ca: PemSource | None = None,
        tls_cert: PemSource | None = None,
        tls_key: PemSource | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
        rpc_timeout_s: float = 10.0,
    ) -> None:
        self.address = address
        self.rpc_timeout_s = rpc_timeout_s
        self.metadata: tuple[tuple[str, str], ...] = (
            ((wire.AUTHORIZATION, f"{wire.BEARER}{token}"),) if token else ()
        )
        # TLS to a worker run with --tls-cert (and a client certificate for one with --tls-ca).
        self._credentials = tls_credentials(tls_ca, tls_cert, tls_key, credentials)
        self._options = list(channel_options)
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        #: The latest grant sent per (tenant, session): what `status()` shows the worker.
        self._grants: dict[tuple[str, str], str] = {}

    def _remember(self, tenant: str, session_id: str, grant: str) -> None:
        if not grant:
            return
        self._grants.pop((tenant, session_id), None)
        self._grants[(tenant, session_id)] = grant
        while len(self._grants) > MAX_REMEMBERED_GRANTS:
            del self._grants[next(iter(self._grants))]

    def stub(self) -> Any:
        if self._stub is None:
            if self._credentials is not None:
                self._channel = grpc.aio.secure_channel(
                    self.address, self._credentials, options=self._options
                )
            else:
                self._channel = grpc.aio.insecure_channel(self.address, options=self._options)
            self._stub = worker_pb2_grpc.WorkerStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def _error(self, what: str, e: grpc.aio.AioRpcError) -> WorkerCallError:
        return WorkerCallError(
            f"{what} on worker {self.address} failed: {e.code().name}: {e.details()}", e.code(), self.address
        )

    async def start(self, lease: LeaseInfo, tenant: str, timeout: float | None = None) -> StartReply:
        req = worker_pb2.StartRequest(
            session_id=lease.session_id,
            tenant=tenant,
            slot=lease.slot.to_proto(),
            lease_id=lease.lease_id,
            epoch=lease.epoch,
            grant=lease.grant,
        )
        self._remember(tenant, lease.session_id, lease.grant)
        if lease.resume_from is not None:
            req.resume_from.CopyFrom(lease.resume_from.to_proto())
        call = self.stub().Start(req, metadata=self.metadata, timeout=timeout or self.rpc_timeout_s)
        try:
            resp = await call
            trailing = await call.trailing_metadata()
        except grpc.aio.AioRpcError as e:
            raise self._error(f"Start of session {lease.session_id} on slot {lease.slot}", e) from e
        restored: str | None = None
        refused: list[str] = []
        for key, value in trailing or ():
            text = value if isinstance(value, str) else value.decode()
            if key == "slotsched-restored-from":
                restored = text
            elif key == "slotsched-refused-snapshot":
                refused.append(text)
        return StartReply(resp.turns, resp.state_sha256, restored if refused else None, tuple(refused))

    async def checkpoint(
        self,
        session_id: str,
        timeout: float | None = None,
        *,
        tenant: str = "",
        lease_id: str = "",
        epoch: int = 0,
        grant: str = "",
    ) -> SnapshotRef:
        self._remember(tenant, session_id, grant)
        try:
            pb = await self.stub().Checkpoint(
                worker_pb2.CheckpointRequest(
                    session_id=session_id, tenant=tenant, lease_id=lease_id, epoch=epoch, grant=grant
                ),
                metadata=self.metadata,
                timeout=timeout or self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            raise self._error(f"Checkpoint of session {session_id}", e) from e
        return SnapshotRef.from_proto(pb)

    async def stop(
        self,
        session_id: str,
        timeout: float | None = None,
        *,
        tenant: str = "",
        lease_id: str = "",
        epoch: int = 0,
        grant: str = "",
    ) -> bool:
        try:
            resp = await self.stub().Stop(
                worker_pb2.StopRequest(
                    session_id=session_id, tenant=tenant, lease_id=lease_id, epoch=epoch, grant=grant
                ),
                metadata=self.metadata,
                timeout=timeout or self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            raise self._error(f"Stop of session {session_id}", e) from e
        if self._grants.get((tenant, session_id)) == grant:
            del self._grants[(tenant, session_id)]
        return bool(resp.stopped)

    async def status(
        self, timeout: float | None = None, grants: Sequence[str] | None = None
    ) -> worker_pb2.StatusResponse:
        """The worker's slots; the actors of `grants` (default: the latest grant this client sent
        per session still running) are reported in full."""
        sent = list(self._grants.values())[-MAX_STATUS_GRANTS:] if grants is None else list(grants)
        try:
            resp: worker_pb2.StatusResponse = await self.stub().Status(
                worker_pb2.StatusRequest(grants=sent),
                metadata=self.metadata,
                timeout=timeout or self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            raise self._error("Status", e) from e
        return resp

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None


#: Gives the WorkerClient for a lease's `worker_address`.
WorkerClientFactory = Callable[[str], WorkerClient]


class WorkerClients:
    """The usual `WorkerClientFactory`: one cached `WorkerClient` (one channel) per address.
    `client_kwargs` go to each WorkerClient: e.g. `tls_ca=`, `tls_cert=`, `tls_key=` for workers
    serving TLS (`slotsched worker --tls-cert`, mTLS with `--tls-ca`)."""

    def __init__(self, token: str | None = None, **client_kwargs: Any) -> None:
        self.token = token
        self._kwargs = client_kwargs
        self._clients: dict[str, WorkerClient] = {}

    def __call__(self, address: str) -> WorkerClient:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = WorkerClient(address, self.token, **self._kwargs)
        return client

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
        self._clients.clear()

    async def __aenter__(self) -> WorkerClients:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@dataclass(frozen=True)
class Started:
    """What the worker reported when an actor was started for a lease."""

    session_id: str
    lease_id: str
    epoch: int
    slot: str
    worker_address: str
    turns: int
    state_sha256: str
    resume_from: SnapshotRef | None
    #: True when the worker had to use an older snapshot than `resume_from` (or none).
    fell_back: bool
    at: float  # unix time


@dataclass(frozen=True)
class Checkpointed:
    """One yield checkpoint, as the lease holder saw it."""

    session_id: str
    lease_id: str
    ref: SnapshotRef | None
    seconds: float
    error: str | None
    at: float  # unix time


class _Owner(TypedDict):
    tenant: str
    lease_id: str
    epoch: int
    grant: str


class ActorCallbacks(TypedDict):
    on_grant: OnGrant
    on_yield: OnYield
    on_yield_cancelled: OnYieldCancelled


class ActorRuntime:
    """The SDK callbacks for actors on slotsched workers (see the module docstring).

    `tenant` is used when a lease does not carry one. A yield checkpoint is bounded by
    `checkpoint_timeout_s` only, not by the lease's yield deadline: the deadline protects the
    waiter's latency, not the snapshot's validity, so a checkpoint that completes after the lease
    was revoked is still sent (a late Yield) and the session resumes from it.
    """

    def __init__(
        self,
        workers: WorkerClientFactory,
        tenant: str | None = None,
        *,
        checkpoint_timeout_s: float = 30.0,
        start_timeout_s: float = 120.0,
        start_attempts: int = 3,
        stop_after_checkpoint: bool = True,
        keep_records: int = 10_000,
    ) -> None:
        self.workers = workers
        self.tenant = tenant
        self.checkpoint_timeout_s = checkpoint_timeout_s
        self.start_timeout_s = start_timeout_s
        self.start_attempts = max(1, start_attempts)
        self.stop_after_checkpoint = stop_after_checkpoint
        #: The latest start per session.
        self.started: dict[str, Started] = {}
        self.checkpoints: deque[Checkpointed] = deque(maxlen=keep_records)
        # Per session, the yield in progress: its lease (id, epoch) and how far it got
        # ("checkpoint", "cancelled" while checkpointing, "stopping": too late to call off).
        self._yielding: dict[str, tuple[tuple[str, int], str]] = {}

    def callbacks(self) -> ActorCallbacks:
        return {
            "on_grant": self.on_grant,
            "on_yield": self.on_yield,
            "on_yield_cancelled": self.on_yield_cancelled,
        }

    def on_yield_cancelled(self, lease: LeaseInfo) -> bool:
        """The SDK's YieldCancelled (called on its loop, between awaits of `on_yield`): True keeps
        the lease (the actor was not stopped), False if the Stop has begun (yield anyway)."""
        key = lease.key
        entry = self._yielding.get(lease.session_id)
        if entry is None or entry[0] != key:
            return True
        if entry[1] == "stopping":
            return False
        self._yielding[lease.session_id] = (key, "cancelled")
        return True

    async def on_grant(self, lease: LeaseInfo) -> None:
        self._yielding.pop(lease.session_id, None)
        tenant = lease.tenant or self.tenant
        if not tenant:
            raise ValueError(f"lease {lease.lease_id} names no tenant and the runtime was given none")
        client = self.workers(lease.worker_address)
        delay = 0.2
        for attempt in range(self.start_attempts):
            try:
                reply = await client.start(lease, tenant, self.start_timeout_s)
                break
            except WorkerCallError as e:
                if e.code not in _RETRY_CODES or attempt == self.start_attempts - 1:
                    log.error("session %s: %s", lease.session_id, e)
                    raise
                await asyncio.sleep(delay)
                delay *= 2
        wanted = lease.resume_from
        fell_back = bool(reply.refused)
        if wanted is not None and wanted.sha256 and reply.state_sha256 != wanted.sha256 and not fell_back:
            fell_back = True  # a worker that does not say which one it used
        if fell_back:
            log.warning(
                "session %s resumed on %s from %s, not from %s (refused: %s); the worker counted the loss",
                lease.session_id,
                lease.slot,
                reply.restored_from_uri or "nothing (fresh start)",
                wanted.uri if wanted else None,
                ", ".join(reply.refused) or "unknown",
            )
        self.started[lease.session_id] = Started(
            lease.session_id,
            lease.lease_id,
            lease.epoch,
            str(lease.slot),
            lease.worker_address,
            reply.turns,
            reply.state_sha256,
            wanted,
            fell_back,
            time.time(),
        )

    async def on_yield(self, lease: LeaseInfo) -> SnapshotRef:
        client = self.workers(lease.worker_address)
        t0 = time.perf_counter()
        # Not cut at the yield deadline: a checkpoint that completes after it is still the one
        # the session resumes from (the SDK sends it as a late Yield; docs/design.md,
        # "Checkpoint-and-yield preemption"). Cut, it was thrown away with the work it saved.
        timeout = self.checkpoint_timeout_s
        key = lease.key
        self._yielding[lease.session_id] = (key, "checkpoint")
        try:
            ref = await client.checkpoint(lease.session_id, timeout, **self._owner(lease))
        except WorkerCallError as e:
            self._yielding.pop(lease.session_id, None)
            seconds = time.perf_counter() - t0
            self.checkpoints.append(
                Checkpointed(lease.session_id, lease.lease_id, None, seconds, str(e), time.time())
            )
            log.error(
                "session %s: checkpoint failed after %.2fs, NOT yielding: the lease will be revoked at its "
                "deadline and the session resumes from its last good snapshot (%s): %s",
                lease.session_id,
                seconds,
                lease.resume_from.uri if lease.resume_from else "none: fresh start",
                e,
            )
            raise
        seconds = time.perf_counter() - t0
        self.checkpoints.append(
            Checkpointed(lease.session_id, lease.lease_id, ref, seconds, None, time.time())
        )
        if self._yielding.get(lease.session_id) == (key, "cancelled"):
            del self._yielding[lease.session_id]
            log.info(
                "session %s: yield called off during the checkpoint; the actor runs on", lease.session_id
            )
            return ref  # the SDK keeps the lease and does not yield
        if self.stop_after_checkpoint:
            self._yielding[lease.session_id] = (key, "stopping")
            try:
                await client.stop(lease.session_id, **self._owner(lease))
            except WorkerCallError as e:  # the snapshot is good; the worker will fence the actor
                log.warning("session %s: stop after checkpoint failed: %s", lease.session_id, e)
        return ref

    async def stop(self, lease: LeaseInfo) -> bool:
        """Stop the session's actor on the lease's worker (e.g. before releasing the session)."""
        return await self.workers(lease.worker_address).stop(lease.session_id, **self._owner(lease))

    def _owner(self, lease: LeaseInfo) -> _Owner:
        """Who started the actor: what Checkpoint and Stop must name to reach it."""
        return {
            "tenant": lease.tenant or self.tenant or "",
            "lease_id": lease.lease_id,
            "epoch": lease.epoch,
            "grant": lease.grant,
        }


def actor_callbacks(workers: WorkerClientFactory, tenant: str | None = None, **kwargs: Any) -> ActorCallbacks:
    """`on_grant`/`on_yield` for `client.session(..., **actor_callbacks(workers))`."""
    return ActorRuntime(workers, tenant, **kwargs).callbacks()


@contextlib.asynccontextmanager
async def actor_session(
    client: AsyncClient,
    session_id: str,
    qos: QoS | str,
    workers: ActorRuntime | WorkerClientFactory,
    *,
    tenant: str | None = None,
    resume_from: SnapshotRef | None = None,
    wait_timeout_s: float | None = None,
    pool: str = "",
    selector: Mapping[str, str] | None = None,
    fallback: Sequence[str] = (),
) -> AsyncIterator[AsyncSession]:
    """`client.session(...)` with an actor on the granted worker, stopped before the release;
    `pool`, `selector` and `fallback` say where it may run (`AsyncClient.session`)."""
    runtime = workers if isinstance(workers, ActorRuntime) else ActorRuntime(workers, tenant)
    session = client.session(
        session_id,
        qos,
        resume_from=resume_from,
        wait_timeout_s=wait_timeout_s,
        pool=pool,
        selector=selector,
        fallback=fallback,
        **runtime.callbacks(),
    )
    async with session as s:
        try:
            yield s
        finally:
            lease = s.lease
            if lease is not None:
                try:
                    await runtime.stop(lease)
                except WorkerCallError as e:
                    log.warning("session %s: stopping its actor at the end failed: %s", session_id, e)
