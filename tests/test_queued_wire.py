"""What a waiter is told, over real gRPC (docs/design.md, "Waiting, queue caps and refusals"):
the stream's Queued and GetSession give one reason, at every point and after a change; a
re-attach's first event is the waiter's true pool, reason, place and estimate; the estimate
counts down in later Queued events with nothing else happening."""

from __future__ import annotations

import asyncio
from typing import Any

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from tests.grpc_fixtures import BE, TOKENS, B, Client, G, next_event, running_server, until
from tests.test_pools_observe import two_pools_yaml

_BOUND_S = 20.0  # a bound on waiting for what must come, never a timing


class _Events:
    """Every event of one Acquire stream, read by a task of its own (the latest is what the
    session was last told)."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.events: list[scheduler_pb2.LeaseEvent] = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for ev in self.call:
            self.events.append(ev)

    def queued(self) -> list[scheduler_pb2.Queued]:
        return [ev.queued for ev in self.events if ev.WhichOneof("event") == "queued"]

    def granted(self) -> scheduler_pb2.Granted | None:
        return next((ev.granted for ev in self.events if ev.WhichOneof("event") == "granted"), None)

    async def wait(self, ok: Any, what: str) -> None:
        for _ in range(int(_BOUND_S / 0.02)):
            if ok():
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{what}: not within {_BOUND_S} s; events {self.events}")

    def cancel(self) -> None:
        self.call.cancel()
        self.task.cancel()


async def _get(client: Client, session_id: str) -> scheduler_pb2.SessionState:
    req = scheduler_pb2.GetSessionRequest(session_id=session_id)
    return await client.scheduler.GetSession(req, metadata=client.md)


async def _agree(client: Client, session_id: str, stream: _Events) -> str:
    """Wait until the stream's latest Queued gives GetSession's pool and reason (each read
    again); the reason."""
    last: tuple[str, str] = ("", "")
    for _ in range(int(_BOUND_S / 0.05)):
        state = await _get(client, session_id)
        told = stream.queued()
        if told:
            last = (told[-1].reason, state.wait_reason)
            if told[-1].reason == state.wait_reason and told[-1].pool == state.pool:
                return state.wait_reason
        await asyncio.sleep(0.05)
    raise AssertionError(f"{session_id}: the stream says {last[0]!r}, GetSession {last[1]!r}")


async def _granted(client: Client, session_id: str, qos: int) -> _Events:
    s = _Events(client.acquire(session_id, qos))
    await s.wait(lambda: s.granted() is not None, f"{session_id} granted")
    return s


def test_the_stream_and_get_session_give_one_reason() -> None:
    """serve's defaults: product's 6 Burstable and batch's 2 BestEffort fill the 8 slots; a third
    batch session waits (tenant_quota). Guaranteed sessions arrive (yields asked of batch's
    leases, positions move), the victims release, and sre's third Guaranteed session's reason
    moves from pool_exhausted to tenant_limit: the stream and GetSession agree throughout."""
    with running_server() as server:  # dev mode: the built-in policy, 4 workers of 2 slots

        async def go() -> None:
            async with (
                Client(server.target, tenant="product") as product,
                Client(server.target, tenant="batch") as batch,
                Client(server.target, tenant="sre") as sre,
            ):
                held = [await _granted(product, f"p{i}", B) for i in range(6)]
                victims = [await _granted(batch, f"b{i}", BE) for i in range(2)]
                waiter = _Events(batch.acquire("b2", BE))
                await waiter.wait(lambda: bool(waiter.queued()), "b2 queued")
                assert await _agree(batch, "b2", waiter) == "tenant_quota"
                await asyncio.sleep(0.5)  # a later point, nothing changed
                assert await _agree(batch, "b2", waiter) == "tenant_quota"
                guaranteed = []
                for i in range(3):  # one after the other: g2 arrives last
                    g = _Events(sre.acquire(f"g{i}", G))
                    await g.wait(lambda g=g: bool(g.queued()), f"g{i} queued")
                    guaranteed.append(g)
                # b2 moved behind the Guaranteed waiters: told again, the same reason as GetSession
                assert await _agree(batch, "b2", waiter) == "tenant_quota"
                assert await _agree(sre, "g0", guaranteed[0]) == "yield_pending"
                assert await _agree(sre, "g2", guaranteed[2]) == "pool_exhausted"
                for i, v in enumerate(victims):  # both are asked to yield for g0 and g1: release
                    await v.wait(
                        lambda v=v: any(ev.WhichOneof("event") == "yield_requested" for ev in v.events),
                        f"b{i} asked to yield",
                    )
                    lease = v.granted().lease  # type: ignore[union-attr]
                    req = scheduler_pb2.ReleaseRequest(
                        session_id=f"b{i}", lease_id=lease.lease_id, epoch=lease.epoch
                    )
                    await batch.scheduler.Release(req, metadata=batch.md)
                for g in guaranteed[:2]:
                    await g.wait(lambda g=g: g.granted() is not None, "g0 and g1 granted")
                # sre holds its 2 Guaranteed: g2's reason changed, and its stream was told
                assert await _agree(sre, "g2", guaranteed[2]) == "tenant_limit"
                assert await _agree(batch, "b2", waiter) == "tenant_quota"
                for s in (*held, *victims, waiter, *guaranteed):
                    s.cancel()

        asyncio.run(go())


def test_a_reattach_is_told_its_true_pool_reason_place_and_estimate() -> None:
    """Two pools, no workers: acme's BestEffort session queued in gpu (tenant_quota). Its
    re-attach's first event says gpu and tenant_quota, with GetSession's place and estimate."""
    with running_server(two_pools_yaml()) as server:

        async def go() -> None:
            async with Client(server.target, TOKENS["acme"]) as acme:
                first = acme.acquire("s1", BE, pool="gpu")
                ev = await until(first, "queued")
                assert (ev.queued.pool, ev.queued.reason) == ("gpu", "tenant_quota")
                first.cancel()
                again = acme.acquire("s1", BE, pool="gpu")
                ev = await next_event(again)
                state = await _get(acme, "s1")
                assert ev.WhichOneof("event") == "queued", ev
                q = ev.queued
                assert (state.pool, state.wait_reason) == ("gpu", "tenant_quota")
                assert (q.pool, q.reason, q.position) == (state.pool, state.wait_reason, state.position)
                assert q.HasField("estimated_wait") == state.HasField("estimated_wait")
                again.cancel()

        asyncio.run(go())


def test_the_estimate_counts_down_in_later_queued_events() -> None:
    """One hold observed (so there is an estimate), the 8 slots held, a waiter at position 0:
    with nothing released, its stream gets a later Queued at the same place with a smaller
    estimate (the countdown; before, the first estimate stood for the whole wait)."""
    with running_server() as server:

        async def go() -> None:
            async with (
                Client(server.target, tenant="product") as product,
                Client(server.target, tenant="batch") as batch,
            ):
                once = await _granted(product, "once", B)
                lease = once.granted().lease  # type: ignore[union-attr]
                req = scheduler_pb2.ReleaseRequest(
                    session_id="once", lease_id=lease.lease_id, epoch=lease.epoch
                )
                await product.scheduler.Release(req, metadata=product.md)
                held = [await _granted(product, f"p{i}", B) for i in range(6)]
                held += [await _granted(batch, f"b{i}", BE) for i in range(2)]
                waiter = _Events(batch.acquire("b2", BE))
                await waiter.wait(lambda: bool(waiter.queued()), "b2 queued")
                first = waiter.queued()[0]
                assert first.HasField("estimated_wait") and first.position == 0
                await waiter.wait(lambda: len(waiter.queued()) >= 2, "a later Queued")
                later = waiter.queued()[1]
                assert later.position == first.position and later.reason == first.reason
                assert later.estimated_wait.ToTimedelta() < first.estimated_wait.ToTimedelta()
                for s in (*held, waiter):
                    s.cancel()

        asyncio.run(go())
