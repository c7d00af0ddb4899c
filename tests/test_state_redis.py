"""The Redis state store end to end: real redis-server processes on free ports, schedulers run as
`python -m scheduler.cli serve --state redis://…` subprocesses, the SDK over real gRPC.

* a SIGKILLed scheduler's successor keeps every lease (same id and epoch) and the queue order;
* two replicas: the standby refuses calls until the leader dies, then takes over in seconds;
* Redis dies under a serving scheduler: mutations fail UNAVAILABLE; Redis back, service back.

Redis runs with `appendonly yes, appendfsync always` (as deploy/ documents) so a Redis restart
loses nothing either.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler.api.gen.slotsched.v1 import admin_pb2, common_pb2, scheduler_pb2
from scheduler.client import AsyncClient, Phase, QoS
from scheduler.grants import GRANT_KEYS_ENV
from scheduler.state.redis_store import RedisStore, id_key
from scheduler.state.store import StaleTerm
from tests.grpc_fixtures import ADMIN_TOKEN, TOKENS, Client, policy_yaml, write_policy
from tests.redis_topology import serving, wait_for

ROOT = Path(__file__).resolve().parents[1]
ACME = TOKENS["acme"]
REDIS_BIN = shutil.which("redis-server") or "/usr/bin/redis-server"

# A missing redis-server skips these tests on a laptop, but never silently in CI: there it fails.
pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_BIN) and not os.environ.get("CI"), reason="redis-server not installed"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProc:
    """A redis-server of our own (AOF on), restartable on the same port and data directory."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProc:
        args = [REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--dir", self.dir]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc, client = self.proc, redis.Redis(port=self.port, socket_timeout=2)

        def up() -> bool:  # answering data commands: its AOF loaded (a restart reloads it)
            assert proc.poll() is None, f"redis-server {self.dir} exited with {proc.returncode}"
            return serving(client)

        wait_for(f"redis on {self.port}", up, 20)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)


GRANT_KEYS = f"k1:{base64.b64encode(os.urandom(32)).decode()}"


class Sched:
    """`slotsched serve --state redis://…` in a subprocess."""

    def __init__(
        self,
        policy_path: str,
        state_url: str,
        name: str,
        ttl: float = 1.5,
        port: int | None = None,
        snapshot_every: int = 1000,
    ) -> None:
        self.port = port or free_port()
        self.name = name
        args = [sys.executable, "-m", "scheduler.cli", "serve", "--policy", policy_path]
        args += ["--state", state_url, "--listen", f"127.0.0.1:{self.port}", "--metrics-listen", ""]
        args += ["--replica-id", name, "--leader-ttl", str(ttl), "--snapshot-every", str(snapshot_every)]
        # Replicas share the grant key, as a deployment must: a successor accepts the tagged lease
        # ids and honours the grants its predecessor handed out.
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SLOTSCHED_AUTOSCALER": "off"}
        env[GRANT_KEYS_ENV] = GRANT_KEYS
        self.log = tempfile.NamedTemporaryFile(prefix=f"slotsched-{name}-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def health(self) -> int | None:
        try:
            with grpc.insecure_channel(self.target) as ch:
                resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
                return int(resp.status)
        except grpc.RpcError:
            return None

    def wait_health(self, want: int, timeout: float = 60) -> float:
        """Seconds until health says `want`; the default bound only stops a hang (a subprocess
        starting on a busy machine takes seconds to import and load)."""
        t0 = time.monotonic()
        while self.health() != want:
            assert self.proc.poll() is None, f"{self.name} exited: {self.output()}"
            assert time.monotonic() - t0 < timeout, f"{self.name} not {want} in {timeout}s: {self.output()}"
            time.sleep(0.05)
        return time.monotonic() - t0

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def led_at(self) -> float:
        """When this replica last began to lead (wall clock), by its own log: a take-over's time
        as the server records it, not as a test polling its health on a busy machine sees it."""
        for line in reversed(Path(self.log.name).read_text(errors="replace").splitlines()):
            if f"leading as {self.name} (" in line:  # "2026-12-07 05:26:00,123 INFO …" (local time)
                at = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
                return at + int(line[20:23]) / 1000
        raise AssertionError(f"{self.name} never led: {self.output()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@contextlib.contextmanager
def cluster() -> Iterator[tuple[RedisProc, str, list[Sched]]]:
    """A Redis of our own, a one-slot policy file, and cleanup of every scheduler started."""
    with tempfile.TemporaryDirectory(prefix="slotsched-redis-") as d:
        r = RedisProc(d).start()
        policy = write_policy(d, policy_yaml(workers=1, slots_per_worker=1, floor=0, lease_ttl_s=3))
        started: list[Sched] = []
        try:
            yield r, policy, started
        finally:
            for s in started:
                s.kill()
            r.kill()
            for s in started:
                with contextlib.suppress(OSError):
                    os.unlink(s.log.name)


async def queue_order(target: str) -> list[str]:
    async with Client(target, token=ADMIN_TOKEN) as c:
        resp = await c.admin.ListQueue(admin_pb2.ListQueueRequest(), metadata=c.md, timeout=5)
        return [e.session_id for e in resp.entries]


def test_sigkilled_scheduler_successor_keeps_leases_and_queue_order() -> None:
    with cluster() as (r, policy, started):
        # Snapshots every few events: the successor recovers from a snapshot plus the journal tail.
        a = Sched(policy, r.url, "a", snapshot_every=5)
        started.append(a)
        a.wait_health(SERVING)

        async def body() -> None:
            async with (
                AsyncClient(a.target, token=ACME, reattach_timeout_s=20) as holder_client,
                AsyncClient(a.target, token=ACME, reattach_timeout_s=20) as waiter_client,
            ):
                holder = holder_client.session("holder", QoS.BURSTABLE)
                holder.start()
                await holder.wait_granted(5)
                before = (holder.lease_id, holder.epoch)
                w1 = waiter_client.session("w1", QoS.BURSTABLE)
                w1.start()
                await w1.wait_until(lambda s: s.queue is not None, 5)
                w2 = waiter_client.session("w2", QoS.BURSTABLE)
                w2.start()
                await w2.wait_until(lambda s: s.queue is not None, 5)
                assert await queue_order(a.target) == ["w1", "w2"]

                # The snapshot is encoded and stored in the background once its batch is in: wait
                # for it, so the successor recovers from a snapshot plus the journal tail.
                # A snapshot trims what the one before it covered: passers (a waiter that
                # leaves, behind w2) until the journal is compacted.
                rc = redis.Redis(port=r.port)
                for i in range(200):
                    if rc.hexists("slotsched:snapshot", "data") and rc.exists("slotsched:trimmed"):
                        break
                    passer = waiter_client.session(f"passer{i}", QoS.BURSTABLE)
                    passer.start()
                    await passer.wait_until(lambda s: s.queue is not None, 5)
                    await passer.release()
                a.kill(signal.SIGKILL)
                assert rc.hexists("slotsched:snapshot", "data") and rc.exists("slotsched:trimmed")
                dropped = rc.hget("slotsched:snapshot", "trimmed_to")
                assert dropped is not None and dropped != b"0-0"
                first = rc.xrange("slotsched:journal", count=1)  # compacted: nothing left up to it
                assert not first or id_key(first[0][0].decode()) > id_key(dropped.decode())
                # Same port: the SDK re-attaches to the successor as it would behind a Service.
                b = Sched(policy, r.url, "b", port=a.port)
                started.append(b)
                b.wait_health(SERVING)
                assert await queue_order(b.target) == ["w1", "w2"]
                await holder.wait_until(lambda s: s.reattaches >= 1 and s.phase is Phase.HOLDING, 15)
                # Past the lease TTL: renewals go on against the successor.
                await asyncio.sleep(3.5)
                assert (holder.lease_id, holder.epoch) == before
                assert holder.phase is Phase.HOLDING and not holder.lost_lease.is_set()
                async with AsyncClient(b.target, token=ACME) as direct:
                    view = await direct.get_session("holder")
                    assert view.lease is not None and (view.lease.lease_id, view.lease.epoch) == before
                    await holder.release()
                    got = await w1.wait_granted(10)
                    assert got.session_id == "w1"
                    assert await queue_order(b.target) == ["w2"]
                await w1.release()
                await w2.aclose()

        asyncio.run(body())


def test_a_bad_state_url_is_a_startup_error_naming_the_flag() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.cli",
            "serve",
            "--state",
            "redis://h:port/0",
            "--listen",
            "127.0.0.1:0",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0
    assert "--state" in out.stderr and "redis://h:port/0" in out.stderr, out.stderr


def test_standby_takes_over_when_the_leader_dies_and_the_client_keeps_its_lease() -> None:
    with cluster() as (r, policy, started):
        a = Sched(policy, r.url, "a")
        started.append(a)
        a.wait_health(SERVING)
        b = Sched(policy, r.url, "b")
        started.append(b)
        b.wait_health(NOT_SERVING)

        async def body() -> None:
            async with Client(b.target, token=ACME) as c:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    req = scheduler_pb2.GetSessionRequest(session_id="x")
                    await c.scheduler.GetSession(req, metadata=c.md, timeout=5)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "not the leader" in (err.value.details() or "")
            # Both replicas behind one name, as a Service would route: pick_first tries a, then b.
            both = f"ipv4:{a.target},{b.target}"
            async with AsyncClient(both, token=ACME, reattach_timeout_s=20) as client:
                holder = client.session("holder", QoS.BURSTABLE)
                holder.start()
                await holder.wait_granted(5)
                before = (holder.lease_id, holder.epoch)
                killed = time.time()
                a.kill(signal.SIGKILL)
                await asyncio.to_thread(b.wait_health, SERVING)
                took = b.led_at() - killed
                assert 0 < took < 1.5 + 2.5, took  # the lease TTL, a renewal period and recovery
                print(f"\nthe standby led {took:.2f} s after the kill (its log)")
                await holder.wait_until(lambda s: s.reattaches >= 1 and s.phase is Phase.HOLDING, 15)
                await asyncio.sleep(3.5)  # past the lease TTL: renewed by the new leader
                assert (holder.lease_id, holder.epoch) == before and not holder.lost_lease.is_set()
                await holder.release()

        asyncio.run(body())


def test_redis_outage_refuses_mutations_then_the_service_recovers() -> None:
    with cluster() as (r, policy, started):
        a = Sched(policy, r.url, "a", ttl=2.0)
        started.append(a)
        a.wait_health(SERVING)

        async def body() -> None:
            async with Client(a.target, token=ACME) as c:
                call = c.acquire("holder", common_pb2.QOS_CLASS_BURSTABLE)
                granted = (await asyncio.wait_for(call.read(), 5)).granted.lease
                r.kill()
                # The first mutation after the outage is refused, never acknowledged undurably.
                renew = scheduler_pb2.RenewRequest(
                    session_id="holder", lease_id=granted.lease_id, epoch=granted.epoch
                )
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.scheduler.Renew(renew, metadata=c.md, timeout=5)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                md = dict(err.value.trailing_metadata() or ())
                assert "retry-after-ms" in md, md
                # The open stream ends UNAVAILABLE (the SDK would re-attach); health says so too.
                with contextlib.suppress(grpc.aio.AioRpcError):
                    while await asyncio.wait_for(call.read(), 5) is not grpc.aio.EOF:
                        pass
                assert await call.code() == grpc.StatusCode.UNAVAILABLE
                await asyncio.to_thread(a.wait_health, NOT_SERVING, 5)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.scheduler.Acquire(
                        scheduler_pb2.AcquireRequest(session_id="new", qos=common_pb2.QOS_CLASS_BURSTABLE),
                        metadata=c.md,
                        timeout=5,
                    ).read()
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE

                r.start()  # same port and AOF: nothing acknowledged was lost
                await asyncio.to_thread(a.wait_health, SERVING, 10)
                got = await c.scheduler.Renew(renew, metadata=c.md, timeout=5)
                assert got.state == common_pb2.LEASE_STATE_ACTIVE
                view = await c.scheduler.GetSession(
                    scheduler_pb2.GetSessionRequest(session_id="holder"), metadata=c.md, timeout=5
                )
                assert (view.lease.lease_id, view.lease.epoch) == (granted.lease_id, granted.epoch)

        asyncio.run(body())


def test_every_term_has_its_own_fencing_token() -> None:
    """A replica that leads again gets a new token: writes left over from its previous term
    (a batch in flight, a snapshot being cut) are refused, and so are another replica's."""
    with tempfile.TemporaryDirectory(prefix="slotsched-redis-") as d:
        r = RedisProc(d).start()

        async def go() -> None:
            a = RedisStore(r.url, "t", "a")
            b = RedisStore(r.url, "t", "b")
            try:
                assert await a.try_lead(5.0)
                first = a.token
                await a.append([b'{"v":1}'], first)
                assert not await b.try_lead(5.0)  # a leads
                with pytest.raises(StaleTerm):
                    await b.append([b"x"], b.token)
                assert await a.try_lead(5.0)  # a again, e.g. after stepping down: a new term
                assert a.token != first and a.token.startswith("a:")
                with pytest.raises(StaleTerm):
                    await a.append([b"stale"], first)
                with pytest.raises(StaleTerm):
                    await a.save_snapshot(b"data", "fp", "0-1", 0.0, first)
                await a.append([b"fresh"], a.token)
                rows = await a.redis.xrange(a.k_journal)
                assert [fields[b"e"] for _, fields in rows] == [b'{"v":1}', b"fresh"]
                assert await a.alive() is None  # no leader has renewed yet
                assert await a.extend_lead(5.0, 1234.5)  # each renewal records when we were alive
                assert await a.alive() == 1234.5
                assert not await b.extend_lead(5.0, 9999.0)  # not b's to keep, nor to stamp
                assert await a.alive() == 1234.5
                await a.resign()
                assert await b.try_lead(5.0)  # resigned: the key is free at once
            finally:
                await a.close()
                await b.close()

        try:
            asyncio.run(go())
        finally:
            r.kill()
