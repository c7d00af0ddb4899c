"""What bench/pools_failover.py's phases share: the pools' policy, the replica processes
(`slotsched serve --leadership pool`), the driver's channels and its view of who leads each
pool (read from each replica's health `slotsched.pool/<name>`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.procs import free_port
from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2_grpc
from scheduler.policy.identities import hash_token

ROOT = Path(__file__).resolve().parents[1]

TOKEN, ADMIN = "bench-token", "bench-admin"
MD = (("authorization", f"Bearer {TOKEN}"),)
ADMIN_MD = (("authorization", f"Bearer {ADMIN}"),)
B = common_pb2.QOS_CLASS_BURSTABLE
SLOTS, WORKERS = 166, 2
SERVING = health_pb2.HealthCheckResponse.SERVING


def log(msg: str) -> None:
    print(f"[pools_failover] {msg}", file=sys.stderr, flush=True)


def pools_policy(pools: list[str]) -> str:
    lines = [
        "apiVersion: slotsched.dev/v1alpha1",
        "kind: SchedulingPolicy",
        "metadata: {name: pools-bench}",
        "spec:",
        "  timing: {leaseTTLSeconds: 900}",
        "  pools:",
    ]
    for p in pools:
        lines.append(
            f"    - {{name: {p}, labels: {{tier: bench}}, slotsPerWorker: {SLOTS}, workers: {WORKERS}, "
            f"minWorkers: {WORKERS}, maxWorkers: {WORKERS}, floor: 0}}"
        )
    lines += [
        "  tenants:",
        "    - name: bench",
        f"      burstable: {{nominal: {SLOTS * WORKERS}, limit: {SLOTS * WORKERS}}}",
        f'      tokens: ["{hash_token(TOKEN)}"]',
        "  access:",
        f'    admins: ["{hash_token(ADMIN)}"]',
    ]
    return "\n".join(lines) + "\n"


class Replica:
    def __init__(
        self, name: str, root: str, policy: str, state: str, keys: str, prefix: str = "slotsched"
    ) -> None:
        self.name, self.port = name, free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.log = os.path.join(root, f"{name}.log")
        self.args = [
            sys.executable, "-m", "scheduler.cli", "serve", "--policy", policy, "--state", state,
            "--leadership", "pool", "--replica-id", name, "--listen", self.target,
            "--advertise", self.target, "--metrics-listen", "", "--grant-key-file", keys,
            "--state-prefix", prefix,
        ]  # fmt: skip
        self._logged = 0
        self.proc: subprocess.Popen[str] | None = None

    def spawn(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self._logged = os.path.getsize(self.log) if os.path.exists(self.log) else 0
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, env=env, stdout=out, stderr=out, text=True)

    async def wait_listening(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "per-pool leadership" in Path(self.log).read_text()[self._logged :]:
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited: see {self.log}")
            await asyncio.sleep(0.05)
        raise RuntimeError(f"replica {self.name} did not start: see {self.log}")

    def cpu_s(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Net:
    """One grpc.aio channel per address, and who leads each pool as this driver last heard."""

    def __init__(self, targets: list[str]) -> None:
        self.targets = targets
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.leader: dict[str, str] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        ch = self.channels.get(address)
        if ch is None:
            ch = self.channels[address] = grpc.aio.insecure_channel(address)
        return ch

    def sched(self, address: str) -> Any:
        return scheduler_pb2_grpc.SchedulerStub(self.channel(address))

    async def close(self) -> None:
        for ch in self.channels.values():
            await ch.close()
        self.channels.clear()


def trailers(err: grpc.aio.AioRpcError) -> dict[str, str]:
    return {k: v for k, v in (err.trailing_metadata() or ()) if isinstance(v, str)}


async def led_by(net: Net, replicas: list[Replica], pools: list[str]) -> dict[str, list[str]]:
    """pool -> the replicas whose health says they lead it."""
    out: dict[str, list[str]] = {p: [] for p in pools}

    async def one(r: Replica) -> None:
        stub = health_pb2_grpc.HealthStub(net.channel(r.target))
        for p in pools:
            try:
                resp = await stub.Check(
                    health_pb2.HealthCheckRequest(service=f"slotsched.pool/{p}"), timeout=1
                )
            except grpc.aio.AioRpcError:
                continue
            if resp.status == SERVING:
                out[p].append(r.target)

    await asyncio.gather(*(one(r) for r in replicas if r.proc is not None and r.proc.poll() is None))
    return out


async def settled(
    net: Net, replicas: list[Replica], pools: list[str], timeout_s: float = 30
) -> dict[str, str]:
    """Every pool led by exactly one replica, and the loads within one of each other."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = await led_by(net, replicas, pools)
        if all(len(v) == 1 for v in now.values()):
            counts = [sum(1 for v in now.values() if v[0] == r.target) for r in replicas]
            if max(counts) - min(counts) <= 1:
                net.leader = {p: v[0] for p, v in now.items()}
                return net.leader
        if time.monotonic() > deadline:
            raise RuntimeError(f"pools did not settle: {now}")
        await asyncio.sleep(0.1)
