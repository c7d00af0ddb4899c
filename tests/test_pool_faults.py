"""Per-pool leadership under faults (issue 25), over a real redis-server and real gRPC: a
replica leading several pools is killed (SIGKILL), frozen (SIGSTOP) or cut from Redis.

In each case the other replica leads every pool within a few seconds, every lease granted
before keeps its id and epoch (the new leader's hot standby carried it, `Resumed` bridged the
gap), nothing is granted twice, and the faulty replica, back, serves none of the pools it lost
from its stale state (a frozen leader thawed is refused by its own deadline and fenced in the
store) before the table gives it its share again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from scheduler.grants import GrantKeyring
from scheduler.serve import RunningServer, StateOptions, start_server
from scheduler.state.redis_members import RedisMembers
from tests.grpc_fixtures import ADMIN_TOKEN, TOKENS, pools_policy_yaml, served_target, write_policy
from tests.test_client_reattach_wake import RefusingProxy
from tests.test_pool_leadership import POOLS, granted
from tests.test_state_redis import REDIS_BIN, RedisProc

pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_BIN) and not os.environ.get("CI"), reason="redis-server not installed"
)

ROOT = Path(__file__).resolve().parents[1]
ACME = (("authorization", f"Bearer {TOKENS['acme']}"),)
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
SERVING = health_pb2.HealthCheckResponse.SERVING


async def pool_status(target: str, pool: str) -> int:
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            resp = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=f"slotsched.pool/{pool}"), timeout=1
            )
            return int(resp.status)
    except grpc.aio.AioRpcError:
        return -1


async def leaders(targets: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {p: [] for p in POOLS}
    for t in targets:
        for p in POOLS:
            if await pool_status(t, p) == SERVING:
                out[p].append(t)
    return out


async def settle(targets: list[str], live: list[str], timeout: float = 20.0) -> dict[str, str]:
    """Until every pool is led by exactly one of `live` (and none by the others)."""
    deadline = time.monotonic() + timeout
    while True:
        now = await leaders(targets)
        if all(len(v) == 1 and v[0] in live for v in now.values()) and {v[0] for v in now.values()} == set(
            live
        ):
            return {p: v[0] for p, v in now.items()}
        assert time.monotonic() < deadline, f"pools did not settle on {live}: {now}"
        await asyncio.sleep(0.1)


async def grant(target: str, sid: str, pool: str) -> tuple[str, int]:
    ev = await granted(target, sid, pool)
    return ev.granted.lease.lease_id, ev.granted.lease.epoch


async def session(target: str, sid: str) -> scheduler_pb2.SessionState:
    async with grpc.aio.insecure_channel(target) as ch:
        state: scheduler_pb2.SessionState = await scheduler_pb2_grpc.SchedulerStub(ch).GetSession(
            scheduler_pb2.GetSessionRequest(session_id=sid), metadata=ACME, timeout=2
        )
        return state


async def renew(target: str, sid: str, lease_id: str, epoch: int) -> None:
    async with grpc.aio.insecure_channel(target) as ch:
        await scheduler_pb2_grpc.SchedulerStub(ch).Renew(
            scheduler_pb2.RenewRequest(session_id=sid, lease_id=lease_id, epoch=epoch),
            metadata=ACME,
            timeout=2,
        )


async def no_double_grant(owner: dict[str, str]) -> None:
    """Every slot and every session held at most once, as each pool's leader lists them."""
    slots: list[str] = []
    sessions: list[str] = []
    for target in set(owner.values()):
        async with grpc.aio.insecure_channel(target) as ch:
            resp = await admin_pb2_grpc.AdminStub(ch).ListLeases(
                admin_pb2.ListLeasesRequest(), metadata=ADMIN
            )
        for lease in resp.leases:
            if owner[lease.pool] == target:
                slots.append(f"{lease.slot.worker_id}/{lease.slot.index}")
                sessions.append(lease.session_id)
    assert len(slots) == len(set(slots)) and len(sessions) == len(set(sessions)), (slots, sessions)


async def held_everywhere(owner: dict[str, str], leases: dict[str, tuple[str, str, int]]) -> None:
    for sid, (pool, lease_id, epoch) in leases.items():
        state = await session(owner[pool], sid)
        assert (state.lease.lease_id, state.lease.epoch) == (lease_id, epoch), (sid, state)


async def fill(owner: dict[str, str]) -> dict[str, tuple[str, str, int]]:
    """One session granted in each pool, at its leader."""
    out = {}
    for pool in POOLS:
        sid = f"s-{pool}"
        lease_id, epoch = await grant(owner[pool], sid, pool)
        out[sid] = (pool, lease_id, epoch)
    return out


def busiest(owner: dict[str, str]) -> str:
    return max(set(owner.values()), key=lambda t: sum(1 for v in owner.values() if v == t))


# ---------------------------------------------------------------- cut from Redis (in-process)


@contextlib.asynccontextmanager
async def proxied_pair() -> AsyncIterator[tuple[list[RunningServer], list[RefusingProxy]]]:
    """Two in-process replicas, each reaching Redis through a proxy of its own."""
    with tempfile.TemporaryDirectory(prefix="slotsched-pool-cut-") as d:
        r = RedisProc(d).start()
        policy = write_policy(d, pools_policy_yaml(workers_per_pool=1, lease_ttl_s=600))
        keys = GrantKeyring.generate()
        proxies: list[RefusingProxy] = []
        servers: list[RunningServer] = []
        try:
            for i in range(2):
                proxy = await RefusingProxy(r.port).start()
                proxies.append(proxy)
                state = StateOptions(
                    state=f"redis://127.0.0.1:{proxy.port}/0", replica_id=f"r{i}", leadership="pool"
                )
                servers.append(await start_server(policy, "127.0.0.1:0", None, state=state, grant_keys=keys))
            yield servers, proxies
        finally:
            for s in servers:
                await s.stop(0)
            for p in proxies:
                await p.close()
            r.kill()


def test_a_replica_cut_from_redis_loses_its_pools_and_no_lease() -> None:
    async def body() -> None:
        async with proxied_pair() as (servers, proxies):
            targets = [s.target for s in servers]
            owner = await settle(targets, targets)
            leases = await fill(owner)
            cut_target = busiest(owner)  # leads two of the three pools
            cut = targets.index(cut_target)
            other = targets[1 - cut]
            lost = [p for p, t in owner.items() if t == cut_target]
            assert len(lost) == 2, owner
            proxies[cut].refusing = True
            proxies[cut].cut()
            owner = await settle(targets, [other], timeout=15)
            # The cut replica claims nothing: not a member, not serving any pool.
            async with grpc.aio.insecure_channel(cut_target) as ch:
                overall = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service="")
                )
            assert overall.status != SERVING
            for pool in lost:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await grant(cut_target, f"late-{pool}", pool)
                assert e.value.code() is grpc.StatusCode.UNAVAILABLE
                assert dict(e.value.trailing_metadata() or ()).get(wire.POOL) == pool
            await held_everywhere(owner, leases)
            await no_double_grant(owner)
            # Back on Redis: it takes its share again, handed over; still nothing lost.
            proxies[cut].refusing = False
            owner = await settle(targets, targets, timeout=20)
            await held_everywhere(owner, leases)
            await no_double_grant(owner)

    asyncio.run(body())


# ---------------------------------------------------------------- killed and frozen (processes)


class Proc:
    def __init__(self, root: str, policy: str, url: str, name: str, keys: str) -> None:
        self.log = os.path.join(root, f"{name}.log")
        self.args = [
            sys.executable, "-m", "scheduler.cli", "serve", "--policy", policy, "--state", url,
            "--leadership", "pool", "--replica-id", name, "--listen", "127.0.0.1:0",
            "--metrics-listen", "", "--grant-key-file", keys,
        ]  # fmt: skip
        self.proc: subprocess.Popen[str] | None = None
        self.target = ""
        self.name = name

    def start(self) -> Proc:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.log, "a") as err:
            self.proc = subprocess.Popen(
                self.args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True
            )
        try:
            self.target = served_target(self.proc, 60)
        except AssertionError:
            raise AssertionError(Path(self.log).read_text()[-3000:]) from None
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def process_pair() -> Any:
    with tempfile.TemporaryDirectory(prefix="slotsched-pool-proc-") as d:
        r = RedisProc(d).start()
        policy = write_policy(d, pools_policy_yaml(workers_per_pool=1, lease_ttl_s=600))
        keys = os.path.join(d, "grant-keys")
        Path(keys).write_text(f"k1:{base64.b64encode(os.urandom(32)).decode()}\n")  # one key, both
        procs = [Proc(d, policy, r.url, f"p{i}", keys) for i in range(2)]
        try:
            for p in procs:
                p.start()
            yield procs
        finally:
            for p in procs:
                p.stop()
            r.kill()


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_a_replica_leading_several_pools_killed_or_frozen(fault: str) -> None:
    async def body(procs: list[Proc]) -> None:
        targets = [p.target for p in procs]
        owner = await settle(targets, targets)
        leases = await fill(owner)
        victim_target = busiest(owner)
        victim = procs[targets.index(victim_target)]
        other = next(t for t in targets if t != victim_target)
        moved = [p for p, t in owner.items() if t == victim_target]
        assert len(moved) == 2, owner
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        t0 = time.monotonic()
        owner = await settle([other], [other], timeout=15)
        print(f"{fault}: {len(moved)} pools served by the survivor after {time.monotonic() - t0:.2f} s")
        await held_everywhere(owner, leases)
        for sid, (pool, lease_id, epoch) in leases.items():  # the new leader renews in the moved pools
            await renew(other if pool in moved else owner[pool], sid, lease_id, epoch)
        if fault == "frozen":
            members = RedisMembers(victim.args[victim.args.index("--state") + 1], "slotsched")
            v_frozen, frozen_table = await members.owners()
            victim.proc.send_signal(signal.SIGCONT)
            # Thawed, its stale leadership answers nothing: its deadline passed, its lease is
            # another's (fenced); it refuses the moved pools until the table gives it a share.
            for sid, (pool, lease_id, epoch) in leases.items():
                if pool not in moved:
                    continue
                try:
                    state = await session(victim_target, sid)
                except grpc.aio.AioRpcError as e:
                    assert e.code() is grpc.StatusCode.UNAVAILABLE, e
                else:  # answered: only once the table handed the pool back, with the lease kept
                    assert (state.lease.lease_id, state.lease.epoch) == (lease_id, epoch), state
                    assert await pool_status(victim_target, pool) == SERVING
            owner = await settle(targets, targets, timeout=20)
            # The rejoin is one version of the owners table, and moves only the pools it gives
            # the thawed replica (no replica's stale read of the membership writes it out again).
            v_end, table = await members.owners()
            await members.close()
            back = [p for p in POOLS if table[p] != frozen_table[p]]
            assert v_end == v_frozen + 1, (v_frozen, frozen_table, v_end, table)
            assert back and {table[p] for p in back} == {victim.name}, (frozen_table, table)
        else:
            await asyncio.to_thread(victim.start)  # a restarted replica rejoins and takes its share back
            targets = [p.target for p in procs]
            owner = await settle(targets, targets, timeout=20)
        await held_everywhere(owner, leases)
        await no_double_grant(owner)
        print(f"{fault}: back to two replicas, {time.monotonic() - t0:.2f} s after the fault")

    with process_pair() as procs:
        asyncio.run(body(procs))
