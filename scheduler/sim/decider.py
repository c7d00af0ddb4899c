"""The seam between the simulator and what decides: the real core, or a baseline policy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from scheduler.core.lifecycle import LeaseState
from scheduler.core.types import Decision, Event, Lease
from scheduler.core.views import PoolView


class Decider(Protocol):
    """Events in, decisions out, time passed in; `Core` is the one slotsched ships."""

    def handle(self, event: Event, now: float) -> list[Decision]: ...

    def next_deadline(self) -> float | None: ...

    def describe(self) -> PoolView: ...

    def leases(self) -> Iterator[tuple[Lease, LeaseState]]: ...


def views(decider: Decider) -> dict[str, PoolView]:
    """Every pool's view by name: `describe_all` when the decider has pools, else its one view."""
    every = getattr(decider, "describe_all", None)
    if every is not None:
        out: dict[str, PoolView] = every()
        return out
    view = decider.describe()
    return {view.name: view}


def capacity(decider: Decider) -> int:
    """Slots over every pool."""
    return sum(v.capacity for v in views(decider).values())
