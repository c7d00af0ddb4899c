"""Failover to a hot standby: kill -9 the leader, time the first Acquire a client gets answered.

Two `slotsched serve --state redis://…` replicas on one redis-server of our own; the SDK is
given both addresses. Each run: 20 leases held and 20 waiting (a 20-slot pool), SIGKILL the
leader, and at once open a new session through the same client: the time from the kill to its
first answer (Queued: the pool is full) is the failover time. Then check that every holder kept
its lease id and epoch (and was not told it lost it), that no slot is held twice, and that the
waiters are still queued in order; restart the killed replica as the next standby.

    PYTHONPATH=. python bench/standby_failover.py --runs 5

The last line is `key=value` pairs. `failover_once` is reusable (bench/failover.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler.api.gen.slotsched.v1 import admin_pb2, admin_pb2_grpc
from scheduler.client import AsyncClient, AsyncSession, QoS
from scheduler.policy.identities import hash_token

ROOT = Path(__file__).resolve().parents[1]
TOKEN, ADMIN = "bench-token", "bench-admin"
SLOTS = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _policy(lease_ttl_s: float) -> str:
    return (
        "apiVersion: slotsched.dev/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: failover}\n"
        f"spec:\n  pool: {{slotsPerWorker: {SLOTS // 2}, workers: 2, floor: 0}}\n"
        f"  timing: {{leaseTTLSeconds: {lease_ttl_s}}}\n"
        f'  access:\n    admins: ["{hash_token(ADMIN)}"]\n'
        "  tenants:\n    - name: bench\n"
        f"      burstable: {{nominal: {SLOTS}, limit: {SLOTS}}}\n"
        f'      tokens: ["{hash_token(TOKEN)}"]\n'
    )


class Replica:
    def __init__(self, policy: str, state: str, name: str, ttl: float, env: dict[str, str]) -> None:
        self.name, self.port = name, _free_port()
        self.args = [sys.executable, "-m", "scheduler.cli", "serve", "--policy", policy, "--state", state]
        self.args += ["--listen", f"127.0.0.1:{self.port}", "--metrics-listen", "", "--replica-id", name]
        self.args += ["--leader-ttl", str(ttl)]
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.args, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def health(self) -> int | None:
        try:
            with grpc.insecure_channel(self.target) as ch:
                return int(
                    health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1).status
                )
        except grpc.RpcError:
            return None

    def wait_health(self, want: int, timeout: float = 30) -> None:
        t0 = time.monotonic()
        while self.health() != want:
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{self.name} not {want} after {timeout} s")
            time.sleep(0.05)


async def _queue(target: str) -> list[str]:
    async with grpc.aio.insecure_channel(target) as ch:
        stub = admin_pb2_grpc.AdminStub(ch)  # type: ignore[no-untyped-call]
        resp = await stub.ListQueue(
            admin_pb2.ListQueueRequest(), metadata=(("authorization", f"Bearer {ADMIN}"),), timeout=5
        )
        return [e.session_id for e in resp.entries]


async def failover_once(client: AsyncClient, leader: Replica, probe_id: str) -> float:
    """SIGKILL `leader`; seconds until a new session through `client` gets its first answer."""
    t0 = time.monotonic()
    leader.kill()
    probe = client.session(probe_id, QoS.BURSTABLE)
    probe.start()
    await probe.wait_until(lambda s: s.queue is not None or s.lease is not None, 30)
    took = time.monotonic() - t0
    await probe.release()
    return took


async def run(runs: int, ttl: float, lease_ttl_s: float) -> dict[str, float | int]:
    redis_bin = shutil.which("redis-server") or "/usr/bin/redis-server"
    with tempfile.TemporaryDirectory(prefix="slotsched-failover-") as d:
        rport = _free_port()
        redis_args = [redis_bin, "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--dir", d]
        redis_args += ["--appendonly", "yes", "--appendfsync", "always"]
        redis = subprocess.Popen(redis_args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        policy = os.path.join(d, "policy.yaml")
        Path(policy).write_text(_policy(lease_ttl_s))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SLOTSCHED_AUTOSCALER": "off"}
        env["SLOTSCHED_GRANT_KEYS"] = f"k1:{base64.b64encode(os.urandom(32)).decode()}"
        state = f"redis://127.0.0.1:{rport}/0"
        reps = [Replica(policy, state, n, ttl, env) for n in ("a", "b")]
        times: list[float] = []
        lost = doubles = waiters_lost = 0
        try:
            time.sleep(0.3)
            reps[0].start()
            await asyncio.to_thread(reps[0].wait_health, health_pb2.HealthCheckResponse.SERVING)
            reps[1].start()
            await asyncio.to_thread(reps[1].wait_health, health_pb2.HealthCheckResponse.NOT_SERVING)
            leader, standby = reps
            async with AsyncClient([r.target for r in reps], token=TOKEN, reattach_timeout_s=60) as client:
                holders: list[AsyncSession] = []
                for i in range(SLOTS):
                    s = client.session(f"h{i}", QoS.BURSTABLE)
                    await s.wait_granted(10)
                    holders.append(s)
                waiters = [client.session(f"w{i}", QoS.BURSTABLE) for i in range(SLOTS)]
                for w in waiters:
                    w.start()
                    await w.wait_until(lambda s: s.queue is not None, 10)
                for k in range(runs):
                    before = {s.session_id: (s.lease_id, s.epoch) for s in holders}
                    await asyncio.sleep(0.5)  # the standby is following: nothing special about the moment
                    took = await failover_once(client, leader, f"probe{k}")
                    times.append(took)
                    await asyncio.gather(
                        *(s.wait_until(lambda s, k=k: s.reattaches > k, 30) for s in holders)
                    )
                    after = {s.session_id: (s.lease_id, s.epoch) for s in holders}
                    lost += sum(before[i] != after[i] for i in before) + sum(
                        s.lost_lease.is_set() for s in holders
                    )
                    slots = [s.lease.slot for s in holders if s.lease is not None]
                    doubles += len(slots) - len(set(slots))
                    order = await _queue(standby.target)
                    waiters_lost += sum(o != w.session_id for o, w in zip(order, waiters, strict=False))
                    waiters_lost += max(0, len(waiters) - len(order))
                    print(f"run {k + 1}: kill -9 -> first Acquire answered in {took:.3f} s", flush=True)
                    leader.start()  # the killed one comes back as the standby
                    await asyncio.to_thread(leader.wait_health, health_pb2.HealthCheckResponse.NOT_SERVING)
                    leader, standby = standby, leader
                for s in [*holders, *waiters]:
                    await s.release()
        finally:
            for r in reps:
                r.kill()
            redis.kill()
            redis.wait(10)
    return {
        "runs": runs,
        "leader_ttl_s": ttl,
        "p50_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
        "min_s": round(min(times), 3),
        "leases_lost": lost,
        "double_grants": doubles,
        "waiters_lost": waiters_lost,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--leader-ttl", type=float, default=1.0)
    p.add_argument("--lease-ttl", type=float, default=30.0, help="the policy's lease TTL (seconds)")
    a = p.parse_args()
    out = asyncio.run(run(a.runs, a.leader_ttl, a.lease_ttl))
    print(" ".join(f"{k}={v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
