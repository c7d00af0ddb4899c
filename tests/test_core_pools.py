"""Many pools in the core: placement as a table (Kueue-style cases), the routing of `Pools`, its
records, and two properties: no session lands in a pool it did not ask for, and a pool decides
exactly as it would alone (pools are independent domains)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.engine import Core
from scheduler.core.placement import candidates
from scheduler.core.pools import Pools, PoolsRecords
from scheduler.core.types import (
    Acquire,
    BlockedReason,
    Decision,
    Ended,
    Granted,
    LeaseId,
    QoS,
    Queued,
    Refused,
    RefuseReason,
    Rejected,
    Release,
    Renew,
    Revoked,
    SessionId,
    SnapshotRef,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerId,
    WorkerRemoved,
    Yield,
)
from scheduler.policy.model import Policy, PoolSpec, TenantPoolQuota, TenantSpec

CPU = PoolSpec(
    name="cpu", labels=(("kind", "cpu"), ("cpuModel", "icelake")), compatibility=("cpuModel",), floor=0
)
GPU = PoolSpec(
    name="gpu", labels=(("gpu", "a100"), ("cpuModel", "icelake")), compatibility=("cpuModel",), floor=0
)
OLD = PoolSpec(
    name="old", labels=(("kind", "cpu"), ("cpuModel", "skylake")), compatibility=("cpuModel",), floor=0
)
POOLS = (CPU, GPU, OLD)
TENANTS = (
    TenantSpec("acme", guaranteed=1, burstable_nominal=1, burstable_limit=4),
    # No GPU at all, and no Guaranteed in the old pool.
    TenantSpec(
        "beta",
        guaranteed=1,
        burstable_limit=4,
        pools=(TenantPoolQuota("gpu", guaranteed=0, burstable_limit=0), TenantPoolQuota("old", guaranteed=0)),
    ),
)
POLICY = Policy(pool=CPU, pools=POOLS, tenants=TENANTS)
D = TypeVar("D")
ICELAKE = SnapshotRef("file:///s", pool="cpu", labels=(("cpuModel", "icelake"),))
SKYLAKE = SnapshotRef("file:///s", pool="old")  # labels from the policy's pool "old" now


def _acq(tenant: str = "acme", qos: QoS = QoS.BURSTABLE, **kw: object) -> Acquire:
    return Acquire(SessionId("s"), TenantName(tenant), qos, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    name: str
    event: Acquire
    want: list[str] | RefuseReason
    policy: Policy = POLICY
    says: tuple[str, ...] = field(default=())  # words the refusal's message must hold


CASES = [
    Case("a named pool", _acq(pool="gpu"), ["gpu"]),
    Case("then its fallbacks in order", _acq(pool="gpu", fallback=("old", "cpu")), ["gpu", "old", "cpu"]),
    Case("a fallback named twice counts once", _acq(pool="cpu", fallback=("cpu", "gpu")), ["cpu", "gpu"]),
    Case("a selector: matches in the policy's order", _acq(selector=(("kind", "cpu"),)), ["cpu", "old"]),
    Case("a selector of two labels", _acq(selector=(("kind", "cpu"), ("cpuModel", "skylake"))), ["old"]),
    Case(
        "a selector matching none",
        _acq(selector=(("gpu", "h100"),)),
        RefuseReason.NO_ELIGIBLE_POOL,
        says=("gpu=h100",),
    ),
    Case(
        "a selector matching none, with a fallback",
        _acq(selector=(("gpu", "h100"),), fallback=("cpu",)),
        ["cpu"],
    ),
    Case(
        "an unknown pool", _acq(pool="tpu"), RefuseReason.UNKNOWN_POOL, says=("'tpu'", "'cpu', 'gpu', 'old'")
    ),
    Case(
        "an unknown fallback",
        _acq(pool="cpu", fallback=("tpu",)),
        RefuseReason.UNKNOWN_POOL,
        says=("fallback", "'tpu'"),
    ),
    Case(
        "several pools, none named default, none asked", _acq(), RefuseReason.NO_POOL_NAMED, says=("'cpu'",)
    ),
    Case("one pool: it, when none is asked", _acq(), ["default"], policy=Policy(tenants=TENANTS)),
    Case(
        "several pools, one named default",
        _acq(),
        ["default"],
        policy=Policy(pool=PoolSpec(), pools=(PoolSpec(), GPU), tenants=TENANTS),
    ),
    Case("no quota in a selected pool: left out", _acq("beta", selector=(("cpuModel", "icelake"),)), ["cpu"]),
    Case(
        "no quota in any candidate",
        _acq("beta", QoS.GUARANTEED, pool="gpu", fallback=("old",)),
        RefuseReason.NO_QUOTA,
        says=("guaranteed", "'gpu', 'old'"),
    ),
    Case("one candidate: its core judges the quota", _acq("beta", pool="gpu"), ["gpu"]),
    Case(
        "a snapshot's labels keep it on its CPU model",
        _acq(selector=(("kind", "cpu"),), resume_from=ICELAKE),
        ["cpu"],
    ),
    Case(
        "a snapshot naming only its pool: that pool's labels now",
        _acq(selector=(("kind", "cpu"),), resume_from=SKYLAKE),
        ["old"],
    ),
    Case(
        "a snapshot no candidate can resume",
        _acq(pool="gpu", resume_from=SKYLAKE),
        RefuseReason.NO_ELIGIBLE_POOL,
        says=("'old'", "cpuModel=skylake"),
    ),
    Case(
        "a snapshot of before pools: anywhere asked",
        _acq(pool="old", resume_from=SnapshotRef("file:///s")),
        ["old"],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_placement(case: Case) -> None:
    got = candidates(case.policy, case.event)
    if isinstance(case.want, RefuseReason):
        assert isinstance(got, Refused), got
        assert got.reason is case.want
        for word in case.says:
            assert word in got.message, (word, got.message)
    else:
        assert got == case.want


def _pools(slots: dict[str, int]) -> Pools:
    p = Pools(POLICY)
    for name, n in slots.items():
        for i in range(n):
            assert not p.handle(WorkerAdded(WorkerId(f"{name}-w{i}"), 1, pool=name), 0.0)
    return p


def _only(out: list[Decision], kind: type[D]) -> D:
    (d,) = [d for d in out if isinstance(d, kind)]
    return d


def test_fallback_grants_in_the_first_pool_with_room_else_queues_in_the_first() -> None:
    p = _pools({"cpu": 1, "gpu": 1})
    first = p.handle(
        Acquire(SessionId("a"), TenantName("acme"), QoS.BURSTABLE, pool="cpu", fallback=("gpu",)), 1
    )
    assert _only(first, Granted).lease.pool == "cpu"
    second = p.handle(
        Acquire(SessionId("b"), TenantName("acme"), QoS.BURSTABLE, pool="cpu", fallback=("gpu",)), 1
    )
    assert _only(second, Granted).lease.pool == "gpu"
    third = p.handle(
        Acquire(SessionId("c"), TenantName("acme"), QoS.BURSTABLE, pool="cpu", fallback=("gpu",)), 1
    )
    q = _only(third, Queued)
    assert (q.pool, q.reason) == ("cpu", BlockedReason.TENANT_QUOTA)
    view = p.session(SessionId("c"))
    assert view is not None and (view.pool, view.reason, view.phase) == ("cpu", "tenant_quota", "queued")
    # The gpu slot frees: "c" waits in cpu and stays there (moved on by no rule it did not state).
    lease = _only(second, Granted).lease
    out = p.handle(Release(SessionId("b"), lease.lease_id, lease.epoch), 2)
    assert not [d for d in out if isinstance(d, Granted)]
    # The cpu slot frees: "c" gets it.
    lease = _only(first, Granted).lease
    out = p.handle(Release(SessionId("a"), lease.lease_id, lease.epoch), 3)
    assert _only(out, Granted).lease.session == "c"


def test_workers_join_one_pool_and_their_events_go_there() -> None:
    p = _pools({"gpu": 1})
    bad = p.handle(WorkerAdded(WorkerId("x"), 1, pool="tpu"), 1)
    assert isinstance(bad[0], Rejected) and "unknown pool 'tpu'" in bad[0].message
    none = p.handle(WorkerAdded(WorkerId("x"), 1), 1)
    assert isinstance(none[0], Rejected) and "must name its pool" in none[0].message
    twice = p.handle(WorkerAdded(WorkerId("gpu-w0"), 1, pool="cpu"), 1)
    assert isinstance(twice[0], Rejected) and "already registered in pool 'gpu'" in twice[0].message
    assert p.worker_pool(WorkerId("gpu-w0")) == "gpu"
    g = _only(p.handle(Acquire(SessionId("a"), TenantName("acme"), QoS.BURSTABLE, pool="gpu"), 2), Granted)
    out = p.handle(WorkerRemoved(WorkerId("gpu-w0")), 3)
    assert [d.lease.pool for d in out if isinstance(d, Revoked)] == ["gpu"]
    assert p.lease(g.lease.lease_id) is None
    assert p.worker_pool(WorkerId("gpu-w0")) is None


def test_a_refusal_and_a_queue_name_the_pool() -> None:
    p = _pools({"cpu": 1})
    out = p.handle(Acquire(SessionId("a"), TenantName("beta"), QoS.BURSTABLE, pool="gpu"), 1)
    r = _only(out, Refused)
    assert r.reason is RefuseReason.NO_QUOTA and r.pool == "gpu"
    assert "'gpu'" in r.message and "burstable" in r.message
    q = _only(p.handle(Acquire(SessionId("b"), TenantName("acme"), QoS.GUARANTEED, pool="gpu"), 1), Queued)
    assert (q.pool, q.reason) == ("gpu", BlockedReason.POOL_EXHAUSTED)
    dup = _only(p.handle(Acquire(SessionId("b"), TenantName("acme"), QoS.GUARANTEED, pool="cpu"), 1), Refused)
    assert dup.reason is RefuseReason.DUPLICATE_SESSION and "'gpu'" in dup.message


def test_a_pool_added_and_a_pool_retired_by_a_policy_change() -> None:
    p = _pools({"cpu": 1, "old": 1})
    g = _only(p.handle(Acquire(SessionId("a"), TenantName("acme"), QoS.BURSTABLE, pool="old"), 1), Granted)
    p.apply_policy(Policy(pool=CPU, pools=(CPU, GPU), tenants=TENANTS), 2)
    assert p.names() == ("cpu", "gpu", "old")  # old retired, still draining
    r = _only(p.handle(Acquire(SessionId("b"), TenantName("acme"), QoS.BURSTABLE, pool="old"), 3), Refused)
    assert r.reason is RefuseReason.UNKNOWN_POOL
    lease = g.lease
    renewed = p.handle(Renew(SessionId("a"), lease.lease_id, lease.epoch), 4)
    assert [type(d).__name__ for d in renewed] == ["Renewed"]  # a retired pool's leases go on
    p.handle(Release(SessionId("a"), lease.lease_id, lease.epoch), 5)
    p.handle(WorkerRemoved(WorkerId("old-w0")), 6)
    assert p.names() == ("cpu", "gpu")  # dropped once it holds nothing


def test_records_round_trip_over_pools() -> None:
    p = _pools({"cpu": 2, "gpu": 1})
    for i, pool in enumerate(["cpu", "cpu", "gpu", "gpu", "cpu"]):
        p.handle(Acquire(SessionId(f"s{i}"), TenantName("acme"), QoS.BURSTABLE, pool=pool), 1 + i)
    recs = p.export_records()
    assert isinstance(recs, PoolsRecords) and [n for n, _ in recs.pools] == ["cpu", "gpu", "old"]
    back = Pools.from_records(POLICY, recs)
    assert back.describe_all() == p.describe_all()
    assert sorted(back.leases()) == sorted(p.leases())
    assert [v for v in back.queue()] == [v for v in p.queue()]
    assert all(lease.pool in ("cpu", "gpu") for lease, _ in back.leases())
    # Both go on alike.
    lease = next(lease for lease, _ in p.leases() if lease.pool == "gpu")
    ev = Release(lease.session, lease.lease_id, lease.epoch)
    assert back.handle(ev, 9) == p.handle(ev, 9)


def test_one_pool_records_are_a_cores_records() -> None:
    policy = Policy(tenants=TENANTS[:1])  # no per-pool quotas: for_pool is the policy itself
    p, core = Pools(policy), Core(policy)
    for target in (p, core):
        target.handle(WorkerAdded(WorkerId("w"), 2), 0)
        target.handle(Acquire(SessionId("a"), TenantName("acme"), QoS.BURSTABLE), 1)
    assert p.export_records() == core.export_records()


# ------------------------------------------------------------------ properties

_SESSIONS = [SessionId(f"s{i}") for i in range(8)]
_NAMES = ["cpu", "gpu", "old"]


@st.composite
def _script(draw: st.DrawFn) -> list[tuple[str, int]]:
    steps: list[tuple[str, int]] = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["acquire", "acquire", "release", "renew", "tick", "worker"]))
        steps.append((kind, draw(st.integers(0, 10_000))))
    return steps


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=_script())
def test_each_pool_decides_as_it_would_alone(script: list[tuple[str, int]]) -> None:
    """The decisions of pool P in a run of many pools equal those of a lone core running P's
    events under `policy.for_pool(P)`, and every grant is in the pool the request named."""
    pools = Pools(POLICY)
    alone = {name: Core(POLICY.for_pool(name)) for name in _NAMES}
    asked: dict[SessionId, str] = {}
    now = applied = 0.0
    for i, (kind, r) in enumerate(script):
        now += (r % 7) / 2
        seed = r
        name = _NAMES[seed % 3]
        if kind == "worker":
            ev: object = WorkerAdded(WorkerId(f"{name}-w{i}"), 1 + seed % 2, pool=name)
            lone_ev: object = WorkerAdded(WorkerId(f"{name}-w{i}"), 1 + seed % 2)
        elif kind == "acquire":
            s = _SESSIONS[seed % len(_SESSIONS)]
            if s in asked:
                continue
            tenant = TenantName(["acme", "beta"][seed // 3 % 2])
            qos = [QoS.GUARANTEED, QoS.BURSTABLE, QoS.BEST_EFFORT][seed // 7 % 3]
            ev = Acquire(s, tenant, qos, pool=name)
            lone_ev = Acquire(s, tenant, qos)
        elif kind in ("release", "renew"):
            held = sorted(lease for lease, _ in pools.leases())
            if not held:
                continue
            lease = held[seed % len(held)]
            name = lease.pool
            cls = Release if kind == "release" else Renew
            ev = lone_ev = cls(lease.session, lease.lease_id, lease.epoch)
        else:
            ev = lone_ev = Tick()
        got = pools.handle(ev, now)  # type: ignore[arg-type]
        applied = now
        # A lone core is ticked when it has a deadline due, as `Pools` ticks each pool.
        ticked = {n: _tick_if_due(alone[n], now) for n in _NAMES}
        if isinstance(ev, Tick):
            assert sorted(map(repr, got)) == sorted(repr(d) for n in _NAMES for d in ticked[n])
            _same_next_deadline(pools, alone, now)
            continue
        want = ticked[name] + alone[name].handle(lone_ev, now)  # type: ignore[arg-type]
        _same_next_deadline(pools, alone, now)
        mine = [d for d in got if _pool_of(d) in (name, None)]
        assert [d for d in mine if not isinstance(d, Rejected)] == [
            d for d in want if not isinstance(d, Rejected)
        ]
        for d in got:
            if isinstance(d, Granted):
                assert d.lease.pool == asked.get(d.lease.session, name)
        if isinstance(ev, Acquire):
            asked[ev.session] = name
        for d in got:
            if isinstance(d, Ended) and d.session in asked and not pools.session(d.session):
                del asked[d.session]
    for n in _NAMES:
        assert pools.describe(n) == alone[n].describe(applied)


def _same_next_deadline(pools: Pools, alone: dict[str, Core], now: float) -> None:
    """Pools' next deadline (kept as lower bounds, made exact when asked) is the earliest of the
    lone cores'. Checked when none is already due: a due deadline that does not move is dropped
    by Pools until its pool's next event (it must not spin), which a lone core does not model."""
    ats = [a for a in (c.next_deadline() for c in alone.values()) if a is not None]
    if all(a > now for a in ats):
        assert pools.next_deadline() == min(ats, default=None)


def _tick_if_due(core: Core, now: float) -> list[Decision]:
    at = core.next_deadline()
    return core.handle(Tick(), now) if at is not None and at <= now else []


def _pool_of(d: Decision) -> str | None:
    lease = getattr(d, "lease", None)
    if lease is not None:
        return str(lease.pool)
    return getattr(d, "pool", None) or None


def test_lease_ids_route_by_worker() -> None:
    p = _pools({"cpu": 1, "gpu": 1})
    g = _only(p.handle(Acquire(SessionId("a"), TenantName("acme"), QoS.BURSTABLE, pool="gpu"), 1), Granted)
    assert p.lease(g.lease.lease_id) == g.lease
    assert p.lease(LeaseId("nobody/0#1")) is None


def test_a_yielded_snapshot_records_the_pool_it_was_taken_in_whatever_the_client_said() -> None:
    """The server knows where the lease was: a client claiming its snapshot came from another
    pool (or with no labels) must not widen where the session may resume."""
    p = _pools({"old": 1, "cpu": 1})
    lease = _only(p.handle(_acq(pool="old"), 1), Granted).lease
    claim = SnapshotRef("file:///s/1", pool="cpu", labels=(("cpuModel", "icelake"),))
    p.handle(Yield(lease.session, lease.lease_id, lease.epoch, claim), 2)
    view = p.session(lease.session)
    assert view is not None and view.pool == "old"
    stored = view.resume_from
    assert stored is not None and stored.uri == "file:///s/1"
    assert (stored.pool, stored.labels) == ("old", (("cpuModel", "skylake"),))
