"""`--state` URLs (scheduler/state/redis_connect.py): what each form names, and every mistake
refused with a message that names `--state` and the mistake, never the password."""

from __future__ import annotations

import pytest

from scheduler.state.config import parse_state
from scheduler.state.redis_connect import RedisTarget, StateConfigError, connect, parse_target
from scheduler.state.redis_store import key_prefix

SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("redis://h:6379/0", RedisTarget("redis", False, (("h", 6379),))),
        ("redis://h", RedisTarget("redis", False, (("h", 6379),))),
        ("rediss://h:6380/2", RedisTarget("redis", True, (("h", 6380),), db=2)),
        (
            f"redis://user:{SECRET}@h:1/0",
            RedisTarget("redis", False, (("h", 1),), username="user", password=SECRET),
        ),
        (f"redis://:{SECRET}@h:1", RedisTarget("redis", False, (("h", 1),), password=SECRET)),
        (
            "redis://h:1/0?replicas=2&replica_timeout_ms=50",
            RedisTarget("redis", False, (("h", 1),), replicas=2, replica_timeout_ms=50),
        ),
        # Sentinel: the hosts are sentinels; WAIT for one replica unless told otherwise.
        (
            "redis+sentinel://s1:26379,s2:26380/mymaster",
            RedisTarget("sentinel", False, (("s1", 26379), ("s2", 26380)), master="mymaster", replicas=1),
        ),
        (
            "redis+sentinel://s1,s2/mymaster/3?replicas=0",
            RedisTarget("sentinel", False, (("s1", 26379), ("s2", 26379)), db=3, master="mymaster"),
        ),
        (
            f"rediss+sentinel://:{SECRET}@s1:1/m?sentinel_auth=1",
            RedisTarget(
                "sentinel", True, (("s1", 1),), master="m", password=SECRET, replicas=1, sentinel_auth=True
            ),
        ),
        # Cluster: start-up nodes; WAIT for one replica too (replicas=0 for a cluster without any).
        (
            "redis+cluster://n1:7000,n2:7001",
            RedisTarget("cluster", False, (("n1", 7000), ("n2", 7001)), replicas=1),
        ),
        ("rediss+cluster://n1:7000/0?replicas=0", RedisTarget("cluster", True, (("n1", 7000),))),
        ("redis+cluster://[::1]:7000", RedisTarget("cluster", False, (("::1", 7000),), replicas=1)),
    ],
)
def test_each_form_names_its_target(url: str, want: RedisTarget) -> None:
    assert parse_target(url) == want
    assert parse_state(url) == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://h:6379/0", "expected memory, redis://"),
        ("redis+etcd://h:1", "expected memory, redis://"),
        ("h:6379", "expected memory, redis://"),
        ("redis://", "no host"),
        ("redis:///0", "no host"),
        ("redis://h:port/0", "port of 'h:port' is not a number"),
        ("redis://h:0/0", "bad port"),
        ("redis://h:70000/0", "not a number from 1 to 65535"),
        ("redis://h:1/x", "database must be a number"),
        ("redis://h:1/0/1", "database must be a number"),
        ("redis://a:1,b:2/0", "several hosts: use redis+sentinel:// or redis+cluster://"),
        ("redis://h:1/0#frag", "no fragment"),
        ("redis://h:1/0?db=1", "unknown option 'db'"),
        ("redis://h:1/0?replicas=one", "replicas='one': expected a whole number"),
        ("redis://h:1/0?replicas=-1", "expected a whole number"),
        ("redis://h:1/0?replicas=1&replicas=2", "given twice"),
        ("redis://h:1/0?replica_timeout_ms=0", "replica_timeout_ms must be at least 1"),
        ("redis+sentinel://s1:1,s2:2", "no master name"),
        ("redis+sentinel://s1:1,s2:2/", "no master name"),
        ("redis+sentinel://s1:1/m/x", "database must be a number (redis+sentinel://…/MASTER/0)"),
        ("redis+sentinel://s1:1,/m", "no host in ''"),
        ("redis+sentinel://s1:1/m?sentinel_auth=2", "sentinel_auth is 0 or 1"),
        ("redis+cluster://n1:7000/1", "only database 0"),
        ("redis+cluster://n1:x", "port of 'n1:x' is not a number"),
    ],
)
def test_a_bad_url_names_the_flag_and_the_mistake(url: str, why: str) -> None:
    with pytest.raises(StateConfigError) as err:
        parse_state(url)
    assert str(err.value).startswith("--state "), err.value
    assert why in str(err.value), err.value


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@h:port/0",
        f"redis://user:{SECRET}@h:1/0?nope=1",
        f"redis+sentinel://:{SECRET}@s1:1,s2:2",
        f"rediss+cluster://u:{SECRET}@n1:7000/5",
        f"redis://u:{SECRET}@a:1,b:2/0",
    ],
)
def test_a_refused_url_never_shows_its_password(url: str) -> None:
    with pytest.raises(StateConfigError) as err:
        parse_state(url)
    assert SECRET not in str(err.value) and ":***@" in str(err.value), err.value


def test_a_target_repr_never_shows_its_password() -> None:
    target = parse_target(f"redis+sentinel://u:{SECRET}@s1:1/m")
    assert SECRET not in repr(target) and SECRET not in str(target)


@pytest.mark.parametrize(
    ("prefix", "mode", "want"),
    [
        ("slotsched", "redis", "slotsched"),  # the names deployments already hold state under
        ("slotsched", "sentinel", "slotsched"),
        ("slotsched", "cluster", "{slotsched}"),  # one hash tag: one slot for the whole pool
        ("team-a", "cluster", "{team-a}"),
    ],
)
def test_keys_are_hash_tagged_in_cluster_mode_only(prefix: str, mode: str, want: str) -> None:
    assert key_prefix(prefix, mode) == want  # type: ignore[arg-type]


@pytest.mark.parametrize(("prefix", "why"), [("a{b}", "no braces"), ("", "empty")])
def test_a_cluster_prefix_that_cannot_be_a_hash_tag_is_refused(prefix: str, why: str) -> None:
    with pytest.raises(StateConfigError, match=f"--state-prefix.*{why}"):
        key_prefix(prefix, "cluster")


def test_each_form_builds_its_client_with_the_urls_credentials_and_database() -> None:
    # No network: redis-py connects lazily. What each client would send, and where.
    target = parse_target(f"rediss+sentinel://u:{SECRET}@s1:1,s2:2/m/3?sentinel_auth=1")
    pool = connect(target, 0.5).connection_pool
    assert pool.connection_class.__name__ == "SentinelManagedSSLConnection"
    kw = pool.connection_kwargs
    assert (kw["db"], kw["username"], kw["password"], kw["socket_timeout"]) == (3, "u", SECRET, 0.5)
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["password"] for s in sentinels] == [SECRET, SECRET]
    # Without sentinel_auth the sentinels get no credentials (most run without requirepass).
    plain = connect(parse_target(f"redis+sentinel://u:{SECRET}@s1:1/m"), 0.5).connection_pool
    assert [
        s.connection_pool.connection_kwargs.get("password") for s in plain.sentinel_manager.sentinels
    ] == [None]
    cluster = connect(parse_target(f"redis+cluster://u:{SECRET}@n1:7000,n2:7001"), 0.5)
    assert sorted((n.host, n.port) for n in cluster.nodes_manager.startup_nodes.values()) == [
        ("n1", 7000),
        ("n2", 7001),
    ]
    assert cluster.connection_kwargs["password"] == SECRET
    one = connect(parse_target(f"rediss://u:{SECRET}@h:1/2"), 0.5).connection_pool
    assert one.connection_class.__name__ == "SSLConnection" and one.connection_kwargs["db"] == 2
