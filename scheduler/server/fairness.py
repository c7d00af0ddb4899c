"""Fair admission of the server's own work, as Kubernetes API Priority and Fairness admits the
API server's: the adapter around the pure `FairQueue` (scheduler/core/fairqueue.py), on the one
event loop, and the bounds on open streams.

Why: every call runs on one event loop; one that a tenant floods (many Channel streams, messages
of hundreds of commands, even refused ones) takes the loop's time from everyone, in arrival
order: a quiet tenant's Acquire and a worker's heartbeat wait behind the flood. So each work item
(a Channel message, a per-session rpc, an Acquire stream's open, a Workers, Admin or KEDA call)
first asks the gate for a seat, charged to its **flow**: the tenant's name, or `role:admin`,
`role:worker`, `role:keda`, each a flow of its own, so a tenant's flood cannot stop heartbeats.

A seat is held for the turn of the event loop the item starts in (its synchronous part: decoding
done, commands applied), given back at the end of that turn (one `call_soon` for all of them):
so at most `spec.limits.seats` seats' work starts in one turn (a Channel message wider than that
is applied in chunks of `seats` commands, and its answers built in such chunks; an item takes as many seats as
its cost, at most all of them: a message of 200 commands takes 200), and when more ask, the rest
wait in
their flow's queue and are started, turn by turn, in fair order (virtual finish tags: a flow's
share is its weight's, 1 each here). An item ahead of every waiting one in that order (a quiet
flow's, under a flood) starts at once, over the turn's seats by at most as many again
(`FairQueue.overdraft`): it would be the next started anyway. A waiting Channel reader reads
nothing more, so gRPC's flow control slows the flooding sender. A flow with
`spec.limits.queuedPerFlow` items waiting is refused (RESOURCE_EXHAUSTED, reason RATE_LIMITED,
the flow and the bound named, with retry-after): on its own side. A Channel's items are never
refused so (a channel has at most one waiting); instead at most a few of a flow's Channel
messages are in progress at once (`MessagePermits`).

With `spec.limits.turnMillis` set (off by default), while two tenants or more have work (within
a second), a Channel chunk is charged its flow's measured time (`spent`: seconds per command; a
costlier chunk raises it at once, cheaper ones lower it by a tenth each) in seats of `turnMillis
/ seats`, never less than its commands, and carries at most what fits `turnMillis`: a turn then
holds about that much work whatever the commands cost, and another tenant's next item waits
about that long. A tenant alone keeps whole turns of `seats` commands (the admin, worker and KEDA
flows, single calls, do not count as contending).

Open streams are bounded at their open (`StreamBounds`): Channel streams per tenant
(`channelsPerTenant`) and per connection (`channelsPerConnection`, the caller's peer address,
counted per tenant: tenants behind one proxy connection do not share a bound),
per-session Acquire streams likewise (`streamsPerTenant`, `streamsPerConnection`).

Metrics per flow (metrics.py): `slotsched_flow_admitted_total` (work admitted, in commands),
`slotsched_flow_queued` (items waiting), `slotsched_flow_refused_total{reason}`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from scheduler.core.fairqueue import FairQueue, Offer
from scheduler.policy.model import LimitsSpec, Policy
from scheduler.server import errors
from scheduler.server.metrics import Metrics

_ROLE: Final = "role:"  # the flows of the admin, worker and KEDA roles (not tenants)
ADMIN_FLOW: Final = "role:admin"
WORKER_FLOW: Final = "role:worker"
KEDA_FLOW: Final = "role:keda"

# The refusal reasons counted in slotsched_flow_refused_total.
QUEUE_FULL: Final = "queue_full"
RATE_LIMITED: Final = "rate_limited"
CHANNELS_PER_TENANT: Final = "channels_per_tenant"
CHANNELS_PER_CONNECTION: Final = "channels_per_connection"
STREAMS_PER_TENANT: Final = "streams_per_tenant"
STREAMS_PER_CONNECTION: Final = "streams_per_connection"

_COST_WEIGHT = 0.1  # how fast a flow's measured cost per command falls towards a cheaper chunk
_ACTIVE_WINDOW_S = 1.0  # tenants with work within this long count as contending


class _Ticket:
    __slots__ = ("cost", "future", "seats")

    def __init__(self, future: asyncio.Future[None], cost: int, seats: float) -> None:
        self.future = future
        self.cost = cost  # units of work (counted in the metrics)
        self.seats = seats  # what it is charged in the fair queue


class AdmissionGate:
    def __init__(self, policy: Callable[[], Policy], clock: Callable[[], float] = time.monotonic) -> None:
        self._policy = policy
        self._clock = clock
        self._limits: LimitsSpec | None = None
        # An item first in fair order may start over the turn's seats by another turn's worth
        # (FairQueue.overdraft): a quiet flow's item then starts in the turn it arrives in.
        seats = LimitsSpec.seats
        self._queue: FairQueue[_Ticket] = FairQueue(seats, LimitsSpec.queued_per_flow, overdraft=seats)
        self._tickets: dict[asyncio.Future[None], _Ticket] = {}  # handed out by try_admit
        self._held = 0  # seats taken in this turn of the loop
        self._end_scheduled = False
        self.metrics: Metrics | None = None  # bound by the wiring
        # Measured seconds per Channel command by flow (`spent`), and the tenants with work in
        # this second: while two or more have, a seat is time (turnMillis / seats), not a command.
        self._unit_s: dict[str, float] = {}
        self._active: set[str] = set()
        self._epoch = clock()
        self.contended = False

    def _fq(self) -> FairQueue[_Ticket]:
        limits = self._policy().limits
        if limits is not self._limits:  # ApplyPolicy: new bounds, the waiting kept
            self._limits = limits
            self._queue.seats = self._queue.overdraft = limits.seats
            self._queue.queued_per_flow = limits.queued_per_flow
        return self._queue

    def queued(self, flow: str) -> int:
        return self._queue.queued(flow)

    def chunk(self, flow: str = "") -> int:
        """The most commands one work item of `flow` may carry: all the seats (a wider Channel
        message is admitted in chunks of this many); under contention, as many as fit one turn's
        time at the flow's measured cost (at least one)."""
        fq = self._fq()
        per, limits = self._timed(flow), self._limits
        if per is None or limits is None:
            return fq.seats
        return max(1, min(fq.seats, int(limits.turn_ms / 1000.0 / per)))

    def spent(self, flow: str, commands: int, seconds: float) -> None:
        """What `flow`'s `commands` took to apply (an average per command: what its next chunks
        are charged in seats while tenants contend)."""
        if commands <= 0:
            return
        per = seconds / commands
        old = self._unit_s.get(flow)
        # Up at once, down slowly: cheap chunks mixed in must not hide the expensive ones.
        self._unit_s[flow] = per if old is None or per > old else old + _COST_WEIGHT * (per - old)

    def _timed(self, flow: str) -> float | None:
        """`flow`'s measured seconds per command while turns are bounded by time (turnMillis
        set, tenants contending, the flow measured), else None. Call after `_fq`."""
        if not self.contended:
            return None
        limits = self._limits
        per = self._unit_s.get(flow)
        if per is None or per <= 0 or limits is None or limits.turn_ms <= 0:
            return None
        return per

    def _seats_for(self, flow: str, cost: int, timed: bool) -> float:
        """An item's seats: its units, or for measured work under contention its time in seats
        of turnMillis / seats each if more (bench/flood.py: an acquire+withdraw ~4, a renewal 1).
        Never below its units: a cheap command still takes its seat (what is not measured, its
        answer's encoding and write, costs too), so a turn is never longer than seats."""
        units = float(max(1, cost))
        per, limits = (self._timed(flow) if timed else None), self._limits
        if per is None or limits is None:
            return units
        return max(units, units * per * limits.seats * 1000.0 / limits.turn_ms)

    async def admit(self, flow: str, cost: int = 1, bounded: bool = True, timed: bool = False) -> None:
        """Return once `flow`'s work item of `cost` may run (at once when a seat is free and no
        one waits); raise RESOURCE_EXHAUSTED (RATE_LIMITED) when `flow`'s queue is full (never
        for an item not `bounded`: accepted work, as a Channel's answers). The seat is given back
        at the end of this turn of the loop."""
        failure = self.try_admit(flow, cost, bounded, timed)
        if failure is None:
            return
        if isinstance(failure, errors.RpcFailure):
            raise failure
        await self._wait(flow, failure)

    def try_admit(
        self, flow: str, cost: int = 1, bounded: bool = True, timed: bool = False
    ) -> None | errors.RpcFailure | asyncio.Future[None]:
        """`admit` without awaiting: None (admitted), the refusal, or the future to await (then
        call `wait` with it). `cost`: the item's units of work (commands, answers); `timed`: they
        are Channel commands whose time `spent` measures, charged that time under contention."""
        fq = self._fq()
        now = self._clock()
        units = self._seats_for(flow, cost, timed)
        if fq.admit_now(flow, now, units):  # the common case: no future, no ticket
            self._admitted(flow, cost, fq.width(units))
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ticket = _Ticket(fut, cost, units)
        offer = fq.offer(flow, ticket, now, units, bounded=bounded)
        if offer is Offer.ADMITTED:  # not reached: admit_now just said no
            self._admitted(flow, cost, fq.width(units))
            return None
        if offer is Offer.REFUSED:
            if self.metrics is not None:
                self.metrics.count_flow_refused(flow, QUEUE_FULL, max(1, cost))
            return errors.flow_queue_full(flow, fq.queued_per_flow, fq.retry_after(flow, now))
        self._set_queued(flow)
        self._tickets[fut] = ticket
        return fut

    async def _wait(self, flow: str, fut: asyncio.Future[None]) -> None:
        ticket = self._tickets.pop(fut)
        try:
            await fut
        except asyncio.CancelledError:
            # Still waiting: out of the queue. (Admitted already: its seat's release is scheduled.)
            if self._queue.cancel(flow, ticket):
                self._set_queued(flow)
            raise

    wait = _wait

    def _admitted(self, flow: str, cost: int, width: int) -> None:
        self._hold(width)
        self._active_flow(flow)
        if self.metrics is not None:
            self.metrics.count_flow_admitted(flow, cost)

    def _active_flow(self, flow: str) -> None:
        active = self._active
        if flow not in active and not flow.startswith(_ROLE):
            active.add(flow)
            if len(active) > 1:
                self.contended = True

    def _next_epoch(self, now: float) -> None:
        """Once a second: contended while two tenants or more had work in the last second (an
        epoch that ended longer ago, after an idle spell, says nothing)."""
        since = now - self._epoch
        if since < _ACTIVE_WINDOW_S:
            return
        self._epoch = now
        self.contended = len(self._active) > 1 and since < 2 * _ACTIVE_WINDOW_S
        self._active = set()

    def _hold(self, seats: int) -> None:
        """Keep `seats` until the end of this turn of the loop: one callback gives back every
        seat taken in the turn (scheduled after the wake-ups of the items admitted in it)."""
        self._held += seats
        if not self._end_scheduled:
            self._next_epoch(self._clock())  # a turn's first item: after an idle spell too
            self._end_scheduled = True
            asyncio.get_running_loop().call_soon(self._end_turn)

    def _end_turn(self) -> None:
        self._end_scheduled = False
        held, self._held = self._held, 0
        fq = self._queue
        woken = 0
        now = self._clock()
        self._next_epoch(now)
        for flow, ticket in fq.release(now, held):
            self._set_queued(flow)
            self._active_flow(flow)
            woken += fq.width(ticket.seats)  # a cancelled one's too: back next turn
            fut = ticket.future
            if fut.cancelled():
                continue
            fut.set_result(None)  # its task runs next turn, before the seat is given back
            if self.metrics is not None:
                self.metrics.count_flow_admitted(flow, ticket.cost)
        if woken:
            self._hold(woken)
        if not fq.waiting and fq.in_use == 0 and len(fq.flows()) > 1024:
            fq.forget_idle()

    def _set_queued(self, flow: str) -> None:
        if self.metrics is not None:
            self.metrics.set_flow_queued(flow, self._queue.queued(flow))


class MessagePermits:
    """At most `per_flow` of a flow's Channel messages in progress at once (applied, their
    answers still being written); another channel of that flow waits, its message read but not
    started. Why: a flooding tenant's 64 channels each mid-message kept ~60,000 live objects of
    accepted work (sessions opening, answers unwritten), and the collector's passes over them
    were the quiet tenant's p99 (bench/flood.py). A flow alone is never held back: a permit is
    handed on once its message's answers are out only while another channel waits."""

    def __init__(self, per_flow: int = 4) -> None:
        self.per_flow = per_flow
        self._held: dict[str, int] = {}
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def try_acquire(self, flow: str) -> asyncio.Future[None] | None:
        """None: a permit is held now; else a future to await (the permit is held once done)."""
        held = self._held.get(flow, 0)
        if held < self.per_flow and not self._waiting.get(flow):
            self._held[flow] = held + 1
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(flow, deque()).append(fut)
        return fut

    def contended(self, flow: str) -> bool:
        return bool(self._waiting.get(flow))

    def release(self, flow: str) -> None:
        """Give a permit back (or hand it to the flow's next waiter)."""
        queue = self._waiting.get(flow)
        while queue:
            fut = queue.popleft()
            if not fut.done():
                fut.set_result(None)  # the permit passes on: held stays the same
                return
        self._waiting.pop(flow, None)
        held = self._held.get(flow, 0) - 1
        if held > 0:
            self._held[flow] = held
        else:
            self._held.pop(flow, None)

    def cancelled(self, flow: str, fut: asyncio.Future[None]) -> None:
        """A waiter that left: out of the queue, or its permit given back if it had one."""
        if fut.done() and not fut.cancelled():
            self.release(flow)
            return
        queue = self._waiting.get(flow)
        if queue is not None and fut in queue:
            queue.remove(fut)


class StreamBounds:
    """Open Channel and Acquire streams per tenant and per connection (the peer), bounded by
    `spec.limits`; `open` refuses past a bound, `close` gives the place back."""

    def __init__(self, policy: Callable[[], Policy]) -> None:
        self._policy = policy
        self._open: dict[tuple[str, str], int] = {}
        self.metrics: Metrics | None = None

    def open_channel(self, tenant: str, context: Any) -> tuple[str, str]:
        lim = self._policy().limits
        return self._open_pair(
            "channel",
            tenant,
            _peer(context),
            (lim.channels_per_tenant, "spec.limits.channelsPerTenant", CHANNELS_PER_TENANT),
            (lim.channels_per_connection, "spec.limits.channelsPerConnection", CHANNELS_PER_CONNECTION),
        )

    def open_stream(self, tenant: str, context: Any) -> tuple[str, str]:
        lim = self._policy().limits
        return self._open_pair(
            "stream",
            tenant,
            _peer(context),
            (lim.streams_per_tenant, "spec.limits.streamsPerTenant", STREAMS_PER_TENANT),
            (lim.streams_per_connection, "spec.limits.streamsPerConnection", STREAMS_PER_CONNECTION),
        )

    def count(self, kind: str, tenant: str) -> int:
        return self._open.get((f"{kind}:tenant", tenant), 0)

    def _open_pair(
        self,
        kind: str,
        tenant: str,
        peer: str,
        by_tenant: tuple[int, str, str],
        by_peer: tuple[int, str, str],
    ) -> tuple[str, str]:
        # A connection is counted per tenant: tenants behind one proxy share its peer address,
        # and one tenant's streams there must not use up another's bound.
        keys = ((f"{kind}:tenant", tenant), (f"{kind}:peer", f"{tenant}\0{peer}"))
        what = "Channel streams" if kind == "channel" else "Acquire streams"
        for key, (bound, policy_key, reason), whose in zip(
            keys, (by_tenant, by_peer), (f"tenant {tenant}", "this connection"), strict=True
        ):
            if self._open.get(key, 0) >= bound:
                if self.metrics is not None:
                    self.metrics.count_flow_refused(tenant, reason)
                raise errors.streams_over_bound(what, whose, policy_key, bound)
        for key in keys:
            self._open[key] = self._open.get(key, 0) + 1
        return tenant, peer

    def close(self, kind: str, held: tuple[str, str]) -> None:
        tenant, peer = held
        for key in ((f"{kind}:tenant", tenant), (f"{kind}:peer", f"{tenant}\0{peer}")):
            n = self._open.get(key, 0) - 1
            if n > 0:
                self._open[key] = n
            else:
                self._open.pop(key, None)


def _peer(context: Any) -> str:
    try:
        peer = context.peer()
    except (AttributeError, NotImplementedError):
        return ""
    return peer if isinstance(peer, str) else str(peer)
