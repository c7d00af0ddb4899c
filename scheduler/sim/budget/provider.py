"""The provider's rate limit as it behaves: a token bucket per dimension (requests, input tokens,
output tokens, total tokens), one minute's limit deep, refilled continuously (as Anthropic
documents its limits), at the real limit, which may be below the one configured.

A call is admitted when every bucket holds what it takes: 1 request, its input tokens, its output
estimate (max tokens: the provider cannot know the output yet); at completion the output estimate
is corrected to the real output. Past it the call is answered 429 with a retry-after of the
whole seconds until the bucket holds enough (providers send whole seconds).

Every answer, a 429 too, states the limit in its headers, as Anthropic's and OpenAI's do
(`anthropic-ratelimit-input-tokens-limit`, `x-ratelimit-limit-tokens`, ...): `stated()`, which a
run turns off (`BudgetSetup.headers`) to show the 429-learning path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler.core.budget.types import ReportedLimits
from scheduler.sim.budget.setup import Vec


def cost(input_tokens: float, output_tokens: float) -> Vec:
    return (1.0, input_tokens, output_tokens, input_tokens + output_tokens)


@dataclass
class Buckets:
    """Token buckets at `limits` per minute (0: not limited), full at the start."""

    limits: Vec
    now: float = 0.0

    def __post_init__(self) -> None:
        self.level = list(self.limits)

    def advance(self, now: float) -> None:
        dt = max(0.0, now - self.now)
        self.now = max(self.now, now)
        for i, lim in enumerate(self.limits):
            if lim > 0:
                self.level[i] = min(lim, self.level[i] + lim * dt / 60.0)

    def deficit_s(self, need: Vec) -> float:
        """Seconds until every limited bucket holds `need` (0: it does now)."""
        wait = 0.0
        for i, lim in enumerate(self.limits):
            if lim > 0 and need[i] > self.level[i] + 1e-6 * lim:  # rounding is not a deficit
                if need[i] > lim:  # never fits whole: wait for a full bucket, then owe the rest
                    wait = max(wait, (lim - self.level[i]) * 60.0 / lim)
                else:
                    wait = max(wait, (need[i] - self.level[i]) * 60.0 / lim)
        return wait

    def take(self, amount: Vec) -> None:
        for i, lim in enumerate(self.limits):
            if lim > 0:
                self.level[i] -= amount[i]


class Provider:
    """The real limit. `admit` answers None (admitted, charged) or a retry-after in seconds."""

    def __init__(self, limits: Vec, now: float = 0.0) -> None:
        self.buckets = Buckets(limits, now)

    def admit(self, need: Vec, now: float) -> float | None:
        self.buckets.advance(now)
        wait = self.buckets.deficit_s(need)
        if wait > 1e-9:
            return float(max(1, math.ceil(wait)))
        self.buckets.take(need)
        return None

    def stated(self) -> ReportedLimits:
        """The limits its response headers state (per minute; None where it has no limit)."""
        r, i, o, t = (x if x > 0 else None for x in self.buckets.limits)
        return ReportedLimits(r, i, o, t)

    def settle(self, estimate: Vec, used: Vec, now: float) -> None:
        """The call ended: charge or refund the difference between what it used and its estimate."""
        self.buckets.advance(now)
        self.buckets.take(tuple(u - e for u, e in zip(used, estimate, strict=True)))  # type: ignore[arg-type]
