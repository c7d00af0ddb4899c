"""Backoff, written once: a `RetryPolicy` says how long to wait before the next try and how many
tries there are (as temporalio's `RetryConfig` does); every wait between two tries in the SDK
comes from one. Which failures are tried again at all is `reactions.py`'s table; who tries
again is told where each policy is used:

* `AsyncClient.reattach`: a session's stream re-attached (or its first attach tried again) after
  `backoff_initial_s` doubling to `backoff_max_s`, for `reattach_timeout_s` (`attach.py`); a wait
  the server told (retry-after) is stretched by up to half, so the sessions it refused together
  do not come back together;
* `AsyncClient.commands`: a Yield or Release tried five times, `backoff_initial_s` doubling
  between tries; a Renew once (its schedule sends the next one before the lease expires)
  (`calls.py`);
* `FAILOVER`: a call whose replica was lost (or does not lead) sent again to the leader after
  50-100 ms, for `failover_timeout_s` (`calls.py`, `follow.py`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait before each retry, and how many tries in all."""

    initial_s: float
    max_s: float = math.inf
    multiplier: float = 2.0
    #: Each wait is multiplied by a factor drawn from this range ((1, 1): no jitter).
    jitter: tuple[float, float] = (1.0, 1.0)
    #: Tries in all, the first included (None: as many as the caller's deadline allows).
    attempts: int | None = None
    #: A wait the server told (retry-after) is multiplied by a factor drawn from this range.
    told_jitter: tuple[float, float] = (1.0, 1.5)

    def delay(self, retry: int) -> float:
        """The wait before retry number `retry` (0 for the first retry)."""
        return _jittered(min(self.initial_s * self.multiplier**retry, self.max_s), self.jitter)

    def allows(self, tries: int) -> bool:
        """Whether another try may follow `tries` tries."""
        return self.attempts is None or tries < self.attempts

    def told(self, retry_after_s: float) -> float:
        """The wait for a server that said when to come back."""
        return _jittered(retry_after_s, self.told_jitter)

    def backoff(self) -> Backoff:
        return Backoff(self)


def _jittered(seconds: float, factor: tuple[float, float]) -> float:
    lo, hi = factor
    return seconds if lo == hi == 1.0 else seconds * random.uniform(lo, hi)


class Backoff:
    """The growing wait of one retry loop: `current` before the next try, `grow` after a failed
    one, `reset` once the server answers."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.current = policy.initial_s

    def grow(self) -> None:
        self.current = min(self.current * self.policy.multiplier, self.policy.max_s)

    def reset(self) -> None:
        self.current = self.policy.initial_s

    def at_least(self, seconds: float) -> None:
        """Wait no less than `seconds` next time (the server said when)."""
        self.current = max(self.current, seconds)


#: A call whose replica was lost, or that a standby refused: sent again to the leader (or the
#: next replica) after 50-100 ms, for `failover_timeout_s`.
FAILOVER = RetryPolicy(initial_s=0.05, multiplier=1.0, jitter=(1.0, 2.0))
