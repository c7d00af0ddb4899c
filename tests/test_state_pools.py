"""Durable state of many pools: every event's pool fields round-trip the journal, a replay places
each request again in the same pool, and a state snapshot holds each pool's part (one pool: the
document of before pools)."""

from __future__ import annotations

import json
from collections import OrderedDict

from scheduler.core.pools import Pools
from scheduler.core.types import (
    Acquire,
    Decision,
    Event,
    QoS,
    Release,
    SessionId,
    SnapshotRef,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerId,
)
from scheduler.policy.model import Policy, PoolSpec, TenantSpec
from scheduler.server.loop import LoopState
from scheduler.state import codec, state_read, state_write

CPU = PoolSpec(
    name="cpu", labels=(("cpuModel", "icelake"), ("kind", "cpu")), compatibility=("cpuModel",), floor=1
)
GPU = PoolSpec(name="gpu", labels=(("cpuModel", "icelake"), ("gpu", "a100")), floor=0)
# Labels in key order, as the policy reader gives them (a read-back policy compares equal).
POLICY = Policy(
    pool=CPU,
    pools=(CPU, GPU),
    tenants=(
        TenantSpec("acme", guaranteed=1, burstable_nominal=1, burstable_limit=3),
        TenantSpec("beta", burstable_limit=3),
    ),
)
REF = SnapshotRef("file:///snap/a", 12, "ab" * 32, 3.0, "cpu", (("cpuModel", "icelake"),))


def _events() -> list[tuple[Event, float]]:
    evs: list[tuple[Event, float]] = [
        (WorkerAdded(WorkerId("c0"), 2, "c0:1", pool="cpu"), 0.0),
        (WorkerAdded(WorkerId("g0"), 1, "g0:1", ((0, 4),), "gpu"), 0.0),
    ]
    t = 1.0
    for i in range(6):
        tenant = TenantName("acme" if i % 2 else "beta")
        pool = "cpu" if i % 3 else ""
        sel = (("gpu", "a100"),) if i % 3 == 0 else ()
        fb = ("gpu",) if i % 3 == 1 else ()
        ref = REF if i == 4 else None
        evs.append((Acquire(SessionId(f"{tenant}/s{i}"), tenant, QoS.BURSTABLE, ref, pool, sel, fb), t))
        t += 1
    evs.append((Release(SessionId("beta/s0")), t))
    evs.append((Tick(), t + 40))
    return evs


def test_pool_fields_round_trip_the_journal() -> None:
    for ev, at in _events():
        rec, back_at, _ = codec.decode(codec.encode(ev, at))
        assert (rec, back_at) == (ev, at)


def test_replaying_the_journal_places_every_request_in_the_same_pool() -> None:
    live, replayed = Pools(POLICY), Pools(POLICY)
    journal: list[bytes] = []
    decided: list[list[Decision]] = []
    for ev, at in _events():
        decided.append(live.handle(ev, at))
        journal.append(codec.encode(ev, at))
    pools = {lease.session: lease.pool for lease, _ in live.leases()}
    assert set(pools.values()) == {"cpu", "gpu"}  # both pools are busy in this run
    for raw, want in zip(journal, decided, strict=True):
        rec, at, _ = codec.decode(raw)
        assert not isinstance(rec, codec.PolicyRecord)
        assert replayed.handle(rec, at) == want


def _state(core: Pools, now: float) -> state_write.State:
    return state_write.State(LoopState(core, {}, {}, {}, {}, {}, OrderedDict()), {}, now)


def test_a_snapshot_holds_every_pool_and_reads_back() -> None:
    live = Pools(POLICY)
    now = 0.0
    for ev, at in _events():
        live.handle(ev, at)
        now = at
    data = state_write.state_bytes(_state(live, now))
    doc = json.loads(data)
    assert doc["core_pool"] == "cpu" and list(doc["pools"]) == ["gpu"]
    back = state_read.read_state(data, state_write.current_fingerprint()).loop.core
    assert back.names() == ("cpu", "gpu") and back.policy == POLICY
    assert back.describe_all() == live.describe_all()
    assert sorted(back.leases()) == sorted(live.leases())
    assert {lease.pool for lease, _ in back.leases()} == {"cpu", "gpu"}
    assert list(back.queue()) == list(live.queue())
    # Both go on alike, in either pool.
    later: list[Event] = [
        Tick(),
        Acquire(SessionId("acme/new"), TenantName("acme"), QoS.GUARANTEED, pool="cpu"),
        Tick(),
    ]
    for ev in later:
        now += 31
        assert back.handle(ev, now) == live.handle(ev, now)


def test_a_snapshot_of_one_pool_is_the_document_of_before_pools() -> None:
    one = Pools(Policy(tenants=POLICY.tenants))
    one.handle(WorkerAdded(WorkerId("w"), 1, "w:1"), 0.0)
    one.handle(Acquire(SessionId("acme/a"), TenantName("acme"), QoS.BURSTABLE), 1.0)
    doc = json.loads(state_write.state_bytes(_state(one, 1.0)))
    assert "pools" not in doc and "core_pool" not in doc
    core = doc["core"]
    assert "pool" not in core["lease_fields"] and len(core["leases"][0]) == len(core["lease_fields"])
