"""The event table (scheduler/dispatch.py) covers every event the loop can apply, once."""

from __future__ import annotations

import typing

from scheduler.core.types import Event, WorkerAdded, WorkerDraining, WorkerRemoved
from scheduler.dispatch import BY_NAME, BY_TYPE, READ_ONLY, TABLE
from scheduler.ports import PolicyApplied


def test_every_event_has_one_row() -> None:
    applied = {*typing.get_args(Event), PolicyApplied}
    assert set(BY_TYPE) == applied
    assert len(TABLE) == len(BY_TYPE)  # no type twice
    assert len(BY_NAME) == len(TABLE) + len(READ_ONLY)  # no journal name twice, old ones included
    assert {s.type for s in READ_ONLY} <= set(BY_TYPE)  # an old record replays as a known event


def test_membership_rows_are_the_worker_events() -> None:
    assert {s.type for s in TABLE if s.membership} == {WorkerAdded, WorkerDraining, WorkerRemoved}
