"""Cold recovery at scale: 10,000 granted leases + 100,000 queued sessions, recovered from a real
redis-server with no standby (snapshot + the worst-case journal tail the cadence allows).

    python3 bench/recovery.py [--leases 10000] [--queued 100000] [--runs 5]

What it does, through the real code paths:
  1. builds the state with real core events through a `SchedulerLoop` and `WorkerRegistry`
     (100 workers, five tenants, Guaranteed/Burstable leases, Burstable/BestEffort queued);
  2. attaches a `Replica` (leader of a redis-server this script starts on a free port) and lets
     one journaled batch cut and store the snapshot (`_cut_snapshot` / `_save_snapshot`), while
     a probe task measures how long the event loop is stalled meanwhile;
  3. appends the worst-case journal tail the snapshot cadence allows (`Replica.tail_bound`:
     renewals, releases that grant queued sessions, new acquires) through the same replica;
  4. times cold recovery `--runs` times: a fresh loop, registry and replica run the real
     `Replica._recover` (load the snapshot from Redis, read it, `Core.from_records`, `loop.load_state`,
     replay the tail), and checks the recovered core equals the live one.

`run()` is importable (bench/failover.py prints its figures). The last line is `key=value`:
cold_recovery_ms_10k_100k (p50), cold_recovery_ms_max, snapshot_bytes, snapshot_cut_ms (the
longest event-loop stall while the snapshot is cut, encoded and stored), tail_entries.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from procs import free_port, start_redis  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from scheduler.core.types import Acquire, Granted, QoS, Release, Renew, SessionId, TenantName, WorkerId  # noqa: E402
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec  # noqa: E402
from scheduler.ports import Extras  # noqa: E402
from scheduler.server.loop import SchedulerLoop  # noqa: E402
from scheduler.server.registry import WorkerRegistry  # noqa: E402
from scheduler.state.redis_store import RedisStore  # noqa: E402
from scheduler.state.replica import Replica, StateMetrics  # noqa: E402

TENANTS = 5
WORKERS = 100


@dataclass(frozen=True)
class Result:
    recovery_ms: list[float]
    snapshot_bytes: int
    cut_stall_ms: float
    tail_entries: int
    build_s: float

    def line(self) -> str:
        return (
            f"cold_recovery_ms_10k_100k={statistics.median(self.recovery_ms):.0f} "
            f"cold_recovery_ms_max={max(self.recovery_ms):.0f} snapshot_bytes={self.snapshot_bytes} "
            f"snapshot_cut_ms={self.cut_stall_ms:.1f} tail_entries={self.tail_entries}"
        )


def policy(leases: int, queued: int) -> Policy:
    per = leases // TENANTS
    return Policy(
        name="recovery-bench",
        pool=PoolSpec(
            slots_per_worker=leases // WORKERS, workers=WORKERS, min_workers=1, max_workers=WORKERS, floor=0
        ),
        timing=TimingSpec(yield_grace_s=30, lease_ttl_s=600, min_runtime_s=60),
        queue=QueueSpec(max_pending=queued * 2, max_pending_per_tenant=queued, best_effort_fraction=1.0),
        tenants=tuple(
            TenantSpec(
                f"t{i}",
                weight=1.0 + i,
                guaranteed=per // 2,
                burstable_nominal=per - per // 2,
                burstable_limit=per * 2,
            )
            for i in range(TENANTS)
        ),
    )


class _Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        self.t += 0.001
        return self.t


def _build(loop: SchedulerLoop, registry: WorkerRegistry, leases: int, queued: int) -> list[Any]:
    """The state: every slot leased (half Guaranteed, half Burstable at nominal: none preemptible,
    so the queue does not turn into yields), then `queued` Burstable/BestEffort requests."""
    per_worker = leases // WORKERS
    for w in range(WORKERS):
        registry.register(
            WorkerId(f"w{w:03d}"), f"10.0.{w // 250}.{w % 250}:7000", per_worker, {"zone": f"z{w % 3}"}
        )
    granted = []
    per = leases // TENANTS
    for i in range(leases):
        t = i % TENANTS
        qos = QoS.GUARANTEED if (i // TENANTS) < per // 2 else QoS.BURSTABLE
        s = SessionId(f"t{t}/lease-{i}")
        ds = loop.submit(Acquire(s, TenantName(f"t{t}"), qos), Extras(wait_timeout_s=None))
        granted += [d.lease for d in ds if isinstance(d, Granted)]
    assert len(granted) == leases, f"{len(granted)} granted of {leases}"
    for i in range(queued):
        t = i % TENANTS
        qos = QoS.BURSTABLE if i % 3 else QoS.BEST_EFFORT
        s = SessionId(f"t{t}/q-{i}")
        loop.submit(Acquire(s, TenantName(f"t{t}"), qos), Extras(wait_timeout_s=3600.0 if i % 2 else None))
    assert len(loop.core.export_records().requests) == queued
    return granted


def _tail(loop: SchedulerLoop, granted: list[Any], n: int, queued: int) -> None:
    """`n` journaled events of a busy leader: mostly renewals, some releases (each grants a queued
    session), some new acquires that queue."""
    live = {lease.session: lease for lease in granted}
    order = list(live)
    k = 0
    for i in range(n):
        kind = i % 10
        if kind < 7:  # renew
            s = order[i % len(order)]
            lease = live.get(s)
            if lease is None:
                s = order[0]
                lease = live[s]
            loop.submit(Renew(s, lease.lease_id, lease.epoch))
        elif kind < 9:  # release: the freed slot goes to the head of the queue
            s = order.pop(0)
            lease = live.pop(s)
            ds = loop.submit(Release(s, lease.lease_id, lease.epoch))
            for d in ds:
                if isinstance(d, Granted):
                    live[d.lease.session] = d.lease
                    order.append(d.lease.session)
        else:  # a new session queues
            k += 1
            t = k % TENANTS
            loop.submit(Acquire(SessionId(f"t{t}/tail-{k}"), TenantName(f"t{t}"), QoS.BURSTABLE), Extras())


class RedisServer:
    """A private redis-server without an AOF (this bench measures reads, not fsync)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="slotsched-recovery-")
        self.port = free_port()
        self.proc = start_redis(self.port, self.dir, aof=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def wait(self) -> None:
        store = RedisStore(self.url, "probe", "probe")
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    await store.redis.ping()
                    return
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
                except Exception:  # redis ConnectionError before the port listens
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
        finally:
            await store.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


async def _noop(*_: Any) -> None:
    return None


def _replica(url: str, loop: SchedulerLoop, registry: WorkerRegistry, pol: Policy, name: str) -> Replica:
    return Replica(
        RedisStore(url, "bench", name, timeout_s=30.0),
        loop,
        registry,
        pol,
        StateMetrics(CollectorRegistry()),
        on_lead=_noop,
        on_step_down=_noop,
        leader_ttl_s=600.0,
    )


async def _max_stall(stop: asyncio.Event, out: list[float]) -> None:
    """The longest the event loop went without running this task (1 ms ticks)."""
    worst = 0.0
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        worst = max(worst, now - last - 0.001)
        last = now
    out.append(worst)


def _tail_bound(replica: Replica, live: int) -> int:
    bound = getattr(replica, "tail_bound", None)
    return int(bound(live)) if callable(bound) else replica.snapshot_every


async def run_async(leases: int = 10_000, queued: int = 100_000, runs: int = 5, log: Any = print) -> Result:
    server = RedisServer()
    try:
        await server.wait()
        pol = policy(leases, queued)
        t0 = time.perf_counter()
        loop = SchedulerLoop(pol, clock=_Clock())
        registry = WorkerRegistry(loop, 5.0)
        granted = _build(loop, registry, leases, queued)
        build_s = time.perf_counter() - t0
        log(f"built {leases} leases + {queued} queued in {build_s:.1f} s")

        # The leader: one journaled batch cuts the snapshot, through the real path.
        leader = _replica(server.url, loop, registry, pol, "leader")
        assert await leader.store.try_lead(600.0)
        leader.serving = True
        loop.journal = leader
        loop.resume()
        leader._since_snapshot = 10**9  # due now
        stop, stalls = asyncio.Event(), []
        probe = asyncio.create_task(_max_stall(stop, stalls))
        await asyncio.sleep(0.01)
        loop.submit(Renew(granted[0].session, granted[0].lease_id, granted[0].epoch))
        await loop.durable()
        while (await leader.store.load_snapshot()) is None:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.01)
        stop.set()
        await probe
        stored = await leader.store.load_snapshot()
        assert stored is not None
        log(f"snapshot stored: {len(stored.data)} bytes, longest event-loop stall {stalls[0] * 1e3:.1f} ms")

        # The worst-case tail the cadence allows, journaled by the same leader (no snapshot cut).
        tail = _tail_bound(leader, leases + queued) - 1
        leader._snapshots_ok = False
        for i in range(0, tail, 1000):
            _tail(loop, granted, min(1000, tail - i), queued)
            await loop.durable()
        n_journal = await leader.store.redis.xlen(leader.store.k_journal)
        log(f"journal tail: {n_journal} entries after the snapshot")
        live_fp = _fingerprint(loop)

        times = []
        for r in range(runs):
            cold = SchedulerLoop(pol, clock=_Clock())
            cold_registry = WorkerRegistry(cold, 5.0)
            cold.begin_shutdown()
            replica = _replica(server.url, cold, cold_registry, pol, f"cold-{r}")
            t1 = time.perf_counter()
            await replica._recover()
            dt = (time.perf_counter() - t1) * 1e3
            times.append(dt)
            assert _fingerprint(cold) == live_fp, "the recovered state differs from the live one"
            await replica.store.close()
            log(f"run {r + 1}: cold recovery {dt:.0f} ms")
        await leader.store.close()
        return Result(times, len(stored.data), stalls[0] * 1e3, int(n_journal), build_s)
    finally:
        server.stop()


def _fingerprint(loop: SchedulerLoop) -> Any:
    r = loop.core.export_records()
    return (r.leases, r.requests, r.expiries, r.free_slots, r.seq, len(loop.export_state().qos))


def run(leases: int = 10_000, queued: int = 100_000, runs: int = 5, log: Any = print) -> Result:
    return asyncio.run(run_async(leases, queued, runs, log))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leases", type=int, default=10_000)
    ap.add_argument("--queued", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    result = run(a.leases, a.queued, a.runs)
    print(result.line())


if __name__ == "__main__":
    main()
