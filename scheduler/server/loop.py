"""The single decision loop: the asyncio event loop owns the core, and nothing else touches it.

Why no lock and no queue in front of the core: every handler runs on the same event loop, and
`submit` calls `Core.handle` synchronously, so events are applied one at a time in arrival order
by construction. An extra hop (a queue drained by a task) would only add a wake-up to every
grant. What `submit` does after `handle`:

* fans each decision out to the affected session's attached Acquire stream (one small queue
  per stream, domain notices the Acquire handler converts to proto);
* keeps what the core does not expose but the wire needs: worker addresses, the pending yield
  request per lease (for replays and `Lease.yield_deadline`), each session's `wait_timeout` (which
  an attached stream enforces: stream.py), and recently ended sessions (for GetSession);
* observes metrics and the handle() duration, hands the event to the journal (if any) and the
  observers, and re-arms the one timer that sends `Tick` at `core.next_deadline()`.

With a durable state store (scheduler/state/, wired in by scheduler/app/), handlers `await
loop.durable()` before they tell a caller anything; in memory mode that awaits an already-done
future (no suspension). The loop knows the store only as a `Journal` and implements
`ReplicaHost` for it (`replay`, `export_state`, `load_state`): see scheduler/ports.py.

Sessions are namespaced `tenant/session_id` in the core so two tenants may use the same id.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TypeVar

from scheduler.core.pools import Pools
from scheduler.core.types import (
    Acquire,
    Decision,
    Ended,
    EndReason,
    Event,
    Expired,
    Granted,
    LeaseId,
    QoS,
    Queued,
    Refused,
    Release,
    Revoked,
    SessionId,
    SnapshotRef,
    TenantName,
    Tick,
    WorkerId,
    YieldCancelled,
    YieldRequested,
)
from scheduler.core.views import PoolView, SessionView
from scheduler.dispatch import BY_TYPE, EventSpec
from scheduler.policy.model import Policy
from scheduler.ports import NO_EXTRAS, EndedSession, Extras, Journal, LoopState, Observer, PolicyApplied
from scheduler.server.metrics import Metrics
from scheduler.server.permits import BudgetMetrics, PermitDesk
from scheduler.server.stream import FINAL, GRANTED, OTHER, LeaseStream, Notice, StreamClosed

_R = TypeVar("_R")

# Kept importable from here: the records moved to scheduler/ports.py, which the state store shares.
__all__ = ["EndedSession", "LoopState", "PolicyApplied", "SchedulerLoop"]

_ENDED_KEEP = 10_000  # recently ended sessions remembered for GetSession
# The core reports a place when a request enters the queue; later moves (others granted or gone,
# a new reason) are offered to the streams (stream.py decides what is told), coalesced to at most
# one pass per this interval.
POSITION_REFRESH_S = 0.2
_YIELDED = EndReason.YIELDED  # an enum member read off its class is a slow lookup (engine.py)


# Where an Acquire asks to go: (pool, selector, fallback), as `Acquire`'s fields.
Placement = tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]]
NO_PLACEMENT: Placement = ("", (), ())


class SchedulerLoop:
    """Owns the Core on the running asyncio loop. Create and use it from that loop only."""

    def __init__(
        self, policy: Policy, metrics: Metrics | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.core = Pools(policy)
        self.metrics = metrics
        # The token budgets beside the slot core: their own core and timer, not journaled.
        #: What the budgets report to (per-pool leadership wraps it: a budget's home reports it).
        self.budget_metrics: BudgetMetrics | None = metrics.budget if metrics is not None else None
        self.permits = PermitDesk(policy, clock, self.budget_metrics)
        #: Where a session's end closes its permits: this loop's desk; under per-pool leadership
        #: every unit's desk of the replica (pool_routes.py: a budget counts at its home's unit).
        self.ends_permits: Callable[[SessionId], None] = self._end_permits
        self._aloop = asyncio.get_running_loop()
        self.observers: list[Observer] = []
        self.shutting_down = False
        self._clock = clock
        self._thread = threading.get_ident()
        self._streams: dict[SessionId, LeaseStream] = {}
        self._addresses: dict[WorkerId, str] = {}
        self._yields: dict[LeaseId, YieldRequested] = {}
        self._waited: dict[SessionId, float] = {}  # waited_s of the current grant, for replays
        self._qos: dict[SessionId, QoS] = {}
        self._wait_timeouts: dict[SessionId, float] = {}
        self._ended: OrderedDict[SessionId, EndedSession] = OrderedDict()
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        self._positions_timer: asyncio.TimerHandle | None = None
        self.journal: Journal | None = None  # set by the wiring root for a durable state store
        self._done: asyncio.Future[None] = self._aloop.create_future()
        self._done.set_result(None)
        if metrics is not None:
            metrics.bind(self.describe_threadsafe, self.describe_all_threadsafe)

    # ------------------------------------------------------------------ events in

    def now(self) -> float:
        return self._clock()

    def submit(self, event: Event, extras: Extras = NO_EXTRAS) -> list[Decision]:
        """Apply one event now; fan its decisions out; return them to the caller. `extras` are
        the server-side facts the journal keeps beside the event (wait_timeout, labels)."""
        now = self._clock()
        spec = BY_TYPE[type(event)]
        if spec.before is not None:
            spec.before(self, event, extras)
        t0 = time.perf_counter()
        decisions = self.core.handle(event, now)
        self._after(event, spec, decisions, now, time.perf_counter() - t0, extras)
        return decisions

    def durable(self) -> Awaitable[None]:
        """Await before telling a caller anything: resolves once every event applied so far is
        journaled. Memory mode: an already-done future, so awaiting it never suspends."""
        j = self.journal
        return self._done if j is None else j.durable()

    def durable_done(self) -> Awaitable[None]:
        """The already-done awaitable `durable` returns when nothing is pending."""
        return self._done

    def apply_policy(self, policy: Policy) -> list[Decision]:
        now = self._clock()
        t0 = time.perf_counter()
        decisions = self.core.apply_policy(policy, now)
        self.permits.apply_policy(policy)
        event = PolicyApplied(policy)
        self._after(event, BY_TYPE[PolicyApplied], decisions, now, time.perf_counter() - t0, NO_EXTRAS)
        return decisions

    def acquire(
        self,
        key: SessionId,
        tenant: str,
        qos: QoS,
        resume_from: SnapshotRef | None,
        wait_timeout_s: float | None,
        make: Callable[[SessionId], LeaseStream] = LeaseStream,
        where: Placement = NO_PLACEMENT,
    ) -> tuple[LeaseStream | None, Refused | None]:
        """Attach a stream (`make(key)`), then ask the core. On a refusal nothing stays attached."""
        stream = self._attach(key, make)
        extras = NO_EXTRAS if wait_timeout_s is None else Extras(wait_timeout_s=wait_timeout_s)
        # The session's bookkeeping is the table's (scheduler/dispatch.py): replay does the same.
        decisions = self.submit(Acquire(key, TenantName(tenant), qos, resume_from, *where), extras)
        for d in decisions:
            if isinstance(d, Refused) and d.session == key:
                if self._streams.get(key) is stream:
                    del self._streams[key]
                return None, d
        return stream, None

    def reattach(
        self, key: SessionId, make: Callable[[SessionId], LeaseStream] = LeaseStream
    ) -> LeaseStream | None:
        """Attach a new stream to a live session and replay its state; None if not live."""
        view = self.core.session(key)
        if view is None:
            return None
        stream = self._attach(key, make)
        now = self._clock()
        if view.lease is None:
            queued = self.core.queued(key)  # its true pool, reason, place and estimate
            if queued is not None:
                stream.offer(queued, now, view.waiting_since)  # wait_timeout runs from its start
        else:
            lease, y = view.lease, self._yields.get(view.lease.lease_id)
            address = self._addresses.get(lease.slot.worker, "")
            granted = Granted(lease, self._waited.get(key, 0.0))
            stream.put(GRANTED, Notice(granted, now, address, y), now)
            if y is not None:
                stream.put(OTHER, Notice(y, now), now)
        return stream

    def detach(self, stream: LeaseStream) -> None:
        stream.disarm()  # nobody listens: its session's wait is nobody's patience now
        if self._streams.get(stream.key) is stream:
            del self._streams[stream.key]

    def _attach(self, key: SessionId, make: Callable[[SessionId], LeaseStream]) -> LeaseStream:
        old = self._streams.get(key)
        if old is not None:
            old.close(StreamClosed.SUPERSEDED)
        stream = make(key)
        stream.patience = self  # its wait_timeout is read here and withdrawn through here
        self._streams[key] = stream
        return stream

    def withdraw_queued(self, key: SessionId) -> bool:
        """Withdraw a still-queued request (its caller's patience ran out: stream.py); False if
        it is not queued any more (a grant beat the timer)."""
        view = self.core.session(key)
        if view is None or view.lease is not None:
            return False
        self.submit(Release(key, None))
        return True

    def begin_shutdown(self) -> None:
        """Refuse new work and end every open stream (UNAVAILABLE: clients re-attach)."""
        self.shutting_down = True
        for stream in list(self._streams.values()):
            stream.close(StreamClosed.SHUTTING_DOWN)
        self._streams.clear()

    def close(self) -> None:
        self.permits.close()
        for timer in (self._timer, self._positions_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._positions_timer = None

    # ------------------------------------------------------------------ state store hooks

    def replay(self, event: Event | PolicyApplied, now: float, extras: Extras = NO_EXTRAS) -> list[Decision]:
        """Re-apply a journaled event at its recorded time: `submit`'s bookkeeping (the same
        table hooks) without streams, metrics, journal, observers or timer (no stream is attached
        during recovery, so `_fan_out` only updates bookkeeping)."""
        spec = BY_TYPE[type(event)]
        if spec.before is not None:
            spec.before(self, event, extras)
        if isinstance(event, PolicyApplied):
            decisions = self.core.apply_policy(event.policy, now)
        else:
            decisions = self.core.handle(event, now)
        if spec.decided is not None:
            spec.decided(self, event, decisions)
        if decisions:
            self._fan_out(decisions, now)
        if spec.after is not None:
            spec.after(self, event, now)
        return decisions

    def export_state(self) -> LoopState:
        return LoopState(
            self.core,
            self._addresses,
            self._yields,
            self._waited,
            self._qos,
            self._wait_timeouts,
            self._ended,
        )

    def load_state(self, state: LoopState) -> None:
        """Replace the core and bookkeeping (after `begin_shutdown` closed every stream)."""
        self.close()
        self._armed_at = None
        self.core = state.core
        self._addresses = state.addresses
        self._yields = state.yields
        self._waited = state.waited
        self._qos = state.qos
        self._wait_timeouts = state.wait_timeouts
        self._ended = state.ended
        self._streams.clear()

    # ------------------------------------------------------------------ Books (dispatch hooks)

    def begin_session(self, key: SessionId, qos: QoS, wait_timeout_s: float | None) -> None:
        self._qos[key] = qos
        self._ended.pop(key, None)
        if wait_timeout_s is not None:
            self._wait_timeouts[key] = wait_timeout_s

    def forget(self, key: SessionId) -> None:
        self._qos.pop(key, None)
        self._waited.pop(key, None)
        self._wait_timeouts.pop(key, None)

    def set_address(self, worker: WorkerId, address: str) -> None:
        self._addresses[worker] = address

    def drop_address(self, worker: WorkerId) -> None:
        self._addresses.pop(worker, None)

    def shift_yields(self, since: float, now: float) -> None:
        """Move the wire's yield deadlines out by the outage, as the core did (see `Resumed`)."""
        gap = max(0.0, now - since)
        if gap:
            self._yields = {lid: replace(y, deadline=y.deadline + gap) for lid, y in self._yields.items()}

    def resume(self) -> None:
        """Serve again after `load_state` (and after a step-down's `begin_shutdown`)."""
        self.shutting_down = False
        self.renew_permits()
        self._arm()

    def renew_permits(self) -> None:
        """Count budgets afresh (a new term; per-pool leadership: a budget whose home moved
        here): every bucket empty (the window assumed spent), a new incarnation in the permit
        ids (a permit of before is charged as a debt when settled)."""
        self.permits.close()
        self.permits = PermitDesk(self.core.policy, self._clock, self.budget_metrics)

    # ------------------------------------------------------------------ queries

    def session(self, key: SessionId) -> SessionView | None:
        return self.core.session(key)

    def live_qos(self, key: SessionId) -> QoS | None:
        """A live session's class (None: not live): a lookup, where `session` builds a view."""
        return self._qos.get(key)

    def ended(self, key: SessionId) -> EndedSession | None:
        return self._ended.get(key)

    def yielding(self, lease_id: LeaseId) -> YieldRequested | None:
        return self._yields.get(lease_id)

    def address(self, worker: WorkerId) -> str:
        return self._addresses.get(worker, "")

    def wait_timeout(self, key: SessionId) -> float | None:
        return self._wait_timeouts.get(key)

    def describe_threadsafe(self, timeout: float = 2.0) -> PoolView | None:
        """core.describe() run on the loop, callable from any thread (the metrics scraper). None
        while not serving: a standby's (or a stopping server's) core is not the pool's state, and
        exporting it would show frozen gauges beside the leader's."""
        return self._read_threadsafe(self.core.describe, timeout)

    def describe_all_threadsafe(self, timeout: float = 2.0) -> Mapping[str, PoolView] | None:
        """Every pool's views (core.describe_all()), as `describe_threadsafe`."""
        return self._read_threadsafe(self.core.describe_all, timeout)

    def _read_threadsafe(self, read: Callable[[], _R], timeout: float) -> _R | None:
        if self.shutting_down:
            return None
        if threading.get_ident() == self._thread:
            return read()
        fut: concurrent.futures.Future[_R] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(read())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                fut.set_exception(e)

        try:
            self._aloop.call_soon_threadsafe(run)
            return fut.result(timeout)
        except (RuntimeError, concurrent.futures.TimeoutError):
            return None  # loop closed or stuck: export no pool gauges rather than hang a scrape

    # ------------------------------------------------------------------ decisions out

    def _after(
        self,
        event: Event | PolicyApplied,
        spec: EventSpec,
        decisions: list[Decision],
        now: float,
        dt: float,
        extras: Extras,
    ) -> None:
        if self.metrics is not None:
            self.metrics.observe(decisions, dt, event, self.core)  # the event and core name tenants
        if spec.decided is not None:
            spec.decided(self, event, decisions)
        if decisions:
            self._fan_out(decisions, now)
            if self._positions_timer is None and not self.shutting_down:
                self._positions_timer = self._aloop.call_later(POSITION_REFRESH_S, self._refresh_positions)
        if spec.after is not None:
            spec.after(self, event, now)
        if self.journal is not None:
            kept = event if spec.journal_as is None else spec.journal_as(event, decisions)
            if kept is not None:  # a quiet renewal changed nothing: no record
                self.journal.record(kept, now, extras)
        for obs in self.observers:
            obs(event, decisions, now)
        self._arm()

    def _fan_out(self, decisions: list[Decision], now: float) -> None:
        """Bookkeeping per decision, and a Notice to the session's stream if one is attached
        (the handler converts it to proto: one conversion per event, as before)."""
        streams = self._streams
        for d in decisions:
            # On the exact type (decisions are final classes): a follower runs this per record.
            if type(d) is Granted:
                key = d.lease.session
                self._waited[key] = d.waited_s
                s = streams.get(key)
                if s is not None:
                    s.put(GRANTED, Notice(d, now, self._addresses.get(d.lease.slot.worker, "")), now)
            elif type(d) is Queued:
                s = streams.get(d.session)
                if s is not None:
                    s.offer(d, now, now)
            elif type(d) is Ended:
                if d.lease is not None and self._yields:
                    self._yields.pop(d.lease.lease_id, None)
                final = d.reason is not _YIELDED
                s = streams.get(d.session)
                if s is not None:
                    s.put(FINAL if final else OTHER, Notice(d, now), now)
                if final:
                    snap = d.lease.resume_from if d.lease is not None else None
                    self._finish(d.session, d.reason, snap, now)
            elif type(d) is YieldRequested:
                self._yields[d.lease.lease_id] = d
                s = streams.get(d.lease.session)
                if s is not None:
                    s.put(OTHER, Notice(d, now), now)
            elif isinstance(d, YieldCancelled | Revoked):
                # YieldCancelled: Renew, GetSession and a re-attach replay say ACTIVE from now on.
                self._yields.pop(d.lease.lease_id, None)
                s = streams.get(d.lease.session)
                if s is not None:
                    s.put(OTHER, Notice(d, now), now)
            elif type(d) is Expired:
                lease = d.lease
                self._yields.pop(lease.lease_id, None)
                s = streams.get(lease.session)
                if s is not None:
                    s.put(OTHER, Notice(d, now), now)  # revoked EXPIRED, then the session's end
                    s.put(FINAL, Notice(Ended(lease.session, EndReason.EXPIRED, lease), now), now)
                self._finish(lease.session, EndReason.EXPIRED, lease.resume_from, now)
            # Renewed, Refused, Rejected answer the caller; they are not stream events.

    def _end_permits(self, key: SessionId) -> None:
        self.permits.session_ended(key)

    def _finish(self, key: SessionId, reason: EndReason, snap: SnapshotRef | None, now: float) -> None:
        """The session is over: its stream (if any) ends after the event just queued."""
        qos = self._qos.pop(key, None)  # `forget`, inline: once per session's end
        self._waited.pop(key, None)
        if self._wait_timeouts:
            self._wait_timeouts.pop(key, None)
        if self._streams:
            self._streams.pop(key, None)
        self.ends_permits(key)  # its permits end with it (docs/design.md, "Token budgets")
        if qos is not None:
            self._ended[key] = EndedSession(reason, qos, snap, now)
            if len(self._ended) > _ENDED_KEEP:
                self._ended.popitem(last=False)

    def _refresh_positions(self) -> None:
        """Offer every attached waiter what the core tells it now: the stream sends a Queued if
        its place, pool, reason or estimate moved materially (stream.py, `offer`)."""
        self._positions_timer = None
        now = self._clock()
        queued = self.core.queued
        for stream in self._streams.values():
            since = stream.queued_since
            if since is None:
                continue
            q = queued(stream.key)
            if q is not None:
                stream.offer(q, now, since)

    def queued_now(self, key: SessionId) -> Queued | None:
        """What the core tells a waiter now (a stream's countdown re-tells from it)."""
        return self.core.queued(key)

    # ------------------------------------------------------------------ timer

    def _arm(self) -> None:
        """Keep one timer at the core's next deadline; a later deadline leaves an earlier timer
        armed (it ticks harmlessly and re-arms)."""
        deadline = self.core.next_deadline()
        if deadline is None or (self._armed_at is not None and self._armed_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = deadline
        # +1 ms so the Tick lands at or after the deadline despite float rounding.
        delay = max(0.001, deadline - self._clock() + 0.001)
        self._timer = self._aloop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._armed_at = None
        if not self.shutting_down:
            self.submit(Tick())
