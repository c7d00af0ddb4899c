"""What one active session spends of a budget a minute, as the autoscaler's cap reads it
(docs/design.md, "Token budgets": the autoscaler does not add workers a budget cannot feed).

Pure (time passed in). Per budget, one-minute buckets of what closed permits were charged
(`PermitEnded.charged`: the usage settled, or the estimate of an expired permit) and the sessions
that were charged: the rate of an active session is the tokens of the last complete minutes over
their session-minutes (a session counts in a minute where it was charged at all). The current,
partial minute is read only while no complete one is known (a partial minute understates it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from scheduler.core.budget.types import Vec

WINDOW_MINUTES = 5  # how far back the rate looks: long enough to span a call, short to follow load


@dataclass(slots=True)
class _Minute:
    minute: int
    charged: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    sessions: set[str] = field(default_factory=set)


class SessionRates:
    def __init__(self, window_minutes: int = WINDOW_MINUTES) -> None:
        self.window = window_minutes
        self._by_budget: dict[str, deque[_Minute]] = {}

    def observe(self, budget: str, session: str, charged: Vec, now: float) -> None:
        minute = int(now // 60)
        ring = self._by_budget.get(budget)
        if ring is None:
            ring = self._by_budget[budget] = deque()
        if not ring or ring[-1].minute != minute:
            ring.append(_Minute(minute))
            while ring[0].minute < minute - self.window:
                ring.popleft()
        m = ring[-1]
        c = m.charged
        c[0] += charged[0]
        c[1] += charged[1]
        c[2] += charged[2]
        c[3] += charged[3]
        m.sessions.add(session)

    def per_session(self, budget: str, now: float) -> Vec | None:
        """Per dimension, what an active session was charged a minute lately; None: no session
        was charged within the window."""
        minute = int(now // 60)
        ring = self._by_budget.get(budget)
        if ring is None:
            return None
        recent = [m for m in ring if minute - self.window <= m.minute <= minute]
        complete = [m for m in recent if m.minute < minute]
        use = complete or recent
        session_minutes = sum(len(m.sessions) for m in use)
        if session_minutes == 0:
            return None
        t = [sum(m.charged[d] for m in use) / session_minutes for d in range(4)]
        return (t[0], t[1], t[2], t[3])

    def forget(self, keep: set[str]) -> None:
        """Budgets a new policy no longer has are forgotten."""
        for name in [b for b in self._by_budget if b not in keep]:
            del self._by_budget[name]
