"""The replica's roles table (scheduler/state/roles.py): what each role does, every move, and
that a move the table lacks raises rather than pass."""

from __future__ import annotations

import pytest

from scheduler.state.roles import DUTIES, TRANSITIONS, IllegalMove, Role, Trigger, move

LIFE = [
    (Role.STANDBY, Trigger.WON, Role.CANDIDATE),
    (Role.CANDIDATE, Trigger.SERVING, Role.LEADER),
    (Role.LEADER, Trigger.LOST, Role.STEPPING_DOWN),
    (Role.STEPPING_DOWN, Trigger.STEPPED_DOWN, Role.STANDBY),
    (Role.STANDBY, Trigger.WON, Role.CANDIDATE),
    (Role.CANDIDATE, Trigger.FAILED, Role.STANDBY),  # a take-over that failed before serving
]


def test_a_replicas_life_follows_the_table() -> None:
    role = Role.STANDBY
    for at, trigger, then in LIFE:
        assert role is at
        role = move(role, trigger)
        assert role is then


def test_every_role_has_duties_and_only_the_leader_serves_or_renews() -> None:
    assert set(DUTIES) == set(Role)
    assert [r for r, d in DUTIES.items() if d.serves] == [Role.LEADER]
    assert [r for r, d in DUTIES.items() if d.renews] == [Role.LEADER]
    # Only a standby follows the journal and campaigns: a candidate, a leader, a replica stepping
    # down (its core is stale until the server knows) and a stopped one do neither.
    assert [r for r, d in DUTIES.items() if d.follows] == [Role.STANDBY]
    assert [r for r, d in DUTIES.items() if d.campaigns] == [Role.STANDBY]


def test_stop_ends_every_role_and_a_stopped_replica_stays_stopped() -> None:
    for role in Role:
        assert move(role, Trigger.STOP) is Role.STOPPED
    for trigger in Trigger:
        assert move(Role.STOPPED, trigger) is Role.STOPPED


@pytest.mark.parametrize(
    ("role", "trigger"),
    [
        (Role.STANDBY, Trigger.SERVING),  # serving without a won term
        (Role.STANDBY, Trigger.LOST),
        (Role.LEADER, Trigger.WON),  # a leader does not campaign
        (Role.STEPPING_DOWN, Trigger.WON),  # nor does a replica stepping down
        (Role.CANDIDATE, Trigger.LOST),  # a candidate that fails says FAILED
    ],
)
def test_a_move_the_table_lacks_raises(role: Role, trigger: Trigger) -> None:
    assert (role, trigger) not in TRANSITIONS
    with pytest.raises(IllegalMove):
        move(role, trigger)
