"""One scheduler replica over a state store: journal, snapshots, recovery, leader election.

The store is a `StateStore` (store.py: the seam, and what every store guarantees; Redis:
redis_store.py); nothing here names a store's types. The replica's roles (standby, candidate,
leader, stepping down, stopped) and their moves are roles.py's tables.

Journal. The loop calls `record` after every event it applies (submit, apply_policy). Group
commit with one append in flight at a time: when none is, the record (codec.py) is sent at once,
from `record` itself (no task, no loop pass before the write); records applied while an append is
in flight join the next batch, which the reply's callback sends, in one fenced append. Where the
store can send at once (`append_nowait`: Redis on plain `redis://`, over resp.py) the reply
settles the batch's waiters in the loop pass it arrives in; elsewhere a task awaits `append`.
Handlers `await loop.durable()` before they reply or write a stream event; that resolves when
the batch holding everything applied so far is in the store (they build their reply meanwhile).
Memory mode never gets here. (When a snapshot is due the cut waits for the next loop pass, the
moment the state is exactly the journal so far.)

Failure. If an append fails (the store unreachable, or the term no longer ours), every
caller waiting for durability gets `StateUnavailable` (UNAVAILABLE with `retry-after-ms` on the
wire, scheduler/server/errors.py), and the replica steps
down: health NOT_SERVING, open Acquire streams end UNAVAILABLE (the SDK re-attaches), calls are
refused "not the leader". Events already applied in memory but not journaled are discarded with
the in-memory state: nobody was told about them, and when this replica (or another) next wins
the lease it rebuilds the state from the store. A lost renewal of the leader lease does the same.
Whether the store answers at all is tracked apart (reach.py, `reach`): a replica that cannot reach
it says so (log, health, NOT_LEADER) rather than pass for a standby.

Snapshots (when one is due, how it is cut and stored, and the journal trimmed): compaction.py.

The replica knows the server only through scheduler/ports.py: it drives a `ReplicaHost` (the
loop) and a `WorkerBook` (the registry), and is the loop's `Journal`; scheduler/app/ wires them.

Hot standby. A replica that does not lead loads the snapshot once, then follows the journal as the
leader appends it (`tail`, blocking at most `tail_block_ms`; after a read that brought records it
waits `tail_pace_s`, so that one read carries several batches), applying every entry
through `loop.replay` (core + bookkeeping, no fan-out, metrics, observers or timers: the loop stays
`shutting_down`, the leader gate refuses every call) and `registry.replay`, so its core is live. If
the leader trimmed the journal past the standby's position (a snapshot it had not read up to), the
standby reloads the snapshot; an entry it cannot decode stops the following. A standby campaigns
only once loaded. Winning the lease is a new term (a new fencing token), so nothing more reaches
the journal from the last leader; the standby then reads the journal's tail once (the last few
entries), and serves. A full recovery (snapshot + the whole journal after it) happens only when
there is nothing live to take over from: at a cold start, after a step-down (this core holds events
that never reached the journal), or when the tail cannot be applied.

Take-over (hot or full): give every registered worker a fresh heartbeat, publish this replica's
address (`--advertise`: what standbys name in NOT_LEADER), then carry the leases across the
outage with one journaled core event, `Resumed(since)`, since = the later of the last recorded
time and the last leader's last lease renewal (`alive`, its clock): holders could neither
renew nor yield while no server was up, so the core moves every expiry out by the outage (and to
at least now + TTL) and every pending yield deadline by the outage, before any timer due now
fires. A fresh store (no snapshot, empty journal) starts by journaling the policy file and
registering the static pool.

Election timing, and how the leader keeps its lease: lease.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

from scheduler.core.types import Resumed
from scheduler.policy.model import Policy
from scheduler.ports import NOT_LEADER, Applied, Extras, ReplicaHost, StateUnavailable, WorkerBook
from scheduler.state import codec
from scheduler.state.compaction import SNAPSHOT_DUTY, SNAPSHOT_RATIO, Compaction
from scheduler.state.lease import DEFAULT_LEADER_TTL_S, MARGIN, LeaderLease, next_renewal, unavailable
from scheduler.state.metrics import StateMetrics
from scheduler.state.reach import StoreReach
from scheduler.state.roles import DUTIES, Role, Trigger, move
from scheduler.state.standby import FOLLOW_PACE_S, Standby, StateError, TakeOver
from scheduler.state.state_write import Captured
from scheduler.state.store import AppendDone, StaleTerm, StateStore, StoreUnavailable

__all__ = ["Replica", "Role", "StateError", "StateMetrics", "TakeOver"]

log = logging.getLogger("slotsched.state")

#: A standby campaigns every 100 ms (with ±50 % jitter): lease.py's election timing.
DEFAULT_CAMPAIGN_INTERVAL_S = 0.1
#: A standby that may not lead its pool looks again this often without a `nudge`.
IDLE_CHECK_S = 1.0


class Replica(Compaction, LeaderLease, Standby):
    """Leadership and durability of one replica, over any `StateStore` (store.py); its roles
    and their moves are roles.py's tables. Create on the loop's event loop."""

    def __init__(
        self,
        store: StateStore,
        loop: ReplicaHost,
        registry: WorkerBook,
        policy: Policy,
        metrics: StateMetrics,
        *,
        on_lead: Callable[[bool], Awaitable[None]],
        on_step_down: Callable[[], Awaitable[None]],
        leader_ttl_s: float = DEFAULT_LEADER_TTL_S,
        snapshot_every: int = 1000,
        snapshot_interval_s: float = 60.0,
        campaign_interval_s: float = DEFAULT_CAMPAIGN_INTERVAL_S,
        advertise: str = "",
        snapshot_ratio: float = SNAPSHOT_RATIO,
        snapshot_duty: float = SNAPSHOT_DUTY,
        where: str = "",
        on_store: Callable[[str | None], Awaitable[None]] | None = None,
        may_lead: Callable[[], bool] | None = None,
        may_follow: Callable[[], bool] | None = None,
        pool: str = "",
    ) -> None:
        """`where` names the store in messages (its URL, password masked); `on_store` is told
                when the store stops or starts answering (StoreReach). `may_lead` (a pool's replica
                among many, ownership.py): campaign only while it says yes, and hand the lease over
                when it says no while leading; None: always (one pool, as before). `may_follow` likewise:
        hold the pool hot only while it says yes (its owner or successor), else hold nothing of it and
        ask the store nothing (a cold load if it is ever to lead it). `pool` names the
                pool in its log lines (per-pool leadership: a replica leads several)."""
        self.store = store
        self.reach = StoreReach(where or store.where, on_store)
        self.loop = loop
        self.registry = registry
        self.policy = policy
        self.metrics = metrics
        self.on_lead = on_lead
        self.on_step_down = on_step_down
        self.leader_ttl_s = leader_ttl_s
        self.renew_interval_s = leader_ttl_s / 4  # three more tries before the local deadline
        self.margin_s = leader_ttl_s * MARGIN  # see the module docstring: clock-rate drift
        self.campaign_interval_s = campaign_interval_s
        # A standby's XREAD blocks at most this long: well inside the store's socket timeout, or
        # as long as the store's tail connection allows (an idle pool: fewer reads to follow it).
        self.tail_block_ms = store.idle_tail_ms or max(10, int(min(200.0, leader_ttl_s * 1000 / 8)))
        self.tail_pace_s = min(FOLLOW_PACE_S, campaign_interval_s / 2)  # standby.py
        self.advertise = advertise  # host:port clients are sent to while this replica leads
        self.leader_address: str | None = None  # a standby's view of where the leader is
        self.last_takeover: TakeOver | None = None
        self.snapshot_loads = 0  # a standby loads once; again only after a trim past it
        self.snapshot_every = snapshot_every
        self.snapshot_interval_s = snapshot_interval_s
        self.snapshot_ratio = snapshot_ratio
        self.snapshot_duty = snapshot_duty
        self.role = Role.STANDBY  # roles.py: what it does, and how it moves
        self.fatal: BaseException | None = None
        self.fatal_event = asyncio.Event()
        self._aloop = asyncio.get_running_loop()
        self._batch: list[bytes] = []
        self._batch_fut: asyncio.Future[None] | None = None
        self._inflight_fut: asyncio.Future[None] | None = None
        self._waiters: dict[asyncio.Future[None], list[asyncio.Future[None]]] = {}
        self._flushing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._term = 0  # bumped at every take-over: see _cut
        self._since_snapshot = 0
        self._last_snapshot = time.monotonic()
        self._snapshots_ok = True
        self._snapshot_task: asyncio.Task[None] | None = None
        self._snapshot_size = 0  # live leases + queued sessions at the last cut
        self._snapshot_events = 0  # journal entries the snapshot being stored covers
        self._snapshot_cost = 0.0  # the last snapshot's capture + encode + store (s, wall)
        self._capture_s = 0.0
        self._last_now = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._deadline = float("-inf")  # monotonic: serve no later than this without a renewal
        self._renew_at = float("inf")
        # Hot standby: the journal id this core is exactly at (None: not loaded, or a leader's
        # core, which runs ahead of the journal until its batch lands).
        self._pos: str | None = None
        self._fresh = True  # no snapshot and no journal entry applied: a new store
        self._follow_task: asyncio.Task[None] | None = None
        self._follow_broken = False
        self._first_load = asyncio.Event()
        self.may_lead = may_lead
        self.may_follow = may_follow
        self._nudged = asyncio.Event()  # the owners table changed (`nudge`)
        self._said = f"pool {pool}: " if pool else ""  # what its log lines begin with

    @property
    def serving(self) -> bool:
        """Leading, recovered, accepting calls (a role whose duties say it serves)."""
        return DUTIES[self.role].serves

    @serving.setter
    def serving(self, value: bool) -> None:
        # For tests and benches that lead a replica without a take-over (`try_lead` alone).
        self.role = Role.LEADER if value else Role.STANDBY

    def _become(self, trigger: Trigger) -> Role:
        """Move by the table (roles.TRANSITIONS): a move it lacks is a bug, and raises."""
        self.role = move(self.role, trigger)
        return self.role

    # ------------------------------------------------------------------ durability

    def durable(self) -> Awaitable[None]:
        if not self.serving:
            return self._refuse()
        fut = self._batch_fut or self._inflight_fut
        if fut is None:
            return self.loop.durable_done()
        # A future per waiter, settled by the flush itself: one waiter's cancellation must not
        # cancel the batch, and `asyncio.shield` would cost every reply one more loop pass.
        waiter: asyncio.Future[None] = self._aloop.create_future()
        self._waiters.setdefault(fut, []).append(waiter)
        return waiter

    def _settle(self, fut: asyncio.Future[None], failure: BaseException | None) -> None:
        """Complete a batch's future and, in the same pass, every waiter on it."""
        if not fut.done():
            if failure is None:
                fut.set_result(None)
            else:
                fut.set_exception(failure)
        for waiter in self._waiters.pop(fut, ()):
            if not waiter.done():
                if failure is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(failure)

    async def _refuse(self) -> None:
        raise unavailable(NOT_LEADER)

    def record(self, event: Applied, now: float, extras: Extras) -> None:
        if not self.serving:
            # Applied to a state this replica no longer leads (e.g. a withdrawal from a stream
            # cancelled by the step-down): it is thrown away at the next recovery, so it must not
            # reach the journal of a later term either.
            return
        raw = codec.encode(event, now, extras)
        self._last_now = max(self._last_now, now)
        self._batch.append(raw)
        self._since_snapshot += 1
        if self._batch_fut is None:
            fut = self._batch_fut = self._aloop.create_future()
            fut.add_done_callback(_consume)
        if not self._flushing:
            self._flushing = True
            if self._snapshot_due():
                self._aloop.call_soon(self._cut, self._term, self.store.token)
            else:  # decided once: no snapshot from here, inside `loop.submit` (mid-event)
                self._cut(self._term, self.store.token, capture=False)

    def _cut(self, term: int, token: str, capture: bool = True) -> None:
        """Send the batch so far, then the next once this one is in: batches go in order, one
        at a time, for one term. A cut left over from an earlier term (this replica stepped down
        and led again) touches nothing of the new term, and its writes are fenced by its own
        term's token. Plain redis://: no task, the reply settles the waiters in the pass it
        arrives in (StateStore.append_nowait); elsewhere a task awaits the append."""
        if term != self._term:
            return
        if not self._batch:
            self._flushing = False
            return
        records, fut = self._batch, self._batch_fut
        self._batch, self._batch_fut = [], None
        batch = [codec.pack(records)]  # one journal entry per batch
        assert fut is not None
        self._inflight_fut = fut
        # A snapshot only between events, while the state is exactly the journal so far.
        snap = self._cut_snapshot() if capture else None
        done = partial(self._appended, term, token, fut, snap, time.perf_counter())
        if not self.serving:
            done(StaleTerm("not serving"))
            return
        try:
            sent = self.store.append_nowait(batch, token, done)
        except Exception as e:  # noqa: BLE001 - unsettled, its waiters would hang: fail it
            done(e)
            return
        if not sent:
            self._background(self._append(batch, token, done))

    async def _append(self, batch: list[bytes], token: str, done: AppendDone) -> None:
        outcome: str | BaseException
        try:
            outcome = await self.store.append(batch, token)
        except Exception as e:  # noqa: BLE001 - any failure: the batch is not durable
            outcome = e
        done(outcome)

    def _appended(
        self,
        term: int,
        token: str,
        fut: asyncio.Future[None],
        snap: Captured | None,
        t0: float,
        outcome: str | BaseException,
    ) -> None:
        if isinstance(outcome, BaseException):
            # The store failed, a fenced write, or anything unforeseen: its waiters must hear (a
            # batch left unsettled would hang them), and a leader that lost a batch must not
            # append later ones (the journal would have a hole): step down.
            self._settle(fut, unavailable(f"the state store is unavailable: {outcome}"))
            if term == self._term:
                # `_flushing` stays set: no later batch goes out before the step-down.
                self._inflight_fut = None
                self.metrics.errors.inc()
                if isinstance(outcome, (StoreUnavailable, StaleTerm)):
                    log.error("journal append failed (%s): stepping down", outcome)
                else:
                    log.error("journal append failed unexpectedly: stepping down", exc_info=outcome)
                # At once, not in a task: a handler asking `durable()` from now on must be refused.
                if self._stop_serving(f"journal append failed: {outcome}"):
                    self._background(self._stepped_down())
            return
        self.metrics.flush.observe(time.perf_counter() - t0)
        self._settle(fut, None)
        if term != self._term:
            return
        self._inflight_fut = None
        if snap is not None:
            self._save_snapshot(snap, outcome, token)
        self._cut(term, token)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in a task this replica holds on to (the loop keeps only a weak reference)."""
        task = self._aloop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ leadership

    def leading(self) -> bool:
        """Serving, and within the local deadline of the last renewal: a leader whose renewal is
        late (a busy or paused loop) stops answering before a successor could have won."""
        return self.serving and time.monotonic() < self._deadline

    async def start(self) -> None:
        """Load the state as a standby, then try once to lead; either way campaign on."""
        if self.may_follow is None or self.may_follow():
            self._follow_task = self._aloop.create_task(self._follow())
            await self._first_load.wait()
        try:
            await self._campaign()
        except StoreUnavailable as e:
            await self.reach.failed(e)
            await self._step_down(f"take-over failed: {e}")
        except StateUnavailable as e:
            log.warning("take-over failed at start (%s): standby until it succeeds", e)
            await self._step_down(f"take-over failed: {e}")
        self._task = self._aloop.create_task(self._run())

    async def _run(self) -> None:
        while self.role is not Role.STOPPED:
            try:
                if DUTIES[self.role].renews:
                    await asyncio.sleep(max(0.0, self._renew_at - time.monotonic()))
                    if self.may_lead is not None and not self.may_lead():
                        await self.hand_over("another replica owns this pool now")
                        continue
                    await self._renew()
                elif self.may_lead is not None and not self.may_lead():
                    # Not its pool to take: nothing to try until the owners table changes (or
                    # its membership), which `nudge` says; a slow check meanwhile, in case.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._nudged.wait(), IDLE_CHECK_S)
                    self._nudged.clear()
                    if self.may_follow is not None and DUTIES[self.role].follows:
                        await self._follow_or_drop()
                    self.leader_address = None  # the owners table says where the leader is
                else:
                    # Jitter: standbys that saw the lease lapse together do not campaign in step.
                    await asyncio.sleep(self.campaign_interval_s * random.uniform(0.5, 1.5))
                    if self.may_follow is not None and DUTIES[self.role].follows:
                        await self._follow_or_drop()
                    await self._campaign()
            except (StoreUnavailable, StateUnavailable) as e:
                # StateUnavailable: a take-over whose first batch (Resumed, the policy) failed to land.
                if not isinstance(e, StateUnavailable):
                    await self.reach.failed(e)
                elif not self.serving:  # a take-over that did not land: say so, never retry silently
                    log.warning("take-over failed (%s): standby, campaigning again", e)
                if self.serving:
                    self.metrics.errors.inc()
                    await self._step_down(f"state store unreachable: {e}")
            except StateError as e:
                log.error("cannot recover the state: %s", e)
                self.fatal = e
                self.fatal_event.set()
                return

    async def _campaign(self) -> None:
        """One try for the lease (only once this standby's core is loaded, or cannot be: then
        the take-over recovers in full); otherwise note where the leader is."""
        if not DUTIES[self.role].campaigns or (self._pos is None and not self._follow_broken):
            return
        if self.may_lead is not None and not self.may_lead():
            self.leader_address = None  # not its pool (ownership.py): the owners table says where
            return
        t0 = time.monotonic()
        won = await self.store.try_lead(self.leader_ttl_s)
        if won:
            if self.reach.ok is not True:  # try_lead answered (a replica that may not lead never asked)
                await self.reach.answered()
            self._become(Trigger.WON)
            self._deadline = t0 + self.leader_ttl_s - self.margin_s
            self._renew_at = next_renewal(t0, self.renew_interval_s)
            try:
                await self._take_over()
            except BaseException:
                if self.role is Role.CANDIDATE:
                    # Failed before serving (the store, a lost lease): this core may be half
                    # caught up. Reload and follow again; the lease lapses for another replica.
                    self._become(Trigger.FAILED)
                    self._pos = None
                    self._ensure_following()
                raise
        else:
            address = await self.store.leader_address()
            if self.reach.ok is not True:  # only a real answer from the store says it is reachable
                await self.reach.answered()
            if address != self.leader_address:
                log.info("%sstandby: the leader is at %s", self._said, address or "(not published yet)")
            self.leader_address = address

    async def _take_over(self) -> None:
        t0 = time.perf_counter()
        # A new term: whatever the previous one left pending is not ours to write any more.
        self._term += 1
        if self._batch_fut is not None:
            self._settle(self._batch_fut, unavailable("a new term began: retry"))
        self._batch, self._batch_fut, self._inflight_fut, self._flushing = [], None, None, False
        await self._stop_following()
        # The lease is ours now, so nothing more reaches the journal from the last leader
        # (fenced): reading the rest of it once makes this core exactly the journal.
        n = await self._catch_up() if self._pos is not None else None
        hot = n is not None
        if n is None:
            n = await self._recover()
        self._pos = None  # from here on this core runs ahead of the journal; a step-down reloads
        self.registry.refresh_all()  # every registered worker gets a fresh heartbeat from now
        fresh = self._fresh
        if self.advertise and not await self.store.publish_address(self.advertise, self.store.token):
            raise unavailable("lost the leader lease while taking over")
        self.leader_address = self.advertise or None
        # The outage began when the last leader was last known alive, not at its last event: an
        # idle spell before the crash is not outage (a holder dead since then gains nothing).
        alive = await self.store.alive()
        last_now = self._last_now
        since = last_now if alive is None else max(last_now, alive)
        if self._become(Trigger.SERVING) is not Role.LEADER:
            raise unavailable("stopping")  # stop() came during the take-over
        self.loop.resume()
        if not fresh:
            self._carry_leases(since)
        await self.on_lead(fresh)
        await self.loop.durable()
        took = time.perf_counter() - t0
        self.metrics.leader.set(1)
        self.metrics.recoveries.inc()
        self.metrics.takeover_entries.inc(n)
        self.metrics.takeover.observe(took)
        self.last_takeover = TakeOver(hot, n, took)
        log.info(
            "%sleading as %s (term %s): %s in %.3f s (%s, %d journal entries read at take-over)",
            self._said,
            self.store.replica_id,
            self.store.token,
            "fresh state" if fresh else "state recovered",
            took,
            "hot standby" if hot else "full recovery",
            n,
        )

    def _carry_leases(self, since: float) -> None:
        """Bridge the outage that began at `since` (see `Resumed`); journaled like any event."""
        self.loop.submit(Resumed(since))

    async def _step_down(self, why: str) -> None:
        if self._stop_serving(why):
            await self._stepped_down()
        else:
            self._ensure_following()

    async def hand_over(self, why: str) -> None:
        """Give the lease up for another replica to take (its pool moved, ownership.py): what
        was applied is made durable first (a reply already being built is not lost), then
        serving stops, the lease is resigned and this replica follows as a standby. Clients
        are told NOT_LEADER and re-attach to the new leader; no lease is lost."""
        if self.role is not Role.LEADER:
            return
        with contextlib.suppress(StateUnavailable):  # failed: its step-down is under way
            await self.loop.durable()
        if not self._stop_serving(f"handing over: {why}", Trigger.HAND_OVER):
            return
        try:
            await self.store.resign()
        except StoreUnavailable as e:
            log.warning("could not resign the leader lease (%s): it lapses by itself", e)
        await self._stepped_down()

    def _stop_serving(self, why: str, trigger: Trigger = Trigger.LOST) -> bool:
        """The synchronous half of a step-down: from here on nothing is told durable and every
        call is refused. False if this replica was not leading."""
        if self.role is not Role.LEADER:
            return False
        log.warning("%sstepping down: %s", self._said, why)
        self._become(trigger)
        self._deadline = float("-inf")
        self.metrics.leader.set(0)
        failure = unavailable(f"stepped down ({why}): retry")
        if self._batch_fut is not None:
            self._settle(self._batch_fut, failure)
        self._batch, self._batch_fut = [], None
        self.loop.begin_shutdown()
        self.loop.close()
        self._pos = None  # this core holds events that never reached the journal: reload
        self.leader_address = None
        return True

    async def _stepped_down(self) -> None:
        """The rest of a step-down: the server is told, then the replica follows again."""
        try:
            await self.on_step_down()
        finally:
            self._become(Trigger.STEPPED_DOWN)
            self._ensure_following()

    async def stop(self) -> None:
        """Graceful exit: stop campaigning and hand the lease over at once."""
        was = self.role is Role.LEADER
        self._become(Trigger.STOP)
        if self._task is not None:
            self._task.cancel()
        await self._stop_following()
        self.metrics.leader.set(0)
        try:
            if was:
                await self.store.resign()
        except StoreUnavailable as e:
            log.warning("could not resign the leader lease (%s): it lapses by itself", e)
        await self.store.close()


def _consume(fut: asyncio.Future[None]) -> None:
    """A batch nobody awaited (e.g. a Tick's) must not log 'exception never retrieved'."""
    if not fut.cancelled():
        fut.exception()
