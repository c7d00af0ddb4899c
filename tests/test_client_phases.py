"""A session's phases change through one table (scheduler/client/phases.py), assigned in one
place (SessionState.move): every (phase, event) pair is listed here with where it leads, or
None where the move is refused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scheduler.client.phases import TRANSITIONS, IllegalTransition, Phase, SessionEvent, next_phase
from scheduler.client.state import SessionSpec, SessionState
from scheduler.client.types import QoS

ROOT = Path(__file__).resolve().parents[1]
P, E = Phase, SessionEvent
S, Q, H, Y, X = P.STARTING, P.QUEUED, P.HOLDING, P.YIELDING, P.ENDED
NO = None  # refused

# Columns: QUEUED, GRANTED, YIELD_ASKED, YIELD_CALLED_OFF, YIELDED, REVOKED, LEASE_LOST, ENDED
EVENTS = (E.QUEUED, E.GRANTED, E.YIELD_ASKED, E.YIELD_CALLED_OFF, E.YIELDED, E.REVOKED, E.LEASE_LOST, E.ENDED)
# fmt: off
EXPECTED: dict[Phase, tuple[Phase | None, ...]] = {
    #           QUEUED GRANTED ASKED OFF  YIELDED REVOKED LOST ENDED
    P.STARTING: (Q,    H,      NO,   NO,  Q,      Q,      NO,  X),
    P.QUEUED:   (Q,    H,      Y,    H,   Q,      Q,      S,   X),
    P.HOLDING:  (Q,    H,      Y,    H,   Q,      Q,      S,   X),
    P.YIELDING: (Q,    H,      Y,    H,   Q,      Q,      S,   X),
    P.ENDED:    (NO,   NO,     NO,   NO,  NO,     NO,     NO,  NO),
}
# fmt: on
CASES = [(phase, event, EXPECTED[phase][i]) for phase in Phase for i, event in enumerate(EVENTS)]


def test_the_table_covers_every_phase_and_event() -> None:
    assert set(EVENTS) == set(SessionEvent)
    assert set(TRANSITIONS) == set(Phase) == set(EXPECTED)


@pytest.mark.parametrize(("phase", "event", "after"), CASES, ids=[f"{p}-{e}" for p, e, _ in CASES])
def test_each_move(phase: Phase, event: SessionEvent, after: Phase | None) -> None:
    if after is None:
        with pytest.raises(IllegalTransition):
            next_phase(phase, event)
    else:
        assert next_phase(phase, event) is after


def test_the_state_moves_through_the_table_and_an_end_is_final() -> None:
    state = SessionState(SessionSpec("s", QoS.BURSTABLE))
    assert state.phase is P.STARTING
    for event, after in ((E.QUEUED, Q), (E.GRANTED, H), (E.YIELD_ASKED, Y), (E.YIELDED, Q)):
        state.move(event)
        assert state.phase is after
    with pytest.raises(IllegalTransition):
        SessionState(SessionSpec("t", QoS.BURSTABLE)).move(E.YIELD_ASKED)  # holds nothing
    state.end("released")
    state.end("abandoned")  # a second end changes nothing (a release that timed out, say)
    assert state.phase is X and state.end_reason == "released" and state.ended.is_set()
    with pytest.raises(IllegalTransition):
        state.move(E.GRANTED)


def test_a_phase_is_assigned_in_session_state_move_only() -> None:
    offenders = []
    for f in sorted((ROOT / "scheduler" / "client").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if not isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr in ("_phase", "phase"):
                    offenders.append(f"{f.name}:{node.lineno}")
    assert offenders == ["state.py:" + str(_move_line())], offenders


def _move_line() -> int:
    tree = ast.parse((ROOT / "scheduler" / "client" / "state.py").read_text())
    move = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "move")
    assign = next(n for n in ast.walk(move) if isinstance(n, ast.Assign))
    return assign.lineno
