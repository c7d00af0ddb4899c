"""One asyncio timer per event loop for the SDK's many deadlines: each held lease's next renewal
and each command's deadline on a channel.

Why: every session holds a renewal timer between its ticks and every command a deadline timer,
most of them cancelled before they fire (a lease released, a command answered). An asyncio
TimerHandle costs a few Python calls to make and to cancel, and asyncio keeps the cancelled ones in
its heap, ordered by a Python-level `__lt__`: a client holding 100,000 sessions, or making thousands
of acquire+release pairs a second, spent much of its time there. Here a deadline is a small entry
in one heap of plain tuples (compared in C), and the loop holds a single TimerHandle, for the
earliest entry. A cancelled entry is only flagged; the heap is rebuilt without them once they are
most of it.

`ticks().call_at(when, fn, *args)` is `loop.call_at` for these: `fn(*args)` runs in the loop at
`when` (loop time) unless the returned entry was `cancel()`led; an exception it raises goes to the
loop's exception handler, as a callback's would.
"""

from __future__ import annotations

import heapq
import time
import weakref
from asyncio import AbstractEventLoop, TimerHandle, get_running_loop
from collections.abc import Callable
from typing import Any

#: A deadline is due once the loop's clock is this close to it (asyncio's own rule for timers).
_RESOLUTION = time.get_clock_info("monotonic").resolution
#: Rebuild the heap once this many entries (and more than half of it) are cancelled.
_REBUILD_AT = 1024


def _nothing() -> None:
    pass


class Tick:
    """One deadline in the heap; `cancel()` keeps `fn` from running."""

    __slots__ = ("_owner", "args", "cancelled", "fn")

    def __init__(self, owner: Ticks, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._owner = owner
        self.fn = fn
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.fn, self.args = _nothing, ()  # not kept till it leaves the heap
            self._owner.dropped()


class Ticks:
    """The deadlines of one event loop (module doc)."""

    @property
    def _loop(self) -> AbstractEventLoop:
        loop = self._loop_ref()
        assert loop is not None, "a loop's deadlines outlived it"
        return loop

    def __init__(self, loop: AbstractEventLoop) -> None:
        # Weakly: `_OF_LOOP` maps the loop to this, and a strong reference back would keep every
        # loop ever used (each sync Client's) alive with its pending deadlines' sessions.
        self._loop_ref = weakref.ref(loop)
        self._heap: list[tuple[float, int, Tick]] = []
        self._seq = 0
        self._timer: TimerHandle | None = None
        self._armed_at = float("inf")
        self._cancelled = 0

    def __len__(self) -> int:
        """Entries in the heap (cancelled ones not yet dropped included)."""
        return len(self._heap)

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> Tick:
        tick = Tick(self, fn, args)
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, tick))
        if when < self._armed_at:
            self._arm(when)
        return tick

    def dropped(self) -> None:
        self._cancelled += 1
        heap = self._heap
        if self._cancelled >= _REBUILD_AT and 2 * self._cancelled > len(heap):
            self._heap = [e for e in heap if not e[2].cancelled]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer, self._armed_at = None, float("inf")
        heap = self._heap
        end = self._loop.time() + _RESOLUTION
        due: list[Tick] = []
        while heap and (heap[0][0] <= end or heap[0][2].cancelled):
            tick = heapq.heappop(heap)[2]
            if tick.cancelled:
                self._cancelled = max(0, self._cancelled - 1)
            else:
                due.append(tick)
        if heap:
            self._arm(heap[0][0])
        for tick in due:
            tick.cancelled = True  # ran: a later cancel() is a no-op
            try:
                tick.fn(*tick.args)
            except Exception as e:
                self._loop.call_exception_handler(
                    {"message": f"slotsched: a deadline's callback {tick.fn!r} failed", "exception": e}
                )


#: A loop that takes no attribute (uvloop's): its deadlines in a table keyed by it instead, which
#: keeps it alive (the value's armed timer holds it) until the process ends.
_OF_LOOP: weakref.WeakKeyDictionary[AbstractEventLoop, Ticks] = weakref.WeakKeyDictionary()


def ticks() -> Ticks:
    """The running loop's deadlines (made on first use), kept on the loop itself so that a loop
    that ended (each sync Client's) is let go with them."""
    loop = get_running_loop()
    found: Ticks | None = getattr(loop, "_slotsched_ticks", None)  # (an empty Ticks is falsy)
    if found is None:
        found = _OF_LOOP.get(loop)
    if found is None:
        found = Ticks(loop)
        try:
            loop._slotsched_ticks = found  # type: ignore[attr-defined]
        except AttributeError:
            _OF_LOOP[loop] = found
    return found


__all__ = ["Tick", "Ticks", "ticks"]
