"""`--state` URLs and the Redis client each names: one Redis, Sentinel, or Cluster.

    memory
    redis://[[USER]:PASSWORD@]HOST:PORT[/DB][?OPTIONS]
    redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT…]/MASTER[/DB][?OPTIONS]
    redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT…][?OPTIONS]

`rediss` in place of `redis` (`rediss://`, `rediss+sentinel://`, `rediss+cluster://`) speaks TLS
to every node (and, with Sentinel, to the sentinels). With Sentinel the hosts are sentinels and
MASTER is the name they monitor; the client asks them for the primary whenever it (re)connects,
so after a failover the next connection reaches the promoted replica. With Cluster the hosts are
start-up nodes (any one suffices); a Cluster has only database 0.

OPTIONS (`&`-separated):

| option | default | meaning |
| --- | --- | --- |
| `replicas=N` | 1 (Sentinel, Cluster), else 0 | an append is acknowledged once N replicas hold it (WAIT) |
| `replica_timeout_ms=MS` | 500 | how long an append waits for them; not in time = the append failed |
| `sentinel_auth=1` | off | send the URL's credentials to the sentinels too (`requirepass` on them) |

Why `replicas`: Redis replicates asynchronously, so a failover may promote a replica that lacks
the last writes the primary acknowledged; a lease granted in them would be lost. With
`replicas=N` the scheduler tells nobody about an event before N replicas have it; an append not
confirmed in time fails like any append (the replica steps down, callers get UNAVAILABLE with
retry-after). Sentinel promotes the most up-to-date eligible replica, so a promotion keeps every
acknowledged event; a Cluster's replicas start their election earlier the more up to date they
are, which usually (not always) promotes the most up-to-date one: `replicas` equal to the number
of replicas per primary closes that gap, at the cost of refusing appends while one is down.
Plain `redis://` defaults to 0: a replica there is promoted by hand, after the schedulers stop.

Errors name `--state` and what is wrong; they never show the password.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, RedisClusterException

from scheduler.state.config import FORMS, StateConfigError, redact

Mode = Literal["redis", "sentinel", "cluster"]

_SCHEMES: dict[str, tuple[Mode, bool]] = {
    "redis": ("redis", False),
    "rediss": ("redis", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
_OPTIONS = ("replicas", "replica_timeout_ms", "sentinel_auth")


@dataclass(frozen=True)
class RedisTarget:
    """What a `--state` Redis URL names. `repr` hides the password."""

    mode: Mode
    tls: bool
    hosts: tuple[tuple[str, int], ...]
    db: int = 0
    master: str | None = None  # sentinel: the monitored name
    username: str | None = None
    password: str | None = None
    replicas: int = 0  # WAIT for this many replicas after every journal append; 0 = off
    replica_timeout_ms: int = 500
    sentinel_auth: bool = False

    def __repr__(self) -> str:
        hosts = ",".join(f"{h}:{p}" for h, p in self.hosts)
        return (
            f"RedisTarget({self.mode}, {hosts}, master={self.master}, db={self.db}, replicas={self.replicas})"
        )


def parse_target(value: str) -> RedisTarget:
    """The target a Redis `--state` URL names. Raises StateConfigError naming what is wrong."""
    text = value.strip()

    def bad(why: str) -> StateConfigError:
        return StateConfigError(f"--state {redact(text)!r}: {why}")

    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise bad(f"expected {FORMS}")
    mode, tls = _SCHEMES[scheme.lower()]
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise bad("no fragment allowed")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(pw) if colon else None
    hosts = _hosts(hostlist, mode, bad)
    parts = [p for p in path.split("/")] if path else []
    master: str | None = None
    if mode == "sentinel":
        if not parts or not parts[0]:
            raise bad("no master name (redis+sentinel://HOST:PORT,…/MASTER[/DB])")
        master = urllib.parse.unquote(parts.pop(0))
    db = 0
    if parts:
        if len(parts) > 1 or not parts[0].isdigit():
            where = "redis+sentinel://…/MASTER/0" if mode == "sentinel" else "redis://HOST:PORT/0"
            raise bad(f"the database must be a number ({where})")
        db = int(parts[0])
        if mode == "cluster" and db != 0:
            raise bad("a Redis Cluster has only database 0")
    opts = _options(query, bad)
    replicas = opts.get("replicas", 0 if mode == "redis" else 1)
    return RedisTarget(
        mode,
        tls,
        hosts,
        db,
        master,
        username,
        password,
        replicas=replicas,
        replica_timeout_ms=opts.get("replica_timeout_ms", 500),
        sentinel_auth=bool(opts.get("sentinel_auth", 0)),
    )


def _hosts(text: str, mode: Mode, bad: Any) -> tuple[tuple[str, int], ...]:
    if not text:
        raise bad("no host")
    items = text.split(",")
    if mode == "redis" and len(items) > 1:
        raise bad("several hosts: use redis+sentinel:// or redis+cluster://")
    out: list[tuple[str, int]] = []
    for item in items:
        u = urllib.parse.urlsplit(f"//{item}")
        try:
            port = u.port
        except ValueError:
            raise bad(f"the port of {item!r} is not a number from 1 to 65535") from None
        if not u.hostname:
            raise bad(f"no host in {item!r}")
        if port == 0:
            raise bad(f"bad port in {item!r}")
        out.append((u.hostname, port or (26379 if mode == "sentinel" else 6379)))
    return tuple(out)


def _options(query: str, bad: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, raw in urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if name not in _OPTIONS:
            raise bad(f"unknown option {name!r} (known: {', '.join(_OPTIONS)})")
        if name in out:
            raise bad(f"option {name!r} given twice")
        if not raw.isdigit():
            raise bad(f"option {name}={raw!r}: expected a whole number")
        out[name] = int(raw)
    if out.get("replica_timeout_ms", 1) < 1:
        raise bad("replica_timeout_ms must be at least 1 (0 would wait forever)")
    if out.get("sentinel_auth", 0) > 1:
        raise bad("sentinel_auth is 0 or 1")
    return out


class _Cluster(RedisCluster):
    """RedisCluster whose topology errors (a slot not covered while the cluster fails over) are
    RedisErrors, like every other failure the replica handles by stepping down and retrying."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except RedisClusterException as e:
            raise ConnectionError(f"redis cluster: {e}") from e


def connect(target: RedisTarget, timeout_s: float) -> Any:
    """A redis.asyncio client for `target`: no retries of its own (the replica decides what a
    failure means: it steps down and campaigns again), calls bounded by `timeout_s`."""
    common: dict[str, Any] = {
        "username": target.username,
        "password": target.password,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
    }
    if target.mode == "cluster":
        nodes = [ClusterNode(h, p) for h, p in target.hosts]
        # A failed node's slots move to its replica: one refresh of the slot map then the call
        # fails; the replica steps down and its next campaign reaches the promoted node.
        return _Cluster(startup_nodes=nodes, ssl=target.tls, retry=Retry(NoBackoff(), 1), **common)
    retry = Retry(NoBackoff(), 0)
    if target.mode == "sentinel":
        assert target.master is not None
        auth = {"username": target.username, "password": target.password} if target.sentinel_auth else {}
        sentinel_kwargs: dict[str, Any] = {
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "ssl": target.tls,
            "retry": Retry(NoBackoff(), 0),  # a dead sentinel: ask the next one at once
            **auth,
        }
        # Typed in redis-py 8, untyped before: called through Any so mypy passes on both.
        make_sentinel: Any = Sentinel
        hosts = list(target.hosts)
        sentinel = make_sentinel(hosts, sentinel_kwargs=sentinel_kwargs, ssl=target.tls, **common)
        return sentinel.master_for(target.master, redis_class=Redis, db=target.db, retry=retry)
    host, port = target.hosts[0]
    return Redis(host=host, port=port, db=target.db, ssl=target.tls, retry=retry, **common)
