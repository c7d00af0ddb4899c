"""Lifecycles as transition tables: each edge says why it exists; anything else is refused.

A refused move is a bug in the core (never a client error), so it raises instead of returning.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class LeaseState(enum.StrEnum):
    ACTIVE = "active"
    YIELDING = "yielding"  # asked to yield; still holds its slot until it yields or the deadline
    RELEASED = "released"
    YIELDED = "yielded"
    EXPIRED = "expired"
    REVOKED = "revoked"


class WorkerState(enum.StrEnum):
    READY = "ready"
    DRAINING = "draining"  # no new grants; its leases are asked to yield
    REMOVED = "removed"


LEASE_TRANSITIONS: Mapping[LeaseState, frozenset[LeaseState]] = {
    LeaseState.ACTIVE: frozenset(
        {
            LeaseState.YIELDING,  # chosen as a victim, or its worker drains
            LeaseState.RELEASED,  # the holder is done
            LeaseState.YIELDED,  # voluntary checkpoint-and-yield
            LeaseState.EXPIRED,  # not renewed within the TTL: the holder is presumed dead
            LeaseState.REVOKED,  # its worker was removed under it
        }
    ),
    LeaseState.YIELDING: frozenset(
        {
            LeaseState.ACTIVE,  # the yield was cancelled: no waiter needs the slot any more
            LeaseState.RELEASED,  # finished before it had to yield
            LeaseState.YIELDED,  # checkpointed in time
            LeaseState.EXPIRED,
            LeaseState.REVOKED,  # the yield deadline passed, or the worker was removed
        }
    ),
    LeaseState.RELEASED: frozenset(),
    LeaseState.YIELDED: frozenset(),
    LeaseState.EXPIRED: frozenset(),
    LeaseState.REVOKED: frozenset(),
}

WORKER_TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = {
    WorkerState.READY: frozenset({WorkerState.DRAINING, WorkerState.REMOVED}),
    # A drain can be called off (the autoscaler changed its mind) or completed.
    WorkerState.DRAINING: frozenset({WorkerState.READY, WorkerState.REMOVED}),
    WorkerState.REMOVED: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


def check_lease(current: LeaseState, new: LeaseState) -> LeaseState:
    if new not in LEASE_TRANSITIONS[current]:
        raise IllegalTransition(f"lease cannot go from {current} to {new}")
    return new


def check_worker(current: WorkerState, new: WorkerState) -> WorkerState:
    if new not in WORKER_TRANSITIONS[current]:
        raise IllegalTransition(f"worker cannot go from {current} to {new}")
    return new
