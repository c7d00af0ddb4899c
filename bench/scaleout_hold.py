"""bench/scaleout.py's holding phase: one replica holding K sessions at the default lease TTL
(30 s; the SDK renews each lease every TTL/3), in memory mode and with Redis, and what share of a
core that takes, by process.

Processes: the server (`serve` in memory mode, then `serve --state redis://` against a
redis-server with AOF and `appendfsync always`, as deploy/ runs it), and the load generator in its
own process (`scaleout.py --load hold`): one `AsyncClient` that opens K sessions (`start()`, each
held until the end, renewed by the SDK itself; the client spreads them over channels of 10,000)
and reports when all are granted. Then over `--hold-seconds` (whole renewal periods) the CPU each
process spends is read from /proc: the server's share of a core is what is measured; the
generator's and Redis's are shown beside it (the generator is not what is measured, but a
generator short of CPU renews late, and `hold_leases_lost` says whether any lease was lost).

Figures, per mode: `hold_cpu_share_<mode>` (the server's share of one core holding K), its idle
share before any session, the renewals a second made and their pace (over the K x 3 / TTL due: a
generator short of CPU renews late and shows below 1), the server's CPU per renewal made,
`sessions_per_core_<mode>` = TTL / 3 / (CPU per renewal) (what one core holds at the default TTL,
renewals only), and `hold_cpu_share_100k_<mode>` = idle + 100,000 x 3 / TTL x (CPU per renewal),
the extrapolation when K < 100,000 (the cost is per renewal: linear in K).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from bench.procs import free_port, start_redis, stop_all  # noqa: E402
from scheduler.client.aio import AsyncClient, AsyncSession  # noqa: E402
from scheduler.client.renewer import Renewer  # noqa: E402
from scheduler.policy.identities import hash_token  # noqa: E402

TOKEN = "hold-token"
#: The default lease TTL (policy `timing.leaseTTLSeconds`): the SDK renews every third of it.
TTL_S = 30.0
SLOTS_PER_WORKER = 1000
_SERVE = (
    "import asyncio, sys\n"
    "from scheduler.serve import StateOptions, serve_forever\n"
    "state = StateOptions(state=sys.argv[2]) if sys.argv[2] else None\n"
    "sys.exit(asyncio.run(serve_forever(sys.argv[1], sys.argv[3], None, state=state)))\n"
)


def log(msg: str) -> None:
    print(f"[scaleout hold] {msg}", file=sys.stderr, flush=True)


def hold_policy(k: int) -> str:
    """One tenant that may hold k Burstable leases, on enough slots; the default lease TTL."""
    workers = k // SLOTS_PER_WORKER + 1
    return (
        "apiVersion: slotsched.dev/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: hold}\nspec:\n"
        f"  pool: {{slotsPerWorker: {SLOTS_PER_WORKER}, workers: {workers}, minWorkers: 1, "
        f"maxWorkers: {workers}, floor: 0}}\n"
        "  tenants:\n    - name: hold\n"
        f"      burstable: {{nominal: {k}, limit: {k}}}\n"
        f'      tokens: ["{hash_token(TOKEN)}"]\n'
    )


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the load generator (a child)


async def load_hold(args: argparse.Namespace) -> None:
    """Open K sessions, say `held`, then answer each `mark` line on stdin with the renewals seen
    and the leases lost so far (the driver kills it after the last)."""
    k = args.hold_sessions
    renewals = [0]
    # A Redis leader that misses a journal append's deadline steps down and comes back: the
    # sessions wait for it rather than fail (the connect deadline is for a wrong address).
    async with AsyncClient(args.targets, token=TOKEN, connect_timeout_s=120.0) as client:
        sessions: list[AsyncSession] = []
        t0 = time.monotonic()
        for i in range(k):
            s = client.session(f"hold-{i}")
            s.start()
            sessions.append(s)
            if i % 5000 == 4999:
                print(
                    f"[scaleout hold] {i + 1} sessions opened in {time.monotonic() - t0:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
                # The objects of the sessions held so far live as long as the run: out of the
                # collector's sight, or each full collection walks millions of them (a stall of
                # seconds, read by the channel's silence bound as a frozen server).
                gc.freeze()
            if i % 128 == 127:  # at most about 256 acquires in flight: a burst, not a flood
                while sum(1 for x in sessions[-256:] if x.lease is None) > 128:
                    await asyncio.sleep(0.005)
        for s in sessions:
            # A generator short of CPU may renew too late and see a lease expire: counted as
            # lost below (`mark`), not a crash.
            with contextlib.suppress(Exception):
                await s.wait_granted(timeout=120)
        took = time.monotonic() - t0

        # Every Renew answered counts, quiet ones too (since decision 0019 a renewal moves the
        # lease's expiry only every other time: counting expiry moves counted half the work).
        answered = Renewer._answered

        def counted(self: Renewer, lease: Any, resp: Any) -> bool:
            renewals[0] += 1
            return answered(self, lease, resp)

        Renewer._answered = counted  # type: ignore[method-assign]
        gc.freeze()
        print(f"held {k} {took:.1f}", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line.startswith("mark"):
                break
            lost = sum(1 for s in sessions if s.lost_lease.is_set() or s.lease is None)
            detached = sum(1 for s in sessions if not s._attached)  # re-attaching (a leader lost)
            print(f"mark {renewals[0]} {lost} {detached}", flush=True)


# ---------------------------------------------------------------- the driver


def _server(root: str, mode: str, k: int, state: str | None) -> tuple[subprocess.Popen[str], str]:
    policy = Path(root, f"hold-{mode}.yaml")
    policy.write_text(hold_policy(k))
    address = f"127.0.0.1:{free_port()}"
    out = open(os.path.join(root, f"hold-{mode}.log"), "a")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(policy), state or "", address],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out, stderr=out, text=True,
    )  # fmt: skip
    return proc, address


async def _wait_serving(address: str, timeout_s: float = 60) -> None:
    import grpc

    from scheduler.api.gen.slotsched.v1 import scheduler_pb2, scheduler_pb2_grpc

    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]
        while True:
            try:
                await stub.GetSession(
                    scheduler_pb2.GetSessionRequest(session_id="nobody"),
                    metadata=(("authorization", f"Bearer {TOKEN}"),),
                    timeout=2,
                )
                return
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server at {address} did not start") from e
                await asyncio.sleep(0.2)


def hold_one(args: argparse.Namespace, root: str, mode: str, script: str) -> dict[str, Any]:
    k = args.hold_sessions
    redis = None
    state = None
    if mode == "redis":
        port = free_port()
        redis = start_redis(port, root)
        state = f"redis://127.0.0.1:{port}/0"
    server, address = _server(root, mode, k, state)
    gen: subprocess.Popen[str] | None = None
    try:
        asyncio.run(_wait_serving(address))
        time.sleep(1.0)
        pids = {"server": server.pid} | ({"redis": redis.pid} if redis else {})
        c0, t0 = {n: cpu_of(p) for n, p in pids.items()}, time.monotonic()
        time.sleep(args.idle)
        idle = {n: (cpu_of(p) - c0[n]) / (time.monotonic() - t0) for n, p in pids.items()}
        cmd = [sys.executable, script, "--load", "hold", "--targets", address, "--hold-sessions", str(k)]
        gen = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert gen.stdin is not None and gen.stdout is not None
        line = gen.stdout.readline()
        if not line.startswith("held"):
            raise RuntimeError(f"the hold generator answered {line!r}")
        log(f"{mode}: {k} sessions granted in {float(line.split()[2]):.1f} s; settling one renewal period")
        time.sleep(args.hold_settle_seconds)  # a renewal period: the acquire phase's renewals spread out
        pids["generator"] = gen.pid

        def mark() -> tuple[int, int]:
            assert gen is not None and gen.stdin is not None and gen.stdout is not None
            gen.stdin.write("mark\n")
            gen.stdin.flush()
            _, renewed, lost, detached = gen.stdout.readline().split()
            if int(detached):
                log(f"{mode}: {detached} sessions re-attaching (the server stopped serving them)")
            return int(renewed), int(lost)

        r0, _ = mark()
        c0, t0 = {n: cpu_of(p) for n, p in pids.items()}, time.monotonic()
        time.sleep(args.hold_seconds)
        wall = time.monotonic() - t0
        share = {n: (cpu_of(p) - c0[n]) / wall for n, p in pids.items()}
        r1, lost = mark()
        gen.kill()  # (releasing K sessions one by one would take long: the server goes anyway)
        gen.wait(timeout=30)
    finally:
        if gen is not None and gen.poll() is None:
            gen.kill()
        stop_all([server], grace_s=5)
        if redis is not None:
            redis.kill()
    used = share["server"] - idle["server"]
    rate = (r1 - r0) / wall
    due = k * 3.0 / TTL_S  # the renewals a second K sessions need
    # The server's CPU per renewal it made (below a few 10 ms CPU ticks over the window: not
    # measured); a session costs that x 3 / TTL of a core. The pace says whether the generator
    # kept up: a late renewal still renews, so a generator short of CPU shows as a pace below 1.
    per_renewal = used / rate if used * wall >= 0.05 and rate > 0 else None
    per = None if per_renewal is None else per_renewal * 3.0 / TTL_S
    fig = {
        f"hold_cpu_share_{mode}": share["server"],
        f"hold_idle_share_{mode}": idle["server"],
        f"hold_generator_share_{mode}": share["generator"],
        f"hold_renewals_per_s_{mode}": rate,
        f"hold_renewal_pace_{mode}": rate / due,
        f"hold_us_per_renewal_{mode}": "na" if per_renewal is None else per_renewal * 1e6,
        f"sessions_per_core_{mode}": "na" if per is None else 1.0 / per,
        f"hold_cpu_share_100k_{mode}": "na" if per is None else idle["server"] + 100_000 * per,
        f"hold_leases_lost_{mode}": lost,
    }
    if redis is not None:
        fig["hold_redis_share"] = share["redis"]
    log(
        f"{mode}: holding {k} sessions, {rate:.0f} renewals/s (pace {rate / due:.2f} of the {due:.0f} due): "
        f"server {share['server']:.3f} of a core (idle {idle['server']:.3f}), "
        f"generator {share['generator']:.3f}"
        + (f", redis {share['redis']:.3f}" if redis is not None else "")
        + (
            f"; {per_renewal * 1e6:.0f} µs per renewal: {1 / per:.0f} sessions per core; 100,000 would take "
            f"{idle['server'] + 1e5 * per:.2f} of a core"
            if per is not None and per_renewal is not None
            else "; too little CPU to say per session"
        )
        + f"; leases lost {lost}"
    )  # fmt: skip
    return fig


def hold_phase(args: argparse.Namespace, root: str, script: str) -> dict[str, Any]:
    fig: dict[str, Any] = {"sessions_held": args.hold_sessions}
    modes = args.hold_modes.split(",")
    for mode in modes:
        fig |= hold_one(args, root, mode, script)
    fig["hold_leases_lost"] = sum(fig[f"hold_leases_lost_{m}"] for m in modes)
    fig["hold_renewal_pace"] = min(fig[f"hold_renewal_pace_{m}"] for m in modes)
    return fig
