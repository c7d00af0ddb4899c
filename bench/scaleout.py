"""Scale-out by CPU time: what 1, 2 and 3 `slotsched serve --leadership pool` replicas on one Redis
cost per operation, by process, and the capacity those costs imply for N replicas of one core.

This machine has 2 cores shared with other jobs, so throughput cannot show scaling; CPU seconds
spent by each process per operation can. Processes: one redis-server on a free port (AOF,
`appendfsync always`, as deploy/ runs it), N replica subprocesses (a fresh state prefix per N),
and the load generator in its own process (`--load`, this script again), so the driver's CPU is
not any replica's.

Per N (30 pools, 2 workers x 166 slots each):

* **idle baseline**: each replica's CPU over `--idle` seconds with no traffic (share of a core);
* **pairs**: acquire+release pairs on the pools one replica (A) leads only, 32 in flight per
  pool; A's CPU beyond its baseline per pair is the leader's cost, every other replica's the
  follower's (`follow_us_per_pair` summed over them, and per following replica);
* **renewals**: `--renew-sessions` held sessions per pool of A, renewed in a loop: the same split.

Then a memory-mode server (`serve` without `--state`, the same policy) takes the same renewals:
`durable_renew_ratio` is the leader's CPU per renewal on Redis over the in-memory one.

Capacity, pairs/s for N replicas of one core each:
`N x (1 - baseline) / (lead + followers(N) x follow)`, with `follow` the cost one following
replica pays for a pair (the followers' sum at N = 3 over how many follow one pool: one of A's
pools loaded alone, the replicas that work for it counted) and `followers(N)` what that count
shows: N - 1 if every other replica follows every pool, 1 if only its successor does.
The baseline for N > 3 is the one at N = 3.

With N = 3, failures, against the sessions held by the renewal phase: the replica leading most
pools is killed (SIGKILL): `pool_failover_ms_max`, until a survivor answers a GetSession in each of
its pools; it rejoins; then a pool's leader and its successor (the owners table) together:
`double_failure_ms_max`. `leases_lost`: held sessions whose lease id or epoch changed.

The SDK (`bench/scaleout_sdk.py`): the multiplexed SDK against the raw Channel from one load
generator process, against a memory-mode server: `sdk_channel_pairs_ratio_c64` (pairs/s at 64
sessions, measured; `_one_core`: projected from the CPU per pair with a core per process) and
`sdk_p50_ratio_c1` (Acquire -> Granted p50 through the SDK over a no-op call's).

Holding (`bench/scaleout_hold.py`): one replica holding `--hold-sessions` K sessions through the
SDK at the default TTL, in memory mode and with Redis: the server's share of a core
(`hold_cpu_share_memory`, `hold_cpu_share_redis`), sessions one core holds
(`sessions_per_core_*`) and the share 100,000 would take (`hold_cpu_share_100k_*`).

Usage: `python bench/scaleout.py [--pools P] [--idle S] [--seconds S] [--renew-sessions K]
[--replicas 1,2,3] [--no-failures] [--sdk-seconds S] [--sdk-rounds R] [--no-sdk]
[--hold-sessions K] [--hold-seconds S] [--no-hold]`. Progress on stderr; the last line is
`key=value` pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
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

from bench import scaleout_hold, scaleout_sdk  # noqa: E402
from bench.pools_failover import failover_of, get_session  # noqa: E402
from bench.pools_procs import MD, B, Net, Replica, pools_policy, settled  # noqa: E402
from bench.procs import free_port, start_redis, stop_all  # noqa: E402
from scheduler.api.gen.slotsched.v1 import scheduler_pb2  # noqa: E402

#: The last line's keys after the issue's: the SDK phase's projection, and the holding phase's.
HOLD_KEYS = (
    "sdk_channel_pairs_ratio_c64_one_core",
    "sessions_held",
    "hold_cpu_share_memory",
    "hold_cpu_share_redis",
    "sessions_per_core_memory",
    "sessions_per_core_redis",
    "hold_cpu_share_100k_memory",
    "hold_cpu_share_100k_redis",
    "hold_renewal_pace",
    "hold_leases_lost",
)


def log(msg: str) -> None:
    print(f"[scaleout] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the load generator (a child)


def _acquire(sid: str, pool: str) -> scheduler_pb2.ChannelCommand:
    return scheduler_pb2.ChannelCommand(
        acquire=scheduler_pb2.AcquireRequest(session_id=sid, qos=B, pool=pool)
    )


async def _pairs(net: Net, pool: str, address: str, seconds: float, tag: str) -> int:
    done = n = 0
    stop = time.monotonic() + seconds
    call = net.sched(address).Channel(metadata=MD)
    await call.write(
        scheduler_pb2.ChannelRequest(commands=[_acquire(f"{tag}-{pool}-{i}", pool) for i in range(32)])
    )
    n = 32
    while (left := stop - time.monotonic()) > 0:
        try:
            resp = await asyncio.wait_for(call.read(), left)
        except TimeoutError:
            break
        if resp is grpc.aio.EOF:
            break
        cmds = []
        for ev in resp.events:
            kind = ev.WhichOneof("kind")
            if kind == "event" and ev.event.WhichOneof("event") == "granted":
                lease = ev.event.granted.lease
                rel = scheduler_pb2.ReleaseRequest(
                    session_id=ev.session_id, lease_id=lease.lease_id, epoch=lease.epoch
                )
                cmds += [scheduler_pb2.ChannelCommand(release=rel), _acquire(f"{tag}-{pool}-{n}", pool)]
                n += 1
            elif kind == "released":
                done += 1
        if cmds:
            await call.write(scheduler_pb2.ChannelRequest(commands=cmds))
    call.cancel()
    return done


async def _renewals(
    net: Net, pool: str, address: str, seconds: float, k: int, tag: str
) -> tuple[int, dict[str, Any]]:
    """Acquire k sessions (held), then renew them all, k at a time, for `seconds`."""
    call = net.sched(address).Channel(metadata=MD)
    sids = [f"{tag}-{pool}-{i}" for i in range(k)]
    await call.write(scheduler_pb2.ChannelRequest(commands=[_acquire(s, pool) for s in sids]))
    held: dict[str, Any] = {}
    while len(held) < k:
        resp = await call.read()
        if resp is grpc.aio.EOF:
            raise RuntimeError(f"{pool}: channel ended while acquiring")
        for ev in resp.events:
            if ev.WhichOneof("kind") == "event" and ev.event.WhichOneof("event") == "granted":
                lease = ev.event.granted.lease
                held[ev.session_id] = [pool, lease.lease_id, lease.epoch]
    renews = [
        scheduler_pb2.ChannelCommand(
            ref=i + 1, renew=scheduler_pb2.RenewRequest(session_id=s, lease_id=held[s][1], epoch=held[s][2])
        )
        for i, s in enumerate(sids)
    ]
    done = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        await call.write(scheduler_pb2.ChannelRequest(commands=renews))
        got = 0
        while got < k:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                raise RuntimeError(f"{pool}: channel ended while renewing")
            for ev in resp.events:
                if ev.WhichOneof("kind") == "renewed":
                    got += 1
                elif ev.WhichOneof("kind") == "error":
                    raise RuntimeError(f"{pool} {ev.session_id}: {ev.error.status.message}")
        done += k
    await call.done_writing()
    call.cancel()
    return done, held


async def _counted(work: Any, empty: Any) -> Any:
    """A pool whose leader moves mid-run (a loaded machine can lapse a membership) ends its own
    part: the others go on, and the run says how many pools failed."""
    try:
        return await work
    except (grpc.aio.AioRpcError, RuntimeError) as e:
        print(f"[scaleout load] a pool failed: {str(e).splitlines()[0][:200]}", file=sys.stderr, flush=True)
        return empty


async def load_main(args: argparse.Namespace) -> None:
    targets = dict(t.split("=", 1) for t in args.targets.split(","))
    net = Net(sorted(set(targets.values())))
    t0 = time.monotonic()
    out: dict[str, Any] = {}
    try:
        if args.load == "pairs":
            got = await asyncio.gather(
                *(_counted(_pairs(net, p, a, args.seconds, args.tag), 0) for p, a in targets.items())
            )
            out = {"ops": sum(got)}
        else:
            both = await asyncio.gather(
                *(
                    _counted(_renewals(net, p, a, args.seconds, args.renew_sessions, args.tag), (0, {}))
                    for p, a in targets.items()
                )
            )
            out = {"ops": sum(n for n, _ in both), "held": {s: v for _, h in both for s, v in h.items()}}
    finally:
        await net.close()
    out["seconds"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)


# ---------------------------------------------------------------- the driver


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(kind: str, targets: dict[str, str], seconds: float, k: int, tag: str) -> dict[str, Any]:
    spec = ",".join(f"{p}={a}" for p, a in targets.items())
    cmd = [sys.executable, str(Path(__file__)), "--load", kind, "--targets", spec, "--seconds", str(seconds),
           "--renew-sessions", str(k), "--tag", tag]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr[-2000:]}")
    failed = [line for line in done.stderr.splitlines() if "a pool failed" in line]
    for line in failed[:5]:
        log(f"{kind}: {line}")
    if failed:  # a loaded machine lapsed a membership and pools moved: the figure is weaker
        log(f"{kind}: {len(failed)} of {len(targets)} pools failed mid-run")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def measure(pids: dict[str, int], fn: Any) -> tuple[dict[str, float], float, Any]:
    """CPU seconds each pid spent while `fn()` ran, the wall seconds, and fn's result."""
    c0 = {n: cpu_of(p) for n, p in pids.items()}
    t0 = time.monotonic()
    result = fn()
    wall = time.monotonic() - t0
    return {n: cpu_of(p) - c0[n] for n, p in pids.items()}, wall, result


def split(
    cpu: dict[str, float], wall: float, base: dict[str, float], leader: str, ops: int
) -> tuple[float, float, dict[str, float]]:
    """(lead µs/op, follow µs/op summed over the others, each other's µs/op), baseline removed."""
    extra = {n: max(0.0, c - base[n] * wall) * 1e6 / max(1, ops) for n, c in cpu.items()}
    others = {n: v for n, v in extra.items() if n != leader}
    return extra[leader], sum(others.values()), others


async def one_n(
    n: int,
    args: argparse.Namespace,
    root: str,
    state: str,
    pools: list[str],
    fig: dict[str, Any],
    running: list[Replica],
) -> dict[str, Any]:
    policy, keys = os.path.join(root, "policy.yaml"), os.path.join(root, "grant-keys")
    reps = [Replica(f"n{n}r{i}", root, policy, state, keys, prefix=f"scale{n}") for i in range(n)]
    net = Net([r.target for r in reps])
    out: dict[str, Any] = {"replicas": reps, "net": net, "state": state, "prefix": f"scale{n}"}
    running += reps  # stopped by the caller whatever happens
    for r in reps:
        r.spawn()
    await asyncio.gather(*(r.wait_listening() for r in reps))
    owner = await settled(net, reps, pools, timeout_s=60)
    await asyncio.sleep(2.0)  # past the start-up's loads
    pids = {r.name: r.proc.pid for r in reps if r.proc is not None}
    cpu, wall, _ = measure(pids, lambda: time.sleep(args.idle))
    base = {name: c / wall for name, c in cpu.items()}
    fig[f"idle_core_share_n{n}"] = max(base.values())
    log(f"n={n}: idle core share per replica {', '.join(f'{k} {v:.3f}' for k, v in base.items())}")
    lead = reps[0]
    mine = {p: a for p, a in owner.items() if a == lead.target}
    cpu, wall, res = measure(pids, lambda: run_load("pairs", mine, args.seconds, 0, f"p{n}"))
    lp, fp, each = split(cpu, wall, base, lead.name, res["ops"])
    fig[f"lead_us_per_pair_n{n}"], fig[f"follow_us_per_pair_n{n}"] = lp, fp
    log(f"n={n}: {res['ops']} pairs on {len(mine)} pools of {lead.name}: lead {lp:.0f} µs/pair, "
        f"follow {fp:.0f} µs/pair ({', '.join(f'{k} {v:.0f}' for k, v in each.items())})")  # fmt: skip
    cpu, wall, res = measure(
        pids, lambda: run_load("renew", mine, args.seconds, args.renew_sessions, f"h{n}")
    )
    lr, fr, each = split(cpu, wall, base, lead.name, res["ops"])
    fig[f"lead_us_per_renew_n{n}"], fig[f"follow_us_per_renew_n{n}"] = lr, fr
    log(f"n={n}: {res['ops']} renewals: lead {lr:.0f} µs/renewal, follow {fr:.0f} µs/renewal "
        f"({', '.join(f'{k} {v:.0f}' for k, v in each.items())})")  # fmt: skip
    out["held"] = res["held"]
    out["owner"] = owner
    if n >= 3:  # how many replicas follow one pool: load one of A's pools alone, count who works
        one = dict([next(iter(mine.items()))])
        cpu, wall, res = measure(pids, lambda: run_load("pairs", one, args.seconds / 2, 0, f"o{n}"))
        _, _, each = split(cpu, wall, base, lead.name, res["ops"])
        top = max(each.values(), default=0.0)
        fig[f"followers_per_pool_n{n}"] = sum(1 for v in each.values() if v > 0.3 * top and v > 5)
        log(
            f"n={n}: one pool loaded, its followers (µs/pair): "
            + ", ".join(f"{k} {v:.0f}" for k, v in each.items())
        )
    return out


async def memory_renewals(args: argparse.Namespace, root: str, pools: list[str], fig: dict[str, Any]) -> None:
    policy, keys = os.path.join(root, "policy.yaml"), os.path.join(root, "grant-keys")
    port = free_port()
    target = f"127.0.0.1:{port}"
    out = open(os.path.join(root, "memory.log"), "a")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "serve", "--policy", policy, "--listen", target,
         "--metrics-listen", "", "--grant-key-file", keys],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out, stderr=out, text=True,
    )  # fmt: skip
    try:
        net = Net([target])
        deadline = time.monotonic() + 60
        while True:
            try:
                await get_session(net, target, "nobody")
                break
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the memory-mode server did not start") from e
                await asyncio.sleep(0.1)
        await net.close()
        await asyncio.sleep(1.0)
        pids = {"memory": proc.pid}
        cpu, wall, _ = measure(pids, lambda: time.sleep(args.idle))
        base = {"memory": cpu["memory"] / wall}
        some = {p: target for p in pools[: max(1, len(pools) // 3)]}
        cpu, wall, res = measure(
            pids, lambda: run_load("renew", some, args.seconds, args.renew_sessions, "m")
        )
        fig["memory_us_per_renew"] = split(cpu, wall, base, "memory", res["ops"])[0]
        cpu, wall, res = measure(pids, lambda: run_load("pairs", some, args.seconds, 0, "mp"))
        fig["memory_us_per_pair"] = split(cpu, wall, base, "memory", res["ops"])[0]
        log(
            f"memory mode: {fig['memory_us_per_renew']:.0f} µs/renewal, "
            f"{fig['memory_us_per_pair']:.0f} µs/pair"
        )
    finally:
        stop_all([proc], grace_s=5)
        out.close()


async def failures(run: dict[str, Any], pools: list[str], fig: dict[str, Any]) -> None:
    """N = 3: one replica killed, then a pool's leader and successor together (module doc)."""
    reps: list[Replica] = run["replicas"]
    net: Net = run["net"]
    held: dict[str, Any] = run["held"]
    probe = {}
    for sid, (pool, _, _) in held.items():
        probe.setdefault(pool, sid)
    if not probe:  # the renewal phase held nothing (its pools failed): nothing to check
        log("failures: no held session to probe with: failover figures na")
        return
    worst: list[float] = []
    doubles: list[float] = []
    for kind in ("single", "double"):
        owner = await settled(net, reps, pools, timeout_s=60)
        by_name = {r.target: r for r in reps}
        if kind == "single":
            victims = [max(reps, key=lambda r: sum(1 for a in owner.values() if a == r.target))]
        else:  # a probed pool's leader and its successor, as the owners table names them
            pool = next(iter(probe))
            successor = await successor_of(run["state"], run["prefix"], pool)
            victims = [by_name[owner[pool]], *(r for r in reps if r.name == successor)]
            assert len(victims) == 2, (pool, successor)
        names = {v.target for v in victims}
        theirs = [p for p, a in owner.items() if a in names and p in probe]
        survivors = [r.target for r in reps if r.target not in names]
        t_kill = time.monotonic()
        for v in victims:
            assert v.proc is not None
            v.proc.kill()
        for v in victims:
            assert v.proc is not None
            v.proc.wait()
        times = await asyncio.gather(*(failover_of(net, p, probe[p], survivors, t_kill) for p in theirs))
        (worst if kind == "single" else doubles).extend(times)
        log(
            f"{kind} failure of {[v.name for v in victims]}: {len(theirs)} pools back "
            f"in max {max(times):.0f} ms"
        )
        for v in victims:
            v.spawn()
        await asyncio.gather(*(v.wait_listening() for v in victims))
    owner = await settled(net, reps, pools, timeout_s=60)
    lost = 0
    for sid, (pool, lease_id, epoch) in held.items():
        try:
            st = await get_session(net, owner[pool], sid)
            if st.lease.lease_id.split(".")[0] != lease_id.split(".")[0] or st.lease.epoch != epoch:
                lost += 1
        except grpc.aio.AioRpcError:
            lost += 1
    fig["pool_failover_ms_max"] = max(worst)
    fig["double_failure_ms_max"] = max(doubles)
    fig["leases_lost"] = lost


async def successor_of(state: str, prefix: str, pool: str) -> str | None:
    """The pool's successor in the owners table (ownership.py: `NEXT` + pool)."""
    from scheduler.state.ownership import NEXT
    from scheduler.state.redis_members import RedisMembers

    members = RedisMembers(state, prefix)
    try:
        _, table = await members.owners()
    finally:
        await members.close()
    return table.get(NEXT + pool)


def capacity(fig: dict[str, Any], ns: list[int]) -> None:
    lead = fig[f"lead_us_per_pair_n{ns[0]}"]  # one replica: all it does for a pair is lead it
    top = max(ns)
    # What following a pair costs all followers together at N = top, and per follower.
    follow_all = fig.get(f"follow_us_per_pair_n{top}", 0.0)
    k = fig.get(f"followers_per_pool_n{top}", top - 1)
    every = k > 1  # every other replica follows every pool (else: only its successor)
    follow_one = follow_all / max(1, k)

    def base(n: int) -> float:
        return float(fig[f"idle_core_share_n{min(n, top)}"])

    cap = {}
    for n in range(1, 9):
        followers = 0 if n == 1 else (n - 1 if every else 1)
        cap[n] = n * (1 - base(n)) / ((lead + followers * follow_one) / 1e6)
    log("capacity, pairs/s, N replicas of one core: " + ", ".join(f"N={n} {c:.0f}" for n, c in cap.items()))
    fig["capacity_pairs_per_s_n1"] = cap[1]
    fig["capacity_ratio_n4"] = cap[4] / cap[1]
    fig["capacity_ratio_n8"] = cap[8] / cap[1]


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    ns = [int(x) for x in args.replicas.split(",")]
    pools = [f"p{i:02d}" for i in range(args.pools)]
    fig: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="slotsched-scaleout-") as root:
        Path(root, "policy.yaml").write_text(pools_policy(pools))
        Path(root, "grant-keys").write_text(f"bench:{base64.b64encode(os.urandom(32)).decode()}\n")
        rport = free_port()
        redis = start_redis(rport, root)
        state = f"redis://127.0.0.1:{rport}/0"
        running: list[Replica] = []
        try:
            last: dict[str, Any] = {}
            for n in ns:
                last = await one_n(n, args, root, state, pools, fig, running)
                if n != max(ns):
                    stop_all([r.proc for r in last["replicas"] if r.proc is not None], grace_s=5)
                    await last["net"].close()
            fig["redis_cpu_s"] = cpu_of(redis.pid)
            await memory_renewals(args, root, pools, fig)
            if max(ns) >= 3 and not args.no_failures:
                await failures(last, pools, fig)
            await last["net"].close()
        finally:
            stop_all([r.proc for r in running if r.proc is not None and r.proc.poll() is None], grace_s=5)
            redis.kill()
    capacity(fig, ns)
    top = max(ns)
    fig["idle_baseline_core_share"] = fig[f"idle_core_share_n{top}"]
    durable = statistics.median(fig[f"lead_us_per_renew_n{n}"] for n in ns)
    fig["durable_renew_ratio"] = durable / max(1e-9, fig["memory_us_per_renew"])
    return fig


async def drive_all(args: argparse.Namespace) -> dict[str, Any]:
    fig: dict[str, Any] = await drive(args) if args.replicas else {}
    with tempfile.TemporaryDirectory(prefix="slotsched-scaleout-sdk-") as root:
        if not args.no_sdk:
            fig |= await asyncio.to_thread(scaleout_sdk.sdk_phase, args, root, str(Path(__file__)))
        if not args.no_hold:
            fig |= await asyncio.to_thread(scaleout_hold.hold_phase, args, root, str(Path(__file__)))
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pools", type=int, default=30)
    ap.add_argument("--idle", type=float, default=6.0)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--renew-sessions", type=int, default=50)
    ap.add_argument("--replicas", default="1,2,3")
    ap.add_argument("--no-failures", action="store_true")
    ap.add_argument("--sdk-seconds", type=float, default=12.0, help="c64 seconds, SDK and Channel together")
    ap.add_argument("--sdk-rounds", type=int, default=6, help="interleaved blocks of the SDK phase")
    ap.add_argument("--sdk-iterations", type=int, default=300, help="c1 operations per target per block")
    ap.add_argument("--no-sdk", action="store_true")
    ap.add_argument("--hold-sessions", type=int, default=5000, help="sessions one replica holds")
    ap.add_argument("--hold-seconds", type=float, default=20.0, help="measured while holding them")
    ap.add_argument(
        "--hold-settle-seconds", type=float, default=10.0, help="waited before measuring (a renewal period)"
    )
    ap.add_argument("--hold-modes", default="memory,redis", help="of the holding phase: memory, redis")
    ap.add_argument("--no-hold", action="store_true")
    ap.add_argument("--load", choices=("pairs", "renew", "sdk", "hold"), help=argparse.SUPPRESS)
    ap.add_argument("--server-pid", help=argparse.SUPPRESS)
    ap.add_argument("--iterations", type=int, default=300, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=6, help=argparse.SUPPRESS)
    ap.add_argument("--targets", help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="x", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load in ("sdk", "hold"):
        asyncio.run(scaleout_sdk.load_sdk(args) if args.load == "sdk" else scaleout_hold.load_hold(args))
        return
    if args.load:
        asyncio.run(load_main(args))
        return
    fig = asyncio.run(drive_all(args))
    for k, v in fig.items():
        log(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}")
    last = {
        k: fig.get(k, "na") for k in ("capacity_ratio_n4", "idle_baseline_core_share", "durable_renew_ratio")
    }
    last |= {k: fig.get(k, "na") for k in ("sdk_channel_pairs_ratio_c64", "sdk_p50_ratio_c1")}
    last |= {k: fig.get(k, "na") for k in ("pool_failover_ms_max", "double_failure_ms_max", "leases_lost")}
    last |= {k: fig.get(k, "na") for k in HOLD_KEYS}
    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in last.items()))


if __name__ == "__main__":
    main()
