"""KEDA's external scaler contract, served by the scheduler: weighted demand as a metric.

Why a KEDA endpoint besides the autoscaler loop: on a cluster that already runs KEDA, a
ScaledObject with an `external` trigger pointing here lets the HPA size the worker Deployment on
the same weighted demand the loop uses — `replicas = ceil(demand / slots_per_worker)` since the
target per replica is one worker's slots. Run one or the other against a Deployment, not both: the
HPA does not drain before removal, the loop does.

A pool with a floor is always active: floor headroom is demand (the floor must exist as capacity
for a Guaranteed arrival to be served without waiting for a new worker), so KEDA never scales
such a pool to zero.

The servicer only translates: `demand_fn` returns the weighted demand in slots (busy + weighted
pending + floor headroom) and `slots_per_worker_fn` the target size; both are called on the
server's event loop, the only place the core may be read.

Many pools: the trigger's metadata names the pool (`pool: gpu`), one ScaledObject per pool's
worker Deployment; the metric is that pool's demand, its target that pool's slots per worker. A
pool the policy lacks is INVALID_ARGUMENT naming it; no `pool` is the default pool (as before
pools). The per-pool answers come from a `PoolDemand` given as `demand_fn` (it is also callable
with no argument: the default pool's demand).

Who may call: the endpoint reveals demand (how busy the pool is), so with a policy it needs the
worker or the admin role (`authorize`, set by app.py). KEDA's external scaler sends no
`authorization` header, so the credential may also come as `token` in the trigger's metadata
(KEDA forwards it as `ScaledObjectRef.scalerMetadata`; a header, when present, wins), or as
`tokenFromEnv`: KEDA replaces that entry's value (an env var name) with the var's value from the
scale target's container, so the token can stay in a Secret (a TriggerAuthentication's params
never reach an external scaler). Over mTLS (`--tls-ca`) KEDA presents its client certificate
(TriggerAuthentication: caCert, tlsClientCert, tlsClientKey) and no call reaches any service
without a certificate of that CA. In insecure dev mode it is open, like everything else.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import grpc

from scheduler.api.gen.externalscaler import externalscaler_pb2 as pb
from scheduler.api.gen.externalscaler import externalscaler_pb2_grpc as pb_grpc
from scheduler.policy.model import DEFAULT_POOL
from scheduler.server import errors

METRIC_NAME = "slotsched_weighted_demand_slots"
_EPS = 1e-9  # 2.0000000000000004 slots is 2 slots, as in the decision


@runtime_checkable
class PoolDemand(Protocol):
    """Weighted demand and slots per worker of each pool (`pool` None: the default pool)."""

    def __call__(self, pool: str | None = None) -> float: ...

    def slots_per_worker(self, pool: str | None = None) -> int: ...

    def pool_names(self) -> Sequence[str]: ...


class KedaExternalScaler(pb_grpc.ExternalScalerServicer):
    def __init__(
        self,
        demand_fn: Callable[[], float],
        slots_per_worker_fn: Callable[[], int],
        *,
        poll_interval_s: float = 1.0,
        authorize: Callable[[Any, str | None], None] | None = None,
        admit: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._demand = demand_fn
        self._pools = demand_fn if isinstance(demand_fn, PoolDemand) else None
        self._admit = admit  # the fair admission gate's KEDA flow (fairness.py)
        self._slots = slots_per_worker_fn
        self.poll_interval_s = poll_interval_s
        self._authorize = authorize

    async def _allow(
        self, context: grpc.aio.ServicerContext[object, object], ref: pb.ScaledObjectRef
    ) -> None:
        """Refuse a caller without the role `authorize` asks for (raises RpcFailure's abort);
        then wait for the call's admission in the KEDA flow."""
        try:
            if self._authorize is not None:
                md = ref.scalerMetadata
                self._authorize(context, md.get("token") or md.get("tokenFromEnv"))
            if self._admit is not None:
                await self._admit()
        except errors.RpcFailure as f:
            await errors.abort(context, f)

    async def _pool(
        self, context: grpc.aio.ServicerContext[object, object], ref: pb.ScaledObjectRef
    ) -> str | None:
        """The pool the trigger's metadata names (None: absent, the default pool)."""
        name = ref.scalerMetadata.get("pool") or None
        if name is None:
            return None
        known = list(self._pools.pool_names()) if self._pools is not None else [DEFAULT_POOL]
        if name not in known:
            await errors.abort(context, errors.unknown_pool(name, known))
        return name

    async def _read(
        self, context: grpc.aio.ServicerContext[object, object], pool: str | None = None
    ) -> float:
        try:
            if self._pools is not None:
                return float(self._pools(pool))
            return float(self._demand())
        except Exception as e:  # the scheduler cannot answer now; KEDA retries on its interval
            await errors.abort(context, errors.unavailable(f"weighted demand unavailable: {e}"))
            raise  # abort raises; this keeps type checkers sure nothing is returned

    async def IsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.IsActiveResponse:
        await self._allow(context, request)
        pool = await self._pool(context, request)
        return pb.IsActiveResponse(result=await self._read(context, pool) > _EPS)

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[pb.IsActiveResponse]:
        """Push the activity once at once, then on every change (polled every second)."""
        await self._allow(context, request)
        pool = await self._pool(context, request)
        last: bool | None = None
        while True:
            active = await self._read(context, pool) > _EPS
            if active != last:
                last = active
                yield pb.IsActiveResponse(result=active)
            await asyncio.sleep(self.poll_interval_s)

    async def GetMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetMetricSpecResponse:
        await self._allow(context, request)
        pool = await self._pool(context, request)
        slots = self._pools.slots_per_worker(pool) if self._pools is not None else self._slots()
        size = max(1, int(slots))
        spec = pb.MetricSpec(metricName=METRIC_NAME, targetSize=size, targetSizeFloat=float(size))
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetMetricsResponse:
        await self._allow(context, request.scaledObjectRef)
        pool = await self._pool(context, request.scaledObjectRef)
        demand = await self._read(context, pool)
        value = pb.MetricValue(
            metricName=request.metricName or METRIC_NAME,
            metricValue=max(0, math.ceil(demand - _EPS)),
            metricValueFloat=demand,
        )
        return pb.GetMetricsResponse(metricValues=[value])


def add_keda_servicer(
    server: Any,
    demand_fn: Callable[[], float],
    slots_per_worker_fn: Callable[[], int],
    authorize: Callable[[Any, str | None], None] | None = None,
    admit: Callable[[], Awaitable[None]] | None = None,
) -> KedaExternalScaler:
    """Register the external scaler on a grpc.aio server (or app.py's guarded registrar, before
    `start`); returns the servicer. `authorize(context, metadata_token)` raises RpcFailure for a
    refused caller."""
    servicer = KedaExternalScaler(demand_fn, slots_per_worker_fn, authorize=authorize, admit=admit)
    pb_grpc.add_ExternalScalerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    return servicer
