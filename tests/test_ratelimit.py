"""Rate limits per flow: the pure token bucket (a table, time passed in), the server's adapter
(which flow a call is charged to, with a fake clock), and over real gRPC: past a bucket a call is
RESOURCE_EXHAUSTED with retry-after-ms and counted; a tenant's Acquire flood, or an admin's
flood, never makes a tenant's renewals fail."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest

from scheduler.api.gen.slotsched.v1 import admin_pb2
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.core.ratelimit import TokenBucket
from scheduler.policy.identities import Identity
from scheduler.policy.model import ADMIN, WORKER, Policy, RateLimit, RateLimitsSpec, TenantSpec
from scheduler.server.errors import RETRY_AFTER_KEY, RpcFailure
from scheduler.server.metrics import Metrics
from scheduler.server.ratelimit import RateLimiter

pytest.register_assert_rewrite("tests.grpc_fixtures")
from tests.grpc_fixtures import (  # noqa: E402
    ADMIN_TOKEN,
    TOKENS,
    B,
    Client,
    ServerThread,
    next_event,
    policy_yaml,
    running_server,
)

Code = grpc.StatusCode

# --- the pure bucket -------------------------------------------------------------------------

# (id, rate, burst, [(time, expected wait; 0 = admitted)])
BUCKET_TABLE: list[tuple[str, float, int, list[tuple[float, float]]]] = [
    ("burst-then-refused", 1.0, 3, [(0, 0), (0, 0), (0, 0), (0, 1.0)]),
    ("refills-at-rate", 2.0, 1, [(0, 0), (0, 0.5), (0.25, 0.25), (0.5, 0), (0.5, 0.5)]),
    ("never-above-burst", 10.0, 2, [(100, 0), (100, 0), (100, 0.1)]),
    ("refused-takes-nothing", 1.0, 1, [(0, 0), (0.5, 0.5), (0.5, 0.5), (1.0, 0)]),
    ("clock-backwards-mints-nothing", 1.0, 1, [(10, 0), (5, 1.0), (10, 1.0), (11, 0)]),
    ("slow-rate", 0.1, 1, [(0, 0), (1, 9.0), (10, 0)]),
]


@pytest.mark.parametrize(
    ("rate", "burst", "steps"), [pytest.param(r, b, s, id=i) for i, r, b, s in BUCKET_TABLE]
)
def test_token_bucket(rate: float, burst: int, steps: list[tuple[float, float]]) -> None:
    bucket = TokenBucket.full(rate, burst, 0.0)
    got = [round(bucket.take(t), 6) for t, _ in steps]
    assert got == [w for _, w in steps]


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (1, 0)])
def test_token_bucket_refuses_a_size_that_admits_nothing(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="rate > 0 and burst >= 1"):
        TokenBucket.full(rate, burst, 0.0)


# --- the adapter: which flow a call is charged to --------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def limiter(policy: Policy) -> tuple[RateLimiter, Clock, Metrics, list[Policy]]:
    clock, metrics, box = Clock(), Metrics(), [policy]
    lim = RateLimiter(lambda: box[0], clock)
    lim.metrics = metrics
    return lim, clock, metrics, box


ONE = RateLimit(1.0, 1)
POLICY = Policy(
    tenants=(TenantSpec("a"), TenantSpec("b"), TenantSpec("vip", rate_limit=RateLimit(1.0, 3))),
    rate_limits=RateLimitsSpec(tenant=ONE, renewals=ONE, admin=ONE, worker=ONE),
)
ADMIN_ID = Identity(role=ADMIN, key="spec.access.admins")
W0 = Identity(role=WORKER, key="spec.access.workers[0]")
W1 = Identity(role=WORKER, key="spec.access.workers[1]")


def refused(fn: object, *args: str | Identity) -> RpcFailure | None:
    try:
        fn(*args)  # type: ignore[operator]
    except RpcFailure as f:
        return f
    return None


def test_each_flow_has_its_own_bucket() -> None:
    lim, _, metrics, _ = limiter(POLICY)
    # Each of these is the first call of its flow: all admitted although every bucket holds one.
    for call in (
        (lim.tenant, "a", "Acquire"),
        (lim.tenant, "a", "Renew"),  # renewals: not the Acquire bucket
        (lim.tenant, "b", "Acquire"),  # another tenant
        (lim.role, ADMIN_ID, "DescribePool"),
        (lim.role, W0, "Heartbeat"),
        (lim.role, W1, "Heartbeat"),  # another worker entry
    ):
        assert refused(*call) is None, call
    # The second call of each flow is refused.
    f = refused(lim.tenant, "a", "GetSession")  # GetSession shares the Acquire bucket
    assert f is not None and f.code is Code.RESOURCE_EXHAUSTED
    assert "spec.rateLimits.tenant" in f.message and "tenant:a" in f.message
    assert dict(f.metadata)[RETRY_AFTER_KEY] == "1000"
    f = refused(lim.tenant, "a", "Yield")  # Renew, Release, Yield share the renewals bucket
    assert f is not None and "spec.rateLimits.renewals" in f.message
    f = refused(lim.role, ADMIN_ID, "ListLeases")
    assert f is not None and "role:admin" in f.message
    assert refused(lim.role, W0, "Register") is not None
    assert metrics.rate_limited == {
        ("a", "GetSession"): 1,
        ("a", "Yield"): 1,
        ("role:admin", "ListLeases"): 1,
        ("role:worker", "Register"): 1,
    }


def test_a_tenants_own_rate_limit_overrides_the_default() -> None:
    lim, _, _, _ = limiter(POLICY)
    for _ in range(3):
        assert refused(lim.tenant, "vip", "Acquire") is None
    f = refused(lim.tenant, "vip", "Acquire")
    assert f is not None and "spec.tenants[2].rateLimit" in f.message


def test_an_acquire_flood_never_refuses_the_tenants_renewals() -> None:
    policy = Policy(
        tenants=(TenantSpec("a"),),
        rate_limits=RateLimitsSpec(tenant=RateLimit(5.0, 5), renewals=RateLimit(10.0, 10)),
    )
    lim, clock, metrics, _ = limiter(policy)
    renewed = 0
    for step in range(1000):  # 10 s of 100 Acquires a second, and 4 renewals a second
        clock.t += 0.01
        refused(lim.tenant, "a", "Acquire")
        if step % 25 == 0:
            assert refused(lim.tenant, "a", "Renew") is None
            renewed += 1
    assert renewed == 40
    assert metrics.rate_limited[("a", "Acquire")] > 900
    assert ("a", "Renew") not in metrics.rate_limited


def test_no_bucket_means_unlimited_and_a_resized_bucket_starts_full() -> None:
    lim, _, _, box = limiter(Policy(tenants=(TenantSpec("a"),)))
    for _ in range(1000):
        assert refused(lim.tenant, "a", "Acquire") is None
        assert refused(lim.role, ADMIN_ID, "ApplyPolicy") is None
    box[0] = Policy(tenants=(TenantSpec("a"),), rate_limits=RateLimitsSpec(tenant=ONE))
    assert refused(lim.tenant, "a", "Acquire") is None
    assert refused(lim.tenant, "a", "Acquire") is not None
    box[0] = Policy(tenants=(TenantSpec("a"),), rate_limits=RateLimitsSpec(tenant=RateLimit(1.0, 2)))
    assert refused(lim.tenant, "a", "Acquire") is None  # a new size: a full bucket


# --- over real gRPC ---------------------------------------------------------------------------

LIMITS = {
    "tenant": {"qps": 0.5, "burst": 2},
    "renewals": {"qps": 50, "burst": 50},
    "admin": {"qps": 0.5, "burst": 3},
}


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with running_server(policy_yaml(rate_limits=LIMITS)) as s:
        yield s


async def code_of(call: object) -> tuple[Code, tuple[tuple[str, str | bytes], ...]]:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as e:
        return e.code(), tuple(e.trailing_metadata() or ())
    return Code.OK, ()


def test_floods_are_refused_and_renewals_go_on(server: ServerThread) -> None:
    async def go() -> None:
        async with (
            Client(server.target, token=TOKENS["acme"]) as c,
            Client(server.target, token=ADMIN_TOKEN) as a,
        ):
            call = c.acquire("held", B)  # 1st token of acme's Acquire bucket
            lease = (await next_event(call)).granted.lease
            renew = pb.RenewRequest(session_id="held", lease_id=lease.lease_id, epoch=lease.epoch)
            codes = []
            for i in range(6):  # an Acquire flood by the same tenant: 1 more admitted, then refused
                flood = c.acquire(f"flood-{i}", B)
                try:
                    await next_event(flood)
                    codes.append(Code.OK)
                except grpc.aio.AioRpcError as e:
                    codes.append(e.code())
                    assert dict(e.trailing_metadata() or ())[RETRY_AFTER_KEY].isdigit()
                    assert "spec.rateLimits.tenant" in (e.details() or "")
                flood.cancel()
                assert (await code_of(c.scheduler.Renew(renew, metadata=c.md)))[0] == Code.OK
            assert codes[0] == Code.OK and codes[1:] == [Code.RESOURCE_EXHAUSTED] * 5
            # An admin flood: refused past its own bucket; the tenant's renewals still pass.
            admin_codes = []
            for _ in range(8):
                admin_codes.append(
                    (await code_of(a.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=a.md)))[0]
                )
                assert (await code_of(c.scheduler.Renew(renew, metadata=c.md)))[0] == Code.OK
            assert admin_codes[:3] == [Code.OK] * 3 and set(admin_codes[3:]) == {Code.RESOURCE_EXHAUSTED}
            call.cancel()

    asyncio.run(go())
    counted = server.call(lambda s: dict(s.loop.metrics.rate_limited))
    assert counted[("acme", "Acquire")] == 5 and counted[("role:admin", "DescribePool")] == 5
    assert not any(rpc == "Renew" for _, rpc in counted)
    # ...and exported as slotsched_rate_limited_total{tenant,rpc}.
    from prometheus_client import generate_latest

    text = generate_latest(server.call(lambda s: s.loop.metrics.registry)).decode()
    assert 'slotsched_rate_limited_total{rpc="Acquire",tenant="acme"} 5.0' in text
