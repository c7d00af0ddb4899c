"""What the benches that run `slotsched` subprocesses share: the bench tenant's policy and a clean
stop of the processes (SIGTERM, then SIGKILL after a grace), so every bench ends."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Sequence

from scheduler.policy.identities import hash_token


def bench_policy(token: str, admin: str | None = None) -> str:
    """One tenant `bench` with room for 128 Burstable leases on 8 x 16 slots, long leases."""
    access = f'  access:\n    admins: ["{hash_token(admin)}"]\n' if admin is not None else ""
    return (
        "apiVersion: slotsched.dev/v1alpha1\n"
        "kind: SchedulingPolicy\n"
        "metadata: {name: bench}\n"
        "spec:\n"
        "  pool: {slotsPerWorker: 16, workers: 8, minWorkers: 1, maxWorkers: 8, floor: 0}\n"
        "  timing: {leaseTTLSeconds: 300}\n"
        "  tenants:\n"
        "    - name: bench\n"
        "      burstable: {nominal: 128, limit: 128}\n"
        f'      tokens: ["{hash_token(token)}"]\n' + access
    )


def stop_all(procs: Sequence[subprocess.Popen[str]], grace_s: float = 15.0) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def free_port() -> int:
    """A TCP port free on loopback now (a fixed port lets a killed process come back on it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(
    port: int, directory: str, fsync: str = "always", replica_of: int | None = None, aof: bool = True
) -> subprocess.Popen[str]:
    """A private redis-server, durable the way deploy/ runs it (AOF, `appendfsync always` by
    default; `aof=False`: none); with `replica_of`, a replica of the server on that port."""
    extra = ["--replicaof", "127.0.0.1", str(replica_of)] if replica_of is not None else []
    durability = ["--appendonly", "yes", "--appendfsync", fsync] if aof else ["--appendonly", "no"]
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", "",
         *durability, *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start")
