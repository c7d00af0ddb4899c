"""client/ticks.py: one timer per loop for the SDK's deadlines. What is due runs, in deadline
order; what was cancelled never runs, also after the heap is rebuilt without the cancelled; a
callback that raises goes to the loop's exception handler and the others still run."""

from __future__ import annotations

import asyncio
from typing import Any

from scheduler.client import ticks as ticks_module
from scheduler.client.ticks import ticks


async def _until(cond: Any, timeout_s: float = 10.0) -> None:
    """Wait for `cond()` (a bound only against a hang: a deadline that never runs fails here)."""
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.001)


def test_due_deadlines_run_in_order_and_cancelled_ones_never() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        ran: list[int] = []
        t = ticks()
        now = loop.time()
        t.call_at(now + 0.03, ran.append, 3)
        t.call_at(now + 0.01, ran.append, 1)
        gone = t.call_at(now + 0.02, ran.append, 2)
        t.call_at(now - 1, ran.append, 0)  # already due: at the next turn
        gone.cancel()
        await _until(lambda: len(ran) >= 3)
        await asyncio.sleep(0.03)
        assert ran == [0, 1, 3]
        assert ticks() is t  # one per loop

    asyncio.run(body())


def test_a_rebuilt_heap_keeps_every_live_deadline(monkeypatch: Any) -> None:
    monkeypatch.setattr(ticks_module, "_REBUILD_AT", 8)

    async def body() -> None:
        loop = asyncio.get_running_loop()
        ran: list[int] = []
        t = ticks()
        entries = [t.call_at(loop.time() + 0.01 + i * 0.001, ran.append, i) for i in range(30)]
        for i, e in enumerate(entries):
            if i % 3:
                e.cancel()
        assert len(t) < 30  # rebuilt without the cancelled ones (most of it)
        await _until(lambda: len(ran) >= 10)
        await asyncio.sleep(0.02)
        assert ran == list(range(0, 30, 3))

    asyncio.run(body())


def test_a_failing_callback_is_reported_and_the_others_run() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        ran: list[int] = []

        def boom() -> None:
            raise ValueError("boom")

        t = ticks()
        t.call_at(loop.time(), boom)
        t.call_at(loop.time(), ran.append, 1)
        await _until(lambda: ran and errors)
        assert isinstance(errors[0]["exception"], ValueError) and ran == [1]

    asyncio.run(body())


def test_a_finished_loop_and_its_deadlines_are_let_go() -> None:
    """Each sync Client runs its own loop: the deadlines of one that ended must not keep it (and
    its sessions) alive."""
    import gc
    import weakref

    from scheduler.client import ticks as ticks_module

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def one() -> None:
        loop = asyncio.get_running_loop()
        loops.append(weakref.ref(loop))
        ticks_module.ticks().call_at(loop.time() + 3600, lambda: None)

    for _ in range(3):
        asyncio.run(one())
    gc.collect()
    assert [r() for r in loops] == [None, None, None]
