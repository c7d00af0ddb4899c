"""Per-pool leadership (issue 25): three `slotsched serve --leadership pool` replicas, 30 pools,
10,000 sessions spread over them; kill -9 one replica ten times; a fourth joins.

Processes, all on loopback: Redis (one server, AOF `appendfsync always`; with `--topology
cluster` a 3 x 2 Redis Cluster), three replica subprocesses on fixed ports with one grant key,
and this process driving raw gRPC (one Channel per pool to that pool's leader, found by
following NOT_LEADER as any client does). Every pool has 2 workers x 166 slots; 10,000
Burstable sessions over 30 pools fill them, so about 40 wait.

Measured:

* **pools_per_replica_max_over_min**: pools led per replica (health `slotsched.pool/<name>`
  on each replica), the busiest over the idlest, once the table has settled;
* per kill (a random replica leading pools, SIGKILL): **pool_failover_ms** for each of its
  pools, from the kill until a survivor answers a GetSession of a session in that pool; the
  killed replica is then restarted and rejoins (its share moves back to it: a hand-over);
* **other_pool_errors**: calls to the pools the killed replica did not lead (a prober per pool,
  every 20 ms, from the kill until its pools are back) that failed; and their latency p50
  against the same probers' p50 before the kill (**other_pool_p50_ratio**);
* after the kills, from every pool's leader: **leases_lost** (a session granted at the start
  whose lease id or epoch changed, or is gone), **double_grants** (a slot held by two
  sessions, or a session by two leases), **waiters_lost** (a session queued at the start that
  is neither queued nor granted);
* a fourth replica joins: **pools_moved_on_join** (pools whose leader changed; ≈ 30/4), with
  leases checked again;
* **decisions_per_s_1** and **decisions_per_s_3**: acquire+release pairs a second, over all
  pools at once, with one replica leading all 30 and with three (10 each), driven from this
  one process on the same two cores (its CPU share is printed): on this machine the figure shows
  that pools' decisions are independent (no pool waits on another's leader), not that two
  cores scale.

Usage: `python bench/pools_failover.py [--topology single|cluster|both] [--kills K]
[--sessions N] [--pools P] [--plot PNG] [--decide-s S]` (`--decide-s`: how long each
decision-rate phase runs, 5 s by default; the test's small run makes it short). Progress goes
to stderr; the last line is `key=value` pairs (a `_cluster` suffix for the Cluster run).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench.pools_procs import (  # noqa: E402
    ADMIN_MD,
    MD,
    B,
    Net,
    Replica,
    log,
    pools_policy,
    settled,
    trailers,
)
from bench.procs import free_port, start_redis, stop_all  # noqa: E402
from scheduler.api import wire  # noqa: E402
from scheduler.api.gen.slotsched.v1 import (  # noqa: E402
    admin_pb2,
    admin_pb2_grpc,
    scheduler_pb2,
)


async def fill(net: Net, pool: str, sids: list[str]) -> dict[str, tuple[str, str, int] | None]:
    """Acquire every session of the pool on one Channel to its leader: sid -> (lease id,
    slot, epoch) if granted, None if queued."""
    out: dict[str, tuple[str, str, int] | None] = {}
    call = net.sched(net.leader[pool]).Channel(metadata=MD)
    for i in range(0, len(sids), 100):
        cmds = [
            scheduler_pb2.ChannelCommand(
                acquire=scheduler_pb2.AcquireRequest(session_id=s, qos=B, pool=pool), ref=1
            )
            for s in sids[i : i + 100]
        ]
        await call.write(scheduler_pb2.ChannelRequest(commands=cmds))
    while len(out) < len(sids):
        resp = await call.read()
        if resp is grpc.aio.EOF:
            raise RuntimeError(f"pool {pool}: channel ended")
        for ev in resp.events:
            kind = ev.WhichOneof("kind")
            if kind == "error":
                raise RuntimeError(f"pool {pool} {ev.session_id}: {ev.error.status.message}")
            if kind != "event":
                continue
            what = ev.event.WhichOneof("event")
            if what == "granted":
                lease = ev.event.granted.lease
                out[ev.session_id] = (
                    lease.lease_id.split(".")[0],
                    f"{lease.slot.worker_id}/{lease.slot.index}",
                    lease.epoch,
                )
            elif what == "queued":
                out.setdefault(ev.session_id, None)
    await call.done_writing()
    call.cancel()
    return out


async def get_session(net: Net, address: str, sid: str) -> scheduler_pb2.SessionState:
    return await net.sched(address).GetSession(
        scheduler_pb2.GetSessionRequest(session_id=sid), metadata=MD, timeout=1
    )


async def failover_of(net: Net, pool: str, sid: str, survivors: list[str], t_kill: float) -> float:
    """ms from the kill until a survivor answers for the pool (following its NOT_LEADER)."""
    while True:
        for address in survivors:
            try:
                await get_session(net, address, sid)
                net.leader[pool] = address
                return (time.monotonic() - t_kill) * 1000
            except grpc.aio.AioRpcError as e:
                named = trailers(e).get("x-slotsched-leader")
                if named in survivors and named != address and trailers(e).get(wire.POOL) == pool:
                    try:
                        await get_session(net, named, sid)
                        net.leader[pool] = named
                        return (time.monotonic() - t_kill) * 1000
                    except grpc.aio.AioRpcError:
                        pass
        if time.monotonic() - t_kill > 30:
            return float("inf")
        await asyncio.sleep(0.01)


class Probers:
    """A GetSession every 20 ms to each given pool's leader: latencies and failures."""

    def __init__(self, net: Net, pools: dict[str, str]) -> None:
        self.net, self.pools = net, pools
        self.latencies: list[float] = []
        self.errors = 0
        self._stop = asyncio.Event()

    async def _one(self, pool: str, sid: str) -> None:
        address = self.net.leader[pool]
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                await get_session(self.net, address, sid)
                self.latencies.append((time.perf_counter() - t0) * 1000)
            except grpc.aio.AioRpcError as e:
                self.errors += 1
                log(f"  other pool {pool} at {address}: {e.code().name} {e.details()}")
            await asyncio.sleep(0.02)

    async def run_for(self, seconds: float) -> None:
        self._stop.clear()
        tasks = [asyncio.create_task(self._one(p, s)) for p, s in self.pools.items()]
        await asyncio.sleep(seconds)
        self._stop.set()
        await asyncio.gather(*tasks)

    def start(self) -> list[asyncio.Task[None]]:
        self._stop.clear()
        return [asyncio.create_task(self._one(p, s)) for p, s in self.pools.items()]

    async def stop(self, tasks: list[asyncio.Task[None]]) -> None:
        self._stop.set()
        await asyncio.gather(*tasks)


async def all_leases(net: Net, address: str) -> list[Any]:
    admin = admin_pb2_grpc.AdminStub(net.channel(address))
    out: list[Any] = []
    token = ""
    while True:
        resp = await admin.ListLeases(
            admin_pb2.ListLeasesRequest(page_size=1000, page_token=token), metadata=ADMIN_MD
        )
        out += list(resp.leases)
        token = resp.next_page_token
        if not token:
            return out


async def check_state(
    net: Net, pools: list[str], start: dict[str, tuple[str, str, int] | None], where: dict[str, str]
) -> tuple[int, int, int]:
    """(leases_lost, double_grants, waiters_lost) as every pool's leader tells them."""
    leases: list[Any] = []
    for address in sorted(set(net.leader.values())):
        mine = {p for p, a in net.leader.items() if a == address}
        leases += [lease for lease in await all_leases(net, address) if lease.pool in mine]
    by_session: dict[str, list[Any]] = {}
    slots: dict[str, int] = {}
    for lease in leases:
        by_session.setdefault(lease.session_id, []).append(lease)
        key = f"{lease.slot.worker_id}/{lease.slot.index}"
        slots[key] = slots.get(key, 0) + 1
    double = sum(n - 1 for n in slots.values() if n > 1) + sum(
        len(v) - 1 for v in by_session.values() if len(v) > 1
    )
    lost = 0
    waiters_lost = 0
    for sid, held in start.items():
        now = by_session.get(sid)
        if held is not None:
            if not now or (now[0].lease_id.split(".")[0], now[0].epoch) != (held[0], held[2]):
                lost += 1
        elif not now:  # queued at the start: must still wait (nothing left since) or be granted
            state = await get_session(net, net.leader[where[sid]], sid)
            if state.state != scheduler_pb2.SESSION_PHASE_QUEUED:
                waiters_lost += 1
    return lost, double, waiters_lost


async def pairs_per_s(net: Net, pools: list[str], seconds: float, tag: str) -> float:
    """Acquire+release pairs a second over every pool at once: per pool one Channel to its
    leader, 32 sessions in flight, each released as soon as it is granted."""
    done = 0
    stop = time.monotonic() + seconds

    async def pool_driver(pool: str) -> None:
        nonlocal done
        call = net.sched(net.leader[pool]).Channel(metadata=MD)
        n = 0

        def acquire(i: int) -> scheduler_pb2.ChannelCommand:
            return scheduler_pb2.ChannelCommand(
                acquire=scheduler_pb2.AcquireRequest(session_id=f"{tag}-{pool}-{i}", qos=B, pool=pool)
            )

        await call.write(scheduler_pb2.ChannelRequest(commands=[acquire(i) for i in range(32)]))
        n = 32
        while (left := stop - time.monotonic()) > 0:
            try:
                resp = await asyncio.wait_for(call.read(), left)
            except TimeoutError:
                break
            if resp is grpc.aio.EOF:
                return
            cmds = []
            for ev in resp.events:
                if ev.WhichOneof("kind") == "event" and ev.event.WhichOneof("event") == "granted":
                    lease = ev.event.granted.lease
                    rel = scheduler_pb2.ReleaseRequest(
                        session_id=ev.session_id, lease_id=lease.lease_id, epoch=lease.epoch
                    )
                    cmds.append(scheduler_pb2.ChannelCommand(release=rel))
                    cmds.append(acquire(n))
                    n += 1
                elif ev.WhichOneof("kind") == "released":
                    done += 1
            if cmds:
                await call.write(scheduler_pb2.ChannelRequest(commands=cmds))
        call.cancel()

    t0 = time.monotonic()
    await asyncio.gather(*(pool_driver(p) for p in pools), return_exceptions=True)
    return done / (time.monotonic() - t0)


async def decisions(
    net: Net,
    replicas: list[Replica],
    pools: list[str],
    figures: dict[str, float],
    root: str,
    state: str,
    seconds: float,
) -> None:
    """decisions_per_s_1 and _3 (module doc), on a fresh state (the bench's sessions fill the
    pools), each replica's and the driver's CPU beside."""
    for r in replicas:
        if r.proc is not None and r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()
    policy, keys = os.path.join(root, "policy.yaml"), os.path.join(root, "grant-keys")
    for n in (1, 3):
        live = [Replica(f"d{n}-{i}", root, policy, state, keys, prefix=f"decide{n}") for i in range(n)]
        replicas += live  # stopped with the others
        for r in live:
            r.spawn()
        await asyncio.gather(*(r.wait_listening() for r in live))
        await settled(net, live, pools)
        c0, s0 = _cpu_self(), [r.cpu_s() for r in live]
        figures[f"decisions_per_s_{n}"] = rate = await pairs_per_s(net, pools, seconds, f"d{n}")
        cpu = ", ".join(f"{r.name} {r.cpu_s() - s:.1f}" for r, s in zip(live, s0, strict=True))
        driver = _cpu_self() - c0
        log(f"{n} replica(s): {rate:.0f} pairs/s; CPU s in {seconds:g} s: driver {driver:.1f}, {cpu}")
        for r in live:
            assert r.proc is not None
            r.proc.kill()
            r.proc.wait()


def _cpu_self() -> float:
    t = os.times()
    return t.user + t.system


async def run(
    topology: str, args: argparse.Namespace, root: str
) -> tuple[dict[str, float], list[list[float]]]:
    pools = [f"p{i:02d}" for i in range(args.pools)]
    policy = os.path.join(root, "policy.yaml")
    Path(policy).write_text(pools_policy(pools))
    keys = os.path.join(root, "grant-keys")
    Path(keys).write_text(f"bench:{base64.b64encode(os.urandom(32)).decode()}\n")  # one key, every replica
    redis_procs: list[subprocess.Popen[str]] = []
    cluster: Any = None
    if topology == "single":
        rport = free_port()
        redis_procs.append(start_redis(rport, root))
        state = f"redis://127.0.0.1:{rport}/0"
    else:
        from tests.redis_topology import ClusterSet

        cluster = ClusterSet(root, 3, 2)
        await asyncio.to_thread(cluster.start)
        state = cluster.url()
    replicas = [Replica(f"r{i}", root, policy, state, keys) for i in range(3)]
    net = Net([r.target for r in replicas])
    figures: dict[str, float] = {}
    per_kill: list[list[float]] = []
    rng = random.Random(args.seed)
    try:
        for r in replicas:
            r.spawn()
        await asyncio.gather(*(r.wait_listening() for r in replicas))
        owner = await settled(net, replicas, pools)
        counts = [sum(1 for a in owner.values() if a == r.target) for r in replicas]
        figures["pools_per_replica_max_over_min"] = max(counts) / max(1, min(counts))
        log(f"{topology}: pools per replica {counts}")

        # 10,000 sessions over the pools, each acquired in its pool at its leader.
        where = {f"s{i}": pools[i % len(pools)] for i in range(args.sessions)}
        t0 = time.monotonic()
        start: dict[str, tuple[str, str, int] | None] = {}
        by_pool: dict[str, list[str]] = {p: [] for p in pools}
        for sid, p in where.items():
            by_pool[p].append(sid)

        async def fill_following(pool: str) -> dict[str, tuple[str, str, int] | None]:
            # A pool moved meanwhile (NOT_LEADER naming its leader): acquire again there; an
            # acquire of a live session re-attaches and tells its state, so nothing doubles.
            for _ in range(10):
                try:
                    return await fill(net, pool, by_pool[pool])
                except grpc.aio.AioRpcError as e:
                    named = trailers(e).get("x-slotsched-leader")
                    log(f"{topology}: {pool} moved while filling ({e.details()}): following")
                    if named:
                        net.leader[pool] = named
                    else:
                        await asyncio.sleep(0.2)
            raise RuntimeError(f"{pool}: could not fill")

        for got in await asyncio.gather(*(fill_following(p) for p in pools)):
            start.update(got)
        queued = sum(1 for v in start.values() if v is None)
        log(f"{topology}: {len(start) - queued} granted, {queued} queued in {time.monotonic() - t0:.1f} s")
        probe_sid = {p: by_pool[p][0] for p in pools}

        failovers: list[float] = []
        other_errors = 0
        quiet: list[float] = []
        loud: list[float] = []
        for k in range(args.kills):
            owner = await settled(net, replicas, pools)
            victim = rng.choice(replicas)
            theirs = [p for p, a in owner.items() if a == victim.target]
            others = {p: probe_sid[p] for p in pools if p not in theirs}
            survivors = [r.target for r in replicas if r is not victim]
            base = Probers(net, others)
            await base.run_for(1.0)
            quiet += base.latencies
            probers = Probers(net, others)
            tasks = probers.start()
            assert victim.proc is not None
            t_kill = time.monotonic()
            victim.proc.kill()
            victim.proc.wait()
            times = await asyncio.gather(
                *(failover_of(net, p, probe_sid[p], survivors, t_kill) for p in theirs)
            )
            await asyncio.sleep(0.5)
            await probers.stop(tasks)
            loud += probers.latencies
            other_errors += probers.errors + base.errors
            failovers += times
            per_kill.append(list(times))
            log(
                f"{topology} kill {k + 1}/{args.kills}: {victim.name} led {len(theirs)} pools, back in "
                f"{statistics.median(times):.0f} ms median, {max(times):.0f} max; other pools' errors "
                f"{probers.errors}"
            )
            victim.spawn()  # rejoins: its share moves back to it, handed over
            await victim.wait_listening()
        await settled(net, replicas, pools)
        lost, double, waiters = await check_state(net, pools, start, where)
        figures.update(
            pool_failover_ms_p50=statistics.median(failovers),
            pool_failover_ms_max=max(failovers),
            leases_lost=lost,
            double_grants=double,
            waiters_lost=waiters,
            other_pool_errors=other_errors,
            other_pool_p50_ratio=statistics.median(loud) / statistics.median(quiet),
        )

        # A fourth replica joins: about P/4 pools move to it, nothing lost.
        before = dict(net.leader)
        fourth = Replica("r3", root, policy, state, keys)
        replicas.append(fourth)
        fourth.spawn()
        await fourth.wait_listening()
        after = await settled(net, replicas, pools)
        figures["pools_moved_on_join"] = sum(1 for p in pools if before[p] != after[p])
        lost2, double2, waiters2 = await check_state(net, pools, start, where)
        figures["leases_lost_on_join"] = lost2 + double2 + waiters2
        log(f"{topology}: a fourth replica took {figures['pools_moved_on_join']:.0f} pools")

        if topology == "single":
            await decisions(net, replicas, pools, figures, root, state, args.decide_s)
    finally:
        await net.close()
        stop_all([r.proc for r in replicas if r.proc is not None and r.proc.poll() is None], grace_s=5)
        for proc in redis_procs:
            proc.kill()
        if cluster is not None:
            cluster.close()
    return figures, per_kill


def plot(path: str, runs: dict[str, list[list[float]]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot")
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    for (name, kills), marker in zip(runs.items(), "os", strict=False):
        xs = [k + 1 + (0.15 if marker == "s" else -0.15) for k, times in enumerate(kills) for _ in times]
        ys = [t for times in kills for t in times]
        ax.scatter(xs, ys, marker=marker, label=f"Redis {name}", alpha=0.7)
    ax.axhline(2000, color="red", linestyle="--", label="bar: 2,000 ms")
    ax.set_xlabel("kill -9 of one replica (each dot: one of the pools it led)")
    ax.set_ylabel("ms until a survivor serves the pool")
    ax.set_title("Per-pool failover: 3 replicas, 30 pools, 10,000 sessions")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topology", choices=("single", "cluster", "both"), default="both")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--pools", type=int, default=30)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--plot", default=None, metavar="PNG")
    ap.add_argument(
        "--decide-s", type=float, default=5.0, help="seconds each decision-rate phase runs (default 5)"
    )
    args = ap.parse_args()
    out: dict[str, float] = {}
    kills: dict[str, list[list[float]]] = {}
    for topology in ("single", "cluster") if args.topology == "both" else (args.topology,):
        with tempfile.TemporaryDirectory(prefix=f"slotsched-pools-{topology}-") as root:
            figures, kills[topology] = asyncio.run(run(topology, args, root))
        suffix = "" if topology == "single" else "_cluster"
        out.update({f"{k}{suffix}": v for k, v in figures.items()})
    if args.plot:
        plot(args.plot, kills)
    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
