"""Redis as people run it, on loopback: a primary with replicas watched by Sentinels, and a Redis
Cluster. Every process is a real redis-server on a free port with a temp directory of its own;
`close()` SIGKILLs them all. Used by tests/test_state_sentinel.py, tests/test_state_cluster.py
and bench/redis_failover.py.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import redis

REDIS_BIN = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
MASTER = "slotsched"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    for _ in range(200):
        port = random.randint(20000, 55000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise AssertionError("no free port pair for a cluster node")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Poll `check` until it returns something true (a connection error counts as not yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
            if got:
                return got
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Node:
    """One redis-server (or sentinel) process; AOF on, fsync always, as deploy/ documents."""

    def __init__(
        self, root: str, name: str, extra: list[str], sentinel_conf: str | None = None, port: int = 0
    ) -> None:
        self.port = port or free_port()
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)
        self.extra = extra
        self.sentinel_conf = sentinel_conf
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Node:
        if self.sentinel_conf is not None:
            conf = os.path.join(self.dir, "sentinel.conf")  # sentinel rewrites its config: its own copy
            with open(conf, "w", encoding="utf-8") as f:
                f.write(f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n{self.sentinel_conf}")
            args = [REDIS_BIN, conf, "--sentinel"]
        else:
            args = [REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            args += ["--appendonly", "yes", "--appendfsync", "always", "--dir", self.dir, *self.extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc = self.proc

        def up() -> bool:
            assert proc.poll() is None, f"redis-server {self.dir} exited with {proc.returncode}"
            return bool(self.client().ping())

        wait_for(f"redis on {self.port}", up, 10)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)


class SentinelSet:
    """A primary, `replicas` replicas and `sentinels` sentinels (quorum: a majority) watching it,
    with short failure detection (down-after 500 ms) so a test sees a failover in seconds."""

    def __init__(self, root: str, replicas: int = 1, sentinels: int = 3) -> None:
        self.root = root
        self.primary = Node(root, "primary", [])
        self.replicas = [
            Node(root, f"replica{i}", ["--replicaof", "127.0.0.1", str(self.primary.port)])
            for i in range(replicas)
        ]
        quorum = sentinels // 2 + 1
        conf = (
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary.port} {quorum}\n"
            f"sentinel down-after-milliseconds {MASTER} 500\n"
            f"sentinel failover-timeout {MASTER} 3000\n"
            f"sentinel parallel-syncs {MASTER} 1\n"
        )
        self.sentinels = [Node(root, f"sentinel{i}", [], sentinel_conf=conf) for i in range(sentinels)]

    def start(self) -> SentinelSet:
        self.primary.start()
        for r in self.replicas:
            r.start()
        # Replicas in sync before the sentinels look: they learn of replicas from the primary's INFO.
        wait_for(
            "replicas in sync",
            lambda: all(r.client().info("replication")["master_link_status"] == "up" for r in self.replicas),
        )
        for s in self.sentinels:
            s.start()
        n = len(self.sentinels)

        def ready() -> bool:
            for s in self.sentinels:
                c = s.client()
                if (
                    len(c.sentinel_slaves(MASTER)) < len(self.replicas)
                    or len(c.sentinel_sentinels(MASTER)) < n - 1
                ):
                    return False
            return True

        wait_for("sentinels to see the replicas and each other", ready, 20)
        return self

    def url(self, options: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER}/0{options}"

    def current_primary_port(self) -> int:
        for s in self.sentinels:
            try:
                return int(s.client().sentinel_get_master_addr_by_name(MASTER)[1])
            except (redis.RedisError, OSError, TypeError):
                continue
        raise AssertionError("no sentinel answers")

    def node_on(self, port: int) -> Node:
        return next(n for n in [self.primary, *self.replicas] if n.port == port)

    def close(self) -> None:
        for n in [*self.sentinels, self.primary, *self.replicas]:
            n.kill()


class ClusterSet:
    """A Redis Cluster of `primaries` primaries with `replicas` replicas each."""

    def __init__(self, root: str, primaries: int = 3, replicas: int = 0) -> None:
        self.nodes = [
            Node(
                root,
                f"node{i}",
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                ],
                port=free_cluster_port(),
            )
            for i in range(primaries * (1 + replicas))
        ]
        self.replicas = replicas

    def start(self) -> ClusterSet:
        for n in self.nodes:
            n.start()
        args = [REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
        args += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        subprocess.run(args, check=True, capture_output=True, timeout=60)
        wait_for(
            "cluster state ok",
            lambda: all(n.client().cluster("info")["cluster_state"] == "ok" for n in self.nodes),
            20,
        )

        def synced() -> bool:  # a replica that never synced cannot be promoted
            roles = [n.client().info("replication") for n in self.nodes]
            return all(r.get("master_link_status") == "up" for r in roles if r["role"] == "slave")

        wait_for("replicas in sync", synced, 20)
        return self

    def url(self, options: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:2])
        return f"redis+cluster://{hosts}{options}"

    def close(self) -> None:
        for n in self.nodes:
            n.kill()
