"""A checkpoint that completes after its lease's yield deadline keeps its work.

Real scheduler and worker (gRPC, one process), the SDK with `actor_session`, a local snapshot
directory behind a store whose `put` is held until the test lets it go. The order is forced with
events, never with sleeps: the batch session's yield checkpoint starts, the deadline passes and the
lease is revoked (its slot goes to the Guaranteed waiter, whose Start ends the old actor on the
slot), and only then does the snapshot reach the store. The rule (docs/design.md,
"Checkpoint-and-yield preemption"): the deadline protects the waiter's latency, not the
snapshot's validity: the session resumes from the late snapshot, and no work is counted lost.
"""

from __future__ import annotations

import asyncio
import re
import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.client import AsyncClient, Phase, QoS
from scheduler.client.worker_runtime import ActorRuntime, WorkerClients, actor_session
from slots.worker.actor import ActorConfig
from slots.worker.main import start_worker
from snapshots.local import LocalSnapshotStore
from snapshots.ref import SnapshotRef
from snapshots.store import Chunk

pytest.register_assert_rewrite("tests.grpc_fixtures")  # imported before pytest loads it as a plugin
from tests.grpc_fixtures import WORKER_TOKEN, ServerThread, policy_yaml, running_server  # noqa: E402

TOKENS = {"batch": "late-batch-token", "sre": "late-sre-token"}
TENANTS: list[dict[str, Any]] = [
    {"name": "batch", "token": TOKENS["batch"], "guaranteed": 0, "burstable": {"nominal": 0, "limit": 0}},
    {"name": "sre", "token": TOKENS["sre"], "guaranteed": 1, "burstable": {"nominal": 0, "limit": 0}},
]
CONFIG = ActorConfig(bytes_per_turn=2048, turn_interval_s=0.02)
BOUND_S = 30.0  # every wait's bound (generous: the machine may be loaded)


class HeldStore:
    """A local store whose next `put`, once armed, waits until `release` is set (it runs in a
    worker thread: `asyncio.to_thread`)."""

    def __init__(self, root: Path) -> None:
        self._store = LocalSnapshotStore(root)
        self.armed = False
        self.started = threading.Event()
        self.release = threading.Event()

    def put(
        self, tenant: str, session: str, chunks: Iterable[Chunk], created: float | None = None, **kw: Any
    ) -> SnapshotRef:
        if self.armed:
            self.armed = False
            self.started.set()
            assert self.release.wait(BOUND_S), "the test never let the held put go"
        return self._store.put(tenant, session, chunks, created, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture
def server() -> Iterator[ServerThread]:
    text = policy_yaml(TENANTS, workers=1, slots_per_worker=1, floor=0, yield_grace_s=1, min_runtime_s=0)
    with running_server(text, static_pool=False, heartbeat_interval_s=0.2) as s:
        yield s


async def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + BOUND_S
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"not in {BOUND_S}s: {what}"
        await asyncio.sleep(0.01)


def test_a_snapshot_completed_after_the_deadline_is_the_one_the_session_resumes_from(
    server: ServerThread, tmp_path: Path
) -> None:
    async def go() -> None:
        store = HeldStore(tmp_path)
        w = await start_worker(
            server.target, "w0", 1, snapshots=store, token=WORKER_TOKEN, actor_config=CONFIG,  # type: ignore[arg-type]
            grants=server.server.grant_keys.verifier(),
        )  # fmt: skip
        await asyncio.wait_for(w.agent.registered.wait(), BOUND_S)
        workers = WorkerClients()
        rt = ActorRuntime(workers, checkpoint_timeout_s=BOUND_S)
        batch = AsyncClient(server.target, token=TOKENS["batch"])
        sre = AsyncClient(server.target, token=TOKENS["sre"])
        metrics = server.server.loop.metrics
        assert metrics is not None
        try:
            async with actor_session(batch, "be-1", QoS.BESTEFFORT, rt) as be:
                await _until(lambda: (w.host.running("be-1") or _NO).turns >= 5, "the actor took turns")
                store.armed = True
                leave = asyncio.Event()
                waiter = asyncio.create_task(_hold_the_slot(sre, rt, store.release, leave))
                # The checkpoint reached the store, and is held there ...
                assert await asyncio.to_thread(store.started.wait, BOUND_S)
                # ... past the deadline: revoked, re-queued, its slot the waiter's.
                await _until(lambda: be.phase is Phase.QUEUED and be.lost_lease.is_set(), "be-1 revoked")
                await _until(lambda: store.release.is_set(), "the waiter holds the slot")
                # The snapshot completes late and goes out as a late Yield.
                await _until(lambda: metrics.late_snapshots == 1, "the late snapshot kept")
                (late,) = [c.ref for c in rt.checkpoints if c.session_id == "be-1"]
                assert late is not None
                # The SDK reads the Yield's answer after the scheduler counted it.
                await _until(lambda: be.resume_from is not None, "the SDK told its late snapshot was kept")
                assert be.resume_from is not None and be.resume_from.sha256 == late.sha256
                leave.set()
                await waiter  # the waiter left: be-1 is granted again, from the late snapshot
                await be.wait_granted(BOUND_S)
                started = rt.started["be-1"]
                assert started.resume_from is not None and started.resume_from.sha256 == late.sha256
                assert started.state_sha256 == late.sha256 and not started.fell_back
            assert w.metrics.work_lost_total() == 0.0
            body = await asyncio.to_thread(
                lambda: urllib.request.urlopen(server.metrics_url, timeout=10).read()
            )
            assert re.search(rb"^slotsched_late_snapshots_total 1\.0$", body, re.M), body
            assert metrics.revocations  # it was a revocation, not a yield in time
            assert sum(metrics.revocations.values()) == 1 and metrics.yields == 0
        finally:
            for c in (batch, sre):
                await c.close()
            await workers.close()
            await w.stop()

    asyncio.run(go())


async def _hold_the_slot(
    sre: AsyncClient, rt: ActorRuntime, release: threading.Event, leave: asyncio.Event
) -> None:
    """The Guaranteed waiter: granted at the victim's deadline, it lets the held put go, and
    releases its slot when told to."""
    async with actor_session(sre, "g-1", QoS.GUARANTEED, rt):
        release.set()
        await asyncio.wait_for(leave.wait(), BOUND_S)


class _NoActor:
    turns = 0


_NO = _NoActor()
