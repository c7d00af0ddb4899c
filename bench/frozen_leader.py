"""A frozen leader (SIGSTOP, not a crash): how soon after the hot standby serves does the SDK
carry on there?

A SIGKILLed leader's connections are reset at once; a frozen one's stay open (the kernel still
ACKs) and simply never answer, so a client notices only through its own bounds: gRPC keepalive
and the channel's silence bound (scheduler/client/channel.py). Each run, on one redis-server of
our own and two `slotsched serve --state redis://…` replicas (leader TTL `--leader-ttl`), the SDK
(given both addresses) holds `--holders` leases; then the leader gets SIGSTOP for `--freeze` s
and, at that moment, half the holders release and a new session starts. Measured from the moment
the standby's gRPC health says SERVING:

* **release_ms**: the slowest of those Releases to complete (each must end "released");
* **new_session_ms**: the session started at the freeze gets its grant;
* **late_session_ms**: a session started once the standby serves gets its grant;
* **reattach_ms**: the slowest of the other holders to re-attach, lease id and epoch kept;
* **failed**: what did not happen (a release, a grant, a re-attach failed; a lease lost).

Then SIGCONT: the old leader finds its lease taken and steps down, to serve as the next run's
standby.

    PYTHONPATH=. python bench/frozen_leader.py [--runs 3] [--freeze 12] [--no-multiplex]

Progress goes to stderr; the last line is `key=value` pairs (the max over runs, and p50).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from grpc_health.v1 import health_pb2  # noqa: E402
from standby_failover import Replica  # noqa: E402

from scheduler.client import AsyncClient, AsyncSession, QoS  # noqa: E402
from scheduler.policy.identities import hash_token  # noqa: E402

TOKEN = "frozen-bench-token"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def policy_text(slots: int) -> str:
    return (
        "apiVersion: slotsched.dev/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: frozen}\n"
        f"spec:\n  pool: {{slotsPerWorker: {slots}, workers: 1, floor: 0}}\n"
        "  timing: {leaseTTLSeconds: 30}\n"
        "  tenants:\n    - name: bench\n"
        f"      burstable: {{nominal: {slots}, limit: {slots}}}\n"
        f'      tokens: ["{hash_token(TOKEN)}"]\n'
    )


async def _serving(replica: Replica, since: float, timeout_s: float = 30.0) -> float:
    """The moment (monotonic) `replica`'s health first says SERVING, polled every 20 ms."""
    while replica.health() != SERVING:
        if time.monotonic() - since > timeout_s:
            raise RuntimeError(f"{replica.name} did not serve within {timeout_s} s")
        await asyncio.sleep(0.02)
    return time.monotonic()


FAILED: list[str] = []  # what failed, over all runs (a failure's time still counts)


async def _timed(what: str, coro: object) -> float:
    try:
        await coro  # type: ignore[misc]
    except Exception as e:
        FAILED.append(f"{what}: {e}")
        say(f"FAILED {what}: {e}")
    return time.monotonic()


async def one_run(
    client: AsyncClient,
    leader: Replica,
    standby: Replica,
    holders: list[AsyncSession],
    k: int,
    freeze_s: float,
) -> dict[str, float]:
    assert leader.proc is not None
    half = len(holders) // 2
    leaving, staying = holders[:half], holders[half:]
    kept = {s.session_id: (s.lease_id, s.epoch) for s in staying}
    reattaches = {s.session_id: s.reattaches for s in staying}
    t0 = time.monotonic()
    leader.proc.send_signal(signal.SIGSTOP)
    releases = [asyncio.create_task(_timed(f"release {s.session_id}", s.release())) for s in leaving]
    fresh = client.session(f"fresh{k}", QoS.BURSTABLE)
    fresh_done = asyncio.create_task(_timed(fresh.session_id, fresh.wait_granted(60)))
    serving = await _serving(standby, t0)
    say(f"run {k + 1}: the standby serves {serving - t0:.2f} s after the freeze")
    late = client.session(f"late{k}", QoS.BURSTABLE)
    late_done = asyncio.create_task(_timed(late.session_id, late.wait_granted(60)))

    async def reattached(s: AsyncSession) -> None:
        await s.wait_until(lambda s: s.reattaches > reattaches[s.session_id] and s.lease is not None, 60)

    back = [asyncio.create_task(_timed(f"re-attach {s.session_id}", reattached(s))) for s in staying]
    try:
        released_at = await asyncio.gather(*releases)
        fresh_at, late_at = await fresh_done, await late_done
        back_at = await asyncio.gather(*back)
    finally:
        wait = t0 + freeze_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        leader.proc.send_signal(signal.SIGCONT)
    FAILED.extend(f"not released: {s.session_id}" for s in leaving if s.end_reason != "released")
    FAILED.extend(
        f"lease lost: {s.session_id}"
        for s in staying
        if (s.lease_id, s.epoch) != kept[s.session_id] or s.lost_lease.is_set()
    )
    await asyncio.to_thread(leader.wait_health, NOT_SERVING)  # stepped down: the next standby
    for s in (fresh, late):
        await s.aclose()
    for i, s in enumerate(leaving):  # the holders that left come back for the next run
        holders[i] = client.session(f"{s.session_id.split('.')[0]}.{k + 1}", QoS.BURSTABLE)
        await holders[i].wait_granted(10)
    out = {
        "standby_serves_ms": (serving - t0) * 1000,
        "release_ms": (max(released_at) - serving) * 1000,
        "new_session_ms": (fresh_at - serving) * 1000,
        "late_session_ms": (late_at - serving) * 1000,
        "reattach_ms": (max(back_at) - serving) * 1000,
    }
    say(f"run {k + 1}: after the standby serves: " + " ".join(f"{n}={v:.0f}" for n, v in out.items()))
    return out


async def run(
    runs: int, freeze_s: float, leader_ttl_s: float, holders_n: int, multiplex: bool
) -> dict[str, object]:
    redis_bin = shutil.which("redis-server") or "/usr/bin/redis-server"
    with tempfile.TemporaryDirectory(prefix="slotsched-frozen-") as d:
        from procs import free_port

        rport = free_port()
        redis_args = [redis_bin, "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--dir", d]
        redis_args += ["--appendonly", "yes", "--appendfsync", "always"]
        redis = subprocess.Popen(redis_args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        policy = os.path.join(d, "policy.yaml")
        Path(policy).write_text(policy_text(holders_n + 2))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SLOTSCHED_AUTOSCALER": "off"}
        env["SLOTSCHED_GRANT_KEYS"] = f"k1:{base64.b64encode(os.urandom(32)).decode()}"
        state = f"redis://127.0.0.1:{rport}/0"
        reps = [Replica(policy, state, n, leader_ttl_s, env) for n in ("a", "b")]
        rows: list[dict[str, float]] = []
        try:
            time.sleep(0.3)
            reps[0].start()
            await asyncio.to_thread(reps[0].wait_health, SERVING)
            reps[1].start()
            await asyncio.to_thread(reps[1].wait_health, NOT_SERVING)
            leader, standby = reps
            targets = [r.target for r in reps]
            async with AsyncClient(
                targets, token=TOKEN, reattach_timeout_s=60, multiplex=multiplex
            ) as client:
                holders = [client.session(f"h{i}", QoS.BURSTABLE) for i in range(holders_n)]
                for s in holders:
                    await s.wait_granted(10)
                for k in range(runs):
                    await asyncio.sleep(1.0)  # the standby is following: nothing special about the moment
                    rows.append(await one_run(client, leader, standby, holders, k, freeze_s))
                    leader, standby = standby, leader
                for s in holders:
                    await s.release()
        finally:
            for r in reps:
                r.kill()
            redis.kill()
            redis.wait(10)
    out: dict[str, object] = {"runs": runs, "freeze_s": freeze_s, "leader_ttl_s": leader_ttl_s}
    out["multiplex"] = multiplex
    for key in rows[0]:
        values = [r[key] for r in rows]
        out[f"{key}_p50"] = round(statistics.median(values))
        out[f"{key}_max"] = round(max(values))
    out["failed"] = len(FAILED)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--freeze", type=float, default=12.0, help="seconds the leader stays stopped")
    p.add_argument("--leader-ttl", type=float, default=1.0)
    p.add_argument("--holders", type=int, default=8)
    p.add_argument("--no-multiplex", action="store_true", help="per-session rpcs instead of Channel")
    a = p.parse_args()
    out = asyncio.run(run(a.runs, a.freeze, a.leader_ttl, a.holders, not a.no_multiplex))
    print(" ".join(f"{k}={v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
