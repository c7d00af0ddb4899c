"""The Workers service: worker agents join, report liveness, drain and leave.

Translation only; membership and liveness bookkeeping live in `registry.WorkerRegistry`, the slot
accounting in the core. Each call goes to the unit its router gives (pool_routes.py): Register
to the pool it names, the others to the unit whose registry holds the worker; under per-pool
leadership a pool led by another replica answers NOT_LEADER naming the pool's leader, which
the worker follows.

Who may call (secure mode), checked before anything is read or changed:

* a worker credential (`spec.access.workers[i]`) for the worker ids in its entry's scope
  (`workerIds` or `workerIdPrefix`); any other id is PERMISSION_DENIED naming the id and the key,
  so one worker cannot heartbeat as another (reading its leases), drain or deregister it
  (revoking other tenants' leases), or re-register its id at its own address (and be sent its
  grants). Register may claim at most the entry's `maxSlots` (PERMISSION_DENIED past it: an
  authority limit) and never more than MAX_WORKER_SLOTS (INVALID_ARGUMENT, for anyone);
* the admin role for any id (an operator drains by hand), bounded by MAX_WORKER_SLOTS only;
* a tenant: PERMISSION_DENIED.

Re-registering a live id: at the same address with the same slots it is idempotent (a worker
re-registering after a scheduler restart keeps its leases). At another address or with other
slots it is the same worker restarted only if the caller is the entry whose scope holds the id
(scopes never overlap, so that entry is the id's one identity): the old registration is then
replaced — removed as by Deregister, its leases revoked and their sessions re-queued — and the
new one added. Anyone else (an admin included) gets FAILED_PRECONDITION "Deregister first", and
the scheduler's in-process pool is never replaced. In insecure dev mode anyone acts as an admin.

Grant keys: every Register and Heartbeat answer carries the worker's own grant keys (K_w of
each key id, the signing one first; scheduler/grants.py), which it checks the grants runtimes
show it with. Only here, after the scope check: a worker credential can obtain the keys of the ids
in its scope only, so no worker can make a grant another worker accepts.

Register's `slot_epochs` (the highest epoch the worker has seen per slot) raise the core's epoch
counters of a newly added worker: a scheduler restarted without its state would otherwise grant
epochs the worker refuses as older than ones it already accepted.
"""

from __future__ import annotations

from typing import Any

from scheduler.api.gen.slotsched.v1 import workers_pb2, workers_pb2_grpc
from scheduler.core.placement import default_pool
from scheduler.core.types import Revoked, WorkerId
from scheduler.grants import GrantKeyring
from scheduler.policy.identities import Identity
from scheduler.policy.model import WORKER
from scheduler.policy.schema import MAX_WORKER_SLOTS, WORKER_ID_MAX_LEN
from scheduler.server import convert, errors
from scheduler.server.auth import Authenticator
from scheduler.server.fairness import ADMIN_FLOW, WORKER_FLOW
from scheduler.server.pool_routes import PoolUnit, Router

MAX_SLOTS = MAX_WORKER_SLOTS
#: Highest slot epoch a Register may report: its successor still fits a JSON number exactly.
MAX_REPORTED_EPOCH = 2**53 - 1


def _worker_id(value: str) -> WorkerId:
    if not value:
        raise errors.invalid_argument("worker_id", "required")
    if len(value) > WORKER_ID_MAX_LEN:
        raise errors.invalid_argument("worker_id", f"longer than {WORKER_ID_MAX_LEN} characters")
    return WorkerId(value)


class WorkersService(workers_pb2_grpc.WorkersServicer):
    def __init__(self, router: Router, auth: Authenticator, keys: GrantKeyring) -> None:
        self._router = router
        self._keys = keys
        self._auth = auth
        # The one Authenticator of the server counts its rate-limit refusals in the server's
        # metrics (every unit's loop counts in the same).
        metrics = router.first().loop.metrics
        auth.limits.metrics = metrics
        auth.gate.metrics = auth.streams.metrics = metrics

    async def _guard(
        self, unit: PoolUnit, context: Any, rpc: str, worker_id: str
    ) -> tuple[Identity, WorkerId]:
        """The caller's identity and the checked worker id it may act as, once the fair
        admission gate admits the call in the workers' flow (an admin's: the admins'), so a
        tenant's flood never holds a heartbeat back; else the failure."""
        loop = unit.loop
        if loop.shutting_down:
            raise errors.unavailable()
        identity = self._auth.worker(context, rpc)
        wid = _worker_id(worker_id)
        self._auth.require_scope(identity, wid)
        await self._auth.gate.admit(WORKER_FLOW if identity.role == WORKER else ADMIN_FLOW)
        if loop.shutting_down:
            raise errors.unavailable()
        return identity, wid

    def _grant_keys(self, worker: WorkerId) -> list[workers_pb2.GrantKey]:
        return [workers_pb2.GrantKey(key_id=kid, key=key) for kid, key in self._keys.worker_keys(worker)]

    @staticmethod
    def _leases_on(unit: PoolUnit, worker: WorkerId) -> list[Any]:
        loop = unit.loop
        return [
            convert.lease_to_pb(lease, loop.address(worker), loop.yielding(lease.lease_id))
            for lease, _ in loop.core.leases()
            if lease.slot.worker == worker
        ]

    @errors.unary
    async def Register(
        self, request: workers_pb2.RegisterRequest, context: Any
    ) -> workers_pb2.RegisterResponse:
        unit = self._router.for_register(request.worker_id, request.pool)
        identity, wid = await self._guard(unit, context, "Register", request.worker_id)
        if not request.address:
            raise errors.invalid_argument("address", "required")
        if not 1 <= request.slots <= MAX_SLOTS:
            raise errors.invalid_argument("slots", f"must be 1 to {MAX_SLOTS}")
        w = identity.worker
        if w is not None and request.slots > w.max_slots:
            raise errors.worker_slots_over_bound(request.slots, f"{identity.key}.maxSlots", w.max_slots)
        epochs = tuple(sorted(request.slot_epochs.items()))
        for index, epoch in epochs:
            if index >= request.slots or epoch > MAX_REPORTED_EPOCH:
                raise errors.invalid_argument(
                    "slot_epochs", f"slot {index} epoch {epoch}: slots 0 to {request.slots - 1}, epochs "
                    f"at most {MAX_REPORTED_EPOCH}"
                )  # fmt: skip
        policy = unit.loop.core.policy
        pool = request.pool or default_pool(policy)
        spec = policy.pool_spec(pool) if pool else None
        if spec is None:
            raise errors.unknown_pool(request.pool, policy.pool_names())
        if w is not None and not w.may_join(spec.name, policy.pool_names()):
            raise errors.worker_pool_denied(spec.name, identity.key, w.pools)
        # The entry whose scope holds the id is its one identity: a restart of the same worker.
        same_identity = identity.role == WORKER
        unit.registry.register(
            wid,
            request.address,
            request.slots,
            dict(request.labels),
            replace=same_identity,
            epochs=epochs,
            pool=request.pool,
        )
        await unit.loop.durable()
        interval = convert.dur(unit.registry.heartbeat_interval_s)
        return workers_pb2.RegisterResponse(
            heartbeat_interval=interval,
            grant_keys=self._grant_keys(wid),
            pool=spec.name,
            compatibility_labels=dict(spec.compat_labels()),
            labels=dict(spec.labels),
        )

    @errors.unary
    async def Heartbeat(
        self, request: workers_pb2.HeartbeatRequest, context: Any
    ) -> workers_pb2.HeartbeatResponse:
        unit = self._router.for_worker(request.worker_id)
        _, wid = await self._guard(unit, context, "Heartbeat", request.worker_id)
        w = unit.registry.heartbeat(wid, request.rss_bytes, request.uptime_seconds)
        # Built now, sent once durable: the leases listed must survive a crash, and a read after
        # the wait could list leases of later events that are not durable yet. Only this
        # worker's leases: the caller was just checked to be this worker (or an admin).
        resp = workers_pb2.HeartbeatResponse(
            draining=w.draining,
            leases=self._leases_on(unit, w.worker_id),
            grant_keys=self._grant_keys(w.worker_id),
        )
        await unit.loop.durable()
        return resp

    @errors.unary
    async def Drain(self, request: workers_pb2.DrainRequest, context: Any) -> workers_pb2.DrainResponse:
        unit = self._router.for_worker(request.worker_id)
        _, wid = await self._guard(unit, context, "Drain", request.worker_id)
        within = None
        if request.HasField("yield_within"):
            within = convert.from_dur(request.yield_within)
            if within < 0:
                raise errors.invalid_argument("yield_within", "must not be negative")
        unit.registry.drain(wid, within)
        resp = workers_pb2.DrainResponse(leases=len(self._leases_on(unit, wid)))
        if within is not None:
            resp.estimated_drain.CopyFrom(convert.dur(within))
        await unit.loop.durable()
        return resp

    @errors.unary
    async def Deregister(
        self, request: workers_pb2.DeregisterRequest, context: Any
    ) -> workers_pb2.DeregisterResponse:
        unit = self._router.for_worker(request.worker_id)
        _, wid = await self._guard(unit, context, "Deregister", request.worker_id)
        decisions = unit.registry.deregister(wid)
        await unit.loop.durable()
        return workers_pb2.DeregisterResponse(revoked=sum(1 for d in decisions if isinstance(d, Revoked)))
