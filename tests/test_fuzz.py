"""Fuzz every rpc (hypothesis over each request's fields, plus raw bytes as bodies) against a real
scheduler and reference worker over loopback: no answer is UNKNOWN or INTERNAL, the server stays
up (health SERVING), and the pool's accounting is intact afterwards (tests/fuzz_requests.py).

The suite runs FUZZ_EXAMPLES requests (a few seconds); `python bench/fuzz.py --requests 10000`
runs the same generator at the issue's bar and prints the counts.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.grants import GrantKeyring, core_lease_id
from scheduler.serve import start_server
from slots.worker.actor import ActorConfig
from slots.worker.main import start_worker
from tests.fuzz_requests import RPCS, Tally, accounting_problems, fuzz_case, holds, send

FUZZ_EXAMPLES = 500


class _Env:
    """A scheduler (dev mode, built-in policy) and a standalone reference worker on a loop of their
    own thread, with a channel to each."""

    def __init__(self, snapshots: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._snapshots = snapshots
        self.run(self._start())

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        self.server = await start_server(None, "127.0.0.1:0", None)
        self.worker = await start_worker(
            "127.0.0.1:1", "w0", 2, snapshots=str(self._snapshots), actor_config=ActorConfig(64, 0.05, None),
            verify_leases=False,
        )  # fmt: skip
        self.scheduler_channel = grpc.aio.insecure_channel(self.server.target)
        self.worker_channel = grpc.aio.insecure_channel(self.worker.address)

    async def _stop(self) -> None:
        await self.scheduler_channel.close()
        await self.worker_channel.close()
        await self.worker.kill()
        await self.server.stop(0)

    def close(self) -> None:
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Env]:
    e = _Env(tmp_path_factory.mktemp("fuzz-snapshots"))
    try:
        yield e
    finally:
        e.close()


def test_every_rpc_is_fuzzed() -> None:
    names = {r.path.rsplit("/", 2)[1] for r in RPCS}
    assert {"slotsched.v1.Scheduler", "slotsched.v1.Workers", "slotsched.v1.Admin", "slotsched.v1.Worker",
            "externalscaler.ExternalScaler", "grpc.health.v1.Health"} <= names  # fmt: skip
    assert len(RPCS) >= 24


def test_a_session_holds_its_lease_as_the_admin_service_lists_it() -> None:
    """The Admin service lists the core id, the tenant reads the tagged one: the same lease. Any
    other lease, an untagged id or another slot or epoch is not."""
    keys = GrantKeyring.generate()
    listed = common_pb2.Lease(lease_id="local-0/0#1", session_id="--workload", epoch=1)
    listed.slot.worker_id, listed.slot.index = "local-0", 0

    def session(lease_id: str, epoch: int = 1, index: int = 0) -> scheduler_pb2.SessionState:
        out = scheduler_pb2.SessionState(session_id="--workload", state=scheduler_pb2.SESSION_PHASE_HOLDING)
        out.lease.CopyFrom(listed)
        out.lease.lease_id, out.lease.epoch, out.lease.slot.index = lease_id, epoch, index
        return out

    assert holds(session(keys.wire_lease_id("local-0/0#1")), listed)
    assert not holds(session("local-0/0#1"), listed)  # a tenant is never shown an untagged id
    assert not holds(session(keys.wire_lease_id("local-0/1#1")), listed)
    assert not holds(session(keys.wire_lease_id("local-0/0#1"), epoch=2), listed)
    assert not holds(session(keys.wire_lease_id("local-0/0#1"), index=1), listed)
    assert not holds(scheduler_pb2.SessionState(session_id="--workload"), listed)


def test_accounting_is_intact_while_a_fuzzed_session_holds_a_lease(env: _Env) -> None:
    """A fuzzed Acquire that is granted leaves its lease held (for its TTL) when the stream goes:
    the check afterwards must find its session holding it (the Admin service lists the core id,
    GetSession the tagged one), then none once it is released."""

    async def go() -> tuple[list[str], list[str]]:
        stub: Any = scheduler_pb2_grpc.SchedulerStub(env.scheduler_channel)  # type: ignore[no-untyped-call]
        md = (("x-slotsched-tenant", "sre"),)
        call = stub.Acquire(
            scheduler_pb2.AcquireRequest(session_id="--workload", qos=common_pb2.QOS_CLASS_BURSTABLE),
            metadata=md,
        )
        try:
            event = await call.read()
        finally:
            call.cancel()
        assert event.WhichOneof("event") == "granted", event
        lease = event.granted.lease
        assert core_lease_id(lease.lease_id) != lease.lease_id
        held = await accounting_problems(env.scheduler_channel)
        await stub.Release(
            scheduler_pb2.ReleaseRequest(session_id="--workload", lease_id=lease.lease_id, epoch=lease.epoch),
            metadata=md,
            timeout=5,
        )
        return held, await accounting_problems(env.scheduler_channel)

    held, released = env.run(go())
    assert held == []
    assert released == []


def test_fuzzed_requests_get_no_unknown_or_internal_and_leave_the_pool_intact(env: _Env) -> None:
    tally = Tally()

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )
    @given(fuzz_case())
    def one(case: Any) -> None:
        rpc, body, md = case
        channel = env.worker_channel if rpc.on_worker else env.scheduler_channel
        code, details = env.run(send(channel, rpc, body, md))
        tally.add(rpc, code, details)
        assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (rpc.path, details)

    one()
    assert tally.requests >= FUZZ_EXAMPLES // 2
    assert tally.bad == []
    # Refusals were exercised, and so were calls that got through.
    assert tally.by_code.get("INVALID_ARGUMENT", 0) > 0 and tally.by_code.get("OK", 0) > 0, tally.by_code

    async def after() -> tuple[Any, list[str]]:
        health = health_pb2_grpc.HealthStub(env.scheduler_channel)
        resp = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        return resp.status, await accounting_problems(env.scheduler_channel)

    status, problems = env.run(after())
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert problems == []
