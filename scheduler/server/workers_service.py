"""The Workers service: worker agents join, report liveness, drain and leave.

Translation only; membership and liveness bookkeeping live in `registry.WorkerRegistry`, the slot
accounting in the core.

Who may call: in secure mode the worker role (worker agents, `spec.access.workers`) or the admin
role (operators draining by hand, `spec.access.admins`); a tenant token is PERMISSION_DENIED,
since Drain and Deregister revoke other tenants' leases and a registered address is where
sessions of every tenant are sent. In insecure dev mode anyone.
"""

from __future__ import annotations

from typing import Any

from scheduler.api.gen.slotsched.v1 import workers_pb2, workers_pb2_grpc
from scheduler.core.types import Revoked, WorkerId
from scheduler.server import convert, errors
from scheduler.server.auth import Authenticator
from scheduler.server.registry import WorkerRegistry

MAX_SLOTS = 1024


def _worker_id(value: str) -> WorkerId:
    if not value:
        raise errors.invalid_argument("worker_id", "required")
    return WorkerId(value)


class WorkersService(workers_pb2_grpc.WorkersServicer):
    def __init__(self, registry: WorkerRegistry, auth: Authenticator) -> None:
        self._registry = registry
        self._loop = registry.loop
        self._auth = auth

    def _guard(self, context: Any) -> None:
        if self._loop.shutting_down:
            raise errors.unavailable()
        self._auth.require_worker(context)

    def _leases_on(self, worker: WorkerId) -> list[Any]:
        return [
            convert.lease_to_pb(lease, self._loop.address(worker), self._loop.yielding(lease.lease_id))
            for lease, _ in self._loop.core.leases()
            if lease.slot.worker == worker
        ]

    @errors.unary
    async def Register(
        self, request: workers_pb2.RegisterRequest, context: Any
    ) -> workers_pb2.RegisterResponse:
        self._guard(context)
        wid = _worker_id(request.worker_id)
        if not request.address:
            raise errors.invalid_argument("address", "required")
        if not 1 <= request.slots <= MAX_SLOTS:
            raise errors.invalid_argument("slots", f"must be 1 to {MAX_SLOTS}")
        self._registry.register(wid, request.address, request.slots, dict(request.labels))
        await self._loop.durable()
        interval = convert.dur(self._registry.heartbeat_interval_s)
        return workers_pb2.RegisterResponse(heartbeat_interval=interval)

    @errors.unary
    async def Heartbeat(
        self, request: workers_pb2.HeartbeatRequest, context: Any
    ) -> workers_pb2.HeartbeatResponse:
        self._guard(context)
        w = self._registry.heartbeat(_worker_id(request.worker_id))
        # Built now, sent once durable: the leases listed must survive a crash, and a read after
        # the wait could list leases of later events that are not durable yet.
        resp = workers_pb2.HeartbeatResponse(draining=w.draining, leases=self._leases_on(w.worker_id))
        await self._loop.durable()
        return resp

    @errors.unary
    async def Drain(self, request: workers_pb2.DrainRequest, context: Any) -> workers_pb2.DrainResponse:
        self._guard(context)
        wid = _worker_id(request.worker_id)
        within = None
        if request.HasField("yield_within"):
            within = convert.from_dur(request.yield_within)
            if within < 0:
                raise errors.invalid_argument("yield_within", "must not be negative")
        self._registry.drain(wid, within)
        resp = workers_pb2.DrainResponse(leases=len(self._leases_on(wid)))
        if within is not None:
            resp.estimated_drain.CopyFrom(convert.dur(within))
        await self._loop.durable()
        return resp

    @errors.unary
    async def Deregister(
        self, request: workers_pb2.DeregisterRequest, context: Any
    ) -> workers_pb2.DeregisterResponse:
        self._guard(context)
        decisions = self._registry.deregister(_worker_id(request.worker_id))
        await self._loop.durable()
        return workers_pb2.DeregisterResponse(revoked=sum(1 for d in decisions if isinstance(d, Revoked)))
