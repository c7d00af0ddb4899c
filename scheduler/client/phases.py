"""A session's phases as this client sees them, and the one table of how they change.

Written as `scheduler/core/lifecycle.py` writes the core's lifecycles: each edge (phase, event ->
next phase) says why it exists; anything else is refused. A refused move is a bug in the SDK
(the parts that report events check that the event concerns the lease held), so it raises
instead of being absorbed. `SessionState.move` (state.py) is the one place a phase is assigned.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from scheduler.api.gen.slotsched.v1 import scheduler_pb2


class Phase(enum.StrEnum):
    """Where a session is in its life, as this client last saw it."""

    #: The Acquire stream is not open yet (or is being re-attached before any event).
    STARTING = "starting"
    #: Waiting in the queue (initially, or re-queued after a yield or revocation).
    QUEUED = "queued"
    #: Holding an active lease.
    HOLDING = "holding"
    #: Holding a lease the server asked to yield.
    YIELDING = "yielding"
    #: The session is over (released, withdrawn, expired, revoked, or failed).
    ENDED = "ended"

    @classmethod
    def from_proto(cls, value: int) -> Phase:
        return _PHASE_FROM_PROTO.get(value, Phase.STARTING)


_PHASE_FROM_PROTO: dict[int, Phase] = {
    int(scheduler_pb2.SESSION_PHASE_QUEUED): Phase.QUEUED,
    int(scheduler_pb2.SESSION_PHASE_HOLDING): Phase.HOLDING,
    int(scheduler_pb2.SESSION_PHASE_YIELDING): Phase.YIELDING,
    int(scheduler_pb2.SESSION_PHASE_ENDED): Phase.ENDED,
}


class SessionEvent(enum.StrEnum):
    """What moves a session from one phase to another (reported by the session's parts)."""

    QUEUED = "queued"  # the stream says the session waits (Queued)
    GRANTED = "granted"  # a grant: a new lease, or ours replayed on re-attach
    YIELD_ASKED = "yield asked"  # YieldRequested for our lease, or a Renew answered YIELDING
    YIELD_CALLED_OFF = "yield called off"  # YieldCancelled for the lease we were yielding
    YIELDED = "yielded"  # our Yield went through (answered, or Ended{YIELDED}): queued again
    REVOKED = "revoked"  # a lease taken from the session (not expired): queued again
    LEASE_LOST = "lease lost"  # a Renew refused: the lease is gone, where we stand is unknown
    ENDED = "ended"  # the session is over


_P, _E = Phase, SessionEvent

TRANSITIONS: Mapping[Phase, Mapping[SessionEvent, Phase]] = {
    Phase.STARTING: {
        _E.QUEUED: _P.QUEUED,
        _E.GRANTED: _P.HOLDING,
        _E.YIELDED: _P.QUEUED,  # a yield of ours applied while we did not know where we stood
        _E.REVOKED: _P.QUEUED,  # revoked while we re-attached: the stream replays it
        _E.ENDED: _P.ENDED,  # refused, gave up connecting, released before any event
    },
    Phase.QUEUED: {
        _E.QUEUED: _P.QUEUED,  # a new position in the queue
        _E.GRANTED: _P.HOLDING,
        _E.YIELD_ASKED: _P.YIELDING,  # a lease kept across a requeue of another (replays)
        _E.YIELD_CALLED_OFF: _P.HOLDING,
        _E.YIELDED: _P.QUEUED,
        _E.REVOKED: _P.QUEUED,
        _E.LEASE_LOST: _P.STARTING,  # the renewal of a lease the stream no longer reports
        _E.ENDED: _P.ENDED,  # withdrawn, wait_timeout_s passed, released
    },
    Phase.HOLDING: {
        _E.QUEUED: _P.QUEUED,  # the server no longer knows our lease (or we yielded it)
        _E.GRANTED: _P.HOLDING,  # the replay of our lease on re-attach, or a re-grant
        _E.YIELD_ASKED: _P.YIELDING,
        _E.YIELD_CALLED_OFF: _P.HOLDING,  # a replayed grant told us the yield is off
        _E.YIELDED: _P.QUEUED,  # a Yield sent before it was called off went through
        _E.REVOKED: _P.QUEUED,
        _E.LEASE_LOST: _P.STARTING,  # until the stream says where the session stands
        _E.ENDED: _P.ENDED,
    },
    Phase.YIELDING: {
        _E.QUEUED: _P.QUEUED,
        _E.GRANTED: _P.HOLDING,  # the replay of the lease we are yielding (its yield goes on)
        _E.YIELD_ASKED: _P.YIELDING,  # asked again (a replay, or a Renew answered YIELDING)
        _E.YIELD_CALLED_OFF: _P.HOLDING,  # the waiter left: keep the lease
        _E.YIELDED: _P.QUEUED,
        _E.REVOKED: _P.QUEUED,  # the yield deadline passed
        _E.LEASE_LOST: _P.STARTING,
        _E.ENDED: _P.ENDED,
    },
    Phase.ENDED: {},
}


class IllegalTransition(RuntimeError):
    pass


def next_phase(current: Phase, event: SessionEvent) -> Phase:
    """The phase `event` moves a session in `current` to; IllegalTransition if it may not."""
    try:
        return TRANSITIONS[current][event]
    except KeyError:
        raise IllegalTransition(f"a session cannot go from {current} on {event}") from None
