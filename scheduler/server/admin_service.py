"""The Admin service: the policy in force, and read-only views of pools, leases and queue.

DescribePool describes one pool (empty: the default one, `loop.core.describe()`'s) and names
every pool, so a client asks for each; ListLeases and ListQueue list every pool's, each entry
naming its pool (a queued one also why it waits), or one pool's with `pool`. An unknown pool is
INVALID_ARGUMENT naming it (errors.unknown_pool).

Translation only. Listings page with opaque cursor tokens (the last key returned, base64 JSON
tagged with the listing it belongs to), so a page is stable when leases come and go between calls
and a token from another listing fails INVALID_ARGUMENT.

ApplyPolicy parses off the event loop, and only a document within the limits of validate.py
(256 KiB, 32 levels deep, 100,000 nodes with aliases expanded): beyond, INVALID_ARGUMENT naming
the limit.

Who may call: in secure mode only the admin role (a token listed under `spec.access.admins`),
because ApplyPolicy sets every tenant's quotas and the listings show every tenant's sessions; a
tenant or worker token is PERMISSION_DENIED. In insecure dev mode anyone.

GetPolicy and ApplyPolicy answer with trailing metadata (policy_log.py): the policy generation,
and whether the state outlives a restart. Every policy applied is logged with who applied it.

Each read is served by the units of the service's router (pool_routes.py). Per-pool
leadership: any replica answers the reads for every pool,
each pool from its unit's core, led here or followed as a hot standby (as of that pool's journal,
milliseconds behind its leader); ApplyPolicy is refused FAILED_PRECONDITION, since a policy
applied to one replica's pools would not reach the others' (docs/design.md, "Pools across
replicas": the policy comes from its source, which every replica reads).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from typing import Any

from scheduler.api.gen.slotsched.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from scheduler.core.lifecycle import LeaseState, WorkerState
from scheduler.core.types import QoS
from scheduler.policy.errors import PolicyError
from scheduler.policy.identities import hash_token
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import policy_to_yaml
from scheduler.server import convert, errors
from scheduler.server.auth import AUTH_HEADER, Authenticator, certificate_names
from scheduler.server.fairness import ADMIN_FLOW
from scheduler.server.metrics import CLASS_ORDER
from scheduler.server.policy_log import PolicyLog
from scheduler.server.pool_routes import PoolUnit, Router
from scheduler.server.validate import parse_policy_limited

DEFAULT_PAGE = 100
MAX_PAGE = 1000


def _page_size(n: int) -> int:
    if n > MAX_PAGE:
        raise errors.invalid_argument("page_size", f"at most {MAX_PAGE}")
    return n or DEFAULT_PAGE


def _encode_token(listing: str, after: list[Any]) -> str:
    raw = json.dumps({"k": listing, "a": after}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_token(listing: str, token: str, shape: tuple[type | tuple[type, ...], ...]) -> list[Any] | None:
    if not token:
        return None
    try:
        doc = json.loads(base64.urlsafe_b64decode(token.encode()))
        after = doc.get("a") if isinstance(doc, dict) and doc.get("k") == listing else None
        if (
            isinstance(after, list)
            and len(after) == len(shape)
            and all(isinstance(v, t) for v, t in zip(after, shape, strict=True))
        ):
            return after
    except (binascii.Error, ValueError, UnicodeDecodeError):
        pass
    raise errors.invalid_argument("page_token", f"not a token from a previous {listing} call")


def _qos_filter(value: int) -> QoS | None:
    if value == common_pb2.QOS_CLASS_UNSPECIFIED:
        return None
    qos = convert.PB_TO_QOS.get(value)
    if qos is None:
        raise errors.invalid_argument("qos", "unknown QoS class")
    return qos


def _pool_filter(names: tuple[str, ...], name: str) -> str | None:
    """The pool a request names (None: every pool); unknown: INVALID_ARGUMENT naming it."""
    if not name:
        return None
    if name not in names:
        raise errors.unknown_pool(name, names)
    return name


def _worker_tokens(policy: Policy) -> set[str]:
    return {t for w in policy.access.workers for t in w.tokens}


def _caller(context: Any, secure: bool) -> str:
    """Who applied a policy, for the log: the admin token's hash prefix (the policy lists the
    whole hash; the token itself is never logged), else the client certificate's name."""
    if not secure:
        return f"{context.peer()} (insecure dev mode)"
    for key, value in context.invocation_metadata() or ():
        if key == AUTH_HEADER:
            text = value if isinstance(value, str) else value.decode("utf-8", "replace")
            return f"admin token {hash_token(text.partition(' ')[2].strip())[:19]}..."
    names = certificate_names(context)
    return f"admin certificate {names[0]}" if names else "an admin"


class AdminService(admin_pb2_grpc.AdminServicer):
    """Over every unit of a router: one loop, or every pool unit of a replica."""

    def __init__(self, router: Router, auth: Authenticator, policy_log: PolicyLog | None = None) -> None:
        self._router = router
        self._units: tuple[PoolUnit, ...] = tuple(router.units.values())
        self._loop = router.first().loop
        self._auth = auth
        self._policy_log = policy_log or PolicyLog(None, durable=False)

    async def _guard(self, context: Any, rpc: str) -> None:
        self._router.check_open()
        self._auth.require_admin(context, rpc)  # charged to the admins' flow (rate limits)
        await self._auth.gate.admit(ADMIN_FLOW)  # and admitted in it (fairness.py)

    def _policy(self) -> Policy:
        return self._router.policy()

    def _names(self) -> tuple[str, ...]:
        return self._router.names()

    async def _settled(self, units: tuple[PoolUnit, ...]) -> None:
        """What was read may still be in flight to the store: wait for it where it is served
        here (a hot standby's core holds only what its pool's journal does)."""
        for unit in units:
            if unit.settles():
                await unit.loop.durable()

    @errors.unary
    async def GetPolicy(
        self, request: admin_pb2.GetPolicyRequest, context: Any
    ) -> admin_pb2.GetPolicyResponse:
        await self._guard(context, "GetPolicy")
        policy = self._policy()
        context.set_trailing_metadata(self._policy_log.metadata())
        return admin_pb2.GetPolicyResponse(yaml=policy_to_yaml(policy), name=policy.name)

    @errors.unary
    async def ApplyPolicy(
        self, request: admin_pb2.ApplyPolicyRequest, context: Any
    ) -> admin_pb2.ApplyPolicyResponse:
        await self._guard(context, "ApplyPolicy")
        loop = self._router.applying()  # FAILED_PRECONDITION under per-pool leadership
        if not request.yaml.strip():
            raise errors.invalid_argument("yaml", "required")
        try:
            # In a thread, within size, depth and alias limits (validate.py): a large or hostile
            # document must not hold the event loop that serves every renewal.
            policy, warnings = await asyncio.to_thread(parse_policy_limited, request.yaml)
        except PolicyError as e:
            raise errors.policy_invalid(e) from e
        notes = [str(w) for w in warnings]
        if self._auth.secure:
            # Applying a policy without admins would lock every operator out until a restart
            # (which reloads the file and loses what was applied): refuse, dry run included.
            if not policy.access.admins:
                raise errors.failed_precondition(
                    "spec.access.admins is empty: this policy would lock every operator out of the Admin "
                    "service; list at least one admin token hash"
                )
            removed = _worker_tokens(loop.core.policy) - _worker_tokens(policy)
            if removed:
                notes.append(
                    f"spec.access.workers: {len(removed)} worker token hash(es) removed; workers using "
                    "them can no longer heartbeat and are removed after missed heartbeats (their "
                    "leases revoked and re-queued)"
                )
        plog, generation = self._policy_log, None
        if not request.dry_run:
            old = loop.core.policy
            loop.apply_policy(policy)
            generation = plog.next_generation()
            await loop.durable()
            plog.applied(generation, old, policy, _caller(context, self._auth.secure))
        context.set_trailing_metadata(plog.metadata(generation))
        return admin_pb2.ApplyPolicyResponse(warnings=notes, applied=not request.dry_run)

    @errors.unary
    async def DescribePool(
        self, request: admin_pb2.DescribePoolRequest, context: Any
    ) -> admin_pb2.DescribePoolResponse:
        await self._guard(context, "DescribePool")
        # No pool named: the first unit (one loop's core describes its default pool).
        unit = self._router.for_pool(request.pool) if request.pool else self._router.first()
        loop, registry = unit.loop, unit.registry
        leader = await unit.leadership()  # None but per pool
        core = loop.core
        name = _pool_filter(self._names(), request.pool)
        view = core.describe(name)
        at = convert.ts(loop.now())
        out = admin_pb2.DescribePoolResponse(
            free=view.free, floor=view.floor, at=at, pool=view.name, pools=self._names()
        )
        if leader is not None:
            out.leader.CopyFrom(
                admin_pb2.PoolLeader(replica_id=leader.replica_id, address=leader.address, term=leader.term)
            )
        spec = core.policy.pool_spec(view.name)  # None: a retired pool, still draining
        if spec is not None:
            out.labels.update(dict(spec.labels))
        for w in view.workers:
            entry = registry.workers.get(w.worker_id)
            info = out.workers.add(
                worker_id=w.worker_id,
                address=w.address,
                slots=w.slots,
                busy=w.busy,
                state=admin_pb2.WORKER_STATE_DRAINING
                if w.state is WorkerState.DRAINING
                else admin_pb2.WORKER_STATE_ACTIVE,
            )
            out.capacity += w.slots  # draining workers included, as the proto says
            if entry is not None:
                info.labels.update(entry.labels)
                if entry.last_heartbeat is not None:
                    info.last_heartbeat.CopyFrom(convert.ts(entry.last_heartbeat))
        yielding = dict.fromkeys(CLASS_ORDER, 0)
        for lease, state in core.leases():
            if state is LeaseState.YIELDING and lease.pool == view.name:
                yielding[lease.qos] += 1
        for i, q in enumerate(CLASS_ORDER):
            out.classes.add(
                qos=convert.QOS_TO_PB[q], held=view.held[i], pending=view.pending[i], yielding=yielding[q]
            )
        for t in sorted(view.tenants, key=lambda t: t.name):
            stats = out.tenants.add(
                tenant=t.name,
                weight=t.weight,
                held=admin_pb2.ClassCounts(guaranteed=t.held[0], burstable=t.held[1], best_effort=t.held[2]),
                pending=admin_pb2.ClassCounts(
                    guaranteed=t.pending[0], burstable=t.pending[1], best_effort=t.pending[2]
                ),
                borrowed=t.borrowed,
                fair_share=t.share,
                guaranteed_quota=t.guaranteed,
                burstable_nominal=t.burstable_nominal,
                burstable_limit=t.burstable_limit,
            )
            if t.best_effort_limit is not None:
                stats.best_effort_limit = t.best_effort_limit
        for b in loop.permits.views():
            if not unit.counts(b.name):
                continue  # counted at its home pool's unit (per-pool leadership)
            out.budgets.add(
                name=b.name, factor=b.factor, limits_per_minute=b.limits_per_minute,
                available=b.shared_available, waiting=b.waiting, open=b.open,
            )  # fmt: skip
        await self._settled((unit,))
        return out

    @errors.unary
    async def ListLeases(
        self, request: admin_pb2.ListLeasesRequest, context: Any
    ) -> admin_pb2.ListLeasesResponse:
        await self._guard(context, "ListLeases")
        size = _page_size(request.page_size)
        qos = _qos_filter(request.qos)
        pool = _pool_filter(self._names(), request.pool)
        after = _decode_token("leases", request.page_token, ((int, float), str))
        rows = sorted(
            (
                (lease.granted_at, lease.lease_id, lease, unit.loop)
                for unit in self._units
                for lease, _ in unit.loop.core.leases()
                if (not request.tenant or lease.tenant == request.tenant)
                and (qos is None or lease.qos is qos)
                and (pool is None or lease.pool == pool)
            ),
            key=lambda r: (r[0], r[1]),
        )
        if after is not None:
            rows = [r for r in rows if (r[0], r[1]) > (after[0], after[1])]
        out = admin_pb2.ListLeasesResponse()
        for _, _, lease, loop in rows[:size]:
            y = loop.yielding(lease.lease_id)
            out.leases.append(convert.lease_to_pb(lease, loop.address(lease.slot.worker), y))
        if len(rows) > size:
            last = rows[size - 1]
            out.next_page_token = _encode_token("leases", [last[0], last[1]])
        await self._settled(self._units)
        return out

    @errors.unary
    async def ListQueue(
        self, request: admin_pb2.ListQueueRequest, context: Any
    ) -> admin_pb2.ListQueueResponse:
        await self._guard(context, "ListQueue")
        size = _page_size(request.page_size)
        qos = _qos_filter(request.qos)
        pool = _pool_filter(self._names(), request.pool)
        after = _decode_token("queue", request.page_token, (int, int, str))
        rows = []
        for v in (v for unit in self._units for v in unit.loop.core.queue()):
            q = QoS(v.qos)
            if (request.tenant and v.tenant != request.tenant) or (qos is not None and q is not qos):
                continue
            if pool is not None and v.pool != pool:
                continue
            rows.append((CLASS_ORDER.index(q), v.position, str(v.session), v))
        rows.sort(key=lambda r: (r[0], r[1], r[2]))
        if after is not None:
            rows = [r for r in rows if (r[0], r[1], r[2]) > (after[0], after[1], after[2])]
        now = self._loop.now()
        out = admin_pb2.ListQueueResponse()
        for _, _, key, v in rows[:size]:
            entry = out.entries.add(
                session_id=convert.split_key(key)[1],
                tenant=v.tenant,
                qos=convert.QOS_TO_PB[QoS(v.qos)],
                position=v.position,
                waited=convert.dur(now - v.waiting_since),
                pool=v.pool,
                reason=v.reason,
            )
            if v.estimated_wait_s is not None:  # unset until a hold has been observed
                entry.estimated_wait.CopyFrom(convert.dur(v.estimated_wait_s))
            if v.resume_from is not None:
                entry.resume_from.CopyFrom(convert.snapshot_to_pb(v.resume_from))
        if len(rows) > size:
            last = rows[size - 1]
            out.next_page_token = _encode_token("queue", [last[0], last[1], last[2]])
        await self._settled(self._units)
        return out
