"""Assembles the gRPC server: the Scheduler, Workers, Admin and KEDA servicers, health,
reflection and the leader gate. No state store, no ports bound, no tasks started: that is the
composition root's job (scheduler/app/, which composes this with the state store, metrics and
the autoscaler). Every servicer serves the units of one router (pool_routes.py): `assemble`
builds the router of one loop, `assemble_router` takes any.

With a `serving` gate (a replicated server) the scheduling services answer UNAVAILABLE with reason
NOT_LEADER (and the leader's address, when known) while it returns False; `set_serving` turns
health SERVING / NOT_SERVING to match (Kubernetes' readiness: the Service routes to the leader).
Health also answers for STATE_HEALTH, the state store: NOT_SERVING while it is unreachable
(`set_store`), so a probe tells a replica that cannot reach Redis from a healthy standby, which
both are NOT_SERVING for the services.

Per-pool leadership (a `PoolRoutes` router): no leader gate, every replica serves, and each call
goes to its pool's unit (pool_routes.py), which answers NOT_LEADER naming the pool's leader for
a pool led elsewhere. Health "" (and each service) is SERVING while the replica is a member of
the replicas' membership, and `pool_health(pool)` is SERVING on the replica leading that pool.
"""

from __future__ import annotations

from collections.abc import Callable
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
from scheduler.server.fairness import KEDA_FLOW
from scheduler.server.keda_service import add_keda_servicer
from scheduler.server.leader_gate import GatedRegistrar
from scheduler.server.loop import SchedulerLoop
from scheduler.server.policy_log import PolicyLog
from scheduler.server.pool_routes import OneLoop, PoolUnit, Router
from scheduler.server.registry import WorkerRegistry
from scheduler.server.scheduler_service import SchedulerService
from scheduler.server.session_ops import SessionOps
from scheduler.server.workers_service import WorkersService

SERVICE_NAMES = (
    scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name,
    workers_pb2.DESCRIPTOR.services_by_name["Workers"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
    externalscaler_pb2.DESCRIPTOR.services_by_name["ExternalScaler"].full_name,
)
DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"  # the port deploy/ scrapes
#: The health entry of the state store: SERVING while it answers (always, with in-memory state).
STATE_HEALTH = "slotsched.state"


def pool_health(pool: str) -> str:
    """The health entry SERVING on the replica that leads `pool` (per-pool leadership)."""
    return f"slotsched.pool/{pool}"


class _Health(health.aio.HealthServicer):  # type: ignore[misc]
    """grpc's aio health servicer, with `List` (it raises NotImplementedError there: UNKNOWN)."""

    async def List(self, request: Any, context: Any) -> health_pb2.HealthListResponse:
        statuses = {name: health_pb2.HealthCheckResponse(status=s) for name, s in self._server_status.items()}
        return health_pb2.HealthListResponse(statuses=statuses)


#: Accept the SDK's keepalive pings (scheduler/client/channel.py: one a second on a quiet
#: connection, also with no call open), twice as often for timer slack: gRPC's defaults (a ping
#: every 5 min, none without a call) answer them GOAWAY too_many_pings, breaking every session.
KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
)


#: HTTP/2 flow control is how a Channel reader that waits for a seat (fairness.py) holds its
#: sender back; grpc's BDP probing would grow each stream's receive window to megabytes, letting a
#: flooder park a million commands in the server's buffers that must all be answered. The fixed
#: 64 KiB window is ample on the links a scheduler sits on (its messages are small).
FLOW_CONTROL_OPTIONS: tuple[tuple[str, int], ...] = (("grpc.http2.bdp_probe", 0),)


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

    async def set_store(self, reachable: bool) -> None:
        await self.health.set(STATE_HEALTH, _status(reachable))

    async def set_pool(self, pool: str, leading: bool) -> None:
        await self.health.set(pool_health(pool), _status(leading))


def _status(ok: bool) -> Any:
    return health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING


def one_loop(loop: SchedulerLoop, registry: WorkerRegistry, keys: GrantKeyring) -> OneLoop:
    """The router of a server's one loop."""
    return OneLoop(PoolUnit("", loop, SessionOps(loop, keys), registry))


def assemble(
    loop: SchedulerLoop,
    registry: WorkerRegistry,
    auth: Authenticator,
    demand: Callable[[], float],
    serving: Callable[[], bool] | None = None,
    grant_keys: GrantKeyring | None = None,
    leader: Callable[[], str | None] = lambda: None,
    policy_log: PolicyLog | None = None,
    store_down: Callable[[], str | None] = lambda: None,
) -> GrpcServer:
    """`assemble_router` over one loop and its registry."""
    keys = grant_keys if grant_keys is not None else GrantKeyring.generate()  # one for both services
    return assemble_router(
        one_loop(loop, registry, keys),
        auth,
        demand,
        lambda: loop.core.policy.pool.slots_per_worker,
        keys,
        policy_log,
        serving=serving,
        leader=leader,
        store_down=store_down,
    )


def assemble_router(
    router: Router,
    auth: Authenticator,
    demand: Callable[[], float],
    slots_per_worker: Callable[[], int],
    grant_keys: GrantKeyring,
    policy_log: PolicyLog | None = None,
    *,
    serving: Callable[[], bool] | None = None,
    leader: Callable[[], str | None] = lambda: None,
    store_down: Callable[[], str | None] = lambda: None,
) -> GrpcServer:
    """A gRPC server (not bound, not started) with every service on it, each serving the
    router's units. `demand` feeds KEDA (weighted demand in slots; a `PoolDemand` answers per
    pool); `serving`, if given, gates the scheduling services (and `leader` names the leader's
    address in the refusal, `store_down` the state store this replica cannot reach);
    `grant_keys` make the Scheduler service's grants and the Workers service hands each worker
    its own keys; `policy_log` counts and logs the policies Admin.ApplyPolicy puts in force."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *KEEPALIVE_OPTIONS, *FLOW_CONTROL_OPTIONS])
    # Every servicer is registered through the wire guard: undecodable or over-long requests are
    # INVALID_ARGUMENT before a servicer sees them (scheduler/api/guard.py); a replicated server's
    # scheduling services through the leader gate too (leader_gate.py), which checks first.
    reg: Any = server
    if serving is not None:
        reg = GatedRegistrar(server, SERVICE_NAMES, serving, leader, store_down)  # wraps the guard's
    reg = guard.GuardedRegistrar(reg, errors.refuse_request)
    scheduler = SchedulerService(router, auth, grant_keys)
    workers = WorkersService(router, auth, grant_keys)
    admin = AdminService(router, auth, policy_log)
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, reg)  # type: ignore[no-untyped-call]
    workers_pb2_grpc.add_WorkersServicer_to_server(workers, reg)  # type: ignore[no-untyped-call]
    admin_pb2_grpc.add_AdminServicer_to_server(admin, reg)  # type: ignore[no-untyped-call]
    add_keda_servicer(
        reg, demand, slots_per_worker, _keda_guard(auth), admit=lambda: auth.gate.admit(KEDA_FLOW)
    )
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
