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


def serving(client: redis.Redis) -> bool:
    """Whether a redis-server answers data commands: PING answers while an AOF still loads (and
    everything else is refused LOADING), so loading must be over too."""
    return bool(client.ping()) and int(client.info("persistence").get("loading", 0)) == 0


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
            args += ["--appendonly", "yes", "--appendfsync", "always", "--dir", self.dir]
            # A replica's full sync starts at once: Redis 7's default diskless sync first waits
            # 5 s for more replicas to share the transfer, so each set started (and each replica
            # resyncing to a promoted primary after a failover) idled 5 s for nothing.
            args += ["--repl-diskless-sync-delay", "0", *self.extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc = self.proc

        def up() -> bool:
            assert proc.poll() is None, f"redis-server {self.dir} exited with {proc.returncode}"
            c = self.client()
            return bool(c.ping()) if self.sentinel_conf is not None else serving(c)

        wait_for(f"redis on {self.port}", up, 20)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)


class SentinelSet:
    """A primary, `replicas` replicas and `sentinels` sentinels (quorum: a majority) watching it,
    with short failure detection (down-after 500 ms) so a test sees a failover in seconds; a test
    that wants no failover gives a longer `down_after_ms` (on a loaded machine a primary can be
    slow to answer a sentinel's PING for 500 ms, and is then failed over for nothing).

    `start()` returns once the set is what a client needs: every sentinel names the primary
    (`SENTINEL get-master-addr-by-name`), sees it up as a master (what redis-py checks before it
    connects: else "No master found"), knows the replicas and the other sentinels, and the primary
    answers. `wait_ready()` waits for that again (after a failover: for the new primary)."""

    def __init__(self, root: str, replicas: int = 1, sentinels: int = 3, down_after_ms: int = 500) -> None:
        self.root = root
        self.primary = Node(root, "primary", [])
        self.replicas = [
            Node(root, f"replica{i}", ["--replicaof", "127.0.0.1", str(self.primary.port)])
            for i in range(replicas)
        ]
        quorum = sentinels // 2 + 1
        conf = (
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary.port} {quorum}\n"
            f"sentinel down-after-milliseconds {MASTER} {down_after_ms}\n"
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
        # ... and acknowledging writes: the first WAIT after a full sync may take the replicas'
        # once-a-second acknowledgement, longer than a test's replica timeout (200 ms). Probed
        # in a database of its own, which no test reads.
        probe = redis.Redis(port=self.primary.port, db=9, socket_timeout=2)

        def acked() -> bool:
            probe.set("slotsched-test:probe", "1")
            return int(probe.wait(len(self.replicas), 100)) >= len(self.replicas)

        wait_for("replicas acknowledging a write", acked)
        probe.delete("slotsched-test:probe")
        probe.close()
        for s in self.sentinels:
            s.start()
        self.wait_ready(primary_port=self.primary.port)
        return self

    def wait_ready(self, primary_port: int | None = None, timeout: float = 30.0) -> int:
        """Wait until every sentinel names the same primary (`primary_port`, if given), sees it
        up as a master with the replicas and the other sentinels, and that primary answers as a
        master; its port."""
        n = len(self.sentinels)

        def ready() -> int | None:
            ports = set()
            for s in self.sentinels:
                c = s.client()
                addr = c.sentinel_get_master_addr_by_name(MASTER)
                state = c.sentinel_master(MASTER)
                if not addr or not state["is_master"] or state["is_sdown"] or state["is_odown"]:
                    return None
                if state["num-other-sentinels"] < n - 1 or len(c.sentinel_slaves(MASTER)) < len(
                    self.replicas
                ):
                    return None
                ports.add(int(addr[1]))
            if len(ports) != 1 or (primary_port is not None and ports != {primary_port}):
                return None
            port = ports.pop()
            primary = redis.Redis(port=port, socket_timeout=2)
            if not serving(primary) or primary.info("replication")["role"] != "master":
                return None
            return port

        return int(wait_for("sentinels to name an answering primary, with its replicas", ready, timeout))

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

        def ok(node: Node) -> bool:  # every node: state ok, every slot served, every node known
            info = node.client().cluster("info")
            return (
                info["cluster_state"] == "ok"
                and int(info["cluster_slots_assigned"]) == int(info["cluster_slots_ok"]) == 16384
                and int(info["cluster_known_nodes"]) == len(self.nodes)
            )

        wait_for("cluster state ok, all slots covered", lambda: all(ok(n) for n in self.nodes), 30)

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
