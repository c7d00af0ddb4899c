"""The event table (scheduler/dispatch.py) covers every event the loop can apply, once."""

from __future__ import annotations

import typing

from scheduler.core.types import Event, WorkerAdded, WorkerDraining, WorkerRemoved
from scheduler.dispatch import BY_NAME, BY_TYPE, TABLE
from scheduler.ports import PolicyApplied


def test_every_event_has_one_row() -> None:
    applied = {*typing.get_args(Event), PolicyApplied}
    assert set(BY_TYPE) == applied
    assert len(TABLE) == len(BY_TYPE) == len(BY_NAME)  # no type or journal name twice


def test_membership_rows_are_the_worker_events() -> None:
    assert {s.type for s in TABLE if s.membership} == {WorkerAdded, WorkerDraining, WorkerRemoved}
