"""When a simulation run stops: every session is done, or no session can progress any more.

Why a guard: a contender may keep work from ever finishing. KEDA's Redis-list scaler, for one,
counts only *waiting* sessions; 300 s after the list last had items it scales the pool to zero and
kills the running ones, which re-queue without a checkpoint, wake the scaler, and are killed again
300 s into their next run — a session that needs more than that never finishes, and a run that
waits for it never ends. The simulator cannot tell such a loop from a slow run by looking at one
event, so it watches progress:

- progress is a session arriving (a new period, or a first request), a period finished, a
  checkpoint that saved at least a second of work, or a session ending for good (refused, its
  holder dead);
- with no arrival left to come, no progress for `stall_s` means none will come: any contender
  that serves work at all finishes or checkpoints something within the longest period's hold
  plus every delay the policy allows (lease TTL, yield grace, checkpoint, a worker's start and
  drain) and generous slack for autoscaler cooldowns;
- `horizon_s` bounds virtual time whatever happens: the whole workload run one period after
  another (arrivals, holds, think times) plus that slack per period.

The run then ends where it is and what is left counts as unfinished, with a note saying why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.policy.model import Policy
from scheduler.sim.workload import SessionPlan

SLACK_S = 600.0  # autoscaler cooldowns and polls (KEDA 300 s, HPA stabilization 300 s) fit in it
MIN_SAVED_S = 1.0  # a checkpoint saving less than this is not progress (a loop can shave crumbs)


@dataclass
class RunGuard:
    stall_s: float
    horizon_s: float
    last_progress_s: float = 0.0
    arrivals_pending: int = 0  # arrivals scheduled and not yet happened
    events: int = 0
    stopped_at_s: float | None = None
    why: str = ""

    @classmethod
    def for_run(cls, policy: Policy, plans: Sequence[SessionPlan], checkpoint_s: float) -> RunGuard:
        t, auto = policy.timing, policy.autoscaler
        delays = 2 * (t.lease_ttl_s + t.yield_grace_s + checkpoint_s) + auto.start_delay_s
        scaling = auto.scale_up_period_s + auto.scale_up_cooldown_s + auto.scale_down_cooldown_s
        slack = delays + auto.drain_timeout_s + scaling + max(SLACK_S, auto.scale_down_stabilization_s)
        periods = [p for plan in plans for p in plan.periods]
        longest = max((p.hold_s for p in periods), default=0.0)
        last_arrival = max((p.arrival_s for p in periods), default=0.0)
        serial = sum(p.hold_s + (p.think_s or 0.0) + slack for p in periods)
        return cls(stall_s=longest + slack, horizon_s=last_arrival + serial + slack)

    def progress(self, now: float) -> None:
        self.last_progress_s = max(self.last_progress_s, now)

    def saved(self, now: float, seconds: float) -> None:
        """A checkpoint saved `seconds` of work."""
        if seconds >= MIN_SAVED_S:
            self.progress(now)

    def should_stop(self, now: float) -> bool:
        """After each event: has the run gone on without progress (or past the horizon)?
        The caller stops only if some session is still open."""
        self.events += 1
        if self.arrivals_pending == 0 and now - self.last_progress_s > self.stall_s:
            self.why = (
                f"no session made progress (no period finished, no checkpoint saved work, nothing left "
                f"to arrive) for {self.stall_s:.0f} s, longer than any period's hold plus every delay of "
                f"the policy, so none would"
            )
            return True
        if now > self.horizon_s:
            self.why = (
                f"virtual time passed {self.horizon_s:.0f} s, the whole workload run one period after "
                "another with every delay of the policy"
            )
            return True
        return False

    def note(self, now: float, unfinished: int, revocations: int, lost: float) -> str:
        """The report's sentence for a stopped run."""
        self.stopped_at_s = now
        tail = (
            f"; {revocations} lease(s) were revoked (killed) along the way, losing {lost:.0f} slot-s of work"
            if revocations
            else ""
        )
        return f"Stopped at {now:.0f} s with {unfinished} session(s) unfinished: {self.why}{tail}."
