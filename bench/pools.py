"""Many pools (issue 24): the core's decision rate, memory and restore time with 100 pools.

1. Decision rate. Many: 100 pools x 100 slots (50 workers x 2 slots each) x 20 tenants with
   quotas in every pool (the tenant-wide quotas apply to each pool). One: one pool of the same
   total work, 10,000 slots (5,000 workers x 2 slots), the same 20 tenants with 100x the
   quotas. Both are full, with the same queue depth in all (10 waiters per pool, 1,000 in the
   one pool), and run the same churn: each step releases a random held lease (its pool grants
   the freed slot to its next waiter) and a new session arrives in that lease's pool, naming it
   (the one pool: naming none, the single-pool path); every 4th step also renews a random
   lease. Half the arrivals are Burstable, half BestEffort (as bench/core.py). The random picks
   are drawn before the clock starts; the timed loop holds the core's calls and the driver's
   bookkeeping, identical in all. Beside them, the same one-pool workload on a bare `Core`
   (what `Pools` of one pool wraps), and the many-pool workload sent straight to each pool's
   own core (`direct`: Pools' routing bypassed; a diagnostic, no timers of other pools fire).
   The four run in one process, `--rounds` times, in an order that rotates each round (the
   machine is shared and noisy); rates are medians over rounds, ratios the median of each
   round's ratio (the two rates of a round were measured seconds apart).
   pools_cost_ratio = one-pool rate / many-pool rate (bar <= 1.3), split into
   pools_routing_ratio = direct rate / many-pool rate (what Pools' routing costs) and
   per_pool_cores_ratio = one-pool rate / direct rate (what 100 small cores cost over one big);
   single_pool_overhead_ratio = bare Core rate / 1-pool Pools rate. pools_cost_ratio_best_rounds
   = the fastest one-pool round's rate / the fastest many-pool round's (least disturbed by
   other jobs on a shared machine).
2. Memory per pool: tracemalloc of building `Pools` of 100 empty pools and of 1, the difference
   over 99.
3. Restore: a state of 100 pools, 10,000 leases and 100,000 queued (spread evenly over pools),
   written by the state writer (`state_write.state_bytes`) and read back (`state_read.read_state`,
   which builds the cores): restore_100_pools_s (median of `--restore-runs`, bar < 2 s) beside
   restore_1_pool_s for the same totals in one pool.

    python bench/pools.py            # ~1-2 min; last line: key=value pairs
    python bench/pools.py --quick    # a smoke run: small sizes, seconds

Progress goes to stderr; stdout has the figures, the last line `key=value` pairs. With --profile
it also prints a cProfile of the many-pool churn (top functions by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import random
import statistics
import sys
import time
import tracemalloc
from collections import OrderedDict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.core.engine import Core  # noqa: E402
from scheduler.core.pools import Pools  # noqa: E402
from scheduler.core.types import (  # noqa: E402
    Acquire,
    Granted,
    QoS,
    Release,
    Renew,
    SessionId,
    TenantName,
    WorkerAdded,
    WorkerId,
)
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec  # noqa: E402
from scheduler.ports import LoopState, WorkerEntry  # noqa: E402
from scheduler.state import state_read, state_write  # noqa: E402

SLOTS_PER_WORKER = 2
CLASSES = (QoS.BURSTABLE, QoS.BEST_EFFORT)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def policy(pools: int, slots_per_pool: int, tenants: int, nominal: bool = True) -> Policy:
    """`pools` pools of `slots_per_pool` slots (one pool: a policy of today's single `pool:`).
    Tenant quotas scale with the pool, so one pool of N x S slots is N pools' worth of work.
    `nominal` False: no Burstable nominal (with one, a tenant often falls under it in a small
    pool and preempts, where it never does in the big one: 1,502 yield requests and 1,531
    cancellations per 40,000 steps, against none; without, both layouts decide the same work)."""
    specs = tuple(
        PoolSpec(
            name=f"p{p}" if pools > 1 else "default",
            slots_per_worker=SLOTS_PER_WORKER,
            workers=slots_per_pool // SLOTS_PER_WORKER,
            min_workers=1,
            max_workers=slots_per_pool // SLOTS_PER_WORKER,
            floor=0,
        )
        for p in range(pools)
    )
    per = max(1, slots_per_pool // (5 * tenants)) if nominal else 0  # 20 x 1 = 20% of 100 slots
    ts = tuple(
        TenantSpec(f"t{i}", weight=1 + i % 3, burstable_nominal=per, burstable_limit=10**6)
        for i in range(tenants)
    )
    return Policy(
        name="pools-bench",
        pool=specs[0],
        pools=specs if pools > 1 else (),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=3600, min_runtime_s=3600),
        queue=QueueSpec(max_pending=10**7, max_pending_per_tenant=10**7),
        tenants=ts,
    )


class Workload:
    """A full set of pools with waiters, and the churn driven through it."""

    def __init__(self, core: Core | Pools, pools: int, slots_per_pool: int, tenants: int,
                 queued_per_pool: int, seed: int, direct: bool = False) -> None:  # fmt: skip
        self.core = core
        self.rng = random.Random(seed)
        self.tenants = [TenantName(f"t{i}") for i in range(tenants)]
        names = [f"p{p}" if pools > 1 else "" for p in range(pools)]
        self.pool_names = names
        # held: (session, lease_id, epoch, pool) of every live lease
        self.held: list[tuple[SessionId, Any, int, str]] = []
        self.next_id = 0
        self.decisions = 0
        for name in names:
            for w in range(slots_per_pool // SLOTS_PER_WORKER):
                wid = WorkerId(f"{name or 'w'}-{w}")
                self._take(core.handle(WorkerAdded(wid, SLOTS_PER_WORKER, pool=name), 0.0), name)
        for name in names:
            for _ in range(slots_per_pool + queued_per_pool):
                self._arrive(name, 0.0)
        # Every event goes through `handlers[pool]`: the core's (or Pools') handle, or with
        # `direct` the pool's own core's, bypassing Pools' routing (a diagnostic of its cost).
        self.handlers = {
            name: (core.pool(core.names()[p]).handle if direct and isinstance(core, Pools) else core.handle)
            for p, name in enumerate(names)
        }
        self.now = 1.0

    def _take(self, out: list[Any], pool: str) -> None:
        for d in out:
            if isinstance(d, Granted):
                lease = d.lease
                self.held.append((lease.session, lease.lease_id, lease.epoch, pool))
        self.decisions += len(out)

    def _arrive(self, pool: str, now: float) -> None:
        i = self.next_id
        self.next_id += 1
        ev = Acquire(SessionId(f"s{i}"), self.tenants[self.rng.randrange(len(self.tenants))],
                     CLASSES[i & 1], pool=pool)  # fmt: skip
        self._take(self.core.handle(ev, now), pool)

    def churn(self, steps: int) -> tuple[float, int]:
        """Seconds and decisions of `steps` release (+ arrival, + a renew every 4th) steps."""
        rng, held, tenants, handlers = self.rng, self.held, self.tenants, self.handlers
        picks = [(rng.random(), rng.random(), rng.randrange(len(tenants))) for _ in range(steps)]
        first = self.next_id
        self.next_id += steps
        ids = [SessionId(f"s{i}") for i in range(first, first + steps)]
        decisions = 0
        now = self.now
        gc.collect()
        gc.disable()
        start = time.perf_counter()
        for i in range(steps):
            now += 1e-4
            a, b, t = picks[i]
            k = int(a * len(held))
            s, lid, epoch, pool = held[k]
            held[k] = held[-1]
            held.pop()
            handle = handlers[pool]
            out = handle(Release(s, lid, epoch), now)
            for d in out:
                if isinstance(d, Granted):
                    lease = d.lease
                    held.append((lease.session, lease.lease_id, lease.epoch, pool))
            decisions += len(out)
            out = handle(Acquire(ids[i], tenants[t], CLASSES[i & 1], pool=pool), now)
            for d in out:
                if isinstance(d, Granted):
                    lease = d.lease
                    held.append((lease.session, lease.lease_id, lease.epoch, pool))
            decisions += len(out)
            if i & 3 == 0:
                s, lid, epoch, p = held[int(b * len(held))]
                decisions += len(handlers[p](Renew(s, lid, epoch), now))
        elapsed = time.perf_counter() - start
        gc.enable()
        self.now = now
        return elapsed, decisions


# ------------------------------------------------------------------ 1. decision rate


def decision_rate(args: argparse.Namespace) -> dict[str, float]:
    n, size, tenants, q = args.pools, args.slots_per_pool, args.tenants, args.queued_per_pool
    t0 = time.perf_counter()
    many_pol, one_pol = policy(n, size, tenants, args.nominal), policy(1, n * size, tenants, args.nominal)
    runs = {
        "many": Workload(Pools(many_pol), n, size, tenants, q, 1),
        "direct": Workload(Pools(many_pol), n, size, tenants, q, 1, direct=True),
        "one": Workload(Pools(one_pol), 1, n * size, tenants, n * q, 1),
        "core": Workload(Core(one_pol), 1, n * size, tenants, n * q, 1),
    }
    log(f"rate: built {n} pools x {size} slots (x2) and 1 x {n * size} (x2), {q} waiters per pool, "
        f"in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    for w in runs.values():
        w.churn(max(200, args.steps // 10))  # warm up
    rates: dict[str, list[float]] = {k: [] for k in runs}
    keys = list(runs)
    for r in range(args.rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for k in order:
            elapsed, decisions = runs[k].churn(args.steps)
            rates[k].append(decisions / elapsed)
        log(f"round {r + 1}/{args.rounds}: " + "  ".join(f"{k} {rates[k][-1]:,.0f}/s" for k in keys))
    med = {k: statistics.median(v) for k, v in rates.items()}

    def ratio(a: str, b: str) -> list[float]:  # per round: the two ran seconds apart
        return [x / y for x, y in zip(rates[a], rates[b], strict=True)]

    cost = ratio("one", "many")
    return {
        "many_pools_decisions_per_s": med["many"],
        "one_pool_decisions_per_s": med["one"],
        "bare_core_decisions_per_s": med["core"],
        "many_cores_direct_decisions_per_s": med["direct"],
        "pools_cost_ratio": statistics.median(cost),
        "pools_cost_ratio_rounds_min": min(cost),
        "pools_cost_ratio_rounds_max": max(cost),
        # Each layout's fastest round against the other's: on a shared machine, the rounds
        # least slowed by other jobs (a round's two rates can be hit unevenly).
        "pools_cost_ratio_best_rounds": max(rates["one"]) / max(rates["many"]),
        "single_pool_overhead_ratio": statistics.median(ratio("core", "one")),
        "pools_routing_ratio": statistics.median(ratio("direct", "many")),
        "per_pool_cores_ratio": statistics.median(ratio("one", "direct")),
    }


def profile_many(args: argparse.Namespace) -> str:
    w = Workload(Pools(policy(args.pools, args.slots_per_pool, args.tenants)), args.pools,
                 args.slots_per_pool, args.tenants, args.queued_per_pool, 2)  # fmt: skip
    prof = cProfile.Profile()
    prof.enable()
    w.churn(args.steps)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    return buf.getvalue()


# ------------------------------------------------------------------ 2. memory


def memory_per_pool_kb(pools: int, size: int, tenants: int) -> float:
    def built(n: int) -> int:
        pol = policy(n, size, tenants)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        p = Pools(pol)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del p
        return after - before

    one = min(built(1) for _ in range(2))
    many = min(built(pools) for _ in range(2))
    per = (many - one) / (pools - 1) / 1024
    log(f"memory: Pools of 1 empty pool {one / 1024:.0f} KiB, of {pools} {many / 1024:.0f} KiB: "
        f"{per:.1f} KiB per pool")  # fmt: skip
    return per


# ------------------------------------------------------------------ 3. restore


def restore_state(pools: int, leases: int, queued: int, tenants: int) -> bytes:
    """The state document of `pools` pools holding `leases` leases and `queued` waiters in all."""
    size = leases // pools
    pol = policy(pools, size, tenants)
    core = Pools(pol)
    w = Workload(core, pools, size, tenants, queued // pools, 3)
    assert len(w.held) == leases, (len(w.held), leases)
    qos = {s: QoS.BURSTABLE for s, *_ in w.held}
    for view in core.queue():
        qos[view.session] = QoS(view.qos)
    assert len(qos) == leases + queued, (len(qos), leases + queued)
    workers: dict[WorkerId, WorkerEntry] = {}
    addresses: dict[WorkerId, str] = {}
    for name in core.names():
        for wid in core.pool(name).worker_ids():
            addresses[wid] = f"10.0.0.1:{len(addresses)}"
            workers[wid] = WorkerEntry(wid, addresses[wid], SLOTS_PER_WORKER, 0.5, {"pool": name}, 1.0)
    loop = LoopState(core, addresses, {}, {}, qos, {}, OrderedDict())
    return state_write.state_bytes(state_write.State(loop, workers, w.now))


def restore_s(pools: int, leases: int, queued: int, tenants: int, runs: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    raw = restore_state(pools, leases, queued, tenants)
    log(f"restore: state of {pools} pool(s), {leases} leases, {queued} queued built and written "
        f"({len(raw) / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    times = []
    for r in range(runs):
        gc.collect()
        t1 = time.perf_counter()
        back = state_read.read_state(raw, state_write.current_fingerprint())
        times.append(time.perf_counter() - t1)
        got = sum(1 for _ in back.loop.core.leases()), sum(1 for _ in back.loop.core.queue())
        assert got == (leases, queued), got
        del back
        gc.unfreeze()  # read_state froze what it read: let the next run's garbage go
        gc.collect()
        log(f"  read {r + 1}/{runs}: {times[-1]:.2f} s")
    return statistics.median(times), len(raw)


# ------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: small sizes (seconds)")
    ap.add_argument("--pools", type=int, default=100)
    ap.add_argument("--slots-per-pool", type=int, default=100)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--queued-per-pool", type=int, default=10, help="waiters per pool during the churn")
    ap.add_argument("--steps", type=int, default=20000, help="churn steps per run")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-nominal", dest="nominal", action="store_false",
                    help="no Burstable nominals: the same preemption rights in both layouts")  # fmt: skip
    ap.add_argument("--leases", type=int, default=10_000, help="restore: leases in all")
    ap.add_argument("--queued", type=int, default=100_000, help="restore: queued in all")
    ap.add_argument("--restore-runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the many-pool churn")
    args = ap.parse_args()
    if args.quick:
        args.pools, args.slots_per_pool, args.steps, args.rounds = 10, 20, 500, 2
        args.leases, args.queued, args.restore_runs = 200, 2000, 1
    started = time.perf_counter()
    figures: dict[str, float] = {}
    figures.update(decision_rate(args))
    figures["memory_per_pool_kb"] = memory_per_pool_kb(args.pools, args.slots_per_pool, args.tenants)
    many_s, many_bytes = restore_s(args.pools, args.leases, args.queued, args.tenants, args.restore_runs)
    one_s, one_bytes = restore_s(1, args.leases, args.queued, args.tenants, args.restore_runs)
    figures.update(restore_100_pools_s=many_s, restore_1_pool_s=one_s,
                   state_bytes_100_pools=many_bytes, state_bytes_1_pool=one_bytes)  # fmt: skip
    if args.profile:
        print(profile_many(args))
    print(f"{'figure':<34} {'value':>14}")
    for k, v in figures.items():
        print(f"{k:<34} {v:>14,.3f}" if isinstance(v, float) else f"{k:<34} {v:>14,}")
    figures["seconds"] = time.perf_counter() - started
    fmt = {"restore_100_pools_s": ".3f", "restore_1_pool_s": ".3f", "memory_per_pool_kb": ".1f"}
    print(" ".join(
        f"{k}={v:{fmt.get(k, '.0f' if k.endswith(('_per_s', 'seconds')) else '.2f')}}"
        if isinstance(v, float) else f"{k}={v}"
        for k, v in figures.items()
    ))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
