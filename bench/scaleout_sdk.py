"""bench/scaleout.py's SDK phase: what the multiplexed SDK (`AsyncClient`, every session on one
`Scheduler.Channel`) carries against the raw Channel driven from the same process, and what it adds
to a grant at c=1 against a no-op call.

Processes: a memory-mode slotsched server and grpc_latency.py's no-op server, each in its own
subprocess, and the load generator in its own (`scaleout.py --load sdk`), which drives, in
interleaved blocks so drift hits all alike:

* c64: 64 sessions looping acquire -> Granted -> release -> Ended, through the SDK (`async with
  client.session(...)`) and through the raw Channel (grpc_latency.py's `ChannelTarget`: generated
  stubs on one stream, commands batched, events dispatched by session id): pairs/s of each, and
  the CPU seconds per pair of the generator (itself) and of the server (/proc);
* c1: Acquire -> Granted latency one at a time, through the SDK and the raw Channel, and a no-op
  unary call.

Figures: `sdk_channel_pairs_ratio_c64`, the median over blocks of SDK pairs/s over raw Channel
pairs/s (measured); `sdk_channel_pairs_ratio_c64_one_core`, the same projected for one core per
process from the CPU per pair (a process's pairs/s is at most 1 / its CPU per pair, and the
slower of generator and server sets the rate): on a loaded shared machine the measured ratio is
the client's CPU share, so the projection is the steadier figure; `sdk_p50_ratio_c1`, the median
over blocks of the SDK's p50 over the no-op call's; the CPU per pair of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # grpc_latency.py imports its neighbours by name

from grpc_latency import _SERVE, POLICY, TOKEN, ChannelTarget, Target, _spawn, cpu_seconds  # noqa: E402

from bench.procs import stop_all  # noqa: E402
from scheduler.client.aio import AsyncClient  # noqa: E402


def log(msg: str) -> None:
    print(f"[scaleout sdk] {msg}", file=sys.stderr, flush=True)


class SdkTarget:
    """A pair through the SDK: `async with client.session(...)` (Granted), then its release."""

    def __init__(self, address: str) -> None:
        self.client = AsyncClient(address, token=TOKEN)
        self.seq = 0

    async def op(self) -> float:
        self.seq += 1
        session = self.client.session(f"sdk{self.seq}")
        t0 = time.perf_counter()
        await session.__aenter__()
        latency = time.perf_counter() - t0
        assert session.lease is not None
        await session.__aexit__(None, None, None)
        return latency

    async def sequential(self, n: int) -> list[float]:
        return [await self.op() for _ in range(n)]

    async def concurrent(self, workers: int, seconds: float) -> tuple[list[float], float]:
        return await Target.concurrent(self, workers, seconds)  # type: ignore[arg-type]

    async def close(self) -> None:
        await self.client.close()


async def load_sdk(args: argparse.Namespace) -> None:
    """The load generator (a child process): prints one JSON line of blocks."""
    targets = dict(t.split("=", 1) for t in args.targets.split(","))
    server_pid = int(args.server_pid)
    pair: dict[str, Any] = {
        "sdk": SdkTarget(targets["slotsched"]),
        "channel": ChannelTarget(targets["slotsched"]),
    }
    noop = Target(targets["noop"], "noop")
    blocks: list[dict[str, Any]] = []
    try:
        for t in (*pair.values(), noop):  # warm channels, caches and code paths
            await t.sequential(200)
            await t.concurrent(64, 0.5)
        for k in range(args.rounds):
            block: dict[str, Any] = {}
            order = list(pair.items()) if k % 2 == 0 else list(pair.items())[::-1]
            for name, t in order:
                c0, s0 = time.process_time(), cpu_seconds(server_pid)
                lat, rate = await t.concurrent(64, args.seconds / args.rounds)
                c1, s1 = time.process_time(), cpu_seconds(server_pid)
                n = max(1, len(lat))
                block[name] = {
                    "rate": rate,
                    "client_us": (c1 - c0) * 1e6 / n,
                    "server_us": (s1 - s0) * 1e6 / n,
                }
            for name, t in (*pair.items(), ("noop", noop)):
                block[f"{name}_p50_ms"] = statistics.median(await t.sequential(args.iterations)) * 1e3
            blocks.append(block)
            print(
                f"[scaleout sdk] block {k + 1}/{args.rounds}: c64 sdk {block['sdk']['rate']:.0f}/s "
                f"({block['sdk']['client_us']:.0f} µs client, {block['sdk']['server_us']:.0f} µs server), "
                f"channel {block['channel']['rate']:.0f}/s ({block['channel']['client_us']:.0f} / "
                f"{block['channel']['server_us']:.0f} µs); c1 p50 sdk {block['sdk_p50_ms']:.3f} ms, "
                f"channel {block['channel_p50_ms']:.3f}, no-op {block['noop_p50_ms']:.3f}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        for t in (*pair.values(), noop):
            await t.close()
    print(json.dumps(blocks), flush=True)


def figures(blocks: list[dict[str, Any]]) -> dict[str, float]:
    med = statistics.median

    def one_core(name: str, b: dict[str, Any]) -> float:  # pairs/s with a core per process
        return 1e6 / max(b[name]["client_us"], b[name]["server_us"])

    fig = {
        "sdk_channel_pairs_ratio_c64": med(b["sdk"]["rate"] / b["channel"]["rate"] for b in blocks),
        "sdk_channel_pairs_ratio_c64_one_core": med(
            one_core("sdk", b) / one_core("channel", b) for b in blocks
        ),
        "sdk_p50_ratio_c1": med(b["sdk_p50_ms"] / b["noop_p50_ms"] for b in blocks),
        "channel_p50_ratio_c1": med(b["channel_p50_ms"] / b["noop_p50_ms"] for b in blocks),
    }
    for name in ("sdk", "channel"):
        fig[f"{name}_pairs_per_s_c64"] = med(b[name]["rate"] for b in blocks)
        fig[f"{name}_client_us_per_pair"] = med(b[name]["client_us"] for b in blocks)
        fig[f"{name}_server_us_per_pair"] = med(b[name]["server_us"] for b in blocks)
    return fig


def sdk_phase(args: argparse.Namespace, root: str, script: str) -> dict[str, float]:
    """Start the two servers, run the load generator (`script --load sdk`), return the figures."""
    policy = Path(root, "sdk-policy.yaml")
    policy.write_text(POLICY)
    server, address = _spawn([sys.executable, "-c", _SERVE, str(policy)])
    noop, noop_address = _spawn([sys.executable, str(ROOT / "bench" / "grpc_latency.py"), "--noop-server"])
    try:
        spec = f"slotsched={address},noop={noop_address}"
        cmd = [sys.executable, script, "--load", "sdk", "--targets", spec,
               "--seconds", str(args.sdk_seconds), "--rounds", str(args.sdk_rounds),
               "--iterations", str(args.sdk_iterations), "--server-pid", str(server.pid)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=None, text=True,
                              timeout=args.sdk_seconds * 3 + args.sdk_rounds * 60 + 120)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError("the SDK load generator failed")
        fig = figures(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        stop_all([server, noop], grace_s=5)
    log(
        f"c64: SDK {fig['sdk_pairs_per_s_c64']:.0f} pairs/s, "
        f"raw Channel {fig['channel_pairs_per_s_c64']:.0f} "
        f"(ratio {fig['sdk_channel_pairs_ratio_c64']:.2f}; one core per process "
        f"{fig['sdk_channel_pairs_ratio_c64_one_core']:.2f}); client µs/pair SDK "
        f"{fig['sdk_client_us_per_pair']:.0f}, Channel {fig['channel_client_us_per_pair']:.0f}; server "
        f"µs/pair {fig['sdk_server_us_per_pair']:.0f} / {fig['channel_server_us_per_pair']:.0f}; "
        f"c1 p50 SDK/no-op {fig['sdk_p50_ratio_c1']:.2f} (raw Channel {fig['channel_p50_ratio_c1']:.2f})"
    )
    return fig
