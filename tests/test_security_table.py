"""The security table: role x RPC x own/other resource on the scheduler, over real gRPC.

Callers: tenant A (acme) and tenant B (globex) tokens, worker-1 and worker-2 tokens (two
`spec.access.workers` entries, each bound to its own worker id and 4 slots), the admin token, no
token and a garbage token. Each row is one call and the status it must end with: every
cross-identity action is refused with the code named here, every own action allowed. The rows
run in order on one server (set up with a lease of each tenant on the workers); each is then one
pytest case, so a failure names its row. docs/security.md cites the rows by id.

Codes, once: no credential UNAUTHENTICATED; a credential without the role, or a worker id outside
the credential's scope, PERMISSION_DENIED (before anything is read); another tenant's lease
FAILED_PRECONDITION (the lease exists, the caller does not hold it), another tenant's session
NOT_FOUND (sessions are named within the caller's tenant); a live worker id moved to another
address by anyone but its own credential FAILED_PRECONDITION; slots past the global cap
INVALID_ARGUMENT, past the credential's maxSlots PERMISSION_DENIED.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from scheduler.api.gen.slotsched.v1 import admin_pb2, common_pb2, workers_pb2
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.grants import GrantClaim, GrantKeyring, GrantRefused, GrantVerifier, make_grant

pytest.register_assert_rewrite("tests.grpc_fixtures")
from tests.budget_fixtures import BUDGET, budget_policy_yaml  # noqa: E402
from tests.grpc_fixtures import (  # noqa: E402
    ADMIN_TOKEN,
    TOKENS,
    B,
    Client,
    ServerThread,
    next_event,
    running_server,
)

Code = grpc.StatusCode
OK, PD, UNAUTH, FP, NF, IA = (
    Code.OK,
    Code.PERMISSION_DENIED,
    Code.UNAUTHENTICATED,
    Code.FAILED_PRECONDITION,
    Code.NOT_FOUND,
    Code.INVALID_ARGUMENT,
)

W1_TOKEN, W2_TOKEN = "worker-1-secret", "worker-2-secret"
W1_ADDR, W2_ADDR = "10.0.0.1:7000", "10.0.0.2:7000"
SLOTS = 3
WORKERS = [
    {"tokens": [W1_TOKEN], "workerIds": ["worker-1"], "maxSlots": 4},
    {"tokens": [W2_TOKEN], "workerIds": ["worker-2"], "maxSlots": 4},
]
# caller -> bearer token (None: no credential)
CALLERS: dict[str, str | None] = {
    "acme": TOKENS["acme"],
    "globex": TOKENS["globex"],
    "worker-1": W1_TOKEN,
    "worker-2": W2_TOKEN,
    "admin": ADMIN_TOKEN,
    "none": None,
    "garbage": "garbage-token-nobody-holds",
}


@dataclass
class World:
    """What the rows act on: the callers' clients and the leases the set-up took."""

    c: dict[str, Client] = field(default_factory=dict)
    lease: dict[str, common_pb2.Lease] = field(default_factory=dict)  # tenant -> its held lease
    session: dict[str, str] = field(default_factory=dict)  # tenant -> its held session id
    permit: dict[str, str] = field(default_factory=dict)  # tenant -> its open permit on budget llm

    def renew(self, tenant: str) -> pb.RenewRequest:
        lease = self.lease[tenant]
        return pb.RenewRequest(session_id=self.session[tenant], lease_id=lease.lease_id, epoch=lease.epoch)


Call = Callable[[Client, World], Awaitable[Any]]


async def acquire(c: Client, w: World, session: str) -> None:
    """An Acquire that ends OK once its first event arrives (a re-attach replays the grant)."""
    call = c.acquire(session, B)
    try:
        await next_event(call)
    finally:
        call.cancel()


def register(wid: str, address: str, slots: int = SLOTS) -> workers_pb2.RegisterRequest:
    return workers_pb2.RegisterRequest(worker_id=wid, address=address, slots=slots)


async def release_fresh(c: Client, w: World) -> None:
    """acme takes a second lease and gives it back: Release of its own lease."""
    call = c.acquire("acme-tmp", B)
    lease = (await next_event(call)).granted.lease
    req = pb.ReleaseRequest(session_id="acme-tmp", lease_id=lease.lease_id, epoch=lease.epoch)
    await c.scheduler.Release(req, metadata=c.md)
    call.cancel()


def _yield(w: World, tenant: str) -> pb.YieldRequest:
    lease = w.lease[tenant]
    return pb.YieldRequest(session_id=w.session[tenant], lease_id=lease.lease_id, epoch=lease.epoch)


def _release(w: World, tenant: str) -> pb.ReleaseRequest:
    lease = w.lease[tenant]
    return pb.ReleaseRequest(session_id=w.session[tenant], lease_id=lease.lease_id, epoch=lease.epoch)


async def request_permit(c: Client, w: World, session: str) -> None:
    """A permit of the caller's session (granted in a fraction of a second: the buckets start empty)."""
    req = pb.RequestPermitRequest(
        session_id=session, budget=BUDGET, estimate=pb.TokenUsage(input_tokens=10, output_tokens=10)
    )
    ev = await c.scheduler.RequestPermit(req, metadata=c.md, timeout=10)
    w.permit["acme"] = ev.permit_id  # only acme's own request is granted (the table)


def settle_permit(c: Client, w: World, session: str) -> Awaitable[Any]:
    req = pb.SettlePermitRequest(
        session_id=session, permit_id=w.permit["acme"], usage=pb.TokenUsage(input_tokens=5, output_tokens=5)
    )
    return c.scheduler.SettlePermit(req, metadata=c.md)  # type: ignore[no-any-return]


# The calls, by name, so the table below reads as a table.
CALLS: dict[str, Call] = {
    # Scheduler service
    "Acquire own session": lambda c, w: acquire(c, w, "held"),
    "Renew acme's lease": lambda c, w: c.scheduler.Renew(w.renew("acme"), metadata=c.md),
    "Renew globex's lease": lambda c, w: c.scheduler.Renew(w.renew("globex"), metadata=c.md),
    "Release globex's lease": lambda c, w: c.scheduler.Release(_release(w, "globex"), metadata=c.md),
    "Yield globex's lease": lambda c, w: c.scheduler.Yield(_yield(w, "globex"), metadata=c.md),
    "GetSession acme's session": lambda c, w: c.scheduler.GetSession(
        pb.GetSessionRequest(session_id="acme-only"), metadata=c.md
    ),
    "Release own fresh lease": release_fresh,
    "RequestPermit for own session": lambda c, w: request_permit(c, w, "held"),
    "RequestPermit for acme's session": lambda c, w: request_permit(c, w, "acme-only"),
    "SettlePermit acme's permit as held": lambda c, w: settle_permit(c, w, "held"),
    "SettlePermit acme's permit as held, again": lambda c, w: settle_permit(c, w, "held"),
    "SettlePermit acme's permit as acme-only": lambda c, w: settle_permit(c, w, "acme-only"),
    # Workers service
    "Register worker-1 again (same address)": lambda c, w: c.workers.Register(
        register("worker-1", W1_ADDR), metadata=c.md
    ),
    "Register worker-2 at 10.6.6.6 (hijack)": lambda c, w: c.workers.Register(
        register("worker-2", "10.6.6.6:7000"), metadata=c.md
    ),
    "Register worker-9 (in no scope)": lambda c, w: c.workers.Register(
        register("worker-9", "10.6.6.6:7000"), metadata=c.md
    ),
    "Register worker-1 with 1024 slots": lambda c, w: c.workers.Register(
        register("worker-1", W1_ADDR, 1024), metadata=c.md
    ),
    "Register worker-1 with 5 slots (maxSlots 4)": lambda c, w: c.workers.Register(
        register("worker-1", W1_ADDR, 5), metadata=c.md
    ),
    "Heartbeat worker-1": lambda c, w: c.workers.Heartbeat(
        workers_pb2.HeartbeatRequest(worker_id="worker-1"), metadata=c.md
    ),
    "Heartbeat worker-2 (read its leases)": lambda c, w: c.workers.Heartbeat(
        workers_pb2.HeartbeatRequest(worker_id="worker-2"), metadata=c.md
    ),
    "Drain worker-2": lambda c, w: c.workers.Drain(
        workers_pb2.DrainRequest(worker_id="worker-2"), metadata=c.md
    ),
    "Deregister worker-2": lambda c, w: c.workers.Deregister(
        workers_pb2.DeregisterRequest(worker_id="worker-2"), metadata=c.md
    ),
    # Admin service
    "GetPolicy": lambda c, w: c.admin.GetPolicy(admin_pb2.GetPolicyRequest(), metadata=c.md),
    "ApplyPolicy (dry run)": lambda c, w: c.admin.ApplyPolicy(
        admin_pb2.ApplyPolicyRequest(yaml=POLICY, dry_run=True), metadata=c.md
    ),
    "DescribePool": lambda c, w: c.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=c.md),
    "ListLeases": lambda c, w: c.admin.ListLeases(admin_pb2.ListLeasesRequest(), metadata=c.md),
    "ListQueue": lambda c, w: c.admin.ListQueue(admin_pb2.ListQueueRequest(), metadata=c.md),
}

NOT_TENANTS = ("worker-1", "worker-2", "admin", "garbage")
NOT_ADMINS = ("acme", "globex", "worker-1", "worker-2", "garbage")
NOT_WORKERS = ("acme", "globex", "garbage")

# (caller, call, expected status). Order matters only for the mutating rows, which are allowed
# own actions that leave the others' rows' resources as they were.
TABLE: list[tuple[str, str, Code]] = [
    # --- Scheduler service: tenants only, each within its own tenant
    ("acme", "Acquire own session", OK),
    ("globex", "Acquire own session", OK),
    *[(who, "Acquire own session", PD) for who in NOT_TENANTS],
    ("none", "Acquire own session", UNAUTH),
    ("acme", "Renew acme's lease", OK),
    ("globex", "Renew globex's lease", OK),
    ("acme", "Renew globex's lease", FP),
    ("globex", "Renew acme's lease", FP),
    *[(who, "Renew acme's lease", PD) for who in NOT_TENANTS],
    ("none", "Renew acme's lease", UNAUTH),
    ("acme", "Release globex's lease", FP),
    ("acme", "Yield globex's lease", FP),
    ("worker-1", "Release globex's lease", PD),
    ("admin", "Yield globex's lease", PD),
    ("acme", "GetSession acme's session", OK),
    ("globex", "GetSession acme's session", NF),  # acme's session id names nothing of globex's
    ("admin", "GetSession acme's session", PD),
    ("acme", "Release own fresh lease", OK),
    # --- token budgets: a permit names its caller's tenant's live session, settled by it only
    ("acme", "RequestPermit for own session", OK),
    ("globex", "RequestPermit for acme's session", NF),  # acme's session id names nothing of globex's
    ("admin", "RequestPermit for own session", PD),
    ("globex", "SettlePermit acme's permit as held", FP),  # its own "held": PERMIT_NOT_OWNER
    ("acme", "SettlePermit acme's permit as acme-only", FP),  # another session of acme's
    ("acme", "SettlePermit acme's permit as held", OK),
    ("acme", "SettlePermit acme's permit as held, again", FP),  # settled once: PERMIT_CLOSED
    # --- Workers service: a worker credential within its scope; an admin for any worker
    ("worker-1", "Register worker-1 again (same address)", OK),
    ("worker-1", "Heartbeat worker-1", OK),
    ("worker-2", "Heartbeat worker-2 (read its leases)", OK),
    # the hijack of issue 12, with worker-1's token:
    ("worker-1", "Heartbeat worker-2 (read its leases)", PD),
    ("worker-1", "Deregister worker-2", PD),
    ("worker-1", "Register worker-2 at 10.6.6.6 (hijack)", PD),
    ("worker-1", "Drain worker-2", PD),
    ("worker-2", "Heartbeat worker-1", PD),
    ("worker-1", "Register worker-9 (in no scope)", PD),
    # a fake worker claiming 1,024 slots, and one past its credential's bound
    ("worker-1", "Register worker-1 with 1024 slots", IA),
    ("admin", "Register worker-1 with 1024 slots", IA),
    ("worker-1", "Register worker-1 with 5 slots (maxSlots 4)", PD),
    *[(who, "Heartbeat worker-1", PD) for who in NOT_WORKERS],
    *[(who, "Deregister worker-2", PD) for who in NOT_WORKERS],
    *[(who, "Register worker-2 at 10.6.6.6 (hijack)", PD) for who in NOT_WORKERS],
    ("none", "Heartbeat worker-1", UNAUTH),
    ("none", "Register worker-9 (in no scope)", UNAUTH),
    ("admin", "Heartbeat worker-2 (read its leases)", OK),
    ("admin", "Register worker-2 at 10.6.6.6 (hijack)", FP),  # an operator deregisters first
    # --- Admin service: the admin role only
    *[
        row
        for rpc in ("GetPolicy", "ApplyPolicy (dry run)", "DescribePool", "ListLeases", "ListQueue")
        for row in [("admin", rpc, OK), ("none", rpc, UNAUTH), *[(who, rpc, PD) for who in NOT_ADMINS]]
    ],
    # --- Reference worker service (slots/worker): not in this table. Start / Checkpoint / Stop
    # with signed grants and Status filtered by tenant are covered by tests/test_worker_grants.py
    # (a real scheduler and real workers, e.g. acme stopping globex's actor is PERMISSION_DENIED).
]

# The pool: worker-1 and worker-2 only; acme and globex share the budget `llm`.
POLICY = budget_policy_yaml(floor=0, worker_access=WORKERS)


def row_id(caller: str, call: str) -> str:
    return f"{caller}: {call}"


@dataclass
class Outcome:
    codes: dict[str, tuple[Code, str]]
    heartbeats: dict[str, list[str]]  # caller's own heartbeat -> the workers of the leases listed
    after: dict[str, Any]
    # worker -> the grant keys its own Register and Heartbeat answers handed it, and the server's
    grant_keys: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)
    keyring: GrantKeyring | None = None


async def _walk(server: ServerThread) -> Outcome:
    w = World()
    for name, token in CALLERS.items():
        w.c[name] = await Client(server.target, token=token).__aenter__()
    try:
        handed: dict[str, list[tuple[str, bytes]]] = {}
        for name, addr in (("worker-1", W1_ADDR), ("worker-2", W2_ADDR)):
            reg = await w.c[name].workers.Register(register(name, addr), metadata=w.c[name].md)
            handed[name] = [(k.key_id, k.key) for k in reg.grant_keys]
        # Both tenants hold a session "held" (session ids are per tenant), acme also "acme-only"
        # and globex "held-2": four leases, spread over both workers.
        streams = []
        for tenant, other in (("acme", "acme-only"), ("globex", "held-2")):
            for session in ("held", other):
                call = w.c[tenant].acquire(session, B)
                lease = (await next_event(call)).granted.lease
                streams.append(call)
                if session == "held":
                    w.lease[tenant], w.session[tenant] = lease, session
        codes: dict[str, tuple[Code, str]] = {}
        for caller, call_name, _ in TABLE:
            try:
                await CALLS[call_name](w.c[caller], w)
                codes[row_id(caller, call_name)] = (OK, "")
            except grpc.aio.AioRpcError as e:
                codes[row_id(caller, call_name)] = (e.code(), e.details() or "")
        heartbeats = {}
        for name in ("worker-1", "worker-2"):
            c = w.c[name]
            hb = await c.workers.Heartbeat(workers_pb2.HeartbeatRequest(worker_id=name), metadata=c.md)
            heartbeats[name] = [lease.slot.worker_id for lease in hb.leases]
            assert [(k.key_id, k.key) for k in hb.grant_keys] == handed[name]
        admin = w.c["admin"]
        pool = await admin.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=admin.md)
        leases = await admin.admin.ListLeases(admin_pb2.ListLeasesRequest(), metadata=admin.md)
        after = {
            "workers": {x.worker_id: (x.address, x.slots) for x in pool.workers},
            "leases_on": [lease.slot.worker_id for lease in leases.leases],
        }
        for call in streams:
            call.cancel()
        return Outcome(codes, heartbeats, after, handed, server.server.grant_keys)
    finally:
        for c in w.c.values():
            await c.__aexit__(None)


@pytest.fixture(scope="module")
def outcome() -> Iterator[Outcome]:
    with running_server(POLICY, static_pool=False) as server:
        yield asyncio.run(_walk(server))


@pytest.mark.parametrize(("caller", "call", "want"), [pytest.param(*r, id=row_id(r[0], r[1])) for r in TABLE])
def test_security_table(outcome: Outcome, caller: str, call: str, want: Code) -> None:
    got, details = outcome.codes[row_id(caller, call)]
    assert got == want, f"{caller}: {call}: {got.name} {details!r}, want {want.name}"


def test_refusals_name_the_id_and_the_key(outcome: Outcome) -> None:
    _, details = outcome.codes[row_id("worker-1", "Heartbeat worker-2 (read its leases)")]
    assert "'worker-2'" in details and "spec.access.workers[0].workerIds" in details
    _, details = outcome.codes[row_id("worker-1", "Register worker-1 with 5 slots (maxSlots 4)")]
    assert "spec.access.workers[0].maxSlots is 4" in details
    _, details = outcome.codes[row_id("worker-1", "Register worker-1 with 1024 slots")]
    assert "slots: must be 1 to 256" in details
    _, details = outcome.codes[row_id("admin", "Register worker-2 at 10.6.6.6 (hijack)")]
    assert "Deregister first" in details


def test_the_hijack_changed_nothing_and_heartbeats_list_own_leases_only(outcome: Outcome) -> None:
    # worker-2 is still registered where it registered, with its slots; no fake worker joined.
    assert outcome.after["workers"] == {"worker-1": (W1_ADDR, SLOTS), "worker-2": (W2_ADDR, SLOTS)}
    # Each worker's heartbeat lists exactly the leases on it, and both hold some of the four.
    for name in ("worker-1", "worker-2"):
        assert outcome.heartbeats[name] == [w for w in outcome.after["leases_on"] if w == name]
    assert sorted(outcome.heartbeats["worker-1"] + outcome.heartbeats["worker-2"]) == sorted(
        outcome.after["leases_on"]
    )
    assert len(outcome.after["leases_on"]) == 4
    assert outcome.heartbeats["worker-1"] and outcome.heartbeats["worker-2"]  # both hold some


def test_a_worker_is_handed_its_own_grant_keys_only(outcome: Outcome) -> None:
    """Register and Heartbeat answer with the caller's own keys (the scope was checked first, so
    worker-1 never reads worker-2's): a grant worker-1 makes with its keys, worker-2 refuses."""
    ring = outcome.keyring
    assert ring is not None
    one, two = outcome.grant_keys["worker-1"], outcome.grant_keys["worker-2"]
    assert one == list(ring.worker_keys("worker-1")) and two == list(ring.worker_keys("worker-2"))
    assert {k for _, k in one}.isdisjoint(k for _, k in two)
    claim = GrantClaim("acme", "s", "worker-2/0#1", 1, "worker-2", 0)
    kid, key = one[0]
    with pytest.raises(GrantRefused, match="not valid"):
        GrantVerifier().with_keys("worker-2", two).verify(make_grant(kid, key, claim, 0), claim, 0)


def test_every_caller_and_service_is_in_the_table() -> None:
    callers = {caller for caller, _, _ in TABLE}
    assert callers == set(CALLERS)
    assert {call for _, call, _ in TABLE} == set(CALLS)


def test_a_restarted_worker_replaces_its_own_registration() -> None:
    """Same credential at another address (a pod restarted with a new IP): the old registration is
    replaced, its leases revoked and re-queued; another worker's credential may not do this."""
    with running_server(POLICY, static_pool=False) as server:

        async def go() -> None:
            async with (
                Client(server.target, token=W1_TOKEN) as w1,
                Client(server.target, token=TOKENS["acme"]) as acme,
            ):
                await w1.workers.Register(register("worker-1", W1_ADDR), metadata=w1.md)
                call = acme.acquire("s", B)
                first = (await next_event(call)).granted.lease
                assert first.slot.worker_id == "worker-1"
                moved = register("worker-1", "10.0.0.99:7000")
                await w1.workers.Register(moved, metadata=w1.md)
                revoked = (await next_event(call)).WhichOneof("event")
                assert revoked == "revoked"
                again = (await next_event(call)).WhichOneof("event")
                assert again in ("queued", "granted")
                pool = await w1.workers.Heartbeat(
                    workers_pb2.HeartbeatRequest(worker_id="worker-1"), metadata=w1.md
                )
                assert all(lease.lease_id != first.lease_id for lease in pool.leases)
                await w1.workers.Drain(workers_pb2.DrainRequest(worker_id="worker-1"), metadata=w1.md)
                await w1.workers.Deregister(
                    workers_pb2.DeregisterRequest(worker_id="worker-1"), metadata=w1.md
                )
                call.cancel()

        asyncio.run(go())
        assert server.call(lambda s: dict(s.registry.workers)) == {}
