"""The budget run: sessions replay their LLM calls through a limiter to the provider, in virtual
time. Nothing here decides who is served: the limiter does (`limiters.py`, or slotsched's budget
core in `slotsched.py`); the provider (`provider.py`) answers 429 past its real limit.

A session's calls keep their order and their gaps. A call starts at its offset on the session's
own timeline, shifted by the session's lag: how late its calls ended (or its slot came) against
the unconstrained timeline. It waits for every earlier call that had ended by its offset (the
agent needed that answer); earlier calls still running at its offset (sub-agents) run beside it.
A call needs its session's slot (`pool.py`); its **time to permit** runs from the moment it is
ready to go, slot held, to the moment the provider accepts it: a limiter's wait, a 429's
retry-after and backoff, all of it.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.core.budget.types import ReportedLimits
from scheduler.core.types import QoS
from scheduler.core.views import BudgetFeed
from scheduler.sim.budget.pool import PoolConfig, SlotGate, budget_cap
from scheduler.sim.budget.provider import Buckets, Provider, cost
from scheduler.sim.budget.setup import BudgetSetup, Vec
from scheduler.sim.workload import LlmCall, SessionPlan

CLASS_RANK = {QoS.GUARANTEED: 0, QoS.BURSTABLE: 1, QoS.BEST_EFFORT: 2}
# Event kinds, in the order they apply when simultaneous.
_DONE, _RELEASE, _READY, _SEND, _ASK, _WAKE, _WORKERS, _SCALE = range(8)


@dataclass
class CallRun:
    session: SessionRun
    index: int
    call: LlmCall
    estimate: Vec
    used: Vec
    ready: float = -1.0
    wanted: float = -1.0  # when the session wanted to make it (before its slot, if it had none)
    accepted: float | None = None
    tries: int = 0  # provider answers so far (the SDK's backoff counts them)
    within_reserved: bool = False
    handle: object = None  # the limiter's own (slotsched: the permit id)


@dataclass
class SessionRun:
    plan: SessionPlan
    calls: list[LlmCall]
    cls: int
    ends: list[float] = field(default_factory=list)  # each call's end, unconstrained
    next: int = 0
    inflight: set[int] = field(default_factory=set)
    lag: float = 0.0
    worker: int | None = None
    asking: bool = False
    parked: list[CallRun] = field(default_factory=list)  # ready, waiting for the slot
    release_token: int = 0
    finished: float | None = None

    @property
    def alone_s(self) -> float:
        return max(self.ends, default=0.0)


class Limiter(Protocol):
    """What stands between a ready call and the provider."""

    name: str

    def start(self, sim: BudgetSim) -> None: ...

    def request(self, c: CallRun, now: float) -> None: ...  # eventually sim.send(c, now)

    def throttled(self, c: CallRun, retry_after_s: float, now: float) -> None: ...

    def done(self, c: CallRun, now: float) -> None: ...

    def wake(self, now: float) -> None: ...

    def effective_per_min(self) -> float: ...  # the rate it lets through, in the setup's dimension


def sdk_backoff(tries: int, retry_after_s: float, rng: random.Random) -> float:
    """The common SDK default after a 429: the provider's retry-after, plus exponential backoff
    (0.5 s doubling per try, at most 8 s) with full jitter, so a crowd does not return at once."""
    return retry_after_s + min(8.0, 0.5 * 2.0 ** max(0, tries - 1)) * rng.random()


@dataclass
class Record:
    """What the figures read of a run."""

    calls: list[CallRun] = field(default_factory=list)
    throttles: list[float] = field(default_factory=list)  # provider 429s, when
    sessions: list[SessionRun] = field(default_factory=list)
    workers: list[tuple[float, int, int]] = field(default_factory=list)  # (t, paid, holding)
    worker_seconds: float = 0.0
    end: float = 0.0
    limits: list[tuple[float, float]] = field(default_factory=list)  # (t, effective per min)


class BudgetSim:
    def __init__(
        self,
        plans: Sequence[SessionPlan],
        setup: BudgetSetup,
        limiter: Limiter,
        pool: PoolConfig,
        until_s: float | None = None,
        seed: int = 0,
    ) -> None:
        self.setup = setup
        self.limiter = limiter
        self.pool = SlotGate(pool)
        self.cfg = pool
        self.until = until_s
        self.rng = random.Random(seed)
        self.provider = Provider(setup.real_limits)
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.rec = Record()
        self.dim = setup.dim
        # Tokens accepted in the trailing minute, and holders sampled (the autoscaler's cap).
        self.recent: deque[tuple[float, Vec]] = deque()
        self.holding: deque[tuple[float, int]] = deque()
        self.g_leaf: dict[str, Buckets] = {}
        for p in plans:
            calls = p.calls
            if not calls:
                continue
            s = SessionRun(p, calls, CLASS_RANK[p.qos], [c.offset_s + c.api_s for c in calls])
            self.rec.sessions.append(s)
            self.at(p.arrival_s, _READY, s)

    # --- the event queue ----------------------------------------------------------------------

    def at(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.heap, (t, kind, next(self.seq), payload))

    def run(self, progress: Callable[[float], None] | None = None) -> Record:
        self.limiter.start(self)
        self.at(0.0, _SCALE, None)  # the autoscaler's period (a static pool: only a sample)
        total = len(self.rec.sessions) or 1
        done_sessions = 0
        while self.heap:
            t, kind, _, payload = heapq.heappop(self.heap)
            if self.until is not None and t > self.until:
                break
            self.now = t
            if kind == _DONE:
                assert isinstance(payload, CallRun)
                self._done(payload)
                if payload.session.finished is not None:
                    done_sessions += 1
                    if progress and done_sessions % 10 == 0:
                        progress(done_sessions / total)
            elif kind == _RELEASE:
                assert isinstance(payload, tuple)
                s, token = payload
                if s.release_token == token:
                    self._release_slot(s)
            elif kind == _READY:
                if isinstance(payload, SessionRun):
                    self._release_calls(payload)
                else:
                    assert isinstance(payload, CallRun)
                    self._ready(payload)
            elif kind == _SEND:
                assert isinstance(payload, CallRun)
                self.send(payload, t)
            elif kind == _ASK:
                assert isinstance(payload, CallRun)
                self.limiter.request(payload, t)
            elif kind == _WAKE:
                self.limiter.wake(t)
            elif kind == _WORKERS:
                self.pool.start_ready(t)
                self._grant_slots()
            elif kind == _SCALE:
                self._scale()
                if any(k != _SCALE for _, k, _, _ in self.heap):
                    self.at(t + self.cfg.period_s, _SCALE, None)
        end = self.until if self.until is not None else self.now
        self.pool._pay(end)
        self.rec.worker_seconds = self.pool.paid_s
        self.rec.end = end
        return self.rec

    # --- sessions and their calls ---------------------------------------------------------------

    def _release_calls(self, s: SessionRun) -> None:
        """Schedule every call whose predecessors are done (see the module docstring)."""
        while s.next < len(s.calls):
            c = s.calls[s.next]
            if any(s.ends[j] <= c.offset_s + 1e-9 for j in s.inflight):
                return
            est = cost(c.input_tokens, max(self.setup.max_tokens, c.output_tokens))
            run = CallRun(s, s.next, c, est, cost(c.input_tokens, c.output_tokens))
            s.inflight.add(s.next)
            s.next += 1
            self.at(max(self.now, s.plan.arrival_s + c.offset_s + s.lag), _READY, run)

    def _ready(self, c: CallRun) -> None:
        c.wanted = self.now
        s = c.session
        s.release_token += 1  # a pending idle release is off: the session is busy again
        if s.worker is None:
            s.parked.append(c)
            if not s.asking:
                s.asking = True
                self.pool.ask(s.cls, s, s.plan.tenant)
                self._grant_slots()
            return
        self._go(c)

    def _go(self, c: CallRun) -> None:
        c.ready = self.now
        s = c.session
        if s.cls == 0:
            c.within_reserved = self._within_reserved(c)
        self.rec.calls.append(c)
        self.limiter.request(c, self.now)

    def _within_reserved(self, c: CallRun) -> bool:
        """Whether the tenant's Guaranteed demand conforms to its reserved rate at this call: a
        token bucket of that rate, one minute deep, that every ready Guaranteed call of the tenant
        draws its estimate from (in debt if need be, as the demand it is), covers this one."""
        share = self.setup.shares.get(c.session.plan.tenant)
        if share is None or not any(share.reserved_vec):
            return False
        b = self.g_leaf.get(c.session.plan.tenant)
        if b is None:
            b = self.g_leaf[c.session.plan.tenant] = Buckets(share.reserved_vec, self.now)
        b.advance(self.now)
        within = b.deficit_s(c.estimate) <= 1e-9
        b.take(c.estimate)
        return within

    def _grant_slots(self) -> None:
        for who, worker in self.pool.grant():
            assert isinstance(who, SessionRun)
            who.asking = False
            who.worker = worker
            if who.parked:  # the slot's wait shifts the session's timeline
                late = self.now - (who.plan.arrival_s + who.parked[0].call.offset_s + who.lag)
                who.lag += max(0.0, late)
            parked, who.parked = who.parked, []
            for c in parked:
                self._go(c)

    def send(self, c: CallRun, now: float) -> None:
        """The limiter lets `c` go: the provider admits it or answers 429."""
        retry = self.provider.admit(c.estimate, now)
        c.tries += 1
        if retry is not None:
            self.rec.throttles.append(now)
            self.limiter.throttled(c, retry, now)
            return
        c.accepted = now
        self.recent.append((now, c.used))
        self.at(now + c.call.api_s, _DONE, c)

    def retry_at(self, c: CallRun, t: float) -> None:
        self.at(t, _SEND, c)

    def retry_at_limiter(self, c: CallRun, t: float) -> None:
        """`c` asks its limiter again at `t` (a limiter's own 429, retried by the caller)."""
        self.at(t, _ASK, c)

    def stated(self) -> ReportedLimits | None:
        """What the provider's last answer stated of its limit (None: it states nothing)."""
        return self.provider.stated() if self.setup.headers else None

    def wake_at(self, t: float) -> None:
        self.at(t, _WAKE, None)

    def _done(self, c: CallRun) -> None:
        self.provider.settle(c.estimate, c.used, self.now)
        self.limiter.done(c, self.now)
        s = c.session
        s.inflight.discard(c.index)
        s.lag = max(s.lag, self.now - (s.plan.arrival_s + s.ends[c.index]))
        self._release_calls(s)
        if s.inflight:
            return
        if s.next >= len(s.calls):
            s.finished = self.now
            self._release_slot(s)
            return
        nxt = s.plan.arrival_s + s.calls[s.next].offset_s + s.lag
        if nxt - self.now > self.cfg.idle_release_s:
            s.release_token += 1
            self.at(self.now + self.cfg.idle_release_s, _RELEASE, (s, s.release_token))

    def _release_slot(self, s: SessionRun) -> None:
        if s.worker is not None:
            self.pool.release(s.worker, self.now, s.cls, s.plan.tenant)
            s.worker = None
            self._grant_slots()

    # --- the autoscaler -------------------------------------------------------------------------

    def _scale(self) -> None:
        now = self.now
        while self.recent and self.recent[0][0] <= now - 60.0:
            self.recent.popleft()
        self.holding.append((now, self.pool.held))
        while self.holding and self.holding[0][0] <= now - 60.0:
            self.holding.popleft()
        held = sum(h for _, h in self.holding) / len(self.holding)
        effective = self.limiter.effective_per_min()
        if self.cfg.autoscale:
            # The server's feed: every dimension the budget limits, the effective limit the same
            # fraction of the configured one in each, and what a held slot's session was charged.
            per_session = tuple(
                sum(u[d] for _, u in self.recent) / held if held > 0 else 0.0 for d in range(4)
            )
            scale = effective / (self.setup.limits[self.dim] or 1.0)
            feed = BudgetFeed(self.setup.name, _vec(x * scale for x in self.setup.limits), _vec(per_session))
            cap = budget_cap(feed, self.cfg.slots_per_worker, self.pool.held, self.pool.claimed())
            ready_at = self.pool.scale(now, cap)
            if ready_at is not None:
                self.at(ready_at, _WORKERS, None)
            for src, dst in self.pool.moves(now):
                s = next(s for s in self.rec.sessions if s.worker == src)
                s.worker = dst
            self._grant_slots()
        else:
            self.pool._pay(now)
        self.rec.workers.append((now, self.pool.paid(), self.pool.held))
        self.rec.limits.append((now, effective))


def _vec(xs: Iterable[float]) -> Vec:
    a, b, c, d = xs
    return (a, b, c, d)


def time_alone(s: SessionRun) -> float:
    return max(1e-3, s.alone_s)


def stretch(s: SessionRun) -> float | None:
    if s.finished is None:
        return None
    return (s.finished - s.plan.arrival_s) / time_alone(s)


__all__ = ["BudgetSim", "CallRun", "Limiter", "Record", "SessionRun", "sdk_backoff", "stretch"]
