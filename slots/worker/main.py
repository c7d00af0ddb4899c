"""Assembles a reference worker: snapshot store, actor host, Worker gRPC service, agent, metrics.

`start_worker` runs one on the current event loop and returns a handle (the demo runs several
in-process next to an in-process scheduler; tests use it too); `run_worker` is what
`slotsched worker` runs: it serves until SIGTERM/SIGINT or until the scheduler drains it, and on
the way out drains itself, deregisters and stops its actors (counting what they lose).

Two credentials, two directions: `token` is the worker's own, shown to the scheduler's Workers
service (the worker role, `spec.access.workers` of the scheduler's policy); `accept_token_hashes`
are what lease holders must show this worker's Worker service.

`verify_leases` (default on; `--no-verify-leases` off): every Start must match a lease the
scheduler lists for this worker in its heartbeats (the agent is the service's lease source, see
leases.py and service.py). Off only for a worker used without a scheduler's grants (a
standalone test of the Worker service): then any token holder may start any actor.

`grants` (`--verify-grants`, or `--grant-public-keys`, which also accepts the g1 grants of a
scheduler not upgraded yet): Start, Checkpoint and Stop must carry the lease's grant (service.py),
checked with the keys the agent gets in its Register and Heartbeat answers. Without, grants are
not checked (dev mode: the worker warns at start). `admin_token_hashes` may see every actor in
Status.

`tls` (`--tls-cert/--tls-key/--tls-ca`): the Worker service speaks TLS with that certificate
(requiring client certificates of the CA when one is given), and the agent's channel to the
scheduler uses the same certificate as its client certificate and the CA to verify the scheduler.
Requests are decoded and length-checked by scheduler/api/guard.py, as on the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
import grpc.aio

from scheduler.api import guard
from scheduler.api.gen.slotsched.v1 import worker_pb2_grpc
from scheduler.client.channel import tls_credentials
from scheduler.grants import GrantVerifier
from scheduler.listen import (
    ListenError,
    TlsFiles,
    add_grpc_port,
    check_bindable,
    close_metrics_http,
    split_hostport,
    start_metrics_http,
)
from slots.worker.actor import ActorConfig
from slots.worker.agent import STOPPED, SchedulerRefused, WorkerAgent
from slots.worker.defaults import DEFAULT_SNAPSHOTS
from slots.worker.host import ActorHost
from slots.worker.metrics import WorkerMetrics
from slots.worker.service import WorkerService, refuse_request
from snapshots.config import store_from_url
from snapshots.store import SnapshotStore

log = logging.getLogger("slotsched.worker")


@dataclass
class RunningWorker:
    worker_id: str
    address: str
    port: int
    host: ActorHost
    service: WorkerService
    server: grpc.aio.Server
    agent: WorkerAgent
    metrics: WorkerMetrics
    metrics_port: int | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _agent_task: asyncio.Task[str] | None = None
    _httpd: WSGIServer | None = None
    _closed: bool = False

    async def wait(self) -> str:
        """Until the agent is done: DRAINED (by the scheduler) or STOPPED (by `stop`)."""
        assert self._agent_task is not None
        return await asyncio.shield(self._agent_task)

    async def stop(self, grace: float = 1.0) -> None:
        """Drain ourselves (bounded), deregister, stop serving, stop what is left (counted)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._agent_task is not None:
            with contextlib.suppress(Exception):
                await self._agent_task
        self.service.shutting_down = True
        await self.server.stop(grace)
        await self.host.aclose()
        if self._httpd is not None:
            await asyncio.to_thread(close_metrics_http, self._httpd)

    async def kill(self) -> None:
        """Die without telling anyone (tests of a crashed worker): no drain, no deregister."""
        if self._closed:
            return
        self._closed = True
        if self._agent_task is not None:
            self._agent_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._agent_task
        await self.server.stop(0)
        await self.host.aclose()
        if self._httpd is not None:
            await asyncio.to_thread(close_metrics_http, self._httpd)


async def start_worker(
    scheduler_target: str,
    worker_id: str,
    slots: int,
    listen: str = "127.0.0.1:0",
    snapshots: str | SnapshotStore = DEFAULT_SNAPSHOTS,
    *,
    token: str | None = None,
    tenant: str | None = None,
    pool: str = "",
    advertise: str | None = None,
    actor_config: ActorConfig | None = None,
    accept_token_hashes: Collection[str] = (),
    metrics_listen: str | None = None,
    labels: dict[str, str] | None = None,
    fallback: bool = True,
    drain_yield_s: float = 10.0,
    drain_timeout_s: float = 30.0,
    verify_leases: bool = True,
    grants: GrantVerifier | None = None,
    admin_token_hashes: Collection[str] = (),
    tls: TlsFiles | None = None,
) -> RunningWorker:
    """Start a worker on the running loop: serve the Worker service, then register and heartbeat."""
    store = store_from_url(snapshots) if isinstance(snapshots, str) else snapshots
    metrics = WorkerMetrics()
    host = ActorHost(worker_id, slots, store, actor_config, metrics, fallback=fallback)
    service = WorkerService(host, accept_token_hashes, grants=grants, admin_token_hashes=admin_token_hashes)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    registrar: Any = guard.GuardedRegistrar(server, refuse_request)
    worker_pb2_grpc.add_WorkerServicer_to_server(service, registrar)  # type: ignore[no-untyped-call]
    channel_credentials = None
    if tls is not None and tls.enabled:
        channel_credentials = tls_credentials(
            tls.read("ca") if tls.ca else None, tls.read("cert"), tls.read("key")
        )
    lhost, _ = split_hostport(listen, "--listen")
    if advertise is None and lhost in ("", "0.0.0.0", "::"):
        raise ValueError(f"listening on {listen}: give --advertise HOST:PORT (the address clients dial)")
    if metrics_listen:
        check_bindable(metrics_listen, "--metrics-listen")  # before binding anything: nothing to undo
    port = add_grpc_port(server, listen, "--listen", tls)
    if advertise is None:
        advertise = f"{lhost}:{port}"
    httpd = None
    metrics_port = None
    if metrics_listen:
        try:
            httpd = start_metrics_http(metrics_listen, "--metrics-listen", metrics.registry)
        except ListenError:
            await server.stop(None)  # frees the Worker service port bound above
            raise
        metrics_port = httpd.server_port
    await server.start()
    if not accept_token_hashes:
        log.warning("worker %s accepts Worker calls from anyone (no --accept-token-hash given)", worker_id)
    if not verify_leases:
        log.warning("worker %s starts actors without verifying their leases (--no-verify-leases)", worker_id)
    if grants is None:
        log.warning(
            "worker %s checks no grants (no --verify-grants): any accepted caller may checkpoint or "
            "stop any actor here",
            worker_id,
        )
    agent = WorkerAgent(
        scheduler_target,
        worker_id,
        advertise,
        host,
        token=token,
        tenant=tenant,
        labels=labels,
        pool=pool,
        drain_yield_s=drain_yield_s,
        drain_timeout_s=drain_timeout_s,
        credentials=channel_credentials,
    )
    agent.on_pool = service.join_pool  # its snapshots record the pool and its labels
    if verify_leases:
        service.leases = agent
    if grants is not None:
        agent.on_grant_keys = service.install_grant_keys  # this worker's keys, from the scheduler
        service.refresher = agent
    running = RunningWorker(worker_id, advertise, port, host, service, server, agent, metrics, metrics_port)
    running._httpd = httpd
    running._agent_task = asyncio.create_task(agent.run(running._stop), name=f"agent-{worker_id}")
    return running


async def run_worker(
    scheduler_target: str,
    worker_id: str,
    slots: int,
    listen: str,
    snapshot_url: str = DEFAULT_SNAPSHOTS,
    *,
    token: str | None = None,
    tenant: str | None = None,
    pool: str = "",
    advertise: str | None = None,
    actor_config: ActorConfig | None = None,
    accept_token_hashes: Collection[str] = (),
    metrics_listen: str | None = None,
    fallback: bool = True,
    drain_yield_s: float = 10.0,
    drain_timeout_s: float = 30.0,
    verify_leases: bool = True,
    grants: GrantVerifier | None = None,
    admin_token_hashes: Collection[str] = (),
    tls: TlsFiles | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT or a drain by the scheduler; returns the process exit code."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        running = await start_worker(
            scheduler_target,
            worker_id,
            slots,
            listen,
            snapshot_url,
            token=token,
            tenant=tenant,
            pool=pool,
            advertise=advertise,
            actor_config=actor_config,
            accept_token_hashes=accept_token_hashes,
            metrics_listen=metrics_listen,
            fallback=fallback,
            drain_yield_s=drain_yield_s,
            drain_timeout_s=drain_timeout_s,
            verify_leases=verify_leases,
            grants=grants,
            admin_token_hashes=admin_token_hashes,
            tls=tls,
        )
    except ListenError as e:
        print(f"error: {e}", file=sys.stderr)  # names the address and the flag
        return 2
    except (OSError, ValueError) as e:
        print(f"slotsched worker: cannot start: {e}", file=sys.stderr)
        return 1
    print(
        f"slotsched worker {worker_id} serving on {running.address} ({slots} slots), "
        f"scheduler {scheduler_target}",
        flush=True,
    )
    if running.metrics_port is not None:
        print(f"slotsched worker metrics on port {running.metrics_port}", flush=True)
    stop = asyncio.Event()
    aloop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            aloop.add_signal_handler(sig, stop.set)
    waiter = asyncio.ensure_future(stop.wait())
    agent_done = asyncio.ensure_future(running.wait())
    await asyncio.wait([waiter, agent_done], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    rc, reason = 0, STOPPED
    if agent_done.done():
        error = agent_done.exception()
        if isinstance(error, SchedulerRefused):
            print(f"slotsched worker {worker_id}: {error}", file=sys.stderr, flush=True)
            rc, reason = 1, "refused by the scheduler"
        elif error is not None:
            text: object = error  # one line, not an AioRpcError's multi-line repr
            if isinstance(error, grpc.aio.AioRpcError):
                text = f"{error.code().name}: {error.details()}"
            print(f"slotsched worker {worker_id}: agent failed: {text}", file=sys.stderr, flush=True)
            rc, reason = 1, "agent failed"
        else:
            reason = agent_done.result()
    print(f"slotsched worker {worker_id} shutting down ({reason})", flush=True)
    await running.stop()
    print(f"slotsched worker {worker_id} stopped", flush=True)
    return rc
