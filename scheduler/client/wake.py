"""The sleeps of a client's sessions in re-attach (or connect) backoff, ended together when the
client hears from the server again.

Why: every session of a client breaks in the same outage (a scheduler restart), and each sleeps
its own growing backoff (up to `backoff_max_s`) before it tries again. Without a wake, a session
hears of a grant the restarted server made only when its own sleep ends, seconds after the server
answered its neighbours, and a lease granted meanwhile may expire before it renews. So the first
sign that the server answers again (a session's stream gets an event after it slept in backoff, a
renewal succeeds after one failed, a multiplexed channel gets its first response) wakes every
sleeper at once. Each woken session re-attaches as after its sleep; its backoff is not reset
(only an event does that), so a server that fails again is not hammered: a woken sleep still
lasts the initial backoff, and a session woken once is not woken again before it gets an event
(one that keeps failing, e.g. a status the server sends it alone, sleeps its full backoff however
many other sessions start meanwhile).

Signalled on a transition out of an outage only, never per event: `heard()` with nobody asleep
costs one check.
"""

from __future__ import annotations

import asyncio


def _settle(fut: asyncio.Future[bool], woken: bool) -> None:
    if not fut.done():
        fut.set_result(woken)


class Wake:
    """The sessions of one client sleeping in backoff (`sleep`), woken by `heard`."""

    def __init__(self) -> None:
        self._sleepers: set[asyncio.Future[bool]] = set()
        self.wakes = 0  # how many sleeps `heard` cut short (tests, logs)

    async def sleep(self, delay: float, at_least: float = 0.0) -> bool:
        """Sleep `delay` seconds, or until `heard()` but never less than `at_least` (so sessions
        that wake each other cannot re-attach faster than the initial backoff); True when woken
        early."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        fut: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(delay, _settle, fut, False)
        self._sleepers.add(fut)
        try:
            woken = await fut
        finally:
            timer.cancel()
            self._sleepers.discard(fut)
        if woken:
            await asyncio.sleep(max(0.0, min(delay, at_least) - (loop.time() - start)))
        return woken

    def heard(self) -> None:
        """The server answered this client after an outage: every sleeper tries again now."""
        if not self._sleepers:
            return
        sleepers, self._sleepers = self._sleepers, set()
        for fut in sleepers:
            if not fut.done():
                self.wakes += 1
                fut.set_result(True)
