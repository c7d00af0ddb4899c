"""A replica's roles and how it moves between them, as tables (like scheduler/core/lifecycle.py):
what each role does (`DUTIES`), and every move with why it exists (`TRANSITIONS`). Replica and
Standby ask the table; a move not in it is a bug, so it raises.

    STANDBY ──won──► CANDIDATE ──serving──► LEADER ──lost│hand_over──► STEPPING_DOWN ──stepped_down──► STANDBY
                         └──failed──► STANDBY
    any ──stop──► STOPPED
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class Role(enum.StrEnum):
    STANDBY = "standby"  # follows the journal (hot standby); campaigns once its core is loaded
    CANDIDATE = "candidate"  # won a term: catching up or recovering, not serving yet
    LEADER = "leader"  # serves, journals, renews its lease
    STEPPING_DOWN = "stepping down"  # refuses every call; the server is told, then it follows again
    STOPPED = "stopped"  # a graceful exit: the lease handed over, nothing more happens


class Trigger(enum.StrEnum):
    WON = "won"  # try_lead won a new term
    SERVING = "serving"  # the take-over is done: the core is exactly the journal, leases carried
    FAILED = "failed"  # the take-over failed before serving (the store, a lease lost meanwhile)
    LOST = "lost"  # a failed append or renewal, a lost lease, the store unreachable
    STEPPED_DOWN = "stepped_down"  # the server was told (on_step_down)
    STOP = "stop"  # Replica.stop
    HAND_OVER = "hand_over"  # the pool is another replica's now (ownership.py): durable, resign


@dataclass(frozen=True)
class Duties:
    serves: bool  # calls are answered and journaled (the loop runs, `durable()` is not refused)
    follows: bool  # applies the journal as the leader appends it
    campaigns: bool  # tries for the lease every campaign interval (once loaded)
    renews: bool  # extends its lease every renew interval


DUTIES: Mapping[Role, Duties] = {
    Role.STANDBY: Duties(serves=False, follows=True, campaigns=True, renews=False),
    # Renews only while a long recovery runs (Replica._renew_if_due), not on the renew timer.
    Role.CANDIDATE: Duties(serves=False, follows=False, campaigns=False, renews=False),
    Role.LEADER: Duties(serves=True, follows=False, campaigns=False, renews=True),
    # Its core holds events that never reached the journal: it reloads once the server knows.
    Role.STEPPING_DOWN: Duties(serves=False, follows=False, campaigns=False, renews=False),
    Role.STOPPED: Duties(serves=False, follows=False, campaigns=False, renews=False),
}

TRANSITIONS: Mapping[tuple[Role, Trigger], Role] = {
    (Role.STANDBY, Trigger.WON): Role.CANDIDATE,
    (Role.CANDIDATE, Trigger.SERVING): Role.LEADER,
    # Its core may be half caught up: it reloads and follows; the lease lapses for another.
    (Role.CANDIDATE, Trigger.FAILED): Role.STANDBY,
    (Role.LEADER, Trigger.LOST): Role.STEPPING_DOWN,
    # As a loss, but asked for: everything applied is durable first, and the lease resigned, so
    # the new owner (a hot standby) wins at its next campaign, not after the lease lapses.
    (Role.LEADER, Trigger.HAND_OVER): Role.STEPPING_DOWN,
    (Role.STEPPING_DOWN, Trigger.STEPPED_DOWN): Role.STANDBY,
    **{(role, Trigger.STOP): Role.STOPPED for role in Role},
    # Work in flight at stop() (a take-over, a step-down's task) ends into nothing.
    **{(Role.STOPPED, trigger): Role.STOPPED for trigger in Trigger},
}


class IllegalMove(RuntimeError):
    pass


def move(role: Role, trigger: Trigger) -> Role:
    """The role after `trigger` in `role`; IllegalMove if the table has no such move."""
    new = TRANSITIONS.get((role, trigger))
    if new is None:
        raise IllegalMove(f"a replica cannot go from {role} on {trigger}")
    return new


__all__ = ["DUTIES", "TRANSITIONS", "Duties", "IllegalMove", "Role", "Trigger", "move"]
