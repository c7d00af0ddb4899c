"""The companion autoscaler with its local actuator, end to end: load arrives -> worker processes
start -> load leaves -> workers drain and stop; no session lost, every resume verified.

Why real processes: scaling down is only safe if a drained worker's actors really checkpoint,
leave the process and come back byte for byte in *another* process, and if the processes the
actuator started really exit. So the scheduler runs in-process (its own event loop in a thread,
as in tests/grpc_fixtures.py, so the test can read its registry and autoscaler), the workers are
reference `slotsched worker` processes that the LocalActuator starts from SLOTSCHED_WORKER_COMMAND,
and the sessions are SDK sessions with the worker runtime's callbacks: real actors, real snapshots
in a local snapshot directory.

Scenario (2 slots a worker, minWorkers 1, maxWorkers 3, floor 1, short windows):

1. Load arrives. The minWorkers worker is up; six sessions arrive in class order (Guaranteed,
   three Burstable, two BestEffort: no preemption, so the only yields are the drain's). Weighted
   demand asks for three workers: the actuator starts two more processes and every session is
   granted, its actor running on a worker process.
2. Demand drops while long sessions still run: one session per worker is released, so every
   worker keeps one. Once the stabilization window has passed the autoscaler wants two workers
   and drains the one whose lease costs least to move (the newest): its session checkpoints,
   yields and resumes on another worker from that snapshot; the drained worker leaves the pool
   and its process exits.
3. Load leaves. Every session is released: the pool shrinks to minWorkers (the floor needs no
   more) and the other process exits.

Checked throughout: every session ended Released, no lease was revoked or expired (client and
server agree), grants == yields + 1; every resume restored exactly the state its yield
checkpointed (the sha256 and turn count the worker reported, re-verified from the snapshot file);
the workers counted each resume as verified, no resume failure and no lost work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scheduler.api.gen.slotsched.v1 import admin_pb2
from scheduler.client import AsyncClient, AsyncSession, LeaseInfo, NotFound, QoS
from scheduler.client.worker_runtime import ActorRuntime, Started, WorkerClients, actor_session
from scheduler.policy.identities import hash_token
from scheduler.serve import RunningServer, start_server
from slots.worker.actor import Actor
from tests.grpc_fixtures import ADMIN_TOKEN, WORKER_TOKEN, Client, policy_yaml, write_policy

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
TOKENS = {"acme": "autoscale-e2e-acme-token", "batch": "autoscale-e2e-batch-token"}
RUNTIME_TOKEN = "autoscale-e2e-runtime-token"  # what lease holders show the workers
SLOTS_PER_WORKER = 2
MIN_WORKERS, MAX_WORKERS = 1, 3
WINDOW_S = 3.0  # scale-down stabilization window and both cooldowns
PERIOD_S = 1.0  # the autoscaler decides every second
HEARTBEAT_S = 1.0
BYTES_PER_TURN = 1024
TURN_INTERVAL_S = 0.05
# acme: Guaranteed and Burstable (all three within nominal: never victims); batch: BestEffort only.
TENANTS: list[dict[str, Any]] = [
    {"name": "acme", "guaranteed": 1, "burstable": {"nominal": 3, "limit": 3}, "bestEffort": {"limit": 0}},
    {"name": "batch", "guaranteed": 0, "burstable": {"nominal": 0, "limit": 0}},
]
# In arrival order: the Guaranteed one first, BestEffort last, so nobody is preempted on the way up.
SESSIONS: tuple[tuple[str, str, QoS], ...] = (
    ("g-1", "acme", QoS.GUARANTEED),
    ("b-1", "acme", QoS.BURSTABLE),
    ("b-2", "acme", QoS.BURSTABLE),
    ("b-3", "acme", QoS.BURSTABLE),
    ("be-1", "batch", QoS.BESTEFFORT),
    ("be-2", "batch", QoS.BESTEFFORT),
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc for process state")


# ------------------------------------------------------------------------------------ set-up


def _policy() -> str:
    doc = yaml.safe_load(
        policy_yaml(
            [{**t, "token": TOKENS[t["name"]]} for t in TENANTS],
            name="autoscale-e2e",
            slots_per_worker=SLOTS_PER_WORKER,
            workers=MIN_WORKERS,
            floor=1,
            yield_grace_s=5,
            min_runtime_s=60,  # no fair-share preemption: the only yields are the drain's
        )
    )
    doc["spec"]["pool"].update(minWorkers=MIN_WORKERS, maxWorkers=MAX_WORKERS)
    doc["spec"]["autoscaler"] = {
        "scaleDownStabilizationSeconds": WINDOW_S,
        "scaleUpCooldownSeconds": 0,
        "scaleDownCooldownSeconds": WINDOW_S,
        "drainTimeoutSeconds": 10,
        "startDelaySeconds": 1,
        "scaleUp": {"pods": MAX_WORKERS, "percent": 100, "periodSeconds": 15},
    }
    return str(yaml.safe_dump(doc, sort_keys=False))


def _worker_command(snapshots: Path, logs: Path) -> str:
    """SLOTSCHED_WORKER_COMMAND: the reference worker, its output in logs/{worker_id}.log (exec
    keeps the pid, so the actuator's SIGTERM reaches the worker itself)."""
    worker = shlex.join(
        [
            sys.executable, "-m", "scheduler.cli", "worker",
            "--snapshots", snapshots.as_uri(),
            "--token", WORKER_TOKEN,
            "--accept-token-hash", hash_token(RUNTIME_TOKEN),
            "--metrics-listen", "127.0.0.1:0",
            "--bytes-per-turn", str(BYTES_PER_TURN),
            "--turn-interval", str(TURN_INTERVAL_S),
            "--drain-yield", "5",
            "--drain-timeout", "5",
        ]
    )  # fmt: skip
    template = "--scheduler {scheduler} --worker-id {worker_id} --slots {slots}"
    log = shlex.quote(str(logs)) + "/{worker_id}.log"
    script = f"cd {shlex.quote(str(ROOT))} && exec {worker} {template} >>{log} 2>&1"
    return shlex.join(["/bin/sh", "-c", script])


class AutoscaledServer:
    """`start_server(static_pool=False)` with the local actuator, on an event loop of its own thread."""

    def __init__(self, policy_path: str, worker_command: str) -> None:
        self._policy_path = policy_path
        self._env = {"SLOTSCHED_AUTOSCALER": "local", "SLOTSCHED_WORKER_COMMAND": worker_command}
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.running: RunningServer | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            self.running = await start_server(
                self._policy_path,
                static_pool=False,
                heartbeat_interval_s=HEARTBEAT_S,
                autoscaler_env=self._env,
                autoscale_period_s=PERIOD_S,
            )
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self.running.stop(0.5)  # stops the worker processes the actuator still runs

    def start(self) -> AutoscaledServer:
        self._thread.start()
        if not self._ready.wait(15):
            raise TimeoutError("the scheduler did not start within 15 s")
        if self._error is not None:
            raise self._error
        return self

    @property
    def target(self) -> str:
        assert self.running is not None
        return self.running.target

    def call(self, fn: Callable[[RunningServer], T]) -> T:
        """`fn(server)` on the server's loop (the only thread that may touch the core)."""
        assert self.loop is not None and self.running is not None
        running = self.running

        async def run() -> T:
            return fn(running)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


# ------------------------------------------------------------------------------------ records


class RecordingRuntime(ActorRuntime):
    """The worker runtime, keeping every start (ActorRuntime.started keeps only the latest)."""

    def __init__(self, workers: WorkerClients) -> None:
        super().__init__(workers, checkpoint_timeout_s=5.0)
        self.starts: list[Started] = []

    async def on_grant(self, lease: LeaseInfo) -> None:
        await super().on_grant(lease)
        self.starts.append(self.started[lease.session_id])

    def starts_of(self, session_id: str) -> list[Started]:
        return [s for s in self.starts if s.session_id == session_id]


@dataclass
class Held:
    """One session held by a task through `actor_session` until `leave` is set."""

    sid: str
    tenant: str
    qos: QoS
    leave: asyncio.Event = field(default_factory=asyncio.Event)
    session: AsyncSession | None = None
    lost_lease_seen: bool = False
    task: asyncio.Task[None] | None = None

    async def run(self, client: AsyncClient, runtime: ActorRuntime) -> None:
        async with actor_session(client, self.sid, self.qos, runtime) as s:
            self.session = s

            def watch() -> None:
                if s.lost_lease.is_set():
                    self.lost_lease_seen = True

            s.add_listener(watch)
            await self.leave.wait()

    def granted(self) -> bool:
        """Granted and its actor started; raises what the holding task failed with, if it did."""
        if self.task is not None and self.task.done():
            self.task.result()
        return self.session is not None

    @property
    def s(self) -> AsyncSession:
        assert self.session is not None, f"session {self.sid} was never granted"
        return self.session

    @property
    def worker(self) -> str:
        return self.s.slot.worker_id

    async def end(self) -> None:
        self.leave.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 15)


# ------------------------------------------------------------------------------------ helpers


async def _until(what: str, predicate: Callable[[], Awaitable[bool] | bool], timeout: float) -> float:
    """Poll `predicate` until true; fail naming `what` after `timeout` s. Returns the time waited."""
    t0 = time.monotonic()
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout:.0f} s"
        await asyncio.sleep(0.05)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child the actuator has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _exited(pid: int) -> bool:
    return not _running(pid)


def _scrape(port: int) -> dict[str, float]:
    """Prometheus samples by name (summed over labels) and by `name{label=value}` (one label)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            keys = [sample.name] + [f"{sample.name}{{{k}={v}}}" for k, v in sample.labels.items()]
            for key in keys:
                out[key] = out.get(key, 0.0) + sample.value
    return out


def _actuator_pids(server: AutoscaledServer) -> dict[str, int]:
    """The pid of every worker process the actuator runs (its detail says "pid N")."""
    assert server.running is not None and server.running.autoscaler is not None
    return {w.worker_id: int(w.detail.split()[-1]) for w in server.running.autoscaler.actuator.list()}


def _dump(logs: Path) -> str:
    return "\n".join(
        f"===== {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in sorted(logs.glob("*"))
    )


def _verify_snapshot(session_id: str, start: Started) -> None:
    """Re-verify, from the snapshot file itself, the state a resumed actor reported."""
    ref = start.resume_from
    assert ref is not None and ref.uri.startswith("file://"), ref
    data = Path(unquote(urlsplit(ref.uri).path)).read_bytes()
    actor = Actor.restore(data, session_id, ref.uri, ref.sha256)  # sha256 + internal consistency
    assert (actor.turns, actor.state_sha256()) == (start.turns, start.state_sha256), (
        f"{session_id} resumed with {start.turns} turns / {start.state_sha256}, the snapshot holds "
        f"{actor.turns} turns / {actor.state_sha256()}"
    )


class Cluster:
    """What the test watches: the pool (Admin API), worker logs and metrics, worker processes."""

    def __init__(self, server: AutoscaledServer, admin: Client, logs: Path) -> None:
        self.server = server
        self.admin = admin
        self.logs = logs
        self.pids: dict[str, int] = {}
        self.metrics: dict[str, dict[str, float]] = {}  # the latest scrape of each worker

    async def pool(self) -> admin_pb2.DescribePoolResponse:
        resp: admin_pb2.DescribePoolResponse = await self.admin.admin.DescribePool(
            admin_pb2.DescribePoolRequest(), metadata=self.admin.md
        )
        return resp

    async def workers(self) -> dict[str, admin_pb2.WorkerInfo]:
        return {w.worker_id: w for w in (await self.pool()).workers}

    def log(self, worker_id: str) -> str:
        path = self.logs / f"{worker_id}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def record_processes(self) -> None:
        self.pids.update(_actuator_pids(self.server))

    async def scrape_workers(self) -> None:
        """Scrape every running worker's /metrics (the port its log names)."""
        for wid in list(self.pids):
            m = re.search(r"metrics on port (\d+)", self.log(wid))
            if m is None or not _running(self.pids[wid]):
                continue
            with contextlib.suppress(OSError):  # exiting right now: its previous scrape stands
                self.metrics[wid] = await asyncio.to_thread(_scrape, int(m.group(1)))

    def worker_metric(self, name: str) -> float:
        return sum(m.get(name, 0.0) for m in self.metrics.values())


# ------------------------------------------------------------------------------------ the test


@pytest.mark.timeout(120)
def test_local_actuator_scales_up_drains_and_stops_workers_without_losing_a_session(tmp_path: Path) -> None:
    snapshots, logs = tmp_path / "snapshots", tmp_path / "logs"
    snapshots.mkdir()
    logs.mkdir()
    policy_path = write_policy(tmp_path, _policy())
    server = AutoscaledServer(policy_path, _worker_command(snapshots, logs)).start()
    pids: dict[str, int] = {}
    t0 = time.monotonic()
    try:
        asyncio.run(_scenario(server, logs, pids))
    except BaseException:
        print(_dump(logs))
        raise
    finally:
        with contextlib.suppress(Exception):  # a failure may come before they were recorded
            pids.update(_actuator_pids(server))
        server.stop()  # the actuator stops the workers it still runs
        for pid in pids.values():  # belt and braces: nothing outlives the test
            if _running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    print(f"autoscale e2e: {time.monotonic() - t0:.1f} s")


async def _scenario(server: AutoscaledServer, logs: Path, pids: dict[str, int]) -> None:
    workers = WorkerClients(token=RUNTIME_TOKEN)
    runtime = RecordingRuntime(workers)
    clients = {name: AsyncClient(server.target, token=token) for name, token in TOKENS.items()}
    held = {sid: Held(sid, tenant, qos) for sid, tenant, qos in SESSIONS}
    try:
        async with Client(server.target, token=ADMIN_TOKEN) as admin:
            cl = Cluster(server, admin, logs)
            cl.pids = pids
            await _load_arrives(cl, held, clients, runtime)
            moved = await _demand_drops(cl, held, runtime)
            await _load_leaves(cl, held)
            _check_sessions(held, runtime, moved)
            await _check_counters(cl, runtime)
    finally:
        for h in held.values():
            h.leave.set()
        pending = [h.task for h in held.values() if h.task is not None]
        with contextlib.suppress(TimeoutError):  # let the first error, if any, be the one reported
            await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 20)
        for c in clients.values():
            await c.close()
        await workers.close()


async def _load_arrives(
    cl: Cluster, held: dict[str, Held], clients: dict[str, AsyncClient], runtime: RecordingRuntime
) -> None:
    # The minWorkers worker comes up on its own (no load yet).
    await _until("the minWorkers worker registers", lambda: _n_workers(cl, 1), 20)
    await asyncio.sleep(1.5 * PERIOD_S)  # a decision or two without load: no scale-up
    assert len(await cl.workers()) == MIN_WORKERS

    # Six sessions, one after the other (each queued or granted before the next asks).
    for h in held.values():
        h.task = asyncio.create_task(h.run(clients[h.tenant], runtime), name=f"hold-{h.sid}")
        await _until(f"{h.sid} reaches the scheduler", partial(_known, clients[h.tenant], h.sid), 10)
    t_load = time.monotonic()
    await _until(
        "every session granted, its actor started", lambda: all(h.granted() for h in held.values()), 30
    )
    # The actuator started worker processes: three registered, all taking grants, all full.
    pool = await cl.pool()
    assert len(pool.workers) == MAX_WORKERS, pool
    assert all(w.state == admin_pb2.WORKER_STATE_ACTIVE and w.busy == SLOTS_PER_WORKER for w in pool.workers)
    cl.record_processes()
    assert sorted(cl.pids) == sorted(w.worker_id for w in pool.workers)
    assert all(_running(pid) for pid in cl.pids.values())
    by_worker: dict[str, list[str]] = {}
    for h in held.values():
        by_worker.setdefault(h.worker, []).append(h.sid)
    assert sorted(len(v) for v in by_worker.values()) == [2, 2, 2], by_worker
    # Real actors on real worker processes: each one takes turns.
    for h in held.values():
        await _until(f"{h.sid}'s actor takes turns", partial(_turns_at_least, runtime, h, 5), 10)
        assert h.s.yields == 0 and h.s.grants == 1
    await cl.scrape_workers()
    print(f"load arrived: {MAX_WORKERS} workers, all granted in {time.monotonic() - t_load:.1f} s")


async def _demand_drops(cl: Cluster, held: dict[str, Held], runtime: RecordingRuntime) -> Held:
    """Release one session per worker; the drain must move one of the three that remain."""
    keep: dict[str, Held] = {}
    for h in held.values():  # in arrival order: the Guaranteed session stays where it runs
        keep.setdefault(h.worker, h)
    t_drop = time.monotonic()
    await asyncio.gather(*(h.end() for h in held.values() if h not in keep.values()))
    # Demand is now the 3 busy slots (no floor headroom: the Guaranteed session holds the floor),
    # so two workers. After the stabilization window the autoscaler drains the one whose lease
    # costs least to move (the newest); its session checkpoints, yields and resumes elsewhere.
    await _until("a drain moves a session", lambda: any(k.s.yields for k in keep.values()), WINDOW_S + 15)
    # Not before the window (less the tick that last saw the old demand) has passed.
    waited = time.monotonic() - t_drop
    assert waited >= WINDOW_S - PERIOD_S - 0.5, f"drained {waited:.1f} s after demand fell: no window"
    (m,) = [k for k in keep.values() if k.s.yields]
    await _until(f"{m.sid} resumes on another worker", lambda: len(runtime.starts_of(m.sid)) == 2, 15)
    before, after = runtime.starts_of(m.sid)
    gone = before.slot.split("/")[0]
    assert after.worker_address != before.worker_address and not after.slot.startswith(f"{gone}/")
    assert after.resume_from is not None and not after.fell_back
    _verify_snapshot(m.sid, after)
    await _until(f"{m.sid} runs on", lambda: _turns_at_least(runtime, m, after.turns + 5), 10)
    await cl.scrape_workers()

    # The drained worker leaves the pool and its process exits; two workers remain.
    await _until("the drained worker leaves the pool", lambda: _n_workers(cl, MAX_WORKERS - 1), 15)
    assert gone not in await cl.workers()
    await _until(f"worker {gone}'s process exits", partial(_exited, cl.pids[gone]), 15)
    assert [k.sid for k in keep.values() if k.s.yields] == [m.sid]
    print(f"demand dropped: {m.sid} moved off {gone} after {time.monotonic() - t_drop:.1f} s")
    return m


async def _load_leaves(cl: Cluster, held: dict[str, Held]) -> None:
    t_leave = time.monotonic()
    await cl.scrape_workers()  # before the workers go: their counters leave with them
    await asyncio.gather(*(h.end() for h in held.values() if not h.leave.is_set()))
    # No demand but the floor (1 slot): minWorkers. One more worker drains (idle) and exits.
    await _until("the pool shrinks to minWorkers", lambda: _n_workers(cl, MIN_WORKERS), WINDOW_S + 15)
    (survivor,) = await cl.workers()
    stopped = [wid for wid in cl.pids if wid != survivor]
    for wid in stopped:
        await _until(f"worker {wid}'s process exits", partial(_exited, cl.pids[wid]), 15)
    assert _running(cl.pids[survivor])
    pool = await cl.pool()
    assert pool.capacity == SLOTS_PER_WORKER and pool.workers[0].busy == 0, pool
    assert pool.workers[0].state == admin_pb2.WORKER_STATE_ACTIVE
    # Every stopped worker left cleanly (drained or asked to stop), losing nothing.
    for wid in stopped:
        log = cl.log(wid)
        assert re.search(rf"slotsched worker {wid} shutting down \((drained|stopped)\)", log), log
        assert f"slotsched worker {wid} stopped" in log, log
    for wid in cl.pids:
        log = cl.log(wid)
        assert "work lost" not in log and "resume of session" not in log, log  # (refused or failed)
    # The survivor stays: no flapping below minWorkers, nothing new started.
    await asyncio.sleep(1.5 * PERIOD_S)
    assert list(await cl.workers()) == [survivor]
    assert sorted(p.name for p in cl.logs.glob("*.log")) == sorted(f"{w}.log" for w in cl.pids)
    print(f"load left: pool at {MIN_WORKERS} worker in {time.monotonic() - t_leave:.1f} s")


def _check_sessions(held: dict[str, Held], runtime: RecordingRuntime, moved: Held) -> None:
    """No session lost: each ended Released; grants == yields + 1; every resume verified."""
    for h in held.values():
        s = h.s
        assert s.end_reason == "released" and s.error is None, (h.sid, s.end_reason, s.error)
        assert not h.lost_lease_seen and not s.callback_errors, (h.sid, s.callback_errors)
        starts = runtime.starts_of(h.sid)
        assert len(starts) == s.grants == s.yields + 1, (h.sid, len(starts), s.grants, s.yields)
        assert starts[0].resume_from is None and starts[0].turns == 0
        yields = [c for c in runtime.checkpoints if c.session_id == h.sid]
        assert all(c.error is None and c.ref is not None for c in yields), yields
        # Each re-grant resumed from exactly the snapshot the yield before it wrote.
        assert [(c.ref.uri, c.ref.sha256) for c in yields if c.ref] == [
            (st.resume_from.uri, st.resume_from.sha256) for st in starts[1:] if st.resume_from
        ]
        for st in starts[1:]:
            assert not st.fell_back
            _verify_snapshot(h.sid, st)
        assert s.yields == (1 if h is moved else 0), (h.sid, s.yields)


async def _check_counters(cl: Cluster, runtime: RecordingRuntime) -> None:
    resumes = sum(1 for st in runtime.starts if st.resume_from is not None)
    assert resumes == 1
    # The workers: each resume verified, none failed, no work lost.
    await cl.scrape_workers()
    assert cl.worker_metric("slotsched_worker_resumes_verified_total") == resumes, cl.metrics
    assert cl.worker_metric("slotsched_worker_resume_failures_total") == 0, cl.metrics
    assert cl.worker_metric("slotsched_worker_work_lost_slot_seconds_total") == 0, cl.metrics
    # The scheduler: one yield (the drain's), no revocation, no expiry, no work lost.
    assert cl.server.running is not None and cl.server.running.metrics_port is not None
    sched = await asyncio.to_thread(_scrape, cl.server.running.metrics_port)
    assert sched.get("slotsched_yields_total") == resumes, sched
    assert (
        sched.get("slotsched_preemptions_total") == sched.get("slotsched_preemptions_total{cause=drain}") == 1
    )
    assert sched.get("slotsched_revocations_total", 0.0) == 0, sched
    assert sched.get("slotsched_expiries_total", 0.0) == 0, sched
    assert sched.get("slotsched_work_lost_slot_seconds_total", 0.0) == 0, sched
    # The autoscaler: started what it needed, reported no error.
    errors = cl.server.call(lambda r: list(r.autoscaler.errors) if r.autoscaler else ["no autoscaler"])
    assert errors == [], errors


async def _n_workers(cl: Cluster, n: int) -> bool:
    return len(await cl.workers()) == n


async def _known(client: AsyncClient, sid: str) -> bool:
    try:
        await client.get_session(sid)
    except NotFound:
        return False
    return True


async def _turns_at_least(runtime: RecordingRuntime, h: Held, turns: int) -> bool:
    lease = h.s.lease
    if lease is None:
        return False
    status = await runtime.workers(lease.worker_address).status()
    return any(slot.session_id == h.sid and slot.turns >= turns for slot in status.slots)
