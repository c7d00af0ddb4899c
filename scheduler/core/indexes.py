"""Indexed structures that keep every decision cheap: versioned lazy heaps, counts by position
with block sums (`PositionCounts`).

A tenant's entries are pushed again whenever its state changes, stamped with its new version;
older entries are skipped when they surface. The heap is rebuilt when stale entries outnumber
live ones, so memory stays proportional to the tenants it indexes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from itertools import compress, repeat
from typing import Any

Entry = tuple[Any, ...]


class VersionedHeap:
    """A min-heap of entries whose last two fields are (owner, version).

    `is_current(owner, version)` decides whether an entry still stands.
    """

    __slots__ = ("_heap", "_is_current", "_live_hint")

    def __init__(self, is_current: Callable[[str, int], bool]) -> None:
        self._heap: list[Entry] = []
        self._is_current = is_current
        self._live_hint = 64

    def push(self, entry: Entry, live_owners: int) -> None:
        heap = self._heap
        heapq.heappush(heap, entry)
        if len(heap) > 4 * live_owners + self._live_hint:
            self._compact()

    def peek(self) -> Entry | None:
        heap = self._heap
        is_current = self._is_current
        while heap:
            top = heap[0]
            if is_current(top[-2], top[-1]):
                return top
            heapq.heappop(heap)
        return None

    def pop_current(self) -> Entry | None:
        top = self.peek()
        if top is not None:
            heapq.heappop(self._heap)
        return top

    def push_back(self, entries: list[Entry]) -> None:
        for e in entries:
            heapq.heappush(self._heap, e)

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if self._is_current(e[-2], e[-1])]
        heapq.heapify(self._heap)
        self._live_hint = max(64, len(self._heap))

    def __len__(self) -> int:
        return len(self._heap)


class PositionCounts:
    """Counts by position (a request's arrival sequence number) with prefix sums.

    Kept as counts with sums per block of 64 slots and per 4,096 (`_SHIFTS`): a change is three
    increments and a prefix three sums of at most 64 (more in windows over 2**18) at C speed,
    where a Fenwick tree's O(log n) loops ran in bytecode, one step per level (an arrival and a
    grant each changed it: a tenth of the core's churn).

    New positions only grow (an old one comes back when a revoked lease is re-queued at its
    place), so the counts cover a window of them from `_base` (at or below the lowest position
    counted) and are rebuilt when a position falls outside it, with room on that side: sized to
    the span of what is counted, not to every position ever seen (an O(n) rebuild from the point
    counts, after about n new positions). Sized to every position ever seen, it grew by
    doubling without end under churn (a million acquires: 2 x 8 MiB, each doubling a 100 ms
    stall of the loop and growing).
    """

    __slots__ = ("_counts", "_blocks", "_supers", "_size", "_base")

    def __init__(self, size: int = 64) -> None:  # small: a core per pool, and it doubles
        self._size = size
        self._base = 0  # the position held in slot 1
        self._set([0] * (size + 1))

    def _set(self, counts: list[int]) -> None:
        """Counts by slot (slot 0 unused, always 0) and their block sums, in linear time."""
        self._counts = counts
        self._blocks = _sums(counts, 64)
        self._supers = _sums(self._blocks, 64)

    def add(self, index: int, delta: int) -> None:
        i = index - self._base + 1
        if i > self._size or i < 1:
            self._rebuild(index)
            i = index - self._base + 1
        self._counts[i] += delta
        self._blocks[i >> 6] += delta
        self._supers[i >> 12] += delta

    def load(self, positions: list[int]) -> None:
        """Reset to a count of 1 at each of `positions` (distinct), in linear time (restore)."""
        base = min(positions, default=0)
        size = _window(max(positions, default=0) - base + 1, 1024)
        counts = [0] * (size + 1)
        deque(map(counts.__setitem__, map((1 - base).__add__, positions), repeat(1)), maxlen=0)  # C speed
        self._size, self._base = size, base
        self._set(counts)

    def prefix(self, index: int) -> int:
        """Sum of counts at positions < index."""
        j = min(index - self._base, self._size) + 1  # slots [0, j)
        if j <= 1:
            return 0
        b = j >> 6
        s = j >> 12
        return sum(self._supers[:s]) + sum(self._blocks[s << 6 : b]) + sum(self._counts[b << 6 : j])

    def _rebuild(self, index: int) -> None:
        """A window holding `index` and every position counted, from the lowest of them; twice
        the span they need, so the next rebuild is about a span of new positions away."""
        counts, base = self._counts, self._base
        live = [k for k in compress(range(len(counts)), counts) if k]  # slots counted (k >= 1)
        lo = min(index, base + live[0] - 1) if live else index
        hi = max(index, base + live[-1] - 1) if live else index
        if index < base:  # an old position back (a revoked lease re-queued at its place): room
            lo -= hi - lo  # below as well, so the next ones below need no rebuild of their own
        size = _window(2 * (hi - lo + 1), 64)
        fresh = [0] * (size + 1)
        for k in live:
            fresh[base + k - lo] = counts[k]
        self._size, self._base = size, lo
        self._set(fresh)


def _sums(values: list[int], width: int) -> list[int]:
    """The sums of `values` by consecutive runs of `width` (the last one may be shorter)."""
    return [sum(values[k : k + width]) for k in range(0, len(values), width)]


def _window(needed: int, least: int) -> int:
    size = least
    while size < needed:
        size *= 2
    return size
