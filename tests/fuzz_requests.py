"""The request fuzzer shared by tests/test_fuzz.py and bench/fuzz.py: hypothesis strategies for
every rpc of the Scheduler, Workers, Admin, KEDA, Health and reference Worker services, raw bytes as
request bodies, a sender that classifies each answer, and the accounting check afterwards.

Field values are drawn by type from each message's descriptor, so a new field or rpc is fuzzed
without an edit here: strings mix ids that exist (tenants, workers, sessions) with unicode, empty
and over-long ones; integers include negatives and extremes; enums any int32; maps and repeated
fields up to 80 entries (over the limit of 64). Each request goes through a generic
`channel.unary_unary`/`unary_stream` with identity serializers, so raw bytes travel the same way.

Bad answers are UNKNOWN and INTERNAL: everything else (INVALID_ARGUMENT, NOT_FOUND, …,
DEADLINE_EXCEEDED of an Acquire left queued) is the server refusing properly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2
from hypothesis import strategies as st

from scheduler.api.gen.externalscaler import externalscaler_pb2
from scheduler.api.gen.slotsched.v1 import admin_pb2, scheduler_pb2, worker_pb2, workers_pb2
from scheduler.grants import core_lease_id

BAD = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})
TENANTS = ("product", "sre", "batch")  # the built-in policy's tenants (dev mode)
IDS = ("local-0", "local-1", "w0", "s1", "s2", "product", "sre", "batch", "l", "lease", "x/y", "..", "")
_IDENT = lambda b: b  # noqa: E731


@dataclass(frozen=True)
class Rpc:
    path: str  # /package.Service/Method
    request: Any  # the request message class
    streaming: bool  # server-streaming: one reply read, then cancelled
    on_worker: bool  # served by the reference worker, not the scheduler


def all_rpcs() -> list[Rpc]:
    out = []
    for module, name, on_worker in (
        (scheduler_pb2, "Scheduler", False),
        (workers_pb2, "Workers", False),
        (admin_pb2, "Admin", False),
        (externalscaler_pb2, "ExternalScaler", False),
        (health_pb2, "Health", False),
        (worker_pb2, "Worker", True),
    ):
        svc = module.DESCRIPTOR.services_by_name[name]
        for m in svc.methods:
            if m.client_streaming:
                continue
            cls = getattr(module, m.input_type.name, None)
            if cls is None:  # an input type from another file (e.g. common.proto)
                from scheduler.api.gen.slotsched.v1 import common_pb2

                cls = getattr(common_pb2, m.input_type.name)
            out.append(Rpc(f"/{svc.full_name}/{m.name}", cls, m.server_streaming, on_worker))
    return out


RPCS = all_rpcs()

_strings = st.one_of(
    st.sampled_from(IDS),
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=200, max_size=400),
    st.integers(250, 3000).map(lambda n: "é" * n if n % 2 else "x" * n),
)
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
}


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(max(lo, -3), min(hi, 5)), st.integers(lo, hi), st.sampled_from([lo, hi]))


def _scalar(f: Any) -> st.SearchStrategy[Any]:
    t = f.type
    if t == FieldDescriptor.TYPE_STRING:
        return _strings
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(
            allow_nan=True, allow_infinity=True, width=32 if t == FieldDescriptor.TYPE_FLOAT else 64
        )
    if f.full_name.endswith("Duration.nanos") or f.full_name.endswith("Timestamp.nanos"):
        return _ints(-(10**9), 10**9)
    return _ints(*_INT_RANGES[t])


def _fill(msg: Any, depth: int) -> st.SearchStrategy[Any]:
    """A strategy building an instance of `msg`'s class with a random subset of fields set."""

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        m = type(msg)()
        for f in m.DESCRIPTOR.fields:
            if not draw(st.booleans()):
                continue
            is_map = f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry
            if is_map:
                kf, vf = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
                n = draw(st.sampled_from([0, 1, 3, 80]))
                target = getattr(m, f.name)
                for _ in range(n):
                    target[draw(_scalar(kf))] = draw(_scalar(vf))
            elif f.type == FieldDescriptor.TYPE_MESSAGE:
                if depth > 3:
                    continue
                container = getattr(m, f.name)
                if f.is_repeated:
                    for _ in range(draw(st.sampled_from([1, 2]))):
                        item = container.add()
                        item.CopyFrom(draw(_fill(item, depth + 1)))
                else:
                    container.CopyFrom(draw(_fill(container, depth + 1)))
            elif f.is_repeated:
                getattr(m, f.name).extend(draw(st.lists(_scalar(f), max_size=draw(st.sampled_from([3, 80])))))
            else:
                setattr(m, f.name, draw(_scalar(f)))
        return m

    return build()


@st.composite
def fuzz_case(draw: st.DrawFn) -> tuple[Rpc, bytes, tuple[tuple[str, str], ...]]:
    """One rpc, its request body (a random message, or raw bytes) and metadata."""
    rpc = draw(st.sampled_from(RPCS))
    if draw(st.integers(0, 9)) == 0:
        body = draw(st.binary(max_size=200))
    else:
        body = draw(_fill(rpc.request(), 0)).SerializeToString()
    tenant = draw(st.sampled_from((*TENANTS, "nobody", "")))
    md: tuple[tuple[str, str], ...] = (("x-slotsched-tenant", tenant),) if tenant else ()
    return rpc, body, md


@dataclass
class Tally:
    requests: int = 0
    by_code: dict[str, int] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)  # UNKNOWN / INTERNAL answers, described

    def add(self, rpc: Rpc, code: grpc.StatusCode, details: str) -> None:
        self.requests += 1
        self.by_code[code.name] = self.by_code.get(code.name, 0) + 1
        if code in BAD:
            self.bad.append(f"{rpc.path}: {code.name}: {details[:200]}")


async def send(channel: grpc.aio.Channel, rpc: Rpc, body: bytes, md: Any, timeout: float = 2.0) -> Any:
    """The status of one call (OK once a first reply arrives on a stream). A stream gets a short
    deadline: an Acquire left queued answers DEADLINE_EXCEEDED (and is withdrawn) quickly."""
    try:
        if rpc.streaming:
            call = channel.unary_stream(rpc.path, request_serializer=_IDENT, response_deserializer=_IDENT)(
                body, metadata=md, timeout=min(timeout, 0.25)
            )
            try:
                async for _ in call:
                    break
            finally:
                call.cancel()
            return grpc.StatusCode.OK, ""
        await channel.unary_unary(rpc.path, request_serializer=_IDENT, response_deserializer=_IDENT)(
            body, metadata=md, timeout=timeout
        )
        return grpc.StatusCode.OK, ""
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""


def holds(session: Any, lease: Any) -> bool:
    """Whether `session` (GetSession's SessionState) holds `lease` (as Admin ListLeases lists it).

    The Admin service lists a lease by its core id (`worker/slot#epoch`); the tenant reads it
    tagged (`worker/slot#epoch.TAG`, scheduler/grants.py): the same lease is the tagged id whose
    core id is the listed one, on the same slot with the same epoch."""
    if not session.HasField("lease"):
        return False
    got = session.lease
    return (
        got.lease_id != lease.lease_id  # a tenant never sees an untagged id
        and core_lease_id(got.lease_id) == lease.lease_id
        and got.epoch == lease.epoch
        and (got.slot.worker_id, got.slot.index) == (lease.slot.worker_id, lease.slot.index)
    )


async def accounting_problems(channel: grpc.aio.Channel) -> list[str]:
    """What is inconsistent in the pool as the Admin and Scheduler services describe it (dev
    mode): free + held (+ idle slots of draining workers) = capacity, busy = held, no lease without
    a live session holding it, queue counts."""
    from scheduler.api.gen.slotsched.v1 import admin_pb2_grpc, scheduler_pb2_grpc

    admin: Any = admin_pb2_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
    sched: Any = scheduler_pb2_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]
    pool = await admin.DescribePool(admin_pb2.DescribePoolRequest(), timeout=5)
    problems = []
    held = sum(c.held for c in pool.classes)
    busy = sum(w.busy for w in pool.workers)
    # A draining worker's idle slots are capacity but not free (no new grants go there).
    draining_idle = sum(w.slots - w.busy for w in pool.workers if w.state == admin_pb2.WORKER_STATE_DRAINING)
    if pool.free + held + draining_idle != pool.capacity:
        problems.append(
            f"free {pool.free} + held {held} + idle draining {draining_idle} != capacity {pool.capacity}"
        )
    problems += [
        f"worker {w.worker_id}: busy {w.busy} of {w.slots}" for w in pool.workers if w.busy > w.slots
    ]
    if busy != held:
        problems.append(f"busy slots {busy} != held leases {held}")

    async def listed() -> list[Any]:
        out: list[Any] = []
        token = ""
        while True:
            page = await admin.ListLeases(
                admin_pb2.ListLeasesRequest(page_size=1000, page_token=token), timeout=5
            )
            out.extend(page.leases)
            token = page.next_page_token
            if not token:
                return out

    leases = await listed()
    if len(leases) != held:
        problems.append(f"{len(leases)} leases listed, {held} held")
    suspects: dict[str, str] = {}
    for lease in leases:
        md = (("x-slotsched-tenant", lease.tenant),)
        try:
            s = await sched.GetSession(
                scheduler_pb2.GetSessionRequest(session_id=lease.session_id), metadata=md
            )
        except grpc.aio.AioRpcError as e:
            suspects[lease.lease_id] = (
                f"lease {lease.lease_id}: its session {lease.session_id!r}: {e.code().name}"
            )
            continue
        if not holds(s, lease):
            suspects[lease.lease_id] = (
                f"lease {lease.lease_id}: session {lease.session_id!r} does not hold it"
            )
    # A lease may end between ListLeases and GetSession (its TTL passed: nothing renews the fuzzer's
    # sessions): that is no drift. One the server still lists after the session said otherwise is
    # (lease ids are never reused, so a lease listed before and after existed in between).
    if suspects:
        still = {lease.lease_id for lease in await listed()}
        problems += [why for lease_id, why in suspects.items() if lease_id in still]
    queue = await admin.ListQueue(admin_pb2.ListQueueRequest(page_size=1000), timeout=5)
    pending = sum(c.pending for c in pool.classes)
    if len(queue.entries) != pending:
        problems.append(f"{len(queue.entries)} queue entries listed, {pending} pending")
    per_tenant = sum(t.pending.guaranteed + t.pending.burstable + t.pending.best_effort for t in pool.tenants)
    if per_tenant != pending:
        problems.append(f"tenants' pending {per_tenant} != classes' pending {pending}")
    return problems
