"""The companion autoscaler's loop: gather, decide, act — and the decision stays pure.

Why a loop apart from the decision (Ray autoscaler v2's reconciler): `decide` reads no clock and
does no I/O, so it can be replayed and table-tested; everything that can fail lives here, and a
failure is data for the next tick, never an exception that stops the loop. Each tick:

  1. gather: the actuator's workers and the errors it saw (I/O); the pool's demand (the core);
  2. decide: `decision.decide` with the history the previous tick left;
  3. drain the workers chosen: no new grants, their sessions are asked to checkpoint-and-yield
     within the drain timeout;
  4. ask the actuator for workers while ready + starting < desired (it never stops one);
  5. remove drained workers once empty, or once the drain timeout has passed: the actuator stops
     them, then the core forgets them. A lease still there is revoked, which re-queues its
     session from its last snapshot: a drain never orphans a session.

Two kinds of calls, two places: demand and membership touch the core, which only its owner (the
server's event loop) may touch; actuator calls are blocking I/O. `tick(now)` runs all steps in
order (the simulator, tests); `run()` runs the I/O in a worker thread between the core steps.
Between decisions (`period_s`), `reap` checks draining workers every `reap_every_s`, so a worker
leaves soon after it empties rather than a whole period later.

Recycling (spec.autoscaler.recycle): one worker at a time per pool, past its memory or age
(`recycle.pick_recycle`), is marked RECYCLING: it serves on, but the decision counts it as gone,
so `desired` asks for its replacement, which starts first (at maxWorkers the pool briefly holds
one more, as a Deployment's maxSurge); once the others make up `desired`, it is drained like any
other (its actors yield with checkpoints and resume elsewhere), with reason `recycle`. Ahead of
a known peak (`ahead.py`) the schedule and the forecast raise the
minimum the decision works with; the loop records the demand the forecast reads.

A dry run (an actuator that is `WouldOnly`) changes nothing anywhere: step 3 drains no worker
(a drain is a change to the scheduler, which the actuator alone cannot undo), so step 5 has none
to remove; the loop tells the actuator which it would drain and counts it (`TickReport.would_drain`,
the metric `slotsched_autoscaler_dry_run_actions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry

from scheduler.core.types import WorkerId
from scheduler.policy.model import Policy
from slots.actuators.base import Actuator, DecisionRecorder, ScaleNote, WorkerInfo, WorkerPhase, WouldOnly
from slots.autoscaler.ahead import DemandRecord, forecast_min, lead_seconds, schedule_min
from slots.autoscaler.decision import (
    Reason,
    ScaleConfig,
    ScaleDecision,
    ScaleHistory,
    ScaleInput,
    ScaleWorker,
    ScaleWorkerState,
    decide,
    floor_headroom,
)
from slots.autoscaler.demand import (
    DemandSource,
    Membership,
)
from slots.autoscaler.metrics import AutoscalerMetrics
from slots.autoscaler.recycle import pick_recycle

__all__ = ["Autoscaler", "TickReport"]

log = logging.getLogger("slotsched.autoscaler")


@dataclass(frozen=True)
class TickReport:
    now: float
    decision: ScaleDecision | None  # None for a reap, or when demand could not be read
    asked_for: int  # workers asked of the actuator this tick
    drained: tuple[str, ...]
    removed: tuple[str, ...]
    errors: tuple[str, ...]
    would_drain: tuple[str, ...] = ()  # a dry run: the workers it would have drained
    recycled: tuple[str, ...] = ()  # drained this tick to be replaced (spec.autoscaler.recycle)
    ahead_workers: int = 0  # the minimum the schedule or the forecast raised (0: none)


@dataclass
class _Plan:
    inp: ScaleInput | None = None
    decision: ScaleDecision | None = None
    drained: list[str] = field(default_factory=list)
    would_drain: list[str] = field(default_factory=list)
    start_to: int | None = None  # scale_to(start_to), asking for `missing` more
    missing: int = 0
    remove: list[str] = field(default_factory=list)
    notes: list[ScaleNote] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    recycled: list[str] = field(default_factory=list)
    recycle_cause: str = ""
    ahead: int = 0


@dataclass
class _Done:
    asked_for: int = 0
    removed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Autoscaler:
    def __init__(
        self,
        source: DemandSource,
        membership: Membership,
        actuator: Actuator,
        policy: Callable[[], Policy],
        *,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
        period_s: float = 15.0,
        reap_every_s: float = 1.0,
        start_timeout_s: float = 300.0,
        metrics: AutoscalerMetrics | None = None,
        pool: str | None = None,
    ) -> None:
        """`pool` names the one pool this loop sizes (slots/autoscaler/pools.py: one loop per
        pool, `metrics` shared by them); None: the policy's only pool, as before pools."""
        self.source = source
        self.membership = membership
        self.actuator = actuator
        self.period_s = period_s
        self.reap_every_s = reap_every_s
        self.start_timeout_s = start_timeout_s
        self.history = ScaleHistory()
        self.errors: deque[tuple[float, str]] = deque(maxlen=200)  # recent failures, oldest first
        self.actions = 0  # scale-ups asked for plus drains started
        self.last: TickReport | None = None
        self._policy = policy
        self._clock = clock
        self.pool = pool
        self._metrics = metrics or (AutoscalerMetrics(registry) if registry is not None else None)
        self._draining_since: dict[str, float] = {}
        self._unregistered_since: dict[str, float] = {}  # listed by the actuator, unknown to the core
        self._to_stop: set[str] = set()  # drained workers the core dropped on its own
        self._deregister_retry: set[str] = set()  # stopped, but the core still lists them
        self._gone: set[str] = set()  # stopped; excluded while the actuator still lists them
        self._reported_late: set[str] = set()  # unregistered past start_timeout_s, reported once
        self._recycling: tuple[str, str] | None = None  # (worker, cause): being replaced
        self.demand_record = DemandRecord()  # what the forecast reads (ahead.py)

    # ------------------------------------------------------------------ driving

    def tick(self, now: float) -> TickReport:
        """One full pass (gather, decide, act), all on the caller's thread."""
        plan = self._plan(now, self._gather(), decide_now=True)
        return self._finish(now, plan, self._act(plan))

    def reap(self, now: float) -> TickReport:
        """Only step 5: remove drained workers that are empty or past the drain timeout."""
        plan = self._plan(now, None, decide_now=False)
        return self._finish(now, plan, self._act(plan))

    async def tick_async(self, now: float, decide_now: bool = True) -> TickReport:
        gathered = await asyncio.to_thread(self._gather) if decide_now else None
        plan = self._plan(now, gathered, decide_now)
        done = (
            await asyncio.to_thread(self._act, plan)
            if plan.start_to or plan.remove or plan.notes or plan.would_drain
            else _Done()
        )
        return self._finish(now, plan, done)

    @property
    def busy_draining(self) -> bool:
        return bool(self._draining_since or self._to_stop or self._deregister_retry)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Decide every `period_s` until `stop` is set (or the task is cancelled)."""
        stop = stop or asyncio.Event()
        next_decide = self._clock()
        while not stop.is_set():
            now = self._clock()
            try:
                if now >= next_decide:
                    next_decide = now + self.period_s
                    await self.tick_async(now)
                elif self.busy_draining:
                    await self.tick_async(now, decide_now=False)
            except Exception:  # a bug here must not stop autoscaling: log it, go on
                log.exception("autoscaler tick failed")
            wait = next_decide - self._clock()
            if self.busy_draining:
                wait = min(wait, self.reap_every_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, wait))

    # ------------------------------------------------------------------ steps

    def _gather(self) -> tuple[list[WorkerInfo] | None, list[str]]:
        """Step 1, the I/O half: what the actuator runs, and what failed since the last tick."""
        errors: list[str] = []
        workers: list[WorkerInfo] | None = None
        try:
            workers = self.actuator.list()
        except Exception as e:
            errors.append(f"actuator list failed: {_describe(e)}")
        try:
            errors.extend(self.actuator.poll_errors())
        except Exception as e:
            errors.append(f"actuator poll_errors failed: {_describe(e)}")
        return workers, errors

    def _plan(
        self, now: float, gathered: tuple[list[WorkerInfo] | None, list[str]] | None, decide_now: bool
    ) -> _Plan:
        """Steps 1 (the core half) to 3, and what step 4 and 5 will ask of the actuator."""
        listed, errors = gathered if gathered is not None else (None, [])
        plan = _Plan(errors=list(errors))
        try:
            inp = plan.inp = self.source.read(now)
        except Exception as e:
            plan.errors.append(f"reading demand failed: {_describe(e)}")
            return plan
        policy = self._policy()
        if decide_now:
            inp = plan.inp = self._mark_recycling(now, inp, policy)
        in_core = {w.worker_id: w for w in inp.workers}
        self._track_draining(in_core)
        if decide_now:
            cfg = self._ahead(now, inp, policy, plan)
            plan.decision = d = decide(inp, cfg, self.history)
            self.history = d.history
            self._drain(now, d, plan, policy.autoscaler.drain_timeout_s)
            self._drain_recycled(now, d, in_core, plan, policy.autoscaler.drain_timeout_s)
            if listed is not None:
                self._ask_for_workers(now, listed, in_core, d, plan)
        timeout = policy.autoscaler.drain_timeout_s
        for wid, since in self._draining_since.items():
            w = in_core.get(wid)
            if w is None or w.state is not ScaleWorkerState.DRAINING:
                continue
            if w.busy_slots == 0 or now - since >= timeout:
                plan.remove.append(wid)
        plan.remove.extend(sorted(self._to_stop))
        return plan

    def _mark_recycling(self, now: float, inp: ScaleInput, policy: Policy) -> ScaleInput:
        """The worker being recycled, as RECYCLING; a new one picked once the last has left."""
        if isinstance(self.actuator, WouldOnly):
            return inp  # a dry run replaces nothing
        states = {w.worker_id: w.state for w in inp.workers}
        if self._recycling is not None and states.get(self._recycling[0]) is not ScaleWorkerState.READY:
            if self._recycling[0] not in states:
                self._recycling = None  # gone: the next may start
            return inp  # draining: wait until it has left
        if self._recycling is None:
            self._recycling = pick_recycle(inp.workers, now, policy.autoscaler)
        if self._recycling is None:
            return inp
        wid = self._recycling[0]
        marked = tuple(
            replace(w, state=ScaleWorkerState.RECYCLING) if w.worker_id == wid else w for w in inp.workers
        )
        return replace(inp, workers=marked)

    def _ahead(self, now: float, inp: ScaleInput, policy: Policy, plan: _Plan) -> ScaleConfig:
        """The decision's config with the minimum the schedule or the forecast raises (ahead.py);
        and the demand of this tick recorded for the forecast."""
        cfg = ScaleConfig.from_policy(policy)
        a = policy.autoscaler
        lead = lead_seconds(a.forecast, a.start_delay_s, self.period_s)
        need = sum(inp.busy_by_class.values()) + sum(inp.pending_by_class.values()) + floor_headroom(inp)
        self.demand_record.observe(now, math.ceil(need / inp.slots_per_worker - 1e-9), a.forecast, lead)
        scheduled = schedule_min(a.schedule, now, lead)
        forecast = forecast_min(self.demand_record.buckets, now, a.forecast, lead)
        plan.ahead = max(scheduled, forecast)
        if plan.ahead <= cfg.min_workers:
            return cfg
        why = Reason.FORECAST if forecast > scheduled else Reason.SCHEDULED
        return replace(cfg, ahead_workers=plan.ahead, ahead_reason=why)

    def _drain_recycled(
        self, now: float, d: ScaleDecision, in_core: dict[str, ScaleWorker], plan: _Plan, timeout: float
    ) -> None:
        """Drain the worker being recycled once the ready others make up `desired` (its
        replacement is up), or at once when this tick's scale-down drained it anyway."""
        if self._recycling is None:
            return
        wid, cause = self._recycling
        if wid in plan.drained:
            plan.recycled.append(wid)
            plan.recycle_cause = cause
            return
        w = in_core.get(wid)
        if w is None or w.state is not ScaleWorkerState.RECYCLING:
            return
        others = sum(1 for x in in_core.values() if x.state is ScaleWorkerState.READY) - len(plan.drained)
        if others < d.desired:
            return
        try:
            self.membership.drain(WorkerId(wid), timeout)
        except Exception as e:
            plan.errors.append(f"drain {wid} (recycle) failed: {_describe(e)}")
            return
        self._draining_since[wid] = now
        plan.drained.append(wid)
        plan.recycled.append(wid)
        plan.recycle_cause = cause
        note = _note("down", d, plan.inp, (wid,))
        plan.notes.append(replace(note, reason=Reason.RECYCLE.value))

    def _track_draining(self, in_core: dict[str, ScaleWorker]) -> None:
        """Follow the workers this loop drained. One drained by someone else (an admin, with its
        own deadline) is theirs to remove: the loop neither removes it nor counts it as ready."""
        for wid in list(self._draining_since):
            now_w = in_core.get(wid)
            if now_w is None:
                del self._draining_since[wid]
                self._to_stop.add(wid)  # deregistered on its own: still stop its process
            elif now_w.state is not ScaleWorkerState.DRAINING:
                del self._draining_since[wid]  # the drain was called off
        self._deregister_retry &= set(in_core)

    def _drain(self, now: float, d: ScaleDecision, plan: _Plan, timeout: float) -> None:
        if isinstance(self.actuator, WouldOnly):  # a dry run: the scheduler's workers stay as they are
            plan.would_drain = list(d.drain)
            if d.drain:
                plan.notes.append(_note("down", d, plan.inp, tuple(d.drain)))
            return
        for wid in d.drain:
            try:
                self.membership.drain(WorkerId(wid), timeout)
            except Exception as e:
                plan.errors.append(f"drain {wid} failed: {_describe(e)}")
                continue
            self._draining_since[wid] = now
            plan.drained.append(wid)
        if plan.drained:
            plan.notes.append(_note("down", d, plan.inp, tuple(plan.drained)))

    def _ask_for_workers(
        self,
        now: float,
        listed: list[WorkerInfo],
        in_core: dict[str, ScaleWorker],
        d: ScaleDecision,
        plan: _Plan,
    ) -> None:
        """Step 4: ready (after this tick's drains) + starting < desired asks for the difference."""
        ids = {w.worker_id for w in listed}
        self._gone &= ids
        alive = [w for w in listed if w.phase is not WorkerPhase.STOPPING and w.worker_id not in self._gone]
        for wid in list(self._unregistered_since):
            if wid in in_core or wid not in ids:
                del self._unregistered_since[wid]
                self._reported_late.discard(wid)
        starting = 0
        for w in alive:
            if w.worker_id in in_core:
                continue
            since = self._unregistered_since.setdefault(w.worker_id, now)
            if now - since <= self.start_timeout_s:
                starting += 1
            elif w.worker_id not in self._reported_late:  # say it once, not every tick
                self._reported_late.add(w.worker_id)
                plan.errors.append(f"worker {w.worker_id} has not registered after {now - since:.0f} s")
        ready = sum(1 for w in in_core.values() if w.state is ScaleWorkerState.READY)
        was_ready = {wid for wid, w in in_core.items() if w.state is ScaleWorkerState.READY}
        drained = len(was_ready.intersection(plan.drained))
        missing = d.desired - (ready - drained - len(plan.would_drain)) - starting
        if missing > 0:
            plan.start_to, plan.missing = len(alive) + missing, missing
            plan.notes.append(_note("up", d, plan.inp, ()))

    def _act(self, plan: _Plan) -> _Done:
        """Steps 4 and 5, the I/O half: every actuator call guarded, failures returned as data."""
        done = _Done()
        if plan.would_drain and isinstance(self.actuator, WouldOnly):
            try:
                self.actuator.would("drain", tuple(plan.would_drain))
            except Exception as e:
                done.errors.append(f"telling the dry run failed: {_describe(e)}")
        if isinstance(self.actuator, DecisionRecorder):
            for note in plan.notes:
                try:
                    self.actuator.record(note)
                except Exception as e:
                    done.errors.append(f"recording the decision failed: {_describe(e)}")
        if plan.start_to is not None:
            try:
                self.actuator.scale_to(plan.start_to)
                done.asked_for = plan.missing
            except Exception as e:
                done.errors.append(f"scale_to({plan.start_to}) failed: {_describe(e)}")
        if plan.remove:
            try:
                self.actuator.remove(list(plan.remove))
                done.removed = list(plan.remove)
            except Exception as e:
                done.errors.append(f"remove({', '.join(plan.remove)}) failed: {_describe(e)}")
        return done

    def _finish(self, now: float, plan: _Plan, done: _Done) -> TickReport:
        """Back on the core's side: forget removed workers, count, report."""
        errors = plan.errors + done.errors
        in_core = {w.worker_id for w in plan.inp.workers} if plan.inp is not None else set()
        for wid in done.removed:
            self._draining_since.pop(wid, None)
            self._to_stop.discard(wid)
            self._gone.add(wid)
            if wid in in_core:
                self._deregister_retry.add(wid)
        for wid in sorted(self._deregister_retry):
            try:
                self.membership.deregister(WorkerId(wid))
                self._deregister_retry.discard(wid)
            except Exception as e:
                errors.append(f"deregister {wid} failed: {_describe(e)}")
        d = plan.decision
        self.actions += (1 if done.asked_for else 0) + (1 if plan.drained else 0)
        if self._metrics is not None:
            if d is not None and plan.inp is not None:
                self._metrics.observe(d, _direction(d, plan.inp), self.pool)
                self._metrics.observe_input(plan.inp, plan.ahead, self.pool)
            if plan.recycled:
                self._metrics.count_recycle(plan.recycle_cause, len(plan.recycled), self.pool)
            if errors:
                self._metrics.count_errors(len(errors), self.pool)
            if isinstance(self.actuator, WouldOnly):
                self._metrics.count_would("drain", len(plan.would_drain), self.pool)
                self._metrics.count_would("start", done.asked_for, self.pool)
        where = f" (pool {self.pool})" if self.pool else ""
        for message in errors:
            log.warning("autoscaler%s: %s", where, message)
            self.errors.append((now, message))
        report = TickReport(
            now,
            d,
            done.asked_for,
            tuple(plan.drained),
            tuple(done.removed),
            tuple(errors),
            tuple(plan.would_drain),
            tuple(plan.recycled),
            plan.ahead,
        )
        if d is not None:
            self.last = report
        return report


def _ready(inp: ScaleInput | None) -> int:
    serving = (ScaleWorkerState.READY, ScaleWorkerState.RECYCLING)
    return 0 if inp is None else sum(1 for w in inp.workers if w.state in serving)


def _direction(d: ScaleDecision, inp: ScaleInput) -> str:
    current = _ready(inp)
    return "up" if d.desired > current else "down" if d.desired < current else "none"


def _note(direction: str, d: ScaleDecision, inp: ScaleInput | None, workers: tuple[str, ...]) -> ScaleNote:
    return ScaleNote(
        direction=direction,
        desired=d.desired,
        current=_ready(inp),
        weighted_demand_slots=round(d.weighted_demand_slots, 3),
        reason=d.reason.value,
        at_ceiling=d.at_ceiling,
        estimated_drain_s=d.estimated_drain_s if math.isfinite(d.estimated_drain_s) else 0.0,
        workers=workers,
    )


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
