"""Replicas converge on the journal, whatever the snapshots and failovers (a property, over a real
redis-server): a leader under random churn snapshots every 3 entries (so the journal is trimmed
all the time, also past a standby that paused reading), is crashed mid-churn; its hot standby takes over
and a new standby starts. After each phase the leader's state must equal the state rebuilt by
replaying the *whole* journal from the start (read back from Redis's AOF, which keeps the
trimmed entries), and the standby's must equal the leader's.

This is the oracle that settled bench/failover.py's "double grant" and StaleLease reports: the
replicas never diverged (the journal of those runs grants exactly what the clients were told);
the reports came from the bench's bookkeeping and from the SDK's release while detached (see
tests/test_client_release_detached.py).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from scheduler.core.types import Acquire, QoS, Release, Renew, SessionId, TenantName, Tick, Yield
from scheduler.dispatch import spec_of
from scheduler.grants import GrantKeyring
from scheduler.policy.yaml_io import parse_policy
from scheduler.serve import RunningServer, StateOptions, start_server
from scheduler.server.loop import SchedulerLoop
from scheduler.server.registry import WorkerRegistry
from scheduler.state import codec, state_write
from tests.grpc_fixtures import policy_yaml, write_policy
from tests.test_hot_standby import crash, replica_of
from tests.test_state_redis import REDIS_BIN, RedisProc

pytestmark = pytest.mark.skipif(
    not Path(REDIS_BIN).exists() and not __import__("os").environ.get("CI"),
    reason="redis-server not installed",
)


def _commands(data: bytes) -> list[list[bytes]]:
    """The commands of an AOF (RESP arrays of bulk strings)."""
    out, i = [], 0
    while i < len(data):
        j = data.index(b"\r\n", i)
        argc, i = int(data[i + 1 : j]), j + 2
        args = []
        for _ in range(argc):
            j = data.index(b"\r\n", i)
            n, i = int(data[i + 1 : j]), j + 2
            args.append(data[i : i + n])
            i += n + 2
        out.append(args)
    return out


def journal_state(directory: str, policy_text: str) -> tuple[state_write.State, int]:
    """The state the whole journal rebuilds from an empty core, and its length: every XADD to it
    in the AOF (Redis 7 writes a script's effects), trimmed or not."""
    files = sorted(Path(directory).glob("appendonlydir/*.incr.aof")) or [Path(directory) / "appendonly.aof"]
    policy, _ = parse_policy(policy_text)
    loop = SchedulerLoop(policy)
    loop.begin_shutdown()
    registry = WorkerRegistry(loop, 5.0)
    last, n = float("-inf"), 0
    for args in _commands(b"".join(f.read_bytes() for f in files)):
        if args[0].upper() == b"XADD" and args[1].endswith(b":journal"):
            for rec, at, x in codec.decode_entry(args[4]):  # an entry is a batch (codec.pack)
                decisions = loop.replay(rec, at, x)
                if spec_of(rec).membership:
                    registry.replay(rec, decisions, at, dict(x.labels), x.static)  # type: ignore[arg-type]
                last, n = max(last, at), n + 1
    return state_write.State(loop.export_state(), registry.workers, last), n


def doc(state: state_write.State) -> Any:
    """A state as its snapshot document, less what is wall-clock bookkeeping of the registry
    (a take-over refreshes every heartbeat; registration time is read apart from the event's)."""
    d = orjson.loads(state_write.state_bytes(state))
    d["last_now"] = None
    for w in d["workers"]:
        w.pop("last_heartbeat")
        w.pop("registered_at")
    d["workers"].sort(key=lambda w: w["worker_id"])
    return d


def state_of(s: RunningServer) -> Any:
    return doc(state_write.State(s.loop.export_state(), s.registry.workers, 0.0))


async def churn(loop: SchedulerLoop, rng: random.Random, n: int, tag: str) -> None:
    """Random events on the leader's loop, as its handlers submit them (each one journaled)."""
    mine: list[SessionId] = []
    for i in range(n):
        core, r = loop.core, rng.random()
        views = [v for v in (core.session(s) for s in mine) if v is not None]
        held = [v.lease for v in views if v.lease is not None]
        queued = [v.session for v in views if v.lease is None]
        if r < 0.35 or not mine:
            sid = SessionId(f"acme/{tag}-{i}")
            mine.append(sid)
            loop.submit(Acquire(sid, TenantName("acme"), rng.choice(list(QoS)), None))
        elif r < 0.6 and held:
            lease = rng.choice(held)
            loop.submit(Release(lease.session, lease.lease_id, lease.epoch))
        elif r < 0.72 and held:
            lease = rng.choice(held)
            loop.submit(Renew(lease.session, lease.lease_id, lease.epoch))
        elif r < 0.84 and held:
            lease = rng.choice(held)
            loop.submit(Yield(lease.session, lease.lease_id, lease.epoch, None))
        elif r < 0.92 and queued:
            loop.submit(Release(rng.choice(queued), None, 0))
        else:
            loop.submit(Tick())
        if rng.random() < 0.3:  # let batches, snapshots and the standby's reads interleave
            await asyncio.sleep(rng.choice((0.0, 0.0, 0.001, 0.004)))


async def caught_up(r: RedisProc, standby: RunningServer, timeout: float = 20) -> None:
    """Until the standby's core is at the journal's last entry (or at the snapshot, if the
    journal was trimmed to nothing)."""
    rc = redis.asyncio.Redis(port=r.port)
    try:
        deadline = time.monotonic() + timeout
        while True:
            last = await rc.xrevrange("slotsched:journal", count=1)
            want: Any = last[0][0] if last else await rc.hget("slotsched:snapshot", "stream_id")
            if want is not None and replica_of(standby)._pos == want.decode():
                return
            assert time.monotonic() < deadline, (replica_of(standby)._pos, want)
            await asyncio.sleep(0.02)
    finally:
        await rc.aclose()


@pytest.mark.parametrize("seed", [1, 2])
def test_leader_and_standby_equal_the_whole_journal_across_snapshots_and_failovers(seed: int) -> None:
    rng = random.Random(seed)
    text = policy_yaml(workers=2, slots_per_worker=2, floor=0, lease_ttl_s=30)

    async def body(d: str, r: RedisProc) -> None:
        path, keys = write_policy(d, text), GrantKeyring.generate()
        servers: list[RunningServer] = []

        async def replica(i: int) -> RunningServer:
            state = StateOptions(state=r.url, replica_id=f"r{i}", leader_ttl_s=1.0, snapshot_every=3)
            s = await start_server(path, "127.0.0.1:0", None, state=state, grant_keys=keys)
            replica_of(s).snapshot_ratio = 0.0  # every 3 entries, however big the state
            replica_of(s).snapshot_duty = 0.0  # ... and however little time passed
            servers.append(s)
            return s

        try:
            leader, standby = await replica(0), await replica(1)
            for phase in range(3):
                await churn(leader.loop, rng, 80, f"p{phase}")
                # The standby stops reading for a while: the journal is trimmed past it.
                await replica_of(standby)._stop_following()
                await churn(leader.loop, rng, 40, f"q{phase}")
                replica_of(standby)._ensure_following()
                await churn(leader.loop, rng, 80, f"r{phase}")
                leader.loop.close()  # no Tick of its own while we compare
                await leader.loop.durable()
                await caught_up(r, standby)
                want, n = journal_state(d, text)
                assert state_of(leader) == doc(want), f"phase {phase}: the leader is not its journal ({n})"
                assert state_of(standby) == state_of(leader), f"phase {phase}: the standby diverged"
                # Crash mid-churn: batches and a snapshot in flight, the standby mid-read.
                task = asyncio.create_task(churn(leader.loop, rng, 100_000, f"c{phase}"))
                await asyncio.sleep(rng.uniform(0.05, 0.4))
                task.cancel()
                await crash(leader)
                leader.loop.close()
                leader.loop.shutting_down = True  # the dead process applies nothing more
                deadline = time.monotonic() + 20
                while replica_of(standby).last_takeover is None:
                    assert time.monotonic() < deadline, "the standby did not take over"
                    await asyncio.sleep(0.02)
                assert replica_of(standby).last_takeover.hot
                leader, standby = standby, await replica(phase + 2)
        finally:
            for s in servers:
                await s.stop(0)

    with tempfile.TemporaryDirectory(prefix="slotsched-conv-") as d:
        r = RedisProc(d).start()
        try:
            asyncio.run(body(d, r))
        finally:
            r.kill()
