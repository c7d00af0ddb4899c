"""The reference runtime's side of YieldCancelled (scheduler/client/worker_runtime.py): a yield called off
during the checkpoint leaves the actor running (no Stop) and keeps the lease; once the Stop has
begun it is too late, and the runtime tells the SDK to yield anyway. The worker is a fake here:
what is tested is the order of the runtime's own steps, which a real worker cannot slow down."""

from __future__ import annotations

import asyncio
from typing import Any

from scheduler.client.types import LeaseInfo, QoS, Slot, SnapshotRef
from scheduler.client.worker_runtime import ActorRuntime, WorkerClient

LEASE = LeaseInfo(
    session_id="s1",
    lease_id="w0/0#1",
    epoch=1,
    slot=Slot("w0", 0),
    worker_address="127.0.0.1:1",
    expires_at=None,
    resume_from=None,
    qos=QoS.BESTEFFORT,
    tenant="batch",
)


class SlowWorker:
    """Checkpoint and Stop wait for the test to let them finish."""

    def __init__(self) -> None:
        self.checkpointing = asyncio.Event()
        self.stopping = asyncio.Event()
        self.finish = asyncio.Event()
        self.stops = 0

    async def checkpoint(self, session_id: str, timeout: float | None = None, **owner: Any) -> SnapshotRef:
        self.checkpointing.set()
        await self.finish.wait()
        return SnapshotRef(uri=f"file:///snap/{session_id}")

    async def stop(self, session_id: str, timeout: float | None = None, **owner: Any) -> bool:
        self.stops += 1
        self.stopping.set()
        await self.finish.wait()
        return True


def _runtime(worker: SlowWorker) -> ActorRuntime:
    def factory(address: str) -> WorkerClient:
        return worker  # type: ignore[return-value]

    return ActorRuntime(factory)


def test_called_off_during_the_checkpoint_the_actor_is_not_stopped() -> None:
    async def body() -> None:
        worker = SlowWorker()
        rt = _runtime(worker)
        cb = rt.callbacks()
        task = asyncio.create_task(rt.on_yield(LEASE))
        await worker.checkpointing.wait()
        assert cb["on_yield_cancelled"](LEASE) is True  # keep the lease
        worker.finish.set()
        ref = await task
        assert ref.uri == "file:///snap/s1" and worker.stops == 0

    asyncio.run(body())


def test_called_off_once_the_stop_began_it_is_too_late() -> None:
    async def body() -> None:
        worker = SlowWorker()
        rt = _runtime(worker)
        task = asyncio.create_task(rt.on_yield(LEASE))
        await worker.checkpointing.wait()
        worker.finish.set()
        await worker.stopping.wait()
        assert rt.on_yield_cancelled(LEASE) is False  # the actor is stopping: yield anyway
        await task
        assert worker.stops == 1
        assert rt.on_yield_cancelled(LEASE) is False  # until the Yield: still too late
        # A call-off for another lease (or with no yield under way) keeps the lease.
        other = LeaseInfo(**{**LEASE.__dict__, "lease_id": "w0/0#2", "epoch": 2})
        assert rt.on_yield_cancelled(other) is True

    asyncio.run(body())
