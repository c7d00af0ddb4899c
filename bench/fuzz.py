"""Fuzz a real scheduler and reference worker: the issue's bar of 10,000 requests.

Runs `slotsched serve` (dev mode, the built-in policy: 4 workers x 2 slots) and a standalone
`slotsched worker --no-verify-leases` as subprocesses, then sends requests drawn by the generator of
the test suite (tests/fuzz_requests.py: hypothesis over every field of every rpc of the Scheduler,
Workers, Admin, KEDA, Health and Worker services, one in ten a body of raw random bytes), eight at
a time. Afterwards: health must be SERVING and the pool's accounting intact (free + held =
capacity, busy = held, every lease held by a live session, queue counts consistent).

Usage: `python bench/fuzz.py [--requests N] [--concurrency C]`. Prints the answers by status code,
every UNKNOWN/INTERNAL answer and every accounting problem; the last line is
`fuzz_requests=N unknown_or_internal=U accounting_drift=D` (exit status 1 unless U = D = 0).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from procs import stop_all  # noqa: E402

from tests.fuzz_requests import Tally, accounting_problems, fuzz_case, send  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(args: list[str], ready: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if ready in line:
            return proc
    proc.kill()
    raise RuntimeError(f"{' '.join(args[:1])} did not start")


async def _health(channel: grpc.aio.Channel) -> int:
    resp = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return int(resp.status)


def run(requests: int, concurrency: int) -> tuple[Tally, list[str], bool]:
    sport, wport = _free_port(), _free_port()
    snapshots = tempfile.mkdtemp(prefix="slotsched-fuzz-")
    server = _spawn(["serve", "--listen", f"127.0.0.1:{sport}", "--metrics-listen", ""], "serving gRPC on")
    worker = _spawn(
        ["worker", "--scheduler", "127.0.0.1:1", "--worker-id", "w0", "--slots", "2",
         "--listen", f"127.0.0.1:{wport}", "--snapshots", snapshots, "--no-verify-leases"],
        "serving on",
    )  # fmt: skip
    loop = asyncio.new_event_loop()

    async def open_channels() -> dict[bool, grpc.aio.Channel]:  # bound to `loop`: opened inside it
        return {
            False: grpc.aio.insecure_channel(f"127.0.0.1:{sport}"),
            True: grpc.aio.insecure_channel(f"127.0.0.1:{wport}"),
        }

    channels = loop.run_until_complete(open_channels())
    tally = Tally()

    async def batch(cases: list[Any]) -> None:
        answers = await asyncio.gather(*(send(channels[r.on_worker], r, b, md) for r, b, md in cases))
        for (rpc, _, _), (code, details) in zip(cases, answers, strict=True):
            tally.add(rpc, code, details)

    @settings(
        max_examples=max(1, requests // concurrency),
        deadline=None,
        database=None,
        phases=[Phase.generate],  # no shrinking: count every answer, keep going
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(fuzz_case(), min_size=concurrency, max_size=concurrency))
    def one(cases: list[Any]) -> None:
        if tally.requests < requests:
            loop.run_until_complete(batch(cases[: requests - tally.requests]))

    try:
        t0 = time.monotonic()
        while tally.requests < requests:
            one()
        took = time.monotonic() - t0
        print(f"{tally.requests} requests in {took:.1f} s")
        serving = loop.run_until_complete(_health(channels[False])) == health_pb2.HealthCheckResponse.SERVING
        problems = loop.run_until_complete(accounting_problems(channels[False]))
        for ch in channels.values():
            loop.run_until_complete(ch.close())
    finally:
        stop_all((worker, server))
        loop.close()
    return tally, problems, serving


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    tally, problems, serving = run(args.requests, args.concurrency)
    for code, n in sorted(tally.by_code.items(), key=lambda kv: -kv[1]):
        print(f"  {code:<20} {n}")
    for bad in tally.bad:
        print(f"BAD {bad}")
    for p in problems:
        print(f"DRIFT {p}")
    print(f"health after: {'SERVING' if serving else 'NOT SERVING'}")
    drift = len(problems) + (0 if serving else 1)
    print(f"fuzz_requests={tally.requests} unknown_or_internal={len(tally.bad)} accounting_drift={drift}")
    return 0 if not tally.bad and not drift else 1


if __name__ == "__main__":
    sys.exit(main())
