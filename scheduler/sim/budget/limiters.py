"""The limiters platforms run today, none of which knows classes, tenants' shares or the provider's
real limit. Each is configured with the budget's configured limit (what the platform believes),
and every call it lets go may still be answered 429 by the provider, which the caller retries as
the SDKs do (`engine.sdk_backoff`).

- `NoLimiter`: every call goes straight to the provider; a 429 is retried with backoff and jitter.
- `PerWorker`: the configured limit divided statically among the policy's workers, a token bucket
  each, calls of a worker's sessions in arrival order (a worker added by an autoscaler brings its
  own share: the split is static, so the fleet then overruns it).
- `SlidingWindow`: one fleet-wide sliding window of the last minute in one store (the usual Redis
  limiter), calls served first come first served as the window frees (an ideal FIFO: no polling
  lag is charged to it).
- `Gateway`: an LLM gateway's dynamic limiter, as LiteLLM's (`dynamic_rate_limiter_v3`): per-minute
  counters per model; while the minute's usage is below the saturation threshold any caller may
  use idle capacity; past it each priority (here: the class) is held to its reserved share of the
  limit, and a call past it is answered 429 until the next minute, which the caller retries.
"""

from __future__ import annotations

import math
from collections import deque

from scheduler.sim.budget.engine import BudgetSim, CallRun, sdk_backoff
from scheduler.sim.budget.provider import Buckets
from scheduler.sim.budget.setup import CLASS_KEYS, REQUESTS, Vec

# LiteLLM's default saturation threshold for its priority reservation.
SATURATION = 0.8


class NoLimiter:
    name = "no-limiter"

    def __init__(self) -> None:
        self.sim: BudgetSim | None = None

    def start(self, sim: BudgetSim) -> None:
        self.sim = sim

    def request(self, c: CallRun, now: float) -> None:
        assert self.sim is not None
        self.sim.send(c, now)

    def throttled(self, c: CallRun, retry_after_s: float, now: float) -> None:
        assert self.sim is not None
        self.sim.retry_at(c, now + sdk_backoff(c.tries, retry_after_s, self.sim.rng))

    def done(self, c: CallRun, now: float) -> None:
        pass

    def wake(self, now: float) -> None:
        pass

    def effective_per_min(self) -> float:
        assert self.sim is not None
        return self.sim.setup.limits[self.sim.dim]


class _Queued(NoLimiter):
    """A limiter with FIFO queues of its own, woken at the earliest time its head may fit."""

    def __init__(self) -> None:
        super().__init__()
        self.wake_armed: float | None = None

    def arm(self, t: float) -> None:
        """One timer, at the earliest time any head may fit (a later one is left to it)."""
        assert self.sim is not None
        if self.wake_armed is None or t < self.wake_armed - 1e-9:
            self.wake_armed = t
            self.sim.wake_at(t)

    def due(self, now: float) -> bool:
        """A wake-up is due (not one an earlier arm superseded)."""
        if self.wake_armed is None or now < self.wake_armed - 1e-9:
            return False
        self.wake_armed = None
        return True


class PerWorker(_Queued):
    name = "per-worker"

    def __init__(self) -> None:
        super().__init__()
        self.buckets: dict[int, Buckets] = {}
        self.queues: dict[int, deque[CallRun]] = {}

    def start(self, sim: BudgetSim) -> None:
        super().start(sim)
        n = max(1, sim.cfg.workers)
        self.share: Vec = tuple(x / n for x in sim.setup.limits)  # type: ignore[assignment]

    def _bucket(self, w: int, now: float) -> Buckets:
        if w not in self.buckets:
            self.buckets[w] = Buckets(self.share, now)
            self.queues[w] = deque()
        return self.buckets[w]

    def request(self, c: CallRun, now: float) -> None:
        w = c.session.worker if c.session.worker is not None else -1
        self._bucket(w, now)
        c.handle = w
        self.queues[w].append(c)
        self._serve(w, now)

    def _serve(self, w: int, now: float) -> None:
        b, q = self.buckets[w], self.queues[w]
        b.advance(now)
        while q:
            wait = b.deficit_s(q[0].estimate)
            if wait > 1e-9:
                self.arm(now + max(wait, 1e-3))
                return
            c = q.popleft()
            b.take(c.estimate)
            assert self.sim is not None
            self.sim.send(c, now)

    def done(self, c: CallRun, now: float) -> None:
        assert isinstance(c.handle, int)
        b = self.buckets[c.handle]
        b.advance(now)
        b.take(tuple(u - e for u, e in zip(c.used, c.estimate, strict=True)))  # type: ignore[arg-type]

    def wake(self, now: float) -> None:
        if not self.due(now):
            return
        for w in list(self.queues):
            self._serve(w, now)


class SlidingWindow(_Queued):
    name = "sliding-window"

    def __init__(self) -> None:
        super().__init__()
        self.log: deque[tuple[float, list[float]]] = deque()  # (when, amount), oldest first
        self.sum = [0.0, 0.0, 0.0, 0.0]
        self.queue: deque[CallRun] = deque()

    def request(self, c: CallRun, now: float) -> None:
        self.queue.append(c)
        self._serve(now)

    def _expire(self, now: float) -> None:
        while self.log and self.log[0][0] <= now - 60.0:
            _, amount = self.log.popleft()
            for i in range(4):
                self.sum[i] -= amount[i]

    def _fits_at(self, need: Vec, now: float) -> float:
        """The earliest time the window has room for `need` (old entries aging out)."""
        assert self.sim is not None
        limits = self.sim.setup.limits
        over = [max(0.0, self.sum[i] + need[i] - limits[i]) if limits[i] > 0 else 0.0 for i in range(4)]
        if not any(x > 1e-9 for x in over):
            return now
        freed = [0.0] * 4
        for t, amount in self.log:
            for i in range(4):
                freed[i] += amount[i]
            if all(freed[i] >= over[i] - 1e-9 for i in range(4)):
                return t + 60.0
        return now + 60.0  # larger than the window: wait for it to empty

    def _serve(self, now: float) -> None:
        self._expire(now)
        while self.queue:
            c = self.queue[0]
            t = self._fits_at(c.estimate, now)
            if t > now + 1e-9:
                self.arm(t)
                return
            self.queue.popleft()
            entry = (now, list(c.estimate))
            c.handle = entry
            self.log.append(entry)
            for i in range(4):
                self.sum[i] += c.estimate[i]
            assert self.sim is not None
            self.sim.send(c, now)

    def done(self, c: CallRun, now: float) -> None:
        """The output estimate corrected to the real output, if its entry is still in the window."""
        entry = c.handle
        assert isinstance(entry, tuple)
        if entry[0] > now - 60.0:
            for i in range(4):
                delta = c.used[i] - c.estimate[i]
                entry[1][i] += delta
                self.sum[i] += delta
        self._serve(now)

    def wake(self, now: float) -> None:
        if self.due(now):
            self._serve(now)


class Gateway(NoLimiter):
    name = "gateway"

    def __init__(self, saturation: float = SATURATION) -> None:
        super().__init__()
        self.saturation = saturation
        self.minute = -1
        self.used = [0.0, 0.0, 0.0, 0.0]
        self.by_class: dict[int, list[float]] = {}

    def start(self, sim: BudgetSim) -> None:
        super().start(sim)
        fractions = sim.setup.class_fractions()
        self.reserved = {i: fractions[k] for i, k in enumerate(CLASS_KEYS)}

    def _roll(self, now: float) -> None:
        m = math.floor(now / 60.0)
        if m != self.minute:
            self.minute, self.used, self.by_class = m, [0.0] * 4, {}

    def _limits(self) -> list[float]:
        """The gateway counts requests and total tokens (LiteLLM's rpm and tpm) against the
        configured limit."""
        assert self.sim is not None
        r, i, o, t = self.sim.setup.limits
        return [r, 0.0, 0.0, t or (i + o)]

    def request(self, c: CallRun, now: float) -> None:
        assert self.sim is not None
        self._roll(now)
        limits = self._limits()
        saturated = any(lim > 0 and self.used[d] / lim >= self.saturation for d, lim in enumerate(limits))
        if saturated:
            mine = self.by_class.get(c.session.cls, [0.0] * 4)
            share = self.reserved[c.session.cls]
            if any(lim > 0 and mine[d] >= share * lim for d, lim in enumerate(limits)):
                # The gateway's own 429: until the next minute's counters.
                c.tries += 1
                wait = (self.minute + 1) * 60.0 - now
                self.sim.retry_at_limiter(c, now + sdk_backoff(c.tries, math.ceil(wait), self.sim.rng))
                return
        self.used[REQUESTS] += 1
        self.by_class.setdefault(c.session.cls, [0.0] * 4)[REQUESTS] += 1
        self.sim.send(c, now)

    def throttled(self, c: CallRun, retry_after_s: float, now: float) -> None:
        assert self.sim is not None
        self.sim.retry_at_limiter(c, now + sdk_backoff(c.tries, retry_after_s, self.sim.rng))

    def done(self, c: CallRun, now: float) -> None:
        """Usage is recorded when the response arrives (LiteLLM's success callback)."""
        self._roll(now)
        tokens = c.used[1] + c.used[2]
        self.used[3] += tokens
        self.by_class.setdefault(c.session.cls, [0.0] * 4)[3] += tokens


ROSTER = (NoLimiter, PerWorker, SlidingWindow, Gateway)
__all__ = ["ROSTER", "Gateway", "NoLimiter", "PerWorker", "SlidingWindow"]
