"""How long a Redis primary failure takes out the scheduler: Sentinel and Cluster on loopback.

For each topology (Sentinel: primary + 2 replicas + 3 sentinels, down-after 500 ms; Cluster:
3 primaries with 2 replicas each, node-timeout 1000 ms; both WAIT for one replica, the default)
an in-process scheduler (leader TTL 2 s) grants a
lease, then the Redis primary holding the pool's keys is SIGKILLed. Measured from the kill:

* `promoted` — Redis named the new primary (Sentinel's answer, the Cluster's slot map changed);
* `down` — the scheduler noticed and stepped down (its next lease renewal or append failed);
* `serving` — it leads again on the promoted replica (state recovered, outage bridged);
* `acquire` — a new session's Acquire is granted;

and checked: the holder's lease (id, epoch) is the same after the failover. First, the cost of
`replicas=1`: the latency of one journal append (one record, the fenced script) on the Sentinel
set without and with `WAIT` for a replica.

    python bench/redis_failover.py [--rounds N]

The last line is key=value pairs (medians over the rounds, in seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2  # noqa: E402
from scheduler.grants import GrantKeyring  # noqa: E402
from scheduler.serve import StateOptions, start_server  # noqa: E402
from scheduler.state.redis_store import RedisStore  # noqa: E402
from tests.grpc_fixtures import TOKENS, Client, policy_yaml, write_policy  # noqa: E402
from tests.redis_topology import ClusterSet, SentinelSet  # noqa: E402

TTL_S = 2.0


async def granted(c: Client, session: str) -> common_pb2.Lease:
    call = c.acquire(session, common_pb2.QOS_CLASS_BURSTABLE)
    first = await asyncio.wait_for(call.read(), 30)
    call.cancel()
    assert first.WhichOneof("event") == "granted", first
    lease: common_pb2.Lease = first.granted.lease
    return lease


async def until(check: Any, timeout: float = 30.0) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("timed out")
        await asyncio.sleep(0.01)
    return time.monotonic()


def promoted_at(topo: SentinelSet | ClusterSet, old_port: int) -> float:
    """When Redis itself names a primary other than `old_port` for the pool's keys."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if isinstance(topo, SentinelSet):
                if topo.current_primary_port() != old_port:
                    return time.monotonic()
            else:
                live = next(n for n in topo.nodes if n.port != old_port).client()
                slot = live.cluster("keyslot", "{slotsched}:leader")
                owner = next(
                    r[2][1] for r in live.execute_command("CLUSTER", "SLOTS") if r[0] <= slot <= r[1]
                )
                if int(owner) != old_port:
                    return time.monotonic()
        except (redis.RedisError, OSError, AssertionError):
            pass
        time.sleep(0.01)
    raise TimeoutError("no promotion")


async def one_round(kind: str, root: str) -> dict[str, float]:
    topo: SentinelSet | ClusterSet
    topo = SentinelSet(root, replicas=2) if kind == "sentinel" else ClusterSet(root, 3, 2)
    try:
        await asyncio.to_thread(topo.start)
        policy = write_policy(root, policy_yaml(workers=2, slots_per_worker=1, floor=0, lease_ttl_s=5))
        state = StateOptions(state=topo.url(), replica_id="a", leader_ttl_s=TTL_S)
        running = await start_server(
            policy, "127.0.0.1:0", None, state=state, grant_keys=GrantKeyring.generate()
        )
        replica = running.replica
        assert replica is not None and replica.serving
        try:
            async with Client(running.target, token=TOKENS["acme"]) as c:
                held = await granted(c, "holder")
                if isinstance(topo, SentinelSet):
                    victim = topo.primary
                else:
                    probe = topo.nodes[0].client()
                    slot = probe.cluster("keyslot", "{slotsched}:leader")
                    victim = next(
                        n
                        for n in topo.nodes
                        if n.client().info("replication")["role"] == "master"
                        and n.client().cluster("countkeysinslot", slot) > 0
                    )
                t0 = time.monotonic()
                victim.kill()
                promoted_task = asyncio.create_task(asyncio.to_thread(promoted_at, topo, victim.port))
                down = await until(lambda: not replica.serving)
                serving = await until(lambda: replica.serving)
                while True:  # UNAVAILABLE until the new term's first batch is in
                    try:
                        await granted(c, "newcomer")
                        break
                    except Exception:
                        await asyncio.sleep(0.02)
                acquired = time.monotonic()
                view = await c.scheduler.GetSession(
                    scheduler_pb2.GetSessionRequest(session_id="holder"), metadata=c.md, timeout=5
                )
                assert (view.lease.lease_id, view.lease.epoch) == (held.lease_id, held.epoch), "lease lost"
                promoted = await promoted_task
                return {
                    "promoted": promoted - t0,
                    "down": down - t0,
                    "serving": serving - t0,
                    "acquire": acquired - t0,
                }
        finally:
            await running.stop(0)
    finally:
        topo.close()


async def append_latency(url: str, n: int = 500) -> float:
    """Median seconds of one fenced journal append of one record."""
    store = RedisStore(url, f"bench-{url[-1]}", "r")  # a pool of its own per run
    try:
        assert await store.try_lead(30.0)
        took = []
        for _ in range(n):
            t0 = time.perf_counter()
            await store.append([b'{"bench":1}'], store.token)
            took.append(time.perf_counter() - t0)
        return statistics.median(took)
    finally:
        await store.close()


def wait_cost() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="slotsched-bench-wait-") as d:
        topo = SentinelSet(d, replicas=1, sentinels=1).start()
        try:
            no_wait = asyncio.run(append_latency(topo.url("?replicas=0")))
            with_wait = asyncio.run(append_latency(topo.url("?replicas=1")))
        finally:
            topo.close()
    print(f"append p50: replicas=0 {no_wait * 1e3:.3f} ms, replicas=1 {with_wait * 1e3:.3f} ms", flush=True)
    return {"append_p50_ms_replicas0": no_wait * 1e3, "append_p50_ms_replicas1": with_wait * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    out: dict[str, float] = wait_cost()
    for kind in ("sentinel", "cluster"):
        rows = []
        for i in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix=f"slotsched-bench-{kind}-") as d:
                row = asyncio.run(one_round(kind, d))
            rows.append(row)
            print(f"{kind} round {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in row.items()), flush=True)
        for key in ("promoted", "down", "serving", "acquire"):
            out[f"{kind}_{key}_s"] = statistics.median(r[key] for r in rows)
        out[f"{kind}_max_acquire_s"] = max(r["acquire"] for r in rows)
    print(f"leader_ttl_s={TTL_S} rounds={args.rounds} " + " ".join(f"{k}={v:.2f}" for k, v in out.items()))


if __name__ == "__main__":
    main()
