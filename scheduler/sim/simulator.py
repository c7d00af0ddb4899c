"""The simulator: the real policy core driven in virtual time by simulated holders.

A simulated holder renews its lease every half TTL, releases when its hold is done, and answers
`YieldRequested` by checkpointing (`checkpoint_s`) and yielding; its snapshot saves the work done
up to the request, and it resumes the rest when granted again. A `YieldCancelled` (the waiter
left) before the checkpoint is done calls the yield off: the holder runs on. A holder with
`crash_after_s` lives like any other (renews, answers yields) until that long after its grant,
then dies: it renews, checkpoints and releases no more, and its lease expires one TTL after its
last renewal. Nothing here decides anything: every decision comes from `Pools` (one `Core` per
pool of the policy; with one pool, exactly that pool's core) or from a baseline built on the same
`Decider` seam, for comparisons (`baselines/per_pool.py` runs one per pool).

Pools: each of `policy.pool_specs()` starts with its `workers` (ids `w000`… with one pool, as
always; `<pool>-w000`… with several, each `WorkerAdded` naming its pool), and a session asks with
its plan's `pool` and `fallback` (workload.py).

With `until_s`, a run cut off with work left counts what is still held up to `until_s`.

With `SimConfig.retry_refused`, a holder refused for lack of room (queue full, no capacity) does
what a client of a rejecting runtime does: it asks again after `retry_after_s` plus a seeded
uniform jitter (`retry_jitter_s`, 1.5–3 s by default), keeping its progress and snapshot, until a
retry lands. Its time-to-slot then counts from the first refused attempt, so a retry loop's wait
is measured, not hidden. Other refusals (no quota, unknown tenant) are final, as before.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.api import reasons
from scheduler.core.pools import Pools
from scheduler.core.types import (
    Acquire,
    Decision,
    Ended,
    Event,
    Expired,
    Granted,
    Lease,
    QoS,
    Queued,
    Refused,
    RefuseReason,
    Release,
    Renew,
    Revoked,
    SessionId,
    SnapshotRef,
    TenantName,
    Tick,
    WorkerAdded,
    WorkerId,
    Yield,
    YieldCancelled,
    YieldCause,
    YieldRequested,
)
from scheduler.policy.model import Policy
from scheduler.sim.attainment import Point
from scheduler.sim.decider import Decider, views
from scheduler.sim.guard import RunGuard
from scheduler.sim.stats import SimStats
from scheduler.sim.workload import SessionPlan

# Event kinds, in the order they apply when simultaneous.
_ARRIVE, _COMPLETE, _YIELD_ACK, _RENEW, _TICK, _HOOK, _RETRY, _CRASH = range(8)

# Refusals a client retries: room may appear later (their row in the one table of refusal
# reasons says retry after a pause). The others could never be served.
RETRYABLE = frozenset(RefuseReason(name) for name in reasons.RETRYABLE)
_CLASS = {"guaranteed": 0, "burstable": 1, "besteffort": 2}


@dataclass
class SimConfig:
    checkpoint_s: float = 2.0  # how long a holder takes to checkpoint once asked to yield
    until_s: float | None = None  # stop here and count what is left as unfinished
    sample_every_s: float | None = None  # record a time series for plots
    retry_refused: bool = False  # a refused holder retries (see the module docstring)
    retry_jitter_s: tuple[float, float] = (1.5, 3.0)
    seed: int = 0  # of the retry jitter


@dataclass
class _Live:
    plan: SessionPlan
    period: int = 0
    remaining: float = 0.0
    lease: Lease | None = None
    yield_asked_at: float | None = None
    crashed: bool = False  # dead: renews, yields and releases no more (its lease must expire)
    finished: bool = False
    refused: bool = False
    waiting_since: float | None = None  # first refused attempt of a retry loop
    snapshot: SnapshotRef | None = None  # last checkpoint, quoted by a retry
    beyond_quota: bool = False  # Guaranteed: its current wait began beyond the tenant's quota
    placing: bool = False  # Guaranteed: a wait began; its pool (hence its quota) not known yet


class PoolHook(Protocol):
    """Something that changes the pool during a run (the elastic pool of the autoscaler)."""

    def start(self, sim: Simulator) -> None: ...

    def fire(self, sim: Simulator, now: float) -> None: ...


@dataclass
class Simulator:
    policy: Policy
    plans: list[SessionPlan]
    config: SimConfig = field(default_factory=SimConfig)
    hook: PoolHook | None = None
    decider: Callable[[Policy], Decider] = Pools

    def __post_init__(self) -> None:
        self.core: Decider = self.decider(self.policy)
        self.stats = SimStats(self.policy)
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._live: dict[str, _Live] = {p.session_id: _Live(p) for p in self.plans}
        self._tick_at = math.inf
        self._rng = random.Random(self.config.seed)
        self.waiting_by_tenant: list[dict[str, int]] = []
        # Per sample, every tenant's (held, waiting) by class: fair-share attainment (attainment.py).
        self.points: list[Point] = []
        self._in_retry: dict[str, None] = {}  # sessions in a retry loop, in order of entry
        # Each pool's policy as its core sees it (`Policy.for_pool`: the tenants' quotas there).
        self._in_pool = {name: self.policy.for_pool(name) for name in self.policy.pool_names()}
        # Per tenant, its Guaranteed sessions holding or waiting, in order of entry, with the pool
        # each is in ("" until the decider placed it):
        self._g_play: dict[str, dict[str, str]] = {}
        self.now = 0.0
        self.guard = RunGuard.for_run(self.policy, self.plans, self.config.checkpoint_s)

    # ------------------------------------------------------------------ driving

    def at(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, payload))
        if kind == _ARRIVE:
            self.guard.arrivals_pending += 1

    def schedule_hook(self, t: float) -> None:
        self.at(t, _HOOK, None)

    def apply(self, event: Event) -> list[Decision]:
        decisions = self.core.handle(event, self.now)
        for d in decisions:
            self._on_decision(d)
        nxt = self.core.next_deadline()
        if nxt is not None and nxt < self._tick_at:
            self._tick_at = nxt
            self.at(max(nxt, self.now), _TICK, None)
        return decisions

    def run(self, progress: Callable[[float], None] | None = None) -> SimStats:
        if self.hook is not None:
            self.hook.start(self)
        else:
            specs = self.policy.pool_specs()
            for spec in specs:
                prefix, name = ("", "") if len(specs) == 1 else (f"{spec.name}-", spec.name)
                for i in range(spec.workers):
                    self.add_worker(WorkerId(f"{prefix}w{i:03d}"), spec.slots_per_worker, name)
        for p in self.plans:
            self.at(p.arrival_s, _ARRIVE, p.session_id)
        if self.config.sample_every_s:
            self.at(0.0, _HOOK, "sample")
        until = self.config.until_s if self.config.until_s is not None else math.inf
        last_report = -1.0
        stalled = cut = False
        while self._events:
            t, kind, _, payload = self._events[0]
            if t > until:
                # Cut off with work left: what is held counts up to `until`, not to the last event.
                cut = not self._all_done()
                break
            if kind == _HOOK and payload in (None, "sample") and self._all_done():
                break
            heapq.heappop(self._events)
            self.now = max(self.now, t)
            self._dispatch(kind, payload)
            if self.guard.should_stop(self.now) and not self._all_done():
                stalled = True  # no session can progress any more (guard.py): stop, count the rest
                break
            if progress is not None and self.now - last_report >= 60.0:
                last_report = self.now
                progress(self._progress(until))
        end = until if cut else self.now
        self.stats.finish(end, self.core, self._live_counts())
        if stalled:
            s = self.stats
            s.stopped_at_s = self.now
            s.stop_note = self.guard.note(self.now, s.unfinished, s.revocations, s.work_lost)
        return self.stats

    def add_worker(self, worker: WorkerId, slots: int, pool: str = "") -> None:
        self.apply(WorkerAdded(worker, slots, pool=pool))
        self.capacity_changed()

    def capacity_changed(self) -> None:
        """The pools' capacity may have changed (a worker came, drains or left): count it."""
        every = views(self.core)
        self.stats.capacity_changed(self.now, sum(v.capacity for v in every.values()))
        self.stats.pool_capacity_changed(self.now, {n: v.capacity for n, v in every.items()})

    @staticmethod
    def acquire(p: SessionPlan, snapshot: SnapshotRef | None = None) -> Acquire:
        """The request a session of plan `p` sends (a retry quotes its last snapshot)."""
        return Acquire(
            SessionId(p.session_id), TenantName(p.tenant), p.qos, snapshot, p.pool, p.selector, p.fallback
        )

    def snapshot_on(self, lease: Lease, size: int) -> SnapshotRef:
        """A holder's checkpoint of `lease`, as the server records it: the pool it was taken on
        and that pool's compatibility labels, so a resume (a retry quoting it) goes only where it
        is compatible: the core's placement decides."""
        spec = self.policy.pool_spec(lease.pool)
        labels = spec.compat_labels() if spec is not None else ()
        return SnapshotRef(f"sim://{lease.session}/{lease.epoch}", size, pool=lease.pool, labels=labels)

    def _sample(self) -> None:
        """A point of the time series. A holder in a retry loop waits for a slot as surely as a
        queued one, so it counts as pending (a rejecting decider queues nothing itself); and
        `waiting_by_tenant[i]` is sample i's waiting sessions per tenant, queued or retrying."""
        self.stats.sample(self.now, self.core)
        waiting: dict[str, int] = {}
        by_class: dict[str, tuple[list[int], list[int]]] = {}
        capacity = 0
        for view in views(self.core).values():
            capacity += view.capacity
            for t in view.tenants:
                held, pending = by_class.setdefault(t.name, ([0, 0, 0], [0, 0, 0]))
                for i in range(3):
                    held[i] += t.held[i]
                    pending[i] += t.pending[i]
                if sum(t.pending):
                    waiting[t.name] = waiting.get(t.name, 0) + sum(t.pending)
        for lv in self._retrying():
            waiting[lv.plan.tenant] = waiting.get(lv.plan.tenant, 0) + 1
            by_class.setdefault(lv.plan.tenant, ([0, 0, 0], [0, 0, 0]))[1][_CLASS[lv.plan.qos.value]] += 1
        self.stats.samples[-1].pending += sum(self.retrying())
        self.waiting_by_tenant.append(waiting)
        self.points.append(
            Point(capacity, {n: ((h[0], h[1], h[2]), (w[0], w[1], w[2])) for n, (h, w) in by_class.items()})
        )

    def _retrying(self) -> list[_Live]:
        return [self._live[sid] for sid in self._in_retry]

    def retrying(self) -> tuple[int, int, int]:
        """Holders in a retry loop by class (G, B, BE): waiting for a slot outside the decider."""
        n = [0, 0, 0]
        for lv in self._retrying():
            n[("guaranteed", "burstable", "besteffort").index(lv.plan.qos.value)] += 1
        return n[0], n[1], n[2]

    def _progress(self, until: float) -> float:
        """Share of the run done: virtual time over `until`, else sessions over; never backwards."""
        if until != math.inf:
            return min(1.0, self.now / max(until, 1e-9))
        done = sum(1 for lv in self._live.values() if self._done(lv))
        return done / max(1, len(self._live))

    @staticmethod
    def _done(lv: _Live) -> bool:
        # A dead holder's lease still holds its slot until it expires: not done before that.
        return lv.finished or lv.refused or (lv.crashed and lv.lease is None)

    def _all_done(self) -> bool:
        return all(self._done(lv) for lv in self._live.values())

    def _live_counts(self) -> tuple[int, int]:
        completed = sum(1 for lv in self._live.values() if lv.finished)
        unfinished = sum(1 for lv in self._live.values() if not lv.finished and not lv.refused)
        return completed, unfinished

    def _dispatch(self, kind: int, payload: object) -> None:
        if kind == _ARRIVE:
            lv = self._live[str(payload)]
            self.guard.arrivals_pending -= 1
            self.guard.progress(self.now)
            period = lv.plan.periods[lv.period]
            lv.remaining = period.hold_s
            self._wait_starts(lv)
            self.stats.arrived(lv.plan.tenant, self.now)  # per-tenant first_grant_s counts from it
            self.apply(self.acquire(lv.plan))
        elif kind == _RETRY:
            lv = self._live[str(payload)]
            if lv.lease is None and not lv.finished:
                self.apply(self.acquire(lv.plan, lv.snapshot))
        elif kind == _TICK:
            self._tick_at = math.inf
            self.apply(Tick())
        elif kind == _HOOK:
            if payload == "sample":
                self._sample()
                assert self.config.sample_every_s
                self.at(self.now + self.config.sample_every_s, _HOOK, "sample")
            elif self.hook is not None:
                self.hook.fire(self, self.now)
        else:
            assert isinstance(payload, tuple)
            sid: str = payload[0]
            lease_id: str = payload[1]
            epoch: int = payload[2]
            lv = self._live[sid]
            if lv.lease is None or lv.lease.lease_id != lease_id or lv.lease.epoch != epoch:
                return  # that lease is gone (revoked, yielded): a stale timer
            if kind == _CRASH:
                lv.crashed = True
                lv.yield_asked_at = None  # a checkpoint under way dies with the holder
                self.guard.progress(self.now)  # a session ended for good
            elif kind == _RENEW:
                if not lv.crashed:
                    self.apply(Renew(SessionId(sid), lv.lease.lease_id, lv.lease.epoch))
            elif kind == _COMPLETE:
                self.apply(Release(SessionId(sid), lv.lease.lease_id, lv.lease.epoch))
            elif kind == _YIELD_ACK:
                lease = lv.lease
                if lv.yield_asked_at is None or self.now < lv.yield_asked_at + self.config.checkpoint_s:
                    return  # called off (maybe asked again since: not done yet), or the holder died
                done = lv.yield_asked_at - lease.granted_at
                lv.remaining = max(0.0, lv.remaining - done)
                self.guard.saved(self.now, done)
                snap = self.snapshot_on(lease, lv.plan.periods[lv.period].snapshot_bytes)
                lv.snapshot = snap
                self.apply(Yield(SessionId(sid), lease.lease_id, lease.epoch, snap))

    # ------------------------------------------------------------------ the holders

    def _on_decision(self, d: Decision) -> None:
        if isinstance(d, Granted):
            lv = self._live[d.lease.session]
            if lv.waiting_since is not None:
                # Granted on a retry: the wait began at the first refused attempt.
                d = d._replace(waited_s=self.now - lv.waiting_since)
                lv.waiting_since = None
                self._in_retry.pop(lv.plan.session_id, None)
        self.stats.record(d, self.now)
        if isinstance(d, Granted):
            self._placed(lv, d.lease.pool)
            if lv.beyond_quota and d.lease.qos is QoS.GUARANTEED:
                self.stats.beyond_quota.append(d.waited_s)
            lv.lease = d.lease
            lv.yield_asked_at = None
            key = (d.lease.session, d.lease.lease_id, d.lease.epoch)
            crash = lv.plan.periods[lv.period].crash_after_s
            if crash is not None and crash < lv.remaining:
                # Alive (renewing, answering yields) until then; dead, it never releases.
                self.at(self.now + crash, _CRASH, key)
                held_for = crash
            else:
                self.at(self.now + lv.remaining, _COMPLETE, key)
                held_for = lv.remaining
            renew_every = self.policy.timing.lease_ttl_s / 2
            t = self.now + renew_every
            limit = self.now + held_for
            while t < limit:
                self.at(t, _RENEW, key)
                t += renew_every
        elif isinstance(d, YieldRequested):
            lv = self._live[d.lease.session]
            if lv.crashed or lv.lease is None or lv.lease.lease_id != d.lease.lease_id:
                return
            lv.yield_asked_at = self.now
            finish_at = d.lease.granted_at + lv.remaining
            if finish_at > self.now + self.config.checkpoint_s or d.cause is YieldCause.DRAIN:
                self.at(
                    self.now + self.config.checkpoint_s,
                    _YIELD_ACK,
                    (d.lease.session, d.lease.lease_id, d.lease.epoch),
                )
            # else: it finishes before a checkpoint would, and simply releases.
        elif isinstance(d, YieldCancelled):
            lv = self._live[d.lease.session]
            if lv.lease is not None and lv.lease.lease_id == d.lease.lease_id:
                lv.yield_asked_at = None  # its pending checkpoint-and-yield is off: it runs on
        elif isinstance(d, Ended):
            lv = self._live[d.session]
            if d.lease is not None and lv.lease is not None and d.lease.lease_id == lv.lease.lease_id:
                lv.lease = None
                if d.reason.value == "released":
                    self._leaves(lv)
                    self._next_period(lv)
                else:
                    self._wait_starts(lv)  # yielded: re-queued by the decider
        elif isinstance(d, Revoked | Expired):
            lv = self._live[d.lease.session]
            if lv.lease is not None and lv.lease.lease_id == d.lease.lease_id:
                lv.lease = None
                if isinstance(d, Revoked):
                    self._wait_starts(lv)
                else:
                    self._leaves(lv)
                # Revoked: re-queued by the core, it resumes from its last snapshot (remaining
                # unchanged). Expired: the holder is dead; the session ends unfinished.
        elif isinstance(d, Refused):
            lv = self._live[d.session]
            self._placed(lv, d.pool)
            if self.config.retry_refused and d.reason in RETRYABLE:
                if lv.waiting_since is None:
                    lv.waiting_since = self.now
                    self._in_retry[d.session] = None
                lo, hi = self.config.retry_jitter_s
                self.at(self.now + d.retry_after_s + self._rng.uniform(lo, hi), _RETRY, d.session)
            else:
                lv.refused = True
                self._leaves(lv)
                self.guard.progress(self.now)  # a session ended for good
        elif isinstance(d, Queued):
            self._placed(self._live[d.session], d.pool)

    def _wait_starts(self, lv: _Live) -> None:
        """A Guaranteed session enters play (holding or waiting) at its first wait and keeps its
        place until it leaves; whether this wait is beyond quota is known once placed (`_placed`)."""
        if lv.plan.qos is QoS.GUARANTEED:
            self._g_play.setdefault(lv.plan.tenant, {}).setdefault(lv.plan.session_id, "")
            lv.placing = True

    def _placed(self, lv: _Live, pool: str) -> None:
        """A Guaranteed wait placed in `pool` is beyond quota when the tenant's quota in that pool
        (`Policy.for_pool`, overrides included) is taken by its sessions in play there that entered
        before it: it then waits for the tenant's own leases to end, which the promised bound does
        not cover. Quotas are per pool, as the cores hold them."""
        if not lv.placing or pool not in self._in_pool:
            return
        lv.placing = False
        sid, tenant = lv.plan.session_id, lv.plan.tenant
        play = self._g_play.setdefault(tenant, {})
        play[sid] = pool
        ahead = 0
        for other, where in play.items():
            if other == sid:
                break
            ahead += where == pool
        spec = self._in_pool[pool].tenant(tenant)
        lv.beyond_quota = ahead >= (spec.guaranteed if spec is not None else 0)

    def _leaves(self, lv: _Live) -> None:
        self._g_play.get(lv.plan.tenant, {}).pop(lv.plan.session_id, None)

    def _next_period(self, lv: _Live) -> None:
        self.guard.progress(self.now)
        lv.period += 1
        if lv.period >= len(lv.plan.periods):
            lv.finished = True
            return
        nxt = lv.plan.periods[lv.period]
        lv.snapshot = None
        start = self.now + nxt.think_s if nxt.think_s is not None else max(self.now, nxt.arrival_s)
        self.at(start, _ARRIVE, lv.plan.session_id)


def simulate(policy: Policy, plans: list[SessionPlan], config: SimConfig | None = None) -> SimStats:
    return Simulator(policy, plans, config or SimConfig()).run()
