"""A token bucket, pure: the caller passes the time in (the server's adapter reads the clock).

`rate` tokens a second flow in, at most `burst` are kept; a call takes one. Refused, it learns
how long until a token is there (the server sends that as `retry-after-ms`). A clock that steps
backwards refills nothing and is not remembered, so it cannot mint tokens either.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    rate: float  # tokens a second, > 0
    burst: int  # the most tokens kept, >= 1
    tokens: float
    last: float  # when `tokens` was last brought up to date

    @classmethod
    def full(cls, rate: float, burst: int, now: float) -> TokenBucket:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, got rate {rate}, burst {burst}")
        return cls(rate, burst, float(burst), now)

    def take(self, now: float, cost: float = 1.0) -> float:
        """Take `cost` tokens if there are enough: 0.0. Else take nothing and return the seconds
        until there will be (at least a token's worth, never 0)."""
        if now > self.last:
            self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
            self.last = now
        if self.tokens >= cost:
            self.tokens -= cost
            return 0.0
        return max((cost - self.tokens) / self.rate, 1e-3)
