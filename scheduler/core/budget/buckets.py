"""A token bucket per budget dimension, pure (time passed in), that may go below zero.

Unlike the server's rate limiter (`scheduler/core/ratelimit.py`: one call costs one token), a
permit reserves an estimate and is settled later with what it really cost, so a bucket is
charged after the fact and may owe tokens: a debt the next grants wait out. A clock that steps
backwards refills nothing. Dimensions the budget does not limit (`on` excludes them) are never
checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scheduler.core.budget.types import Vec

ZERO: Vec = (0.0, 0.0, 0.0, 0.0)
# Float dust from refills and refunds must not make an exact fit wait for a nanosecond.
EPS = 1e-9


def vsub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3])


def vneg(a: Vec) -> Vec:
    return (-a[0], -a[1], -a[2], -a[3])


@dataclass(slots=True)
class Bucket:
    """Per dimension: `rate` tokens a second flow in, at most `cap` are kept (never more: every
    change clamps to it, so what passes it is overflow a lender hands on)."""

    on: tuple[int, ...]  # the dimensions counted
    rate: list[float]
    cap: list[float]
    tokens: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    last: float = 0.0

    @classmethod
    def per_minute(cls, on: tuple[int, ...], per_minute: Vec, now: float, full: bool = False) -> Bucket:
        """A bucket holding one minute of `per_minute` at most, empty (or full)."""
        rate = [v / 60.0 for v in per_minute]
        cap = list(per_minute)
        return cls(on, rate, cap, list(cap) if full else [0.0] * 4, now)

    def advance(self, now: float) -> list[float]:
        """Refill up to `now`; returns what overflowed the cap per dimension (for a lender)."""
        over = [0.0, 0.0, 0.0, 0.0]
        dt = now - self.last
        if dt <= 0:
            return over
        self.last = now
        for d in self.on:
            t = self.tokens[d] + dt * self.rate[d]
            if t > self.cap[d]:  # tokens never pass the cap (rescale clamps them)
                over[d] = t - self.cap[d]
                t = self.cap[d]
            self.tokens[d] = t
        return over

    def refill(self, now: float) -> None:
        """`advance` for a bucket that lends nothing: the same arithmetic, no overflow list (the
        permit's hot path refills several meters per event)."""
        dt = now - self.last
        if dt <= 0:
            return
        self.last = now
        tokens, rate, cap = self.tokens, self.rate, self.cap
        for d in self.on:
            t = tokens[d] + dt * rate[d]
            tokens[d] = cap[d] if t > cap[d] else t

    def covers(self, v: Vec) -> bool:
        t = self.tokens
        # A loop, not all(...): the generator costs more than the test on the permit's hot path.
        for d in self.on:  # noqa: SIM110
            if not t[d] + EPS * (1.0 + abs(v[d])) >= v[d]:
                return False
        return True

    def full(self) -> bool:
        return all(self.tokens[d] + EPS >= self.cap[d] for d in self.on)

    def take(self, v: Vec, floor: bool = False) -> None:
        """Charge `v` (may go below zero; `floor`: not below minus one cap, for a meter whose
        memory of a burst is bounded to a minute)."""
        for d in self.on:
            t = self.tokens[d] - v[d]
            self.tokens[d] = max(t, -self.cap[d]) if floor else t

    def give(self, v: Vec) -> list[float]:
        """Return `v` (a refund); what would pass the cap is handed back as overflow."""
        over = [0.0, 0.0, 0.0, 0.0]
        for d in self.on:
            t = self.tokens[d] + v[d]
            if t > self.cap[d]:
                over[d] = t - self.cap[d]
                t = self.cap[d]
            self.tokens[d] = t
        return over

    def add(self, v: list[float]) -> None:
        """Tokens lent in (a leaf's overflow), up to the cap; the rest is lost."""
        for d in self.on:
            if v[d] > 0 and self.tokens[d] < self.cap[d]:
                self.tokens[d] = min(self.cap[d], self.tokens[d] + v[d])

    def wait(self, v: Vec, extra_rate: list[float] | None = None, capped: bool = True) -> float:
        """Seconds until it holds `v` at its refill rate (plus `extra_rate`): 0 if it does now,
        inf if it never will (no refill, or, `capped`, `v` above the cap). Not capped: how long
        the refill of `v` takes, for a queue of permits none of which is above the cap."""
        worst = 0.0
        for d in self.on:
            deficit = v[d] - self.tokens[d]
            if deficit <= EPS * (1.0 + abs(v[d])):
                continue
            if capped and v[d] > self.cap[d] * (1.0 + EPS) + EPS:
                return math.inf
            rate = self.rate[d] + (extra_rate[d] if extra_rate is not None else 0.0)
            if rate <= 0:
                return math.inf
            worst = max(worst, deficit / rate)
        # A hair late rather than early: at the time returned the refill covers `v` for sure.
        return worst * (1.0 + 1e-12) + 1e-9 if worst > 0 else 0.0

    def drain(self) -> None:
        """Empty it (the provider says its window is spent); a debt is kept."""
        for d in self.on:
            self.tokens[d] = min(0.0, self.tokens[d])

    def rescale(self, per_minute: Vec) -> None:
        """A new rate and cap (one minute of it); tokens above the new cap are dropped."""
        for d in range(4):
            self.rate[d] = per_minute[d] / 60.0
            self.cap[d] = per_minute[d]
            if self.tokens[d] > self.cap[d]:
                self.tokens[d] = self.cap[d]

    def level(self) -> Vec:
        t = self.tokens
        return (t[0], t[1], t[2], t[3])
