"""What does the scheduler add to a gRPC call? Acquire->Granted against a no-op unary call.

Why this comparison: with a free slot, a grant should cost about one round trip; anything beyond
that is the scheduler's own overhead (auth, core decision, fan-out, proto building). Both servers
run the same way (grpc.aio, each in its own subprocess) and are driven from one client process
(and, for c128 below, from several):

* latency at concurrency 1 and 64: Acquire until the Granted event, vs one no-op unary call;
* throughput at concurrency 64: acquire+release pairs per second (Acquire, Granted, Release,
  Ended, status OK) vs no-op calls per second. A pair is two RPCs, so 0.5 is the ceiling.

With `--redis`, a fourth server runs slotsched with its Redis state store (`--state redis://`,
against a redis-server this script starts on a free port with `appendfsync always`): what making
every reply durable costs, side by side.

A third server, the "shape floor", serves the same Scheduler rpcs with no scheduler behind them
(Acquire yields a canned Granted, Release ends the stream): what grpc.aio itself costs for this
rpc shape. The distance from the floor is the scheduler's own overhead (auth, core, fan-out).

The pool (8 workers x 16 slots, floor 0, one tenant with a Burstable nominal of 128) always has a
free slot. Usage: `python bench/grpc_latency.py [--seconds S] [--iterations N] [--rounds K]
[--no-floor] [--pin] [--redis] [--clients N]`. The last line is `p50_ratio_c1=R pairs_per_s_c64=N
noop_calls_per_s_c64=N channel_pairs_ratio_c64=R channel_p50_ratio_c1=R channel_pairs_per_s_c64=N`,
followed with `--redis` by `redis_p50_ratio_c1=R redis_pairs_per_s_c64=N
redis_channel_p50_ratio_c1=R redis_channel_pairs_ratio_c64=R`, then (unless `--clients 0`) by
`channel_pairs_ratio_c128=R channel_pairs_per_s_c128=N noop_calls_per_s_c128=N
server_cpu_pct_channel=P server_cpu_pct_noop=P client_cpu_pct_max=P`.

c128, a load generator of several processes (`--clients N`, default 3): the figures above come
from this one client process, which can be the limit itself. In each round, after the blocks
above, N client processes each drive their share of 128 sessions over their own Channel to the
slotsched server (acquire+release pairs/s, summed), then N others the no-op server with the same
total concurrency (calls/s): `channel_pairs_ratio_c128` is the median of the first over the
median of the second. Over every block the CPU each process used (utime+stime from /proc, % of
one core) is taken: `server_cpu_pct_*` the server's (median over rounds), `client_cpu_pct_max`
the busiest client's in any block. A server near 100% while the clients have room is what is
measured; a client near 100% is a load generator that is the limit.

The channel shape ("channel", and "redis-channel" with `--redis`) drives the same server over one
open `Scheduler.Channel`: c1 = one session at a time, Acquire command until its Granted event;
c64 = 64 sessions on the one channel, each looping acquire, Granted, release, Ended, with the
commands that are ready written as one message and events dispatched by session id.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from procs import bench_policy, free_port, start_redis, stop_all  # noqa: E402

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc  # noqa: E402

TOKEN = "bench-token"
NOOP_METHOD = "/bench.Noop/Call"
POLICY = bench_policy(TOKEN)
_SERVE = (
    "import asyncio, sys\n"
    "from scheduler.serve import StateOptions, serve_forever\n"
    "state = StateOptions(state=sys.argv[2]) if len(sys.argv) > 2 else None\n"
    "sys.exit(asyncio.run(serve_forever(sys.argv[1], '127.0.0.1:0', None, state=state)))\n"
)


# ---------------------------------------------------------------- the no-op server (subprocess)


async def _noop(request: bytes, context: object) -> bytes:
    return b""


async def noop_server_main() -> None:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "bench.Noop", {"Call": grpc.unary_unary_rpc_method_handler(_noop)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"noop serving gRPC on 127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


class _ShapeFloor(scheduler_pb2_grpc.SchedulerServicer):
    """The Scheduler rpc shape with nothing behind it."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.seq = 0

    async def Acquire(self, request, context):  # type: ignore[no-untyped-def]
        # Written the cheapest way grpc.aio offers (context.write, a bare future), as the server is.
        self.seq += 1
        done = asyncio.get_running_loop().create_future()
        self.waiting[request.session_id] = done
        lease = common_pb2.Lease(lease_id=f"l{self.seq}", session_id=request.session_id, epoch=1)
        await context.write(scheduler_pb2.LeaseEvent(granted=scheduler_pb2.Granted(lease=lease)))
        await done
        await context.write(
            scheduler_pb2.LeaseEvent(ended=scheduler_pb2.Ended(reason=scheduler_pb2.END_REASON_RELEASED))
        )

    async def Release(self, request, context):  # type: ignore[no-untyped-def]
        self.waiting.pop(request.session_id).set_result(None)
        return scheduler_pb2.ReleaseResponse()


async def floor_server_main() -> None:
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(_ShapeFloor(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"floor serving gRPC on 127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


# ---------------------------------------------------------------- the client


def _spawn(args: list[str], cpus: set[int] | None = None) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    proc = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=pin
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "serving gRPC on" in line:
            return proc, line.rsplit(" ", 1)[1].strip()
    proc.kill()
    raise RuntimeError(f"{args} did not start")


class ChannelTarget:
    """The same pair over one open Scheduler.Channel: every session on one stream, commands
    written in batches (whatever is ready when the writer runs), events dispatched by session."""

    def __init__(self, address: str, prefix: str = "c") -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.prefix = prefix  # of session ids: each client process its own
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)  # type: ignore[no-untyped-call]
        self.md = (("authorization", f"Bearer {TOKEN}"),)
        self.seq = 0
        self.call: grpc.aio.StreamStreamCall | None = None
        self.pending: list[scheduler_pb2.ChannelCommand] = []
        self.ready = asyncio.Event()
        self.waiting: dict[str, asyncio.Future[scheduler_pb2.LeaseEvent]] = {}
        self.tasks: list[asyncio.Task[None]] = []

    async def _open(self) -> None:
        self.call = self.stub.Channel(metadata=self.md)
        self.tasks = [asyncio.create_task(self._writer()), asyncio.create_task(self._reader())]

    async def _writer(self) -> None:
        assert self.call is not None
        while True:
            await self.ready.wait()
            self.ready.clear()
            batch, self.pending = self.pending, []
            await self.call.write(scheduler_pb2.ChannelRequest(commands=batch))

    async def _reader(self) -> None:
        assert self.call is not None
        while True:
            resp = await self.call.read()
            if resp is grpc.aio.EOF:
                return
            for ev in resp.events:
                kind = ev.WhichOneof("kind")
                if kind == "event":
                    fut = self.waiting.pop(ev.session_id, None)
                    if fut is not None:
                        fut.set_result(ev.event)
                elif kind == "error":
                    fut = self.waiting.pop(ev.session_id, None)
                    if fut is not None:
                        fut.set_exception(RuntimeError(str(ev.error.status)))

    def _send(self, cmd: scheduler_pb2.ChannelCommand) -> asyncio.Future[scheduler_pb2.LeaseEvent]:
        fut = asyncio.get_running_loop().create_future()
        self.waiting[cmd.acquire.session_id or cmd.release.session_id] = fut
        self.pending.append(cmd)
        self.ready.set()
        return fut

    async def op(self) -> float:
        if self.call is None:
            await self._open()
        self.seq += 1
        sid = f"{self.prefix}{self.seq}"
        t0 = time.perf_counter()
        acquire = scheduler_pb2.AcquireRequest(session_id=sid, qos=common_pb2.QOS_CLASS_BURSTABLE)
        ev = await self._send(scheduler_pb2.ChannelCommand(ref=self.seq, acquire=acquire))
        latency = time.perf_counter() - t0
        lease = ev.granted.lease
        assert lease.lease_id, ev
        release = scheduler_pb2.ReleaseRequest(session_id=sid, lease_id=lease.lease_id, epoch=lease.epoch)
        ended = await self._send(scheduler_pb2.ChannelCommand(ref=self.seq, release=release))
        assert ended.HasField("ended"), ended
        return latency

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        if self.call is not None:
            self.call.cancel()
        await self.channel.close(None)

    async def sequential(self, n: int) -> list[float]:
        return [await self.op() for _ in range(n)]

    async def concurrent(self, workers: int, seconds: float) -> tuple[list[float], float]:
        return await Target.concurrent(self, workers, seconds)  # type: ignore[arg-type]


class Target:
    """One server, driven by one kind of operation: an acquire+release pair or a no-op call."""

    def __init__(self, address: str, kind: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.kind = kind
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)  # type: ignore[no-untyped-call]
        self.noop = self.channel.unary_unary(NOOP_METHOD)
        self.md = (("authorization", f"Bearer {TOKEN}"),)
        self.seq = 0

    async def op(self) -> float:
        """One operation; returns its latency (for a pair: Acquire until Granted)."""
        if self.kind == "noop":
            t0 = time.perf_counter()
            await self.noop(b"")
            return time.perf_counter() - t0
        self.seq += 1
        sid = f"s{self.seq}"
        t0 = time.perf_counter()
        call = self.stub.Acquire(
            scheduler_pb2.AcquireRequest(session_id=sid, qos=common_pb2.QOS_CLASS_BURSTABLE), metadata=self.md
        )
        ev = await call.read()
        latency = time.perf_counter() - t0
        lease = ev.granted.lease
        assert lease.lease_id, ev
        await self.stub.Release(
            scheduler_pb2.ReleaseRequest(session_id=sid, lease_id=lease.lease_id, epoch=lease.epoch),
            metadata=self.md,
        )
        ended = await call.read()
        assert ended.HasField("ended"), ended
        # The end of the stream is its status; waiting for it costs no extra read.
        assert await call.code() == grpc.StatusCode.OK
        return latency

    async def close(self) -> None:
        await self.channel.close(None)

    async def sequential(self, n: int) -> list[float]:
        return [await self.op() for _ in range(n)]

    async def concurrent(self, workers: int, seconds: float) -> tuple[list[float], float]:
        """`workers` loops for `seconds`; returns latencies and completed operations per second."""
        latencies: list[float] = []
        stop_at = time.perf_counter() + seconds

        async def loop() -> None:
            while time.perf_counter() < stop_at:
                latencies.append(await self.op())

        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(workers)))
        return latencies, len(latencies) / (time.perf_counter() - t0)


# ---------------------------------------------------------------- c128: several client processes


async def client_main(kind: str, address: str, sessions: int) -> None:
    """One load-generator process: `sessions` loops on its own Channel (kind "channel") or its
    own channel to the no-op server ("noop"); runs a block per `run S` line read, answers `done`."""
    t: Target | ChannelTarget = Target(address, kind)
    if kind == "channel":
        t = ChannelTarget(address, f"p{os.getpid()}-")
    await t.sequential(50)
    await t.concurrent(sessions, 0.3)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line.startswith("run "):
            break
        lat, rate = await t.concurrent(sessions, float(line.split()[1]))
        print(f"done {len(lat)} {rate:.1f}", flush=True)
    await t.close()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) so far, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ClientPool:
    """N client processes driving one server with `total` concurrency between them."""

    def __init__(self, kind: str, address: str, n: int, total: int) -> None:
        self.kind, self.address = kind, address
        self.shares = [total // n + (1 if i < total % n else 0) for i in range(n)]
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self) -> None:
        """Start the processes (each inherits this one's CPU affinity: `--pin` pins them too)."""
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        me = str(Path(__file__).resolve())
        for share in self.shares:
            args = [me, "--client", self.kind, self.address, str(share)]
            self.procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable, *args, cwd=ROOT, env=env, stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=None,
                )
            )  # fmt: skip
        for p in self.procs:
            await self._line(p, "ready", 60)

    @staticmethod
    async def _line(p: asyncio.subprocess.Process, word: str, timeout: float) -> str:
        assert p.stdout is not None
        line = (await asyncio.wait_for(p.stdout.readline(), timeout)).decode()
        if not line.startswith(word):
            raise RuntimeError(f"a bench client answered {line!r}, not {word!r}")
        return line

    async def block(self, seconds: float, server_pid: int) -> tuple[float, float, list[float]]:
        """One block of `seconds`: total ops/s, and the CPU % of one core the server and
        each client used over it."""
        pids = [server_pid] + [p.pid for p in self.procs]
        before = [cpu_seconds(pid) for pid in pids]
        t0 = time.perf_counter()
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(f"run {seconds}\n".encode())
            await p.stdin.drain()
        lines = [await self._line(p, "done", seconds + 30) for p in self.procs]
        wall = time.perf_counter() - t0
        cpu = [100.0 * (cpu_seconds(pid) - b) / wall for pid, b in zip(pids, before, strict=True)]
        return sum(float(line.split()[2]) for line in lines), cpu[0], cpu[1:]

    async def close(self) -> None:
        for p in self.procs:
            if p.stdin is not None and p.returncode is None:
                with contextlib.suppress(OSError):
                    p.stdin.write(b"quit\n")
                    p.stdin.close()
        for p in self.procs:
            try:
                await asyncio.wait_for(p.wait(), 10)
            except TimeoutError:
                p.kill()
                await p.wait()


def _pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


async def run(
    targets: dict[str, Target | ChannelTarget],
    iterations: int,
    seconds: float,
    rounds: int,
    pools: dict[str, tuple[ClientPool, int]],
) -> None:
    """Interleave short blocks of every target, so drift (other load, CPU frequency) hits all alike."""
    c1: dict[str, list[float]] = {name: [] for name in targets}
    c64: dict[str, list[float]] = {name: [] for name in targets}
    rates: dict[str, list[float]] = {name: [] for name in targets}
    c128: dict[str, list[float]] = {name: [] for name in pools}
    server_cpu: dict[str, list[float]] = {name: [] for name in pools}
    client_cpu: list[float] = []
    for t in targets.values():
        await t.sequential(300)  # warm up channels, caches, code paths
        await t.concurrent(64, 0.5)
    for k in range(rounds):
        for name, t in targets.items():
            c1[name] += await t.sequential(iterations // rounds)
        for name, t in targets.items():
            lat, rate = await t.concurrent(64, seconds / rounds)
            c64[name] += lat
            rates[name].append(rate)
        for name, (pool, server_pid) in pools.items():
            rate, server, clients = await pool.block(seconds / rounds, server_pid)
            c128[name].append(rate)
            server_cpu[name].append(server)
            client_cpu += clients
            shown = " ".join(f"{c:.0f}%" for c in clients)
            print(
                f"round {k + 1}/{rounds} c128 {name}: {rate:.0f}/s, cpu server {server:.0f}% clients {shown}"
            )
        print(
            f"round {k + 1}/{rounds} done: c64 " + " ".join(f"{n} {rates[n][-1]:.0f}/s" for n in targets),
            flush=True,
        )
    for t in targets.values():
        await t.close()

    ms = 1000.0
    names = list(targets)
    print(f"{'':16}" + "".join(f"{n:>18}" for n in names))
    rows = [
        ("c1 p50 (ms)", {n: _pct(c1[n], 50) * ms for n in names}),
        ("c1 p99 (ms)", {n: _pct(c1[n], 99) * ms for n in names}),
        ("c64 p50 (ms)", {n: _pct(c64[n], 50) * ms for n in names}),
        ("c64 p99 (ms)", {n: _pct(c64[n], 99) * ms for n in names}),
        ("c64 ops/s", {n: statistics.median(rates[n]) for n in names}),
    ]
    for label, values in rows:
        print(f"{label:16}" + "".join(f"{values[n]:>18.3f}" for n in names))
    print(
        "(slotsched, floor: latency = Acquire until Granted, ops = acquire+release pairs; noop: unary calls;"
        " *channel: the same pair over one open Scheduler.Channel, c64 = 64 sessions on it)"
    )
    p50_ratio = _pct(c1["slotsched"], 50) / _pct(c1["noop"], 50)
    pairs = statistics.median(rates["slotsched"])
    noop = statistics.median(rates["noop"])
    ch_p50 = _pct(c1["channel"], 50) / _pct(c1["noop"], 50)
    ch_pairs = statistics.median(rates["channel"])
    extra = ""
    if "redis" in targets:
        r_p50 = _pct(c1["redis"], 50) / _pct(c1["noop"], 50)
        r_pairs = statistics.median(rates["redis"])
        r_rate = r_pairs / noop
        rc_p50 = _pct(c1["redis-channel"], 50) / _pct(c1["noop"], 50)
        rc_rate = statistics.median(rates["redis-channel"]) / noop
        print(f"with the Redis state store: p50 ratio c1 {r_p50:.2f}, pairs/no-op calls c64 {r_rate:.2f}")
        print(f"  over the channel: p50 ratio c1 {rc_p50:.2f}, pairs/no-op calls c64 {rc_rate:.2f}")
        extra = (
            f" redis_p50_ratio_c1={r_p50:.2f} redis_pairs_per_s_c64={r_pairs:.0f}"
            f" redis_channel_p50_ratio_c1={rc_p50:.2f} redis_channel_pairs_ratio_c64={rc_rate:.2f}"
        )
    if "floor" in targets:
        floor_p50 = _pct(c1["floor"], 50) / _pct(c1["noop"], 50)
        floor_rate = statistics.median(rates["floor"]) / noop
        print(f"shape floor: p50 ratio c1 {floor_p50:.2f}, pairs/no-op calls c64 {floor_rate:.2f}")
    print(f"per-session: p50 ratio c1 {p50_ratio:.2f}; pairs/no-op calls c64 {pairs / noop:.2f}")
    print(
        f"channel targets: p50 ratio c1 {ch_p50:.2f} (<= 1.3); "
        f"pairs/no-op calls c64 {ch_pairs / noop:.2f} (>= 1.0)"
    )
    print(
        f"p50_ratio_c1={p50_ratio:.2f} pairs_per_s_c64={pairs:.0f} noop_calls_per_s_c64={noop:.0f}"
        f" channel_pairs_ratio_c64={ch_pairs / noop:.2f} channel_p50_ratio_c1={ch_p50:.2f}"
        f" channel_pairs_per_s_c64={ch_pairs:.0f}{extra}{_c128_keys(c128, server_cpu, client_cpu)}"
    )


def _c128_keys(rates: dict[str, list[float]], server: dict[str, list[float]], clients: list[float]) -> str:
    if not rates:
        return ""
    ch, noop = statistics.median(rates["channel"]), statistics.median(rates["noop"])
    cpu_ch, cpu_noop = statistics.median(server["channel"]), statistics.median(server["noop"])
    # What the server spent on one operation (CPU of all its threads): less noisy than the
    # rates on a machine shared with other work, since the server's share of it varies.
    us = {n: statistics.median(1e4 * c / r for r, c in zip(rates[n], server[n], strict=True)) for n in rates}
    print(
        f"c128 (several client processes): channel pairs/no-op calls {ch / noop:.2f} (>= 2.0);"
        f" server cpu {cpu_ch:.0f}% (channel), {cpu_noop:.0f}% (noop); busiest client {max(clients):.0f}%;"
        f" server cpu per op {us['channel']:.0f} us a pair, {us['noop']:.0f} us a no-op call"
        f" (ratio {us['noop'] / us['channel']:.2f})"
    )
    return (
        f" channel_pairs_ratio_c128={ch / noop:.2f} channel_pairs_per_s_c128={ch:.0f}"
        f" noop_calls_per_s_c128={noop:.0f} server_cpu_pct_channel={cpu_ch:.0f}"
        f" server_cpu_pct_noop={cpu_noop:.0f} client_cpu_pct_max={max(clients):.0f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=2000, help="sequential operations per server at c1")
    p.add_argument("--seconds", type=float, default=8.0, help="total duration of the c64 runs per server")
    p.add_argument("--rounds", type=int, default=8, help="interleaved blocks per measurement")
    p.add_argument("--no-floor", action="store_true", help="skip the shape-floor reference server")
    p.add_argument(
        "--redis",
        action="store_true",
        help="also run slotsched with its Redis state store (needs redis-server)",
    )
    p.add_argument(
        "--pin", action="store_true", help="client on the first CPU, servers on the others (less noise)"
    )
    p.add_argument(
        "--clients",
        type=int,
        default=3,
        help="client processes of the c128 blocks (0: none, only the single-client figures)",
    )
    p.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--noop-server", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--floor-server", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        asyncio.run(client_main(args.client[0], args.client[1], int(args.client[2])))
        return 0
    if args.noop_server:
        asyncio.run(noop_server_main())
        return 0
    if args.floor_server:
        asyncio.run(floor_server_main())
        return 0
    me = str(Path(__file__).resolve())
    server_cpus = None
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) >= 2:
            os.sched_setaffinity(0, {cpus[0]})
            server_cpus = set(cpus[1:])
    with tempfile.TemporaryDirectory(prefix="slotsched-bench-") as d:
        policy = Path(d) / "policy.yaml"
        policy.write_text(POLICY)
        procs: list[subprocess.Popen[str]] = []
        try:
            servers = {"slotsched": [sys.executable, "-c", _SERVE, str(policy)]}
            if args.redis:
                redis_port = free_port()
                procs.append(start_redis(redis_port, d))
                servers["redis"] = [
                    sys.executable,
                    "-c",
                    _SERVE,
                    str(policy),
                    f"redis://127.0.0.1:{redis_port}/0",
                ]
            if not args.no_floor:
                servers["floor"] = [sys.executable, me, "--floor-server"]
            servers["noop"] = [sys.executable, me, "--noop-server"]
            addresses, pids = {}, {}
            for name, cmd in servers.items():
                proc, addresses[name] = _spawn(cmd, server_cpus)
                procs.append(proc)
                pids[name] = proc.pid

            async def go() -> None:
                targets: dict[str, Target | ChannelTarget] = {}
                for n, a in addresses.items():
                    targets[n] = Target(a, "noop" if n == "noop" else "pair")
                    if n in ("slotsched", "redis"):
                        # The channel shape against the same server process.
                        targets["channel" if n == "slotsched" else "redis-channel"] = ChannelTarget(a)
                pools: dict[str, tuple[ClientPool, int]] = {}
                if args.clients > 0:  # c128: the channel and the no-op server, each from N processes
                    for n, kind in (("slotsched", "channel"), ("noop", "noop")):
                        pools[kind] = (ClientPool(kind, addresses[n], args.clients, 128), pids[n])
                try:
                    for pool, _ in pools.values():
                        await pool.start()
                    print(f"servers and {2 * args.clients} client processes up", flush=True)
                    await run(targets, args.iterations, args.seconds, args.rounds, pools)
                finally:
                    for pool, _ in pools.values():
                        await pool.close()

            asyncio.run(go())
        finally:
            stop_all(procs, 10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
