"""Assembles a running slotsched server: loop, servicers, health, reflection, metrics, signals.

`start_server` is what tests and embedders use (binds port 0, returns the ports and a `stop`);
`serve_forever` is what `slotsched serve` runs: it prints where it listens, then on SIGTERM or
SIGINT turns health to NOT_SERVING, refuses new work with UNAVAILABLE, ends open Acquire streams
with UNAVAILABLE (clients re-attach elsewhere), and stops the gRPC server within the grace.

Without a policy file the server runs in INSECURE dev mode on the built-in policy: the tenant is
taken from the `x-slotsched-tenant` header and nothing is authenticated.

With `--state redis://…` (StateOptions) the replica journals to Redis and serves only while it
holds the leader lease (scheduler/state/replica.py): until then, and after stepping down, health
is NOT_SERVING and an interceptor answers the Scheduler, Workers, Admin and KEDA services
UNAVAILABLE "not the leader"; the reaper and the autoscaler run only on the leader.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from scheduler.api.gen.externalscaler import externalscaler_pb2
from scheduler.api.gen.slotsched.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    workers_pb2,
    workers_pb2_grpc,
)
from scheduler.core.types import WorkerId
from scheduler.listen import ListenError, add_grpc_port, check_bindable, start_metrics_http
from scheduler.policy.defaults import default_policy
from scheduler.policy.errors import PolicyError
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import load_policy
from scheduler.server.admin_service import AdminService
from scheduler.server.auth import TENANT_HEADER, Authenticator
from scheduler.server.keda_service import add_keda_servicer
from scheduler.server.loop import SchedulerLoop
from scheduler.server.metrics import Metrics
from scheduler.server.registry import WorkerRegistry
from scheduler.server.scheduler_service import SchedulerService
from scheduler.server.workers_service import WorkersService
from slots.actuators.base import Actuator
from slots.actuators.factory import actuator_from_env
from slots.autoscaler.demand import CoreDemand, weighted_demand_of_pool
from slots.autoscaler.loop import Autoscaler

log = logging.getLogger("slotsched.server")


@dataclass(frozen=True)
class StateOptions:
    """Where durable state lives (`slotsched serve --state`); memory keeps none."""

    state: str = "memory"  # memory | redis://HOST:PORT/DB
    prefix: str = "slotsched"
    replica_id: str | None = None  # default hostname-pid
    leader_ttl_s: float = 5.0
    snapshot_every: int = 1000
    snapshot_interval_s: float = 60.0


SERVICE_NAMES = (
    scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name,
    workers_pb2.DESCRIPTOR.services_by_name["Workers"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
    externalscaler_pb2.DESCRIPTOR.services_by_name["ExternalScaler"].full_name,
)
DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"  # the port deploy/ scrapes


def _split_hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, not {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass
class RunningServer:
    port: int
    metrics_port: int | None
    host: str
    secure: bool
    policy: Policy
    loop: SchedulerLoop
    registry: WorkerRegistry
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    _httpd: WSGIServer | None = None
    autoscaler: Autoscaler | None = None
    _actuator: Actuator | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stopped: bool = False
    replica: Any = None  # scheduler.state.replica.Replica in redis mode (imported lazily)

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    async def begin_shutdown(self) -> None:
        """Health NOT_SERVING, new calls UNAVAILABLE, open streams ended with UNAVAILABLE."""
        await self.health.enter_graceful_shutdown()
        self.loop.begin_shutdown()

    async def stop(self, grace: float | None = 1.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.begin_shutdown()
        if self.replica is not None:
            await self.replica.stop()  # resign at once: a standby takes over without waiting a TTL
        if self._httpd is not None:
            # shutdown() waits out serve_forever's 0.5 s poll; nothing needs to wait for it.
            threading.Thread(target=_close_httpd, args=(self._httpd,), daemon=True).start()
        await self.server.stop(grace)
        for t in self._tasks:
            t.cancel()
        close = getattr(self._actuator, "close", None)
        if close is not None:
            close()  # the local actuator stops the worker processes it started
        self.loop.close()


class _LeaderGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Redis mode: while this replica does not serve, the scheduling services answer UNAVAILABLE."""

    def __init__(self, serving: Callable[[], bool], message: str, retry_after_ms: str) -> None:
        self._serving = serving
        self._gated = tuple(f"/{name}/" for name in SERVICE_NAMES)
        self._md = (("retry-after-ms", retry_after_ms),)
        self._message = message

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if self._serving() or handler is None or not details.method.startswith(self._gated):
            return handler

        async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self._message, trailing_metadata=self._md)

        kw = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(refuse, **kw)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(refuse, **kw)
        return handler


def _close_httpd(httpd: WSGIServer) -> None:
    httpd.shutdown()
    httpd.server_close()


def _load(policy_path: str | None) -> tuple[Policy, bool]:
    if policy_path is None:
        return default_policy(), False  # the INSECURE warning comes once the server has started
    policy, warnings = load_policy(policy_path)
    for w in warnings:
        log.warning("policy %s: %s", policy_path, w)
    if not any(t.tokens for t in policy.tenants):
        log.warning("policy %s lists no token: every Scheduler call will be refused", policy_path)
    if not policy.access.admins:
        log.warning("policy %s lists no spec.access.admins: the Admin service refuses everyone", policy_path)
    if not (policy.access.workers or policy.access.admins):
        log.warning(
            "policy %s lists no spec.access.workers: no worker agent can register",
            policy_path,
        )
    return policy, True


async def start_server(
    policy_path: str | None = None,
    listen: str = "127.0.0.1:0",
    metrics_listen: str | None = "127.0.0.1:0",
    static_pool: bool = True,
    *,
    heartbeat_interval_s: float = 5.0,
    autoscaler_env: Mapping[str, str] | None = None,
    autoscale_period_s: float = 15.0,
    state: StateOptions | None = None,
) -> RunningServer:
    """Start a server on the running event loop. Raises PolicyError for a bad policy file.

    `autoscaler_env` (default: the process environment) chooses the companion autoscaler's
    actuator through SLOTSCHED_AUTOSCALER (off | local | kubernetes | dry-run); see
    slots/actuators/factory.py. The KEDA external scaler is always served.

    `state` (default memory) with a redis:// URL makes this a Redis-backed replica; a bad URL
    raises ValueError naming `--state`."""
    state = state or StateOptions()
    redis_url = None
    if state.state != "memory":
        from scheduler.state.redis_store import parse_state

        redis_url = parse_state(state.state)
    policy, secure = _load(policy_path)
    metrics = Metrics()
    loop = SchedulerLoop(policy, metrics)
    auth = Authenticator(secure, lambda: loop.core.policy)
    registry = WorkerRegistry(loop, heartbeat_interval_s)

    def register_static_pool() -> None:
        for i in range(policy.pool.workers):
            registry.register(WorkerId(f"local-{i}"), "local", policy.pool.slots_per_worker, {}, static=True)

    if static_pool and redis_url is None:
        register_static_pool()  # redis mode: on a fresh store only (the journal has them otherwise)

    replica: Any = None
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if redis_url is not None:
        from scheduler.state.redis_store import RedisStore
        from scheduler.state.replica import NOT_LEADER, RETRY_AFTER_MS, Replica, StateMetrics

        loop.shutting_down = True  # nothing runs on the core until this replica leads
        store = RedisStore(
            redis_url,
            state.prefix,
            state.replica_id or f"{os.uname().nodename}-{os.getpid()}",
            # One slow call must not outlast the leader lease it is meant to keep.
            timeout_s=min(1.0, state.leader_ttl_s / 3),
        )
        holder: list[Any] = []
        interceptors.append(
            _LeaderGate(lambda: bool(holder and holder[0].serving), NOT_LEADER, RETRY_AFTER_MS)
        )

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)], interceptors=interceptors)
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(SchedulerService(loop, auth), server)  # type: ignore[no-untyped-call]
    workers_pb2_grpc.add_WorkersServicer_to_server(WorkersService(registry, auth), server)  # type: ignore[no-untyped-call]
    admin_pb2_grpc.add_AdminServicer_to_server(AdminService(registry, auth), server)  # type: ignore[no-untyped-call]

    def demand() -> float:
        # A standby's (or a stepped-down leader's) core is stale: end KEDA's stream so it
        # reconnects through the Service to the leader, rather than read frozen demand.
        if loop.shutting_down:
            raise RuntimeError("this replica is not serving")
        return weighted_demand_of_pool(loop.core.describe(), loop.core.policy)

    add_keda_servicer(server, demand, lambda: loop.core.policy.pool.slots_per_worker)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)

    async def set_health(serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *SERVICE_NAMES):
            await health_servicer.set(name, status)

    await set_health(redis_url is None)
    names = (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)

    host, _ = _split_hostport(listen)
    if metrics_listen:
        check_bindable(metrics_listen, "--metrics-listen")  # before binding anything: nothing to undo
    port = add_grpc_port(server, listen, "--listen")
    httpd = None
    metrics_port = None
    if metrics_listen:
        try:
            httpd = start_metrics_http(metrics_listen, "--metrics-listen", metrics.registry)
        except ListenError:
            await server.stop(None)  # frees the gRPC port bound above
            raise
        metrics_port = httpd.server_port
    await server.start()
    running = RunningServer(
        port, metrics_port, host, secure, policy, loop, registry, server, health_servicer, httpd
    )
    if redis_url is None:
        running._tasks.append(asyncio.create_task(registry.run_reaper()))
    env = os.environ if autoscaler_env is None else autoscaler_env
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    actuator = actuator_from_env(env, scheduler=f"{reach}:{port}", slots=policy.pool.slots_per_worker)
    if actuator is not None:
        running._actuator = actuator
        running.autoscaler = Autoscaler(
            CoreDemand(lambda: loop.core.describe(), lambda: loop.core.policy),
            registry,
            actuator,
            lambda: loop.core.policy,
            clock=loop.now,
            registry=metrics.registry,
            period_s=autoscale_period_s,
        )
        if redis_url is None:
            running._tasks.append(asyncio.create_task(running.autoscaler.run()))
        log.info(
            "autoscaler on: %s actuator, every %.0f s", env.get("SLOTSCHED_AUTOSCALER"), autoscale_period_s
        )
    if redis_url is not None:
        lead_tasks: list[asyncio.Task[None]] = []

        async def on_lead(fresh: bool) -> None:
            if fresh:
                loop.apply_policy(policy)  # journaled first: replay never depends on today's file
                if static_pool:
                    register_static_pool()
            lead_tasks.append(asyncio.create_task(registry.run_reaper()))
            if running.autoscaler is not None:
                lead_tasks.append(asyncio.create_task(running.autoscaler.run()))
            await set_health(True)

        async def on_step_down() -> None:
            for t in lead_tasks:
                t.cancel()
            lead_tasks.clear()
            await set_health(False)

        replica = Replica(
            store,
            loop,
            registry,
            policy,
            StateMetrics(metrics.registry),
            on_lead=on_lead,
            on_step_down=on_step_down,
            leader_ttl_s=state.leader_ttl_s,
            snapshot_every=state.snapshot_every,
            snapshot_interval_s=state.snapshot_interval_s,
        )
        holder.append(replica)
        loop.journal = replica
        running.replica = replica
        running._tasks.append(asyncio.create_task(_cancel_on_exit(lead_tasks)))
        try:
            await replica.start()
        except BaseException:
            await running.stop(0)
            raise
        if replica.fatal is not None:
            await running.stop(0)
            raise RuntimeError(f"cannot recover the state: {replica.fatal}")
    if not secure:
        # Only now, with the ports bound: a start that fails says why, not this.
        log.warning(
            "INSECURE dev mode: no policy file, using the built-in policy; the tenant is taken from the "
            "%s header and no caller is authenticated. Do not expose this port.",
            TENANT_HEADER,
        )
    return running


async def _cancel_on_exit(tasks: list[asyncio.Task[None]]) -> None:
    """Cancels the leader-only tasks when the server's own tasks are cancelled (stop)."""
    try:
        await asyncio.Event().wait()
    finally:
        for t in tasks:
            t.cancel()


async def serve_forever(
    policy_path: str | None = None,
    listen: str = DEFAULT_LISTEN,
    metrics_listen: str | None = DEFAULT_METRICS_LISTEN,
    static_pool: bool = True,
    grace_s: float = 5.0,
    autoscaler: str | None = None,
    state: StateOptions | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT, then shut down gracefully. Returns the process exit code.

    `autoscaler` (off | local | kubernetes | dry-run) overrides SLOTSCHED_AUTOSCALER."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        env = dict(os.environ)
        if autoscaler is not None:
            env["SLOTSCHED_AUTOSCALER"] = autoscaler
        running = await start_server(
            policy_path, listen, metrics_listen, static_pool, autoscaler_env=env, state=state
        )
    except PolicyError as e:
        for p in e.problems:
            print(f"error: {p}", file=sys.stderr)
        print(f"slotsched: cannot start: invalid policy {policy_path}", file=sys.stderr)
        return 2
    except ListenError as e:
        print(f"error: {e}", file=sys.stderr)  # names the address and the flag
        return 2
    except (OSError, RuntimeError, ValueError) as e:
        print(f"slotsched: cannot start: {e}", file=sys.stderr)
        return 1
    # Everything allocated so far (modules, descriptors, the policy) lives as long as the process:
    # keep it out of the collector's full passes, which otherwise stall the loop now and then.
    gc.freeze()
    print(f"slotsched serving gRPC on {running.target}", flush=True)
    if running.metrics_port is not None:
        mhost = _split_hostport(metrics_listen or "")[0]
        print(f"slotsched metrics on http://{mhost}:{running.metrics_port}/metrics", flush=True)
    if running.secure:
        n = len(running.policy.tenants)
        print(f"slotsched mode: secure, policy {running.policy.name!r} with {n} tenants", flush=True)
    else:
        print(f"slotsched mode: INSECURE dev mode (tenant from the {TENANT_HEADER} header)", flush=True)

    if running.replica is not None:
        role = "leader" if running.replica.serving else "standby"
        print(f"slotsched state: redis ({role}, replica {running.replica.store.replica_id})", flush=True)

    stop = asyncio.Event()
    aloop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        if threading.current_thread() is threading.main_thread():
            aloop.add_signal_handler(sig, stop.set)
    waits = [asyncio.create_task(stop.wait())]
    if running.replica is not None:
        waits.append(asyncio.create_task(running.replica.fatal_event.wait()))
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in waits:
        w.cancel()
    fatal = running.replica.fatal if running.replica is not None else None
    print("slotsched shutting down", flush=True)
    await running.stop(grace_s)
    print("slotsched stopped", flush=True)
    if fatal is not None:
        print(f"slotsched: cannot recover the state: {fatal}", file=sys.stderr)
        return 1
    return 0
