"""Assembles the gRPC server: the Scheduler, Workers, Admin and KEDA servicers, health,
reflection and the leader gate. No state store, no ports bound, no tasks started: that is the
wiring root's job (scheduler/serve.py, which composes this with the state store, metrics and the
autoscaler).

With a `serving` gate (a replicated server) the scheduling services answer UNAVAILABLE "not the
leader" while it returns False; `set_serving` turns health SERVING / NOT_SERVING to match.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from scheduler.api import guard
from scheduler.api.gen.externalscaler import externalscaler_pb2
from scheduler.api.gen.slotsched.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    workers_pb2,
    workers_pb2_grpc,
)
from scheduler.grants import GrantKeyring
from scheduler.policy.model import ADMIN, WORKER
from scheduler.server import errors, reflection_v1
from scheduler.server.admin_service import AdminService
from scheduler.server.auth import AUTH_HEADER, Authenticator
from scheduler.server.keda_service import add_keda_servicer
from scheduler.server.loop import SchedulerLoop
from scheduler.server.registry import WorkerRegistry
from scheduler.server.scheduler_service import SchedulerService
from scheduler.server.workers_service import WorkersService

SERVICE_NAMES = (
    scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name,
    workers_pb2.DESCRIPTOR.services_by_name["Workers"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
    externalscaler_pb2.DESCRIPTOR.services_by_name["ExternalScaler"].full_name,
)
DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"  # the port deploy/ scrapes


class _LeaderGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """A replicated server: while this replica does not serve, the scheduling services answer UNAVAILABLE."""

    def __init__(self, serving: Callable[[], bool]) -> None:
        self._serving = serving
        self._gated = tuple(f"/{name}/" for name in SERVICE_NAMES)
        self._failure = errors.not_leader()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if self._serving() or handler is None or not details.method.startswith(self._gated):
            return handler

        async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await errors.abort(context, self._failure)

        kw = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(refuse, **kw)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(refuse, **kw)
        if handler.stream_stream is not None:  # the Scheduler's Channel
            return grpc.stream_stream_rpc_method_handler(refuse, **kw)
        return handler


class _Health(health.aio.HealthServicer):  # type: ignore[misc]
    """grpc's aio health servicer, with `List` (it raises NotImplementedError there: UNKNOWN)."""

    async def List(self, request: Any, context: Any) -> health_pb2.HealthListResponse:
        statuses = {name: health_pb2.HealthCheckResponse(status=s) for name, s in self._server_status.items()}
        return health_pb2.HealthListResponse(statuses=statuses)


@dataclass
class GrpcServer:
    server: grpc.aio.Server
    health: health.aio.HealthServicer

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, status)


def assemble(
    loop: SchedulerLoop,
    registry: WorkerRegistry,
    auth: Authenticator,
    demand: Callable[[], float],
    serving: Callable[[], bool] | None = None,
    grant_keys: GrantKeyring | None = None,
) -> GrpcServer:
    """A gRPC server (not bound, not started) with every service on it. `demand` feeds KEDA
    (weighted demand in slots); `serving`, if given, gates the scheduling services; `grant_keys`
    sign the Scheduler service's grants (None: a generated key)."""
    interceptors = [] if serving is None else [_LeaderGate(serving)]
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)], interceptors=interceptors)
    # Every servicer is registered through the wire guard: undecodable or over-long requests are
    # INVALID_ARGUMENT before a servicer sees them (scheduler/api/guard.py).
    reg: Any = guard.GuardedRegistrar(server, errors.refuse_request)
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(SchedulerService(loop, auth, grant_keys), reg)  # type: ignore[no-untyped-call]
    workers_pb2_grpc.add_WorkersServicer_to_server(WorkersService(registry, auth), reg)  # type: ignore[no-untyped-call]
    admin_pb2_grpc.add_AdminServicer_to_server(AdminService(registry, auth), reg)  # type: ignore[no-untyped-call]
    add_keda_servicer(reg, demand, lambda: loop.core.policy.pool.slots_per_worker, _keda_guard(auth))
    health_servicer = _Health()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, reg)
    reflection_v1.enable((*SERVICE_NAMES, health.SERVICE_NAME), reg)  # v1alpha and v1
    return GrpcServer(server, health_servicer)


def _keda_guard(auth: Authenticator) -> Callable[[Any, str | None], None] | None:
    """KEDA's endpoint reveals demand: with a policy it needs the worker or admin role, from the
    `authorization` header or, as KEDA sends none, from `token` in the trigger's metadata."""
    if not auth.secure:
        return None

    def check(context: Any, token: str | None) -> None:
        md = context.invocation_metadata() or ()
        if token is not None and not any(key == AUTH_HEADER for key, _ in md):
            context = _Bearer(token)
        auth._require(context, "KEDA external scaler", (WORKER, ADMIN))

    return check


class _Bearer:
    """A call context carrying only `authorization: Bearer <token>` (KEDA's metadata token)."""

    def __init__(self, token: str) -> None:
        self._md = ((AUTH_HEADER, f"Bearer {token}"),)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md
