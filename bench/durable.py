"""The durability cost of a reply, for bench/failover.py: Acquire→Granted p50 at concurrency 1
against Redis-backed leaders ÷ against an in-memory server, measured in alternating rounds on
fresh servers (each Redis setup with its own redis-server), so a drift in the shared machine's
load hits every target alike.

A setup is a row of `SETUPS`: its `appendfsync`, whether a replica acknowledges every append
(`?replicas=1`, WAIT), and which client carries the journal append (`APPENDS`). `--append both`
(bench/failover.py) adds the everysec setup over the other client, so the two are compared in
ONE run, interleaved round by round.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from procs import free_port, start_redis

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]

#: Which client carries the journal append: the env value the replica reads
#: (scheduler/state/redis_store.py, `APPEND_ENV`).
APPENDS = {"resp": "resp", "redis-py": "redis-py"}
APPEND_ENV = "SLOTSCHED_JOURNAL_APPEND"


@dataclass(frozen=True)
class Setup:
    fsync: str  # redis appendfsync
    replica: bool  # a replica acknowledges every append (WAIT)
    append: str  # a key of APPENDS


#: name: setup. The figure each gives is `durable_<name>_p50_ratio` (everysec: `durable_p50_ratio`).
SETUPS = {
    "everysec": Setup("everysec", False, "resp"),
    "always": Setup("always", False, "resp"),
    "replica": Setup("everysec", True, "resp"),
}


def setups(append: str) -> dict[str, Setup]:
    """The rows run for `--append`: one client for every setup, or `both`: the everysec setup
    over each client (the default's rows, plus `everysec_<other>`)."""
    if append == "both":
        return {**SETUPS, "everysec_redis-py": Setup("everysec", False, "redis-py")}
    return {name: Setup(s.fsync, s.replica, append) for name, s in SETUPS.items()}


async def serving(target: str) -> bool:
    """gRPC health of the whole server: SERVING on the leader only."""
    async with grpc.aio.insecure_channel(target) as ch:
        try:
            resp = await health_pb2_grpc.HealthStub(ch).Check(  # type: ignore[no-untyped-call]
                health_pb2.HealthCheckRequest(service=""), timeout=0.5
            )
        except grpc.aio.AioRpcError:
            return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


async def acquire_latency(target: str, n: int, tag: str, token: str) -> list[float]:
    """Acquire until Granted, then Release, `n` times in sequence on one channel."""
    out: list[float] = []
    md = (("authorization", f"Bearer {token}"),)
    async with grpc.aio.insecure_channel(target) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)  # type: ignore[no-untyped-call]
        for i in range(n):
            sid = f"lat-{tag}-{i}"
            t0 = time.perf_counter()
            call = stub.Acquire(
                scheduler_pb2.AcquireRequest(session_id=sid, qos=common_pb2.QOS_CLASS_BURSTABLE), metadata=md
            )
            ev = await call.read()
            out.append(time.perf_counter() - t0)
            lease = ev.granted.lease
            await stub.Release(
                scheduler_pb2.ReleaseRequest(session_id=sid, lease_id=lease.lease_id, epoch=lease.epoch),
                metadata=md,
            )
            await call.read()
    return out


async def p50s(targets: dict[str, str], rounds: int, n: int, token: str) -> dict[str, float]:
    """Acquire->Granted p50 (ms) of each target, measured in alternating rounds."""
    lat: dict[str, list[float]] = {name: [] for name in targets}
    for r in range(rounds):
        for name, target in targets.items():
            lat[name] += await acquire_latency(target, n, f"{name}{r}", token)
    return {name: statistics.median(xs) * 1e3 for name, xs in lat.items()}


async def replica_online(port: int, timeout_s: float = 30.0) -> None:
    """Until the redis-server on `port` has a replica in sync (before then WAIT cannot succeed)."""
    import redis.asyncio

    r = redis.asyncio.Redis(port=port)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = await r.info("replication")
            if any(str(v).find("state=online") >= 0 or (isinstance(v, dict) and v.get("state") == "online")
                   for k, v in info.items() if k.startswith("slave")):  # fmt: skip
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the replica of redis on {port} did not come online")
    finally:
        await r.aclose()


def _serve(policy: str, extra: list[str], env: dict[str, str], log: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    args = [sys.executable, "-m", "scheduler.cli", "serve", "--policy", policy, "--listen",
            f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{free_port()}", *extra]  # fmt: skip
    with open(log, "a") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                                stdout=out, stderr=out, text=True)  # fmt: skip
    return proc, f"127.0.0.1:{port}"


async def ratios(
    *,
    policy: str,
    keyfile: str,
    tmp: str,
    serve_args: list[str],
    rounds: int,
    n: int,
    token: str,
    append: str,
    procs: list[subprocess.Popen[str]],
    say: Callable[[str], None],
) -> dict[str, float]:
    """Start an in-memory server and one Redis-backed replica per setup (each on its own
    redis-server; every process goes into `procs`, for the caller to stop), measure, and give
    each setup's p50 ÷ memory's."""
    targets: dict[str, str] = {}
    proc, targets["memory"] = _serve(policy, [], {}, os.path.join(tmp, "durable-memory.log"))
    procs.append(proc)
    for name, setup in setups(append).items():
        d = tempfile.mkdtemp(prefix=f"{name}-", dir=tmp)
        port = free_port()
        procs.append(start_redis(port, d, fsync=setup.fsync))
        state = f"redis://127.0.0.1:{port}/0"
        if setup.replica:
            d2 = tempfile.mkdtemp(prefix=f"{name}-replica-", dir=tmp)
            procs.append(start_redis(free_port(), d2, fsync=setup.fsync, replica_of=port))
            await replica_online(port)
            state += "?replicas=1"
        extra = ["--state", state, "--replica-id", f"durable-{name}", "--grant-key-file", keyfile,
                 *serve_args]  # fmt: skip
        env = {APPEND_ENV: APPENDS[setup.append]}
        proc, targets[name] = _serve(policy, extra, env, os.path.join(tmp, f"durable-{name}.log"))
        procs.append(proc)
    deadline = time.monotonic() + 60
    for target in targets.values():
        while not await serving(target):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server at {target} did not start: see {tmp}")
            await asyncio.sleep(0.05)
    p50 = await p50s(targets, rounds, n, token)
    say("Acquire->Granted p50: " + ", ".join(f"{k} {v:.3f} ms" for k, v in p50.items()))
    return {k: v / p50["memory"] for k, v in p50.items() if k != "memory"}


#: setup -> the bench's key for its ratio (everysec on one Redis: the cost of the journal itself)
FIGURES = {
    "everysec": "durable_p50_ratio",
    "always": "durable_fsync_always_p50_ratio",
    "replica": "durable_replica_wait_p50_ratio",
    "everysec_redis-py": "durable_redispy_p50_ratio",
}


def figures(r: dict[str, float]) -> dict[str, str]:
    """The ratios as the bench's key=value figures."""
    return {FIGURES[name]: f"{v:.2f}" for name, v in r.items()}
