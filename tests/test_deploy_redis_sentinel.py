"""deploy/overlays/redis-sentinel (deploy/components/redis-sentinel): the scheduler's state URL
names the three sentinels the StatefulSet runs, with the Secret's password; every Redis node
persists every write and authenticates; and the start-up scripts of the ConfigMap decide the
primary as documented (run with sh and bash on fake `redis-cli`/`getent`), and write configs a
real redis-server and Sentinel accept.

Rendering needs kubectl (skipped without it, failing under `CI`, as tests/test_deploy_manifests.py).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from scheduler.state.config import parse_state
from scheduler.state.redis_connect import parse_target
from tests.test_deploy_manifests import container, env_of, expand, find, one, render, scheduler

OVERLAY = "redis-sentinel"
NAME = "slotsched-redis"
NAMESPACE = "slotsched"
SHELLS = [s for s in ("sh", "bash") if shutil.which(s)]


def statefulset(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objs, "StatefulSet", NAME)


def config_map(objs: list[dict[str, Any]]) -> dict[str, str]:
    """The data of the ConfigMap the Redis pods mount (its name carries a content hash)."""
    (vol,) = [v for v in statefulset(objs)["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    return one(objs, "ConfigMap", vol["configMap"]["name"])["data"]  # type: ignore[no-any-return]


def secret_password(objs: list[dict[str, Any]]) -> str:
    return base64.b64decode(one(objs, "Secret", NAME)["data"]["password"]).decode()


def pod_dns(i: int) -> str:
    return f"{NAME}-{i}.{NAME}.{NAMESPACE}.svc"


# --- the scheduler's URL ------------------------------------------------------------------------


def test_the_scheduler_asks_the_three_sentinels_with_the_secrets_password() -> None:
    objs = render(OVERLAY)
    assert one(objs, "Deployment", "slotsched-scheduler")["spec"]["replicas"] == 2
    c = scheduler(objs)
    env = env_of(c)
    password = secret_password(objs)
    url = expand(env["SLOTSCHED_STATE"]["value"], c, REDIS_PASSWORD=password)
    assert parse_state(url) == url  # what `slotsched serve` checks at start-up
    target = parse_target(url)
    assert target.mode == "sentinel" and not target.tls
    assert target.replicas >= 1, "an append must wait for a replica, or a failover can lose it"
    assert target.password == password and target.username is None
    assert target.sentinel_auth, "the sentinels require the password (requirepass)"
    sts, svc = statefulset(objs), one(objs, "Service", NAME)
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert ports == {"redis": 6379, "sentinel": 26379}
    # One host per pod's sentinel, by its stable DNS name: <pod>.<service>.<namespace>.svc.
    assert target.hosts == tuple((pod_dns(i), ports["sentinel"]) for i in range(3))
    assert target.master == "slotsched" and target.db == 0
    # The password comes from the Secret the Redis pods use, after SLOTSCHED_STATE's $(…) needs
    # it (Kubernetes expands only variables defined earlier), and never on the command line.
    names = [e["name"] for e in c["env"]]
    assert names.index("REDIS_PASSWORD") < names.index("SLOTSCHED_STATE")
    for ct in [
        *sts["spec"]["template"]["spec"]["initContainers"],
        container(sts, "redis"),
        container(sts, "sentinel"),
    ]:
        assert (
            env_of(ct)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
            == env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        )
        assert not any(
            password in a or "REDIS_PASSWORD" in a for a in ct.get("command", []) + ct.get("args", [])
        )
    assert not any("REDIS_PASSWORD" in a for a in c["args"])


def test_the_url_as_written_in_the_component_parses_with_a_generated_password() -> None:
    text = (
        Path(__file__).resolve().parents[1] / "deploy/components/redis-sentinel/kustomization.yaml"
    ).read_text()
    (value,) = re.findall(r'value: "(redis\+sentinel://[^"]+)"', text)
    password = "0123456789abcdef" * 4  # what `openssl rand -hex 32` prints
    target = parse_target(value.replace("$(REDIS_PASSWORD)", password))
    assert (target.mode, target.master, target.password, target.replicas) == (
        "sentinel",
        "slotsched",
        password,
        1,
    )
    assert [h for h, _ in target.hosts] == [pod_dns(i) for i in range(3)]
    assert password not in repr(target)  # what a start-up error or log line may show


def test_redis_pods_have_probes_resources_a_budget_and_persistent_volumes() -> None:
    objs = render(OVERLAY)
    sts = statefulset(objs)
    spec = sts["spec"]["template"]["spec"]
    for c in spec["containers"]:
        assert c["readinessProbe"] and c["livenessProbe"], c["name"]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], c["name"]
        assert c["lifecycle"]["preStop"]["exec"]["command"][:2] == ["sh", "/etc/redis/prestop.sh"]
    assert {c["name"] for c in spec["containers"]} == {"redis", "sentinel"}
    labels = sts["spec"]["template"]["metadata"]["labels"]
    budgets = [
        p
        for p in find(objs, "PodDisruptionBudget")
        if p["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ]
    assert len(budgets) == 1 and budgets[0]["spec"]["maxUnavailable"] == 1
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert {"name": "data", "mountPath": "/data"} in container(sts, "redis")["volumeMounts"]
    assert claim["metadata"]["name"] == "data"
    # The state alerts of components/redis apply unchanged (the scheduler's metrics).
    assert one(objs, "PrometheusRule", "slotsched-state")


def test_the_config_map_redis_conf_persists_every_write() -> None:
    conf = config_map(render(OVERLAY))["redis.conf"].splitlines()
    assert "appendonly yes" in conf and "appendfsync always" in conf and "dir /data" in conf


# --- the start-up scripts, on fake redis-cli and getent -------------------------------------------

FAKE_REDIS_CLI = r"""#!/bin/sh
# A peer's sentinel: $FAKE/sentinels/<host> holds its answer to get-master-addr-by-name; no file
# = not reachable. Answers only after $FAKE/after calls (a sentinel still starting).
echo "auth=${REDISCLI_AUTH:-} $*" >> "$FAKE/calls"
n=$(cat "$FAKE/count" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$FAKE/count"
host=127.0.0.1
while [ $# -gt 0 ]; do
  case $1 in -h) host=$2; shift 2 ;; -p) shift 2 ;; *) break ;; esac
done
if [ -f "$FAKE/after" ] && [ "$n" -le "$(cat "$FAKE/after")" ]; then exit 1; fi
case "$*" in
  "SENTINEL FAILOVER "*) cp "$FAKE/after-failover" "$FAKE/sentinels/$host"; echo OK; exit 0 ;;
esac
if [ -f "$FAKE/sentinels/$host" ]; then cat "$FAKE/sentinels/$host"; exit 0; fi
echo "Could not connect to Redis at $host:26379: Connection refused" >&2
exit 1
"""

FAKE_GETENT = r"""#!/bin/sh
n=$(cat "$FAKE/getent" 2>/dev/null || echo 0); echo $((n + 1)) > "$FAKE/getent"
[ "$n" -ge "${FAKE_RESOLVES_AFTER:-0}" ] && echo "10.0.0.1 $2"
"""

FAKE_REDIS_SERVER = r"""#!/bin/sh
echo "$*" > "$FAKE/exec"
"""


class Pod:
    """A pod's /data and /etc/redis in tmp_path, with fake peers, to run the ConfigMap's scripts."""

    def __init__(self, root: Path, shell: str, name: str = f"{NAME}-0") -> None:
        self.root, self.shell, self.name = root, shell, name
        self.data, self.etc, self.fake = root / "data", root / "etc", root / "fake"
        for d in (self.data, self.etc, self.fake / "sentinels", root / "bin"):
            d.mkdir(parents=True, exist_ok=True)
        for file, text in config_map(render(OVERLAY)).items():
            (self.etc / file).write_text(text, encoding="utf-8")
        for tool, text in (
            ("redis-cli", FAKE_REDIS_CLI),
            ("getent", FAKE_GETENT),
            ("redis-server", FAKE_REDIS_SERVER),
        ):
            path = root / "bin" / tool
            path.write_text(text, encoding="utf-8")
            path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def sentinel_says(self, peer: int, answer: str) -> None:
        (self.fake / "sentinels" / pod_dns(peer)).write_text(answer, encoding="utf-8")

    def run(
        self, script: str, *args: str, password: str = "pw", **env: str
    ) -> subprocess.CompletedProcess[str]:
        full = {
            "PATH": f"{self.root / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "FAKE": str(self.fake),
            "POD_NAME": self.name,
            "POD_NAMESPACE": NAMESPACE,
            "REDIS_PASSWORD": password,
            "DATA_DIR": str(self.data),
            "BASE_CONF": str(self.etc / "redis.conf"),
            "ASK_INTERVAL": "0",
            "ASK_ROUNDS": "2",
            **env,
        }
        return subprocess.run(
            [self.shell, str(self.etc / script), *args], env=full, capture_output=True, text=True, timeout=30
        )

    def init(self, **env: str) -> tuple[list[str], list[str]]:
        done = self.run("init.sh", **env)
        assert done.returncode == 0, done.stderr
        return (
            (self.data / "redis.conf").read_text().splitlines(),
            (self.data / "sentinel.conf").read_text().splitlines(),
        )


def replicaof(redis_conf: list[str]) -> str | None:
    found = [line.split()[1] for line in redis_conf if line.startswith("replicaof ")]
    assert len(found) <= 1
    return found[0] if found else None


def monitored(sentinel_conf: list[str]) -> str:
    (line,) = [x for x in sentinel_conf if x.startswith("sentinel monitor ")]
    _, _, master, host, port, quorum = line.split()
    assert (master, port, quorum) == ("slotsched", "6379", "2")
    return host


@pytest.mark.parametrize("shell", SHELLS)
def test_first_boot_pod_0_is_the_primary_and_everyone_announces_its_dns_name(
    shell: str, tmp_path: Path
) -> None:
    url_hosts = [h for h, _ in parse_target(_state_url()).hosts]
    for i in range(3):
        pod = Pod(tmp_path / str(i), shell, f"{NAME}-{i}")
        redis, sentinel = pod.init()
        assert replicaof(redis) == (None if i == 0 else pod_dns(0))
        assert monitored(sentinel) == pod_dns(0)
        # The base config, then the password for clients and for replication, and the name.
        assert {"appendonly yes", "appendfsync always"} <= set(redis)
        assert {'requirepass "pw"', 'masterauth "pw"', f"replica-announce-ip {pod_dns(i)}"} <= set(redis)
        # What this pod's sentinel announces is what the scheduler's URL asks.
        assert f"sentinel announce-ip {url_hosts[i]}" in sentinel
        assert {
            "port 26379",
            "sentinel resolve-hostnames yes",
            "sentinel announce-hostnames yes",
            'requirepass "pw"',
            'sentinel auth-pass slotsched "pw"',
            "sentinel down-after-milliseconds slotsched 5000",
        } <= set(sentinel)
        # resolve-hostnames must precede the monitor line that names a host.
        assert sentinel.index("sentinel resolve-hostnames yes") < sentinel.index(
            next(x for x in sentinel if x.startswith("sentinel monitor"))
        )
        calls = (pod.fake / "calls").read_text().splitlines()
        # Asked both peers (never itself), each round, with the password in REDISCLI_AUTH only.
        assert len(calls) == 4 and all(c.startswith("auth=pw ") and " pw" not in c[8:] for c in calls)
        assert not any(pod_dns(i) in c for c in calls)
        assert oct((pod.data / "redis.conf").stat().st_mode & 0o777) == "0o600"
        assert oct((pod.data / "sentinel.conf").stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("shell", SHELLS)
def test_a_restarted_pod_follows_the_primary_the_sentinels_name(shell: str, tmp_path: Path) -> None:
    # After a failover to pod 2 the old primary, pod 0, restarts: it must come back as a replica,
    # not as a second primary. A peer that answers nonsense (NOAUTH) is not counted.
    pod = Pod(tmp_path, shell)
    pod.sentinel_says(1, "NOAUTH Authentication required.\n")
    pod.sentinel_says(2, f"{pod_dns(2)}\n6379\n")
    (pod.data / "sentinel.conf").write_text(f"sentinel monitor slotsched {pod_dns(0)} 6379 2\n")
    redis, sentinel = pod.init()
    assert replicaof(redis) == pod_dns(2) and monitored(sentinel) == pod_dns(2)
    # ... and the one the sentinels name starts as the primary (restarted within down-after).
    pod.sentinel_says(1, f"{pod_dns(0)}\n6379\n")
    pod.sentinel_says(2, f"{pod_dns(0)}\n6379\n")
    redis, sentinel = pod.init()
    assert replicaof(redis) is None and monitored(sentinel) == pod_dns(0)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_majority_of_the_answering_sentinels_wins(shell: str, tmp_path: Path) -> None:
    pod = Pod(tmp_path / "a", shell, f"{NAME}-2")
    pod.sentinel_says(0, f"{pod_dns(1)}\n6379\n")
    pod.sentinel_says(1, f"{pod_dns(1)}\n6379\n")
    redis, _ = pod.init()
    assert replicaof(redis) == pod_dns(1)
    # Two of three peers against one (a StatefulSet of four; the script takes REDIS_PODS).
    pod = Pod(tmp_path / "four", shell, f"{NAME}-3")
    pod.sentinel_says(0, f"{pod_dns(2)}\n6379\n")
    pod.sentinel_says(1, f"{pod_dns(1)}\n6379\n")
    pod.sentinel_says(2, f"{pod_dns(1)}\n6379\n")
    redis, _ = pod.init(REDIS_PODS="4")
    assert replicaof(redis) == pod_dns(1)
    # A peer's sentinel that knows no master (nil) is no answer: the other one decides.
    pod = Pod(tmp_path / "b", shell, f"{NAME}-2")
    pod.sentinel_says(0, "\n")
    pod.sentinel_says(1, f"{pod_dns(1)}\n6379\n")
    redis, _ = pod.init()
    assert replicaof(redis) == pod_dns(1)


@pytest.mark.parametrize("shell", SHELLS)
def test_with_no_sentinel_up_a_pod_trusts_what_its_own_sentinel_last_knew(shell: str, tmp_path: Path) -> None:
    # Every pod restarts at once after a failover to pod 1: pod 0's volume remembers pod 1.
    pod = Pod(tmp_path, shell)
    (pod.data / "sentinel.conf").write_text(
        "\n".join(
            [
                "port 26379",
                'requirepass "old-password"',
                "user default on #0123 ~* &* +@all",
                f"sentinel monitor slotsched {pod_dns(1)} 6379 2",
                "sentinel myid 1b5a3b0d6a1e6b1d2f0b7c55b8a4c2b1d9e3f001",
                "sentinel config-epoch slotsched 3",
                "sentinel leader-epoch slotsched 3",
                "sentinel current-epoch 3",
                f"sentinel known-replica slotsched {pod_dns(0)} 6379",
                f"sentinel known-sentinel slotsched {pod_dns(2)} 26379 9f1c",
                "sentinel down-after-milliseconds slotsched 30000",
            ]
        )
        + "\n"
    )
    redis, sentinel = pod.init()
    assert replicaof(redis) == pod_dns(1) and monitored(sentinel) == pod_dns(1)
    # Its identity and what it learnt are kept, after the monitor line they refer to; the old
    # password and settings are not (a rotated password or a changed setting takes effect).
    monitor_at = sentinel.index(f"sentinel monitor slotsched {pod_dns(1)} 6379 2")
    for kept in (
        "sentinel myid ",
        "sentinel config-epoch ",
        "sentinel current-epoch ",
        "sentinel known-replica ",
    ):
        (line,) = [x for x in sentinel if x.startswith(kept)]
        assert sentinel.index(line) > monitor_at
    assert "old-password" not in "\n".join(sentinel) and not any(x.startswith("user ") for x in sentinel)
    assert [x for x in sentinel if "down-after" in x] == ["sentinel down-after-milliseconds slotsched 5000"]
    # The peers' sentinels, when they answer, win over the remembered primary.
    pod.sentinel_says(2, f"{pod_dns(2)}\n6379\n")
    redis, sentinel = pod.init()
    assert replicaof(redis) == pod_dns(2) and monitored(sentinel) == pod_dns(2)


@pytest.mark.parametrize("shell", SHELLS)
def test_a_pod_that_knows_nothing_waits_for_the_peers_before_it_picks_pod_0(
    shell: str, tmp_path: Path
) -> None:
    # Pod 0 lost its volume while all pods restarted: the peers' sentinels (which know pod 1) come
    # up after its first round of questions; it must not settle on itself.
    pod = Pod(tmp_path, shell)
    pod.sentinel_says(1, f"{pod_dns(1)}\n6379\n")
    pod.sentinel_says(2, f"{pod_dns(1)}\n6379\n")
    (pod.fake / "after").write_text("2")  # the first round's two questions go unanswered
    redis, _ = pod.init(ASK_ROUNDS="3")
    assert replicaof(redis) == pod_dns(1)
    # With the rounds used up, it does settle on pod 0 (a first boot).
    pod = Pod(tmp_path / "again", shell)
    (pod.fake / "after").write_text("100")
    redis, _ = pod.init(ASK_ROUNDS="3")
    assert replicaof(redis) is None
    assert len((pod.fake / "calls").read_text().splitlines()) == 6


@pytest.mark.parametrize("bad", ["pa ss", 'pa"ss', "pa@ss", "pa/ss"])
def test_a_password_that_is_not_url_safe_is_refused(bad: str, tmp_path: Path) -> None:
    pod = Pod(tmp_path, SHELLS[0])
    done = pod.run("init.sh", password=bad)
    assert done.returncode != 0 and "URL-safe" in done.stderr
    assert not (pod.data / "redis.conf").exists() and bad not in done.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_sentinel_waits_for_the_primarys_name_then_execs(shell: str, tmp_path: Path) -> None:
    pod = Pod(tmp_path, shell)
    pod.init()
    done = pod.run("sentinel.sh", FAKE_RESOLVES_AFTER="2", RESOLVE_WAIT_S="5")
    assert done.returncode == 0, done.stderr
    assert (pod.fake / "getent").read_text().strip() == "3"  # two misses, then resolved
    assert (pod.fake / "exec").read_text().split() == [str(pod.data / "sentinel.conf"), "--sentinel"]
    (pod.fake / "exec").unlink()
    (pod.fake / "getent").unlink()
    done = pod.run("sentinel.sh", FAKE_RESOLVES_AFTER="100", RESOLVE_WAIT_S="1")
    assert done.returncode != 0 and "does not resolve" in done.stderr
    assert not (pod.fake / "exec").exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_prestop_hands_the_primary_over_and_lets_a_replica_go(shell: str, tmp_path: Path) -> None:
    pod = Pod(tmp_path, shell)
    local = "127.0.0.1"  # the fake's host when no -h: this pod's own sentinel
    (pod.fake / "sentinels" / local).write_text(f"{pod_dns(1)}\n6379\n")
    done = pod.run("prestop.sh", "redis")
    assert done.returncode == 0 and "FAILOVER" not in (pod.fake / "calls").read_text()
    # This pod is the primary: the redis hook asks for a failover and returns once another is named.
    (pod.fake / "sentinels" / local).write_text(f"{pod_dns(0)}\n6379\n")
    (pod.fake / "after-failover").write_text(f"{pod_dns(2)}\n6379\n")
    done = pod.run("prestop.sh", "redis", HANDOVER_WAIT_S="5")
    assert done.returncode == 0, done.stderr
    calls = (pod.fake / "calls").read_text()
    assert "SENTINEL FAILOVER slotsched" in calls and "auth=pw" in calls
    # The sentinel hook never starts one; it waits (bounded) while this pod is still named.
    (pod.fake / "sentinels" / local).write_text(f"{pod_dns(0)}\n6379\n")
    (pod.fake / "calls").unlink()
    done = pod.run("prestop.sh", "sentinel", HANDOVER_WAIT_S="1")
    assert done.returncode == 0 and "FAILOVER" not in (pod.fake / "calls").read_text()


def _state_url() -> str:
    objs = render(OVERLAY)
    c = scheduler(objs)
    return expand(env_of(c)["SLOTSCHED_STATE"]["value"], c, REDIS_PASSWORD="pw")


# --- the written configs on real processes ------------------------------------------------------


def _loopback(lines: list[str], i: int, redis_ports: list[int], sentinel_ports: list[int], root: Path) -> str:
    """A pod's config on loopback: its DNS names become 127.0.0.1 and each node gets its own
    ports and directory; every other line is what init.sh wrote."""
    out = []
    for line in lines:
        words = line.split()
        if line == "dir /data":
            line = f"dir {root}\nport {redis_ports[i]}"
        elif line == "port 26379":
            line = f"port {sentinel_ports[i]}\ndir {root}"
        elif words[:1] == ["replicaof"] or words[:2] == ["sentinel", "monitor"]:
            j = [pod_dns(k) for k in range(3)].index(words[-3 if words[0] == "sentinel" else -2])
            line = line.replace(f"{pod_dns(j)} 6379", f"127.0.0.1 {redis_ports[j]}")
        out.append(re.sub(rf"{re.escape(NAME)}-\d\.{re.escape(NAME)}\.{NAMESPACE}\.svc", "127.0.0.1", line))
    return "\n".join([*out, "bind 127.0.0.1", ""])


def test_real_redis_and_sentinels_accept_the_written_configs(tmp_path: Path) -> None:
    """Three nodes and three sentinels on the configs init.sh writes at a first boot: the replicas
    sync (masterauth), the sentinels reach the quorum (auth-pass to the nodes, requirepass between
    themselves), every node fsyncs always, and the scheduler's client finds the primary through
    the sentinels with the URL's options."""
    import redis as redis_py

    from scheduler.state.redis_connect import connect
    from tests.redis_topology import REDIS_BIN, free_port, wait_for

    if not os.path.exists(REDIS_BIN):
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    redis_ports = [free_port() for _ in range(3)]
    sentinel_ports = [free_port() for _ in range(3)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(3):
            pod = Pod(tmp_path / f"pod{i}", SHELLS[0], f"{NAME}-{i}")
            redis_conf, sentinel_conf = pod.init()
            for kind, lines, args in (("redis", redis_conf, []), ("sentinel", sentinel_conf, ["--sentinel"])):
                root = tmp_path / f"{kind}{i}"
                root.mkdir()
                conf = root / f"{kind}.conf"
                conf.write_text(_loopback(lines, i, redis_ports, sentinel_ports, root), encoding="utf-8")
                procs.append(
                    subprocess.Popen(
                        [REDIS_BIN, str(conf), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    )
                )
        nodes = [redis_py.Redis(port=p, password="pw", decode_responses=True) for p in redis_ports]
        sentinels = [redis_py.Redis(port=p, password="pw", decode_responses=True) for p in sentinel_ports]
        wait_for("two replicas in sync", lambda: nodes[0].info("replication")["connected_slaves"] == 2, 30)
        for n in nodes:
            assert n.config_get("appendfsync") == {"appendfsync": "always"}
            assert n.config_get("appendonly") == {"appendonly": "yes"}
        for s in sentinels:
            wait_for(
                "the quorum",
                lambda s=s: s.execute_command("SENTINEL CKQUORUM slotsched").startswith("OK 3 "),
                30,
            )
        with pytest.raises(redis_py.AuthenticationError):
            redis_py.Redis(port=sentinel_ports[0], password="wrong").ping()
        url = _state_url()
        for i in range(3):
            url = url.replace(f"{pod_dns(i)}:26379", f"127.0.0.1:{sentinel_ports[i]}")
        target = parse_target(url)
        assert target.sentinel_auth and target.replicas == 1

        async def primary_port() -> int:
            client = connect(target, 5.0)
            try:
                await client.set("slotsched:probe", "1")
                assert await client.execute_command("WAIT", 1, 1000) >= 1
                return int((await client.connection_pool.get_master_address())[1])
            finally:
                await client.aclose()

        import asyncio

        assert asyncio.run(primary_port()) == redis_ports[0]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
