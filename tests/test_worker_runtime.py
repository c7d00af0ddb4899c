"""The yield path in one process: real scheduler (gRPC), real workers (gRPC), the SDK with
`actor_session` callbacks, a local snapshot directory — plus the agent's drain and deregister.

Why in one process as well as with real processes (test_yield_e2e.py): the same path, without
process start-up, runs in a second and shows the wiring (grant -> Start, YieldRequested ->
Checkpoint -> Yield, re-grant -> verified restore on another slot) with every object at hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.api.gen.slotsched.v1 import workers_pb2
from scheduler.client import AsyncClient, Phase, QoS
from scheduler.client.worker_runtime import ActorRuntime, WorkerClients, actor_session
from slots.worker.actor import ActorConfig
from slots.worker.agent import DRAINED
from slots.worker.main import RunningWorker, start_worker

pytest.register_assert_rewrite("tests.grpc_fixtures")  # imported before pytest loads it as a plugin
from tests.grpc_fixtures import (  # noqa: E402
    ADMIN_TOKEN,
    WORKER_TOKEN,
    Client,
    ServerThread,
    policy_yaml,
    running_server,
)

TOKENS = {"batch": "batch-token", "prod": "prod-token", "sre": "sre-token"}
TENANTS: list[dict[str, Any]] = [
    {"name": "batch", "token": TOKENS["batch"], "guaranteed": 0, "burstable": {"nominal": 0, "limit": 0}},
    {"name": "prod", "token": TOKENS["prod"], "guaranteed": 0, "burstable": {"nominal": 1, "limit": 1}},
    {"name": "sre", "token": TOKENS["sre"], "guaranteed": 1, "burstable": {"nominal": 0, "limit": 0}},
]
CONFIG = ActorConfig(bytes_per_turn=2048, turn_interval_s=0.02)


@pytest.fixture
def server() -> Iterator[ServerThread]:
    text = policy_yaml(TENANTS, workers=2, slots_per_worker=1, floor=1, yield_grace_s=3, min_runtime_s=0)
    with running_server(text, static_pool=False, heartbeat_interval_s=0.2) as s:
        yield s


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def _workers(server: ServerThread, tmp: Path, n: int = 2) -> list[RunningWorker]:
    ws = [
        await start_worker(
            server.target,
            f"w{i}",
            1,
            snapshots=str(tmp),
            token=WORKER_TOKEN,
            actor_config=CONFIG,
            grants=server.server.grant_keys.verifier(),  # the runtime must pass every grant through
        )
        for i in range(n)
    ]
    for w in ws:
        await asyncio.wait_for(w.agent.registered.wait(), 5)
    return ws


def _run(fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(fn())  # type: ignore[arg-type]


def test_preempted_actor_checkpoints_and_resumes_on_another_slot(
    server: ServerThread, tmp_path: Path
) -> None:
    async def go() -> None:
        ws = await _workers(server, tmp_path)
        workers = WorkerClients()
        rt = ActorRuntime(workers, checkpoint_timeout_s=3)
        batch = AsyncClient(server.target, token=TOKENS["batch"])
        prod = AsyncClient(server.target, token=TOKENS["prod"])
        sre = AsyncClient(server.target, token=TOKENS["sre"])
        try:
            async with actor_session(batch, "be-1", QoS.BESTEFFORT, rt) as be:
                first_slot = be.slot
                await _until(lambda: any((w.host.running("be-1") or _NO).turns >= 5 for w in ws))
                filler_cm = actor_session(prod, "fill-1", QoS.BURSTABLE, rt)
                filler = await filler_cm.__aenter__()
                async with actor_session(sre, "inc-1", QoS.GUARANTEED, rt) as inc:
                    assert inc.slot == first_slot  # the BestEffort slot was reclaimed
                    await _until(lambda: be.phase is Phase.QUEUED and be.yields == 1)
                    ref = be.resume_from
                    assert ref is not None and ref.sha256 and ref.size_bytes > 0
                    assert rt.checkpoints[-1].ref == ref
                    filler_slot = filler.slot
                    await filler_cm.__aexit__(None, None, None)  # frees the other slot
                    await be.wait_granted(10)
                    assert be.slot == filler_slot != first_slot
                    started = rt.started["be-1"]
                    assert started.state_sha256 == ref.sha256 and not started.fell_back
                    assert started.turns == (ref.size_bytes - 56) // CONFIG.bytes_per_turn
                    host = next(w.host for w in ws if w.host.running("be-1") is not None)
                    await _until(lambda: (host.running("be-1") or _NO).turns > started.turns)
            assert sum(w.metrics.resumes_verified_total() for w in ws) == 1
            assert sum(w.metrics.work_lost_total() for w in ws) == 0.0
            await asyncio.sleep(0.5)  # a few heartbeats: nothing else was fenced
            assert sum(w.metrics.work_lost_total() for w in ws) == 0.0
        finally:
            for c in (batch, prod, sre):
                await c.close()
            await workers.close()
            for w in ws:
                await w.stop()

    _run(go)


def test_drained_worker_exits_and_deregisters(server: ServerThread, tmp_path: Path) -> None:
    async def go() -> None:
        (w,) = await _workers(server, tmp_path, 1)
        async with Client(server.target, token=ADMIN_TOKEN) as c:  # an operator drains by hand
            await c.workers.Drain(workers_pb2.DrainRequest(worker_id="w0"), metadata=c.md)
        assert await asyncio.wait_for(w.wait(), 5) == DRAINED
        assert not w.host.accepting
        assert "w0" not in server.call(lambda s: set(s.registry.workers))
        await w.stop()

    _run(go)


def test_stopped_worker_deregisters(server: ServerThread, tmp_path: Path) -> None:
    async def go() -> None:
        (w,) = await _workers(server, tmp_path, 1)
        assert "w0" in server.call(lambda s: set(s.registry.workers))
        await w.stop()
        assert "w0" not in server.call(lambda s: set(s.registry.workers))

    _run(go)


class _No:
    turns = -1


_NO = _No()
