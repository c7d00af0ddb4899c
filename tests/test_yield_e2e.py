"""Checkpoint-and-yield end to end, with real processes: a scheduler (`slotsched serve`), two
reference workers (`slotsched worker`), a real S3 API server (moto), and the SDK in this process.

Why real processes: the promise is that a preempted actor's state survives a trip through the
snapshot store to *another* worker process, and that a store outage during the checkpoint costs
only the work since the last good snapshot — counted, never hidden. In-process fakes could share
memory by accident; separate processes cannot.

Scenario (both tests): pool of two 1-slot workers. A BestEffort session runs an actor; a
Burstable session (within its nominal, so never a victim) fills the other slot; a Guaranteed
session arrives and preempts the BestEffort one.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.api.gen.slotsched.v1 import admin_pb2
from scheduler.client import AsyncClient, Phase, QoS
from scheduler.client.aio import AsyncSession
from scheduler.client.worker_runtime import ActorRuntime, WorkerClients, actor_session
from scheduler.policy.identities import hash_token
from slots.worker.actor import TRAILER_SIZE

pytest.register_assert_rewrite(
    "tests.fixtures_s3", "tests.grpc_fixtures"
)  # imported before loaded as plugins
from tests.fixtures_s3 import MotoServer, free_port, make_bucket, s3_client  # noqa: E402
from tests.grpc_fixtures import ADMIN_TOKEN, WORKER_TOKEN, Client, policy_yaml, write_policy  # noqa: E402

pytest_plugins = ["tests.fixtures_s3"]

ROOT = Path(__file__).resolve().parents[1]
TOKENS = {"batch": "e2e-batch-token", "prod": "e2e-prod-token", "sre": "e2e-sre-token"}
RUNTIME_TOKEN = "e2e-runtime-token"  # what lease holders show the workers
TENANTS: list[dict[str, Any]] = [
    {"name": "batch", "token": TOKENS["batch"], "guaranteed": 0, "burstable": {"nominal": 0, "limit": 0}},
    {"name": "prod", "token": TOKENS["prod"], "guaranteed": 0, "burstable": {"nominal": 1, "limit": 1}},
    {"name": "sre", "token": TOKENS["sre"], "guaranteed": 1, "burstable": {"nominal": 0, "limit": 0}},
]
BYTES_PER_TURN = 4096
TURN_INTERVAL = 0.05
GRACE_S = 3.0


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout}s:\n{log.read_text()[-3000:]}")


class Cluster:
    """A scheduler process and two worker processes, all on loopback."""

    def __init__(self, tmp: Path, snapshots_url: str) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        # No static pool (workers: 0): capacity comes only from the registered worker processes.
        doc = yaml.safe_load(policy_yaml(TENANTS, workers=0, slots_per_worker=1, yield_grace_s=GRACE_S))
        doc["spec"]["pool"].update(maxWorkers=2, floor="50%")
        self.policy_path = write_policy(tmp, yaml.safe_dump(doc))
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self._spawn(
            "scheduler",
            [
                "serve",
                "--policy",
                self.policy_path,
                "--listen",
                self.target,
                "--metrics-listen",
                f"127.0.0.1:{free_port()}",
            ],
        )
        _wait_port(self.port, self.procs["scheduler"], self.logs["scheduler"])
        self.worker_ports: dict[str, int] = {}
        self.metrics_ports: dict[str, int] = {}
        for wid in ("wa", "wb"):
            port, mport = free_port(), free_port()
            self.worker_ports[wid], self.metrics_ports[wid] = port, mport
            self._spawn(
                wid,
                [
                    "worker", "--scheduler", self.target, "--worker-id", wid, "--slots", "1",
                    "--listen", f"127.0.0.1:{port}", "--snapshots", snapshots_url,
                    "--token", WORKER_TOKEN, "--accept-token-hash", hash_token(RUNTIME_TOKEN),
                    "--metrics-listen", f"127.0.0.1:{mport}", "--bytes-per-turn", str(BYTES_PER_TURN),
                    "--turn-interval", str(TURN_INTERVAL), "--drain-timeout", "2",
                ],
            )  # fmt: skip
        for wid, port in self.worker_ports.items():
            _wait_port(port, self.procs[wid], self.logs[wid])

    def _spawn(self, name: str, args: list[str]) -> None:
        log = self.tmp / f"{name}.log"
        self.logs[name] = log
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", *args],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def worker_of(self, address: str) -> str:
        port = int(address.rsplit(":", 1)[1])
        return next(w for w, p in self.worker_ports.items() if p == port)

    def metric(self, worker: str, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_ports[worker]}/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def dump(self) -> str:
        return "\n".join(f"===== {n}\n{self.log(n)[-4000:]}" for n in self.logs)

    def close(self) -> None:
        """The workers first, all at once (each drains on its own: one after the other only added
        their shutdowns up), then the scheduler."""
        workers = [p for n, p in self.procs.items() if n != "scheduler"]
        for group in (workers, [self.procs["scheduler"]]):
            for p in group:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in group:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[[str], Cluster]]:
    made: list[Cluster] = []

    def make(url: str) -> Cluster:
        c = Cluster(tmp_path, url)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


async def _until(predicate: Callable[[], Awaitable[bool] | bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def _pool_ready(target: str) -> None:
    async with Client(target, token=ADMIN_TOKEN) as c:

        async def ready() -> bool:
            pool = await c.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=c.md)
            return int(pool.capacity) == 2

        await _until(ready)


async def _turns(workers: WorkerClients, address: str, session_id: str) -> int:
    status = await workers(address).status()
    for s in status.slots:
        if s.session_id == session_id:
            return int(s.turns)
    return -1


def _run(fn: Callable[[], Awaitable[None]], cluster: list[Cluster]) -> None:
    try:
        asyncio.run(fn())  # type: ignore[arg-type]
    except BaseException:
        for c in cluster:
            print(c.dump())
        raise
    if os.environ.get("SLOTSCHED_E2E_DUMP"):  # to read what the processes did on a green run
        for c in cluster:
            print(c.dump())


class _Sessions:
    """The three clients and the runtime every scenario uses."""

    def __init__(self, target: str) -> None:
        self.workers = WorkerClients(token=RUNTIME_TOKEN)
        self.runtime = ActorRuntime(self.workers, checkpoint_timeout_s=GRACE_S)
        self.batch = AsyncClient(target, token=TOKENS["batch"])
        self.prod = AsyncClient(target, token=TOKENS["prod"])
        self.sre = AsyncClient(target, token=TOKENS["sre"])

    async def close(self) -> None:
        for c in (self.batch, self.prod, self.sre):
            await c.close()
        await self.workers.close()


async def _fill_and_preempt(x: _Sessions, be: AsyncSession, incident: str) -> tuple[Any, AsyncSession, Any]:
    """Fill the other slot with a Burstable session, then bring in a Guaranteed one."""
    filler_cm = actor_session(x.prod, f"fill-{incident}", QoS.BURSTABLE, x.runtime)
    filler = await filler_cm.__aenter__()
    inc_cm = actor_session(x.sre, incident, QoS.GUARANTEED, x.runtime)
    return filler_cm, filler, inc_cm


# ------------------------------------------------------------------------------------------ tests


def test_preempted_actor_resumes_on_another_worker_through_s3(
    s3_server: str, cluster_factory: Callable[[str], Cluster]
) -> None:
    bucket = make_bucket(s3_server)
    cl = cluster_factory(f"s3://{bucket}/snaps?endpoint_url={s3_server}&region=us-east-1")

    async def go() -> None:
        await _pool_ready(cl.target)
        x = _Sessions(cl.target)
        try:
            async with actor_session(x.batch, "be-1", QoS.BESTEFFORT, x.runtime) as be:
                be_slot, be_addr = be.slot, be.worker_address
                await _until(lambda: _at_least(x.workers, be_addr, "be-1", 10))
                filler_cm, filler, inc_cm = await _fill_and_preempt(x, be, "inc-1")
                async with inc_cm as inc:
                    # The Guaranteed session took the BestEffort slot; its actor runs there.
                    assert inc.slot == be_slot
                    await _until(lambda: be.phase is Phase.QUEUED and be.yields == 1)
                    await _until(lambda: _at_least(x.workers, inc.worker_address, "inc-1", 2))
                    ref = be.resume_from
                    assert ref is not None and ref.uri.startswith(f"s3://{bucket}/snaps/batch/be-1/")
                    checkpointed_turns = (ref.size_bytes - TRAILER_SIZE) // BYTES_PER_TURN
                    assert checkpointed_turns >= 10
                    # The snapshot is an object in the S3 server, with its hash as metadata.
                    key = ref.uri.removeprefix(f"s3://{bucket}/")
                    head = s3_client(s3_server).head_object(Bucket=bucket, Key=key)
                    assert head["ContentLength"] == ref.size_bytes
                    assert head["Metadata"]["sha256"] == ref.sha256
                    # Free the other worker's slot: the BestEffort session resumes there.
                    other_slot = filler.slot
                    await filler_cm.__aexit__(None, None, None)
                    await be.wait_granted(15)
                    assert be.slot == other_slot != be_slot
                    assert cl.worker_of(be.worker_address) != cl.worker_of(be_addr)
                    started = x.runtime.started["be-1"]
                    assert started.state_sha256 == ref.sha256  # state intact, byte for byte
                    assert started.turns == checkpointed_turns and not started.fell_back
                    # ...and it goes on counting from where it stopped.
                    await _until(
                        lambda: _at_least(x.workers, be.worker_address, "be-1", checkpointed_turns + 3)
                    )
            new_worker = cl.worker_of(started.worker_address)
            assert cl.metric(new_worker, "slotsched_worker_resumes_verified_total") == 1
            for w in ("wa", "wb"):
                assert cl.metric(w, "slotsched_worker_resume_failures_total") == 0
                assert cl.metric(w, "slotsched_worker_work_lost_slot_seconds_total") == 0
        finally:
            await x.close()

    _run(go, [cl])


def test_s3_down_at_checkpoint_revokes_and_resumes_from_last_good_snapshot(
    fresh_s3_server: MotoServer, cluster_factory: Callable[[str], Cluster]
) -> None:
    s3 = fresh_s3_server
    bucket = make_bucket(s3.endpoint_url)
    opts = "region=us-east-1&max_attempts=1&connect_timeout=1&read_timeout=5"
    cl = cluster_factory(f"s3://{bucket}?endpoint_url={s3.endpoint_url}&{opts}")

    async def go() -> None:
        await _pool_ready(cl.target)
        x = _Sessions(cl.target)
        try:
            async with actor_session(x.batch, "be-2", QoS.BESTEFFORT, x.runtime) as be:
                await _until(lambda: _at_least(x.workers, be.worker_address, "be-2", 5))
                filler_cm, _filler, inc_cm = await _fill_and_preempt(x, be, "inc-a")
                # 1. A good checkpoint: the last good snapshot.
                async with inc_cm:
                    await _until(lambda: be.phase is Phase.QUEUED and be.yields == 1)
                good = be.resume_from
                assert good is not None
                good_turns = (good.size_bytes - TRAILER_SIZE) // BYTES_PER_TURN
                await be.wait_granted(15)  # back on the slot the incident left
                victim_addr = be.worker_address
                assert x.runtime.started["be-2"].state_sha256 == good.sha256
                await _until(lambda: _at_least(x.workers, victim_addr, "be-2", good_turns + 10))
                # Keep the bucket as durable storage would (moto keeps it in memory only).
                saved = _save_bucket(s3, bucket)
                # 2. The store dies; another incident arrives and the checkpoint cannot be written.
                s3.kill()
                t_kill = time.monotonic()
                async with actor_session(x.sre, "inc-b", QoS.GUARANTEED, x.runtime) as inc_b:
                    waited = time.monotonic() - t_kill
                    assert be.yields == 1, "no Yield without a snapshot"
                    assert waited >= GRACE_S - 0.5, f"granted after {waited:.2f}s: not at the deadline"
                    assert inc_b.worker_address == victim_addr
                    assert any("Checkpoint of session be-2" in str(e) for e in be.callback_errors)
                    await _until(lambda: be.phase is Phase.QUEUED)
                    last = be.resume_from  # the last good snapshot, not a new one
                    assert last is not None and (last.uri, last.sha256) == (good.uri, good.sha256)
                    victim = cl.worker_of(victim_addr)
                    lost = cl.metric(victim, "slotsched_worker_work_lost_slot_seconds_total")
                    assert lost >= GRACE_S, f"lost work not counted: {lost}"
                    log = cl.log(victim)
                    assert re.search(r"work lost: session be-2: [0-9.]+ slot-seconds \(fenced\)", log), log
                    # 3. The store comes back; the session resumes from the last good snapshot.
                    s3.start()
                    _restore_bucket(s3, bucket, saved)
                    await filler_cm.__aexit__(None, None, None)
                    await be.wait_granted(20)
                    started = x.runtime.started["be-2"]
                    assert started.state_sha256 == good.sha256 and started.turns == good_turns
                    assert not started.fell_back
            for w in ("wa", "wb"):
                assert cl.metric(w, "slotsched_worker_resume_failures_total") == 0
        finally:
            await x.close()

    _run(go, [cl])


# ------------------------------------------------------------------------------------------ helpers


async def _at_least(workers: WorkerClients, address: str, session_id: str, turns: int) -> bool:
    return await _turns(workers, address, session_id) >= turns


def _save_bucket(s3: MotoServer, bucket: str) -> list[tuple[str, bytes, dict[str, str]]]:
    client = s3.client()
    out = []
    for obj in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        resp = client.get_object(Bucket=bucket, Key=obj["Key"])
        out.append((obj["Key"], resp["Body"].read(), resp["Metadata"]))
    return out


def _restore_bucket(s3: MotoServer, bucket: str, saved: list[tuple[str, bytes, dict[str, str]]]) -> None:
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    for key, body, meta in saved:
        client.put_object(Bucket=bucket, Key=key, Body=body, Metadata=meta)
