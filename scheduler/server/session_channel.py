"""The Scheduler's `Channel`: many sessions on one bidirectional stream (proto: Scheduler.Channel).

Why: grpc.aio's per-call cost, not the scheduler, capped a runtime hosting many sessions; a
message on an open stream costs a fraction of a call, and a message that carries many commands
(or events) costs about as little as one. So both directions are batched: a ChannelRequest's
commands are applied in one go, and the writer puts every event ready into one ChannelResponse.

The same semantics as the per-session rpcs, by construction: a command is found in the command
table by its oneof field (scheduler/api/commands.py: its rate-limit flow; `commands.BY_FIELD`),
and goes through its operation in `session_ops.UNARY_OPS` (acquire: `SessionOps.open`), the very
functions the per-session rpcs call; an attached session is a `LeaseStream` of the loop like an
Acquire stream's, fed by the same fan-out, keeping the same `wait_timeout` timer (stream.py);
only where its items go differs (`ChannelStream`: this channel's outbox, one deque in event
order, rather than a queue per session and a task per session waiting on it). Errors are the
same `RpcFailure`s, sent as per-session error events (`RpcFailure.session_error`). So is a
command the wire guard refused (a field over its limit: scheduler/api/guard.py hands over a
`PartlyRefused`): that command alone is answered INVALID_ARGUMENT, as its per-session rpc would
have been, and the message's other commands are applied; only what no one command can be blamed
for (bytes that do not decode, too many commands) ends the channel, with every session on it.

Order: commands are applied as read; a command's answer (an `AnswerEntry`) is appended to the
outbox after the events its own event caused (`EventEntry`s, fanned out while `submit` ran), so
a Release's `Ended{RELEASED}` precedes its `released`. The writer takes what is in the outbox,
awaits `loop.durable()` for it (Redis mode: nothing is told before it is journaled), converts,
signs and writes it as one message.

Flow control (documented in the proto): at most `SOFT_LIMIT` entries wait in the outbox before
the reader stops reading commands (backpressure: gRPC's flow control then slows the sender); if
lease events of attached sessions still pile up past `HARD_LIMIT` (a reader that does not read)
the channel ends RESOURCE_EXHAUSTED. Either way a channel's memory is bounded, by these limits
and by `MAX_SESSIONS` attached sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import grpc

from scheduler.api import commands, guard
from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.api.wire import MAX_CHANNEL_SESSIONS
from scheduler.core.types import SessionId
from scheduler.grants import GrantKeyring
from scheduler.ports import StateUnavailable
from scheduler.server import convert, errors
from scheduler.server.auth import Authenticator
from scheduler.server.loop import SchedulerLoop
from scheduler.server.pool_routes import PoolUnit, Router
from scheduler.server.session_ops import FOLLOW_OPS, UNARY_OPS, Outcome, SessionOps
from scheduler.server.stream import CLOSE, FINAL, Item, LeaseStream, StreamClosed

# Outbox entries past which commands are not read: low, so a flooding tenant's channels keep
# little accepted work waiting for its answers (64 channels at 4096: ~100,000 live entries the
# collector walked, 10-30 ms a pass); a busy client's writer drains it every turn anyway.
SOFT_LIMIT = 128
LOW_WATER = 32  # outbox entries a contended message permit waits down to before it passes on
LOW_WAIT_S = 0.5  # the longest it waits for that
HARD_LIMIT = 65_536  # outbox entries past which the channel ends RESOURCE_EXHAUSTED
MAX_SESSIONS = MAX_CHANNEL_SESSIONS  # sessions attached to one channel
MAX_EVENTS_PER_MESSAGE = 1024  # keeps one ChannelResponse well under gRPC's 4 MiB default
_SID_BYTES = guard.limit_for("session_id")
PAUSE_MAX_S = 1.0  # the longest a channel whose whole message was refused stops reading


# ---------------------------------------------------------------- the outbox's entries


@dataclass(slots=True)
class EventEntry:
    """An item the loop put on an attached session's stream (a lease event, or its close)."""

    stream: ChannelStream
    item: Item


@dataclass(slots=True)
class AnswerEntry:
    """The answer to one command: `outcome` is the reply for its `answer` field (the command
    table's `Command.answer`), or the RpcFailure sent as an error event."""

    session_id: str
    ref: int
    outcome: Outcome
    answer: str | None = None  # None: only ever a failure (a refused or unknown command, acquire)


@dataclass(slots=True)
class EndEntry:
    """The client half-closed: once the writer reaches this, every answer has been written."""


OutboxEntry = EventEntry | AnswerEntry | EndEntry
_END = EndEntry()


class ChannelStream(LeaseStream):
    """A session attached to a Channel: the loop's items go to the channel's outbox."""

    __slots__ = ("channel", "session_id", "silent")

    def __init__(self, key: SessionId, channel: _Channel, session_id: str) -> None:
        super().__init__(key)
        self.channel = channel
        self.session_id = session_id
        self.silent = False  # superseded by a re-acquire on this same channel: no ABORTED

    def _push(self, item: Item) -> None:
        self.channel.push(EventEntry(self, item))


class ChannelService:
    """Serves Channel calls for the Scheduler servicer (one `_Channel` per call) on the unit its
    router binds it to: the router's one unit from the start, or (per-pool leadership) the unit
    of the channel's first command."""

    def __init__(self, auth: Authenticator, keys: GrantKeyring, router: Router) -> None:
        self.auth = auth
        self.keys = keys
        self.router = router

    async def serve(self, context: Any) -> None:
        try:
            self.router.check_open()
            tenant = self.auth.tenant(context)
            held = self.auth.streams.open_channel(tenant, context)  # spec.limits.channelsPer*
            try:
                await _Channel(self, context, tenant).run()
            finally:
                self.auth.streams.close("channel", held)
        except errors.RpcFailure as f:
            await errors.abort(context, f)
        except StateUnavailable as e:
            await errors.abort(context, errors.from_state(e))


class _Channel:
    def __init__(self, service: ChannelService, context: Any, tenant: str) -> None:
        self.router = service.router
        self.unit = service.router.bound()
        self.loop: SchedulerLoop
        self.ops: SessionOps
        if self.unit is not None:  # else bound at the first command (_bind)
            self.loop, self.ops = self.unit.loop, self.unit.ops
        self.auth = service.auth
        self.keys = service.keys
        self.context = context
        self.tenant = tenant
        self.sessions: dict[str, ChannelStream] = {}
        # In order: the loop's items of attached sessions, the commands' answers, the end.
        self.outbox: deque[OutboxEntry] = deque()
        self.wake = asyncio.Event()  # the writer has something to write
        self.drained = asyncio.Event()  # the outbox went below SOFT_LIMIT
        self.drained.set()
        self.low = asyncio.Event()  # the outbox went down to LOW_WATER (a message permit's hand-on)
        self.failure: errors.RpcFailure | None = None
        self.failed = asyncio.Event()
        self.reading_done = False
        # Commands of the message being applied that their bucket refused, by flow.
        self.limited_by: dict[commands.Flow, int] = {}
        # Give-up functions of the commands still answered later (a queued permit): at the end
        # of the channel, what still waits is withdrawn.
        self.following: list[Callable[[], None]] = []

    def _down(self) -> errors.RpcFailure:
        """How the channel ends when its loop stops serving: a pool unit stepping down sends
        the caller to the pool's leader."""
        closed = errors.from_closed(StreamClosed.SHUTTING_DOWN)
        return closed if self.unit is None else self.unit.ended(closed)

    def _route(self, command: commands.Command | None, req: Any) -> PoolUnit:
        """The unit a command belongs to (a new acquire's, per pool, is rewritten to name its
        pool); RpcFailure: NOT_LEADER for a pool led elsewhere."""
        if command is commands.ACQUIRE:
            return self.router.for_acquire(self.tenant, req)
        if command is not None and command.by_budget:
            return self.router.for_permit(self.tenant, req)
        return self.router.for_session(self.tenant, req.session_id if req is not None else "")

    def _bind(self, cmd: scheduler_pb2.ChannelCommand) -> None:
        """A channel of per-pool leadership serves the pool of its first command (the SDK keeps
        one per pool); a pool led elsewhere ends it NOT_LEADER, naming that pool's leader."""
        field = cmd.WhichOneof("command")
        command = commands.BY_FIELD.get(field) if field else None
        self.unit = self._route(command, getattr(cmd, field) if field else None)
        self.loop, self.ops = self.unit.loop, self.unit.ops

    def _same_unit(self, command: commands.Command, req: Any) -> PoolUnit:
        """The unit a command of a bound channel goes to: its own; for another pool NOT_LEADER
        if another replica leads it, else FAILED_PRECONDITION (open a Channel for that pool).
        A permit is served by its budget's home unit whichever pool the channel serves here:
        it is not journaled, so the channel's wait for durability is not its unit's to give."""
        unit = self._route(command, req)
        if unit is not self.unit and not command.by_budget:
            assert self.unit is not None
            raise errors.failed_precondition(
                f"this Channel serves pool {self.unit.pool!r}; open another Channel for pool {unit.pool!r}"
            )
        return unit

    def push(self, entry: OutboxEntry) -> None:
        outbox = self.outbox
        if self.failure is not None:
            return
        if len(outbox) >= HARD_LIMIT:
            self.failure = errors.channel_slow_reader(HARD_LIMIT)
            self.failed.set()  # ends the call even while the writer is stuck in a write
            return
        outbox.append(entry)
        if len(outbox) == 1:
            self.wake.set()
        if len(outbox) >= SOFT_LIMIT:
            self.drained.clear()

    # ------------------------------------------------------------------ the call

    async def run(self) -> None:
        reader = asyncio.create_task(self._read(), name="slotsched-channel-read")
        writer = asyncio.create_task(self._write(), name="slotsched-channel-write")
        failed = asyncio.create_task(self.failed.wait(), name="slotsched-channel-overflow")
        tasks = (reader, writer, failed)
        try:
            pending: set[asyncio.Task[Any]] = set(tasks)
            while True:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if failed in done and self.failure is not None:
                    raise self.failure
                for task in done:
                    task.result()  # raises the failure that ended it
                if writer in done:
                    return  # every answer written after the client half-closed
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
            self._detach_all()

    def _detach_all(self) -> None:
        if self.unit is None:
            return  # never bound: nothing attached
        for give_up in self.following:
            give_up()
        self.following.clear()
        for s in self.sessions.values():
            self.loop.detach(s)  # its wait_timeout timer too
        self.sessions.clear()

    # ------------------------------------------------------------------ commands in

    async def _read(self) -> None:
        read = self.context.read
        while True:
            if not self.drained.is_set():
                await self.drained.wait()  # backpressure: the writer is behind
            req = await read()
            if req is grpc.aio.EOF:
                break
            if type(req) is guard.Refused:  # not attributable to one command: ends the channel
                raise errors.invalid_argument(req.field, req.description)
            refused: dict[int, guard.Refused] = {}
            if type(req) is guard.PartlyRefused:
                refused = req.refused
                req = req.message
            # Same authentication as every rpc, per message: a credential ApplyPolicy removed
            # stops working here too (cached: one digest and a lookup).
            self.auth.tenant(self.context)
            cmds = req.commands
            if self.unit is None:
                if not cmds:
                    continue
                self._bind(cmds[0])
            if self.loop.shutting_down:
                raise self._down()
            limited: dict[commands.Flow, errors.RpcFailure] = {}
            self.limited_by = {}
            await self._apply(cmds, refused, limited)
            if cmds and sum(self.limited_by.values()) == len(cmds):
                # Every command past its bucket: this channel reads its next message once its
                # buckets could take what this one asked (at most PAUSE_MAX_S on), so refusing a
                # flood does not take the loop either; gRPC's flow control holds the sender.
                await asyncio.sleep(self._refill_pause(limited))
        self.reading_done = True
        self.push(_END)

    async def _apply(
        self, cmds: Any, refused: dict[int, guard.Refused], limited: dict[commands.Flow, errors.RpcFailure]
    ) -> None:
        """Apply a message's commands, holding one of its flow's message permits (fairness.py:
        at most a few of a tenant's channels mid-message; the others wait here, read but not
        started), in chunks of fair admission: at most `spec.limits.seats` commands, each chunk
        a work item of the tenant's flow costing its commands, so a wide message cannot make one
        turn of the loop long; while a chunk waits, nothing more is read from this channel
        (gRPC's flow control holds the sender). Never refused for the flow's queue bound: a
        channel has at most one item waiting (bounded by channelsPerTenant), and refusing cost a
        message's answers while the refused channels, paused alike, came back in one turn."""
        gate, permits, tenant = self.auth.gate, self.auth.permits, self.tenant
        waiting = permits.try_acquire(tenant)
        if waiting is not None:
            try:
                await waiting
            except asyncio.CancelledError:
                permits.cancelled(tenant, waiting)
                raise
        try:
            if self.loop.shutting_down:  # it stepped down while this message waited
                raise self._down()
            n, i = len(cmds), 0
            while i < n:
                j = min(n, i + gate.chunk(tenant))
                admitted = gate.try_admit(tenant, j - i, bounded=False, timed=True)
                if admitted is not None:
                    await gate.wait(tenant, admitted)  # type: ignore[arg-type]
                    if self.loop.shutting_down:
                        raise self._down()
                started = perf_counter()
                for k in range(i, j):
                    cmd = cmds[k]
                    bad = refused.get(k) if refused else None
                    if bad is None:
                        self._command(cmd, limited)
                    else:
                        self._refuse(cmd, bad, limited)
                gate.spent(tenant, j - i, perf_counter() - started)
                i = j
            if permits.contended(tenant) and len(self.outbox) > LOW_WATER:
                # Another channel of this tenant waits: once these answers are out (or a while,
                # so a client that does not read holds no permit for long).
                self.low.clear()
                with contextlib.suppress(TimeoutError):  # asyncio.timeout: 3.11's wait_for can
                    async with asyncio.timeout(LOW_WAIT_S):  # swallow a cancellation
                        await self.low.wait()
        finally:
            permits.release(tenant)

    def _charge(
        self, command: commands.Command, limited: dict[commands.Flow, errors.RpcFailure]
    ) -> errors.RpcFailure | None:
        """Charge one command to its flow's bucket, before any work: its refusal, or None. Once a
        bucket refused one command of this message, the message's later commands of that flow
        get the same refusal (counted, not built again): a flood's excess is refused cheaply.
        Returned, never raised: one shared refusal raised per command would grow its traceback
        by a frame (holding the command) each time, and leave cycles for the collector, whose
        full passes then stall the loop (measured: 100-150 ms each, several a second)."""
        flow = command.flow
        failure = limited.get(flow)
        if failure is not None:
            self.auth.limits.count_refused(self.tenant, command)
        else:
            failure = self.auth.limits.refusal(self.tenant, command)
            if failure is None:
                return None
            limited[flow] = failure
        self.limited_by[flow] = self.limited_by.get(flow, 0) + 1
        return failure

    def _refill_pause(self, limited: dict[commands.Flow, errors.RpcFailure]) -> float:
        """How long a channel whose whole message its buckets refused stops reading: until they
        could take what it asked (refused commands / qps, per flow; at least the soonest
        retry-after), at most PAUSE_MAX_S. Pausing only until the next token let 100 flooding
        channels come back every few ms, each message refused whole again (~100,000 refusals a
        second, the server's whole loop); now such a channel costs about one read a second."""
        limits = self.auth.limits
        refill = max(limits.refill_s(self.tenant, flow, k) for flow, k in self.limited_by.items())
        soonest = min(int(dict(f.metadata).get(errors.RETRY_AFTER_KEY, "0")) for f in limited.values())
        return min(PAUSE_MAX_S, max(refill, soonest / 1000.0))

    def _command(
        self, cmd: scheduler_pb2.ChannelCommand, limited: dict[commands.Flow, errors.RpcFailure]
    ) -> None:
        field = cmd.WhichOneof("command")
        command = commands.BY_FIELD.get(field) if field else None
        tenant = self.tenant
        sid = ""
        out: Outcome
        try:
            if command is None:
                # Charged as a tenant's call; its answer is the bucket's refusal, or this one.
                out = self._charge(commands.ACQUIRE, limited) or errors.invalid_argument(
                    "command", f"set one of {commands.FIELDS_TEXT}"
                )
            else:
                req = getattr(cmd, field)
                sid = req.session_id
                refused = self._charge(command, limited)
                if refused is not None:
                    out = refused
                else:
                    unit = self._same_unit(command, req)
                    if command is commands.ACQUIRE:
                        self._acquire(req)  # its answer is its lease events
                        return
                    out = UNARY_OPS[command](unit.ops, tenant, req)
                    if command.follows:
                        self._follow(command, unit, sid, cmd.ref, out)
        except errors.RpcFailure as f:
            # Kept as an answer: without its traceback, which would hold this frame (and the
            # command) in a cycle until the collector's next pass.
            out = f.with_traceback(None)
        self.push(AnswerEntry(sid, cmd.ref, out, command.answer if command is not None else None))

    def _follow(self, command: commands.Command, unit: PoolUnit, sid: str, ref: int, first: Outcome) -> None:
        """A command answered again later on its ref (a queued permit's grant or refusal)."""

        def tell(outcome: Outcome) -> None:
            self.push(AnswerEntry(sid, ref, outcome, command.answer))

        give_up = FOLLOW_OPS[command](unit.ops, self.tenant, first, tell)
        if give_up is not None:
            self.following.append(give_up)

    def _refuse(
        self,
        cmd: scheduler_pb2.ChannelCommand,
        bad: guard.Refused,
        limited: dict[commands.Flow, errors.RpcFailure],
    ) -> None:
        """A command the wire guard refused (a field over its limit): answered alone, as the
        per-session rpc would have ended, the field named from the command down (proto); not
        applied, but charged to its flow's bucket like every command (past it, the answer is
        the rate limit's refusal)."""
        kind = cmd.WhichOneof("command")
        sid = getattr(cmd, kind).session_id if kind else ""
        if len(sid.encode()) > _SID_BYTES:
            sid = ""  # the refused field itself: not echoed
        command = commands.BY_FIELD.get(kind) if kind else None
        failure = self._charge(command if command is not None else commands.ACQUIRE, limited)
        self.push(AnswerEntry(sid, cmd.ref, failure or errors.invalid_argument(bad.field, bad.description)))

    def _acquire(self, req: scheduler_pb2.AcquireRequest) -> None:
        sid = req.session_id
        old = self.sessions.get(sid)
        if old is None and len(self.sessions) >= MAX_SESSIONS:
            raise errors.channel_full(MAX_SESSIONS)
        if old is not None:
            old.silent = True  # re-attached on this channel: the replay says all

        def make(key: SessionId) -> LeaseStream:
            return ChannelStream(key, self, sid)

        try:
            stream = self.ops.open(self.tenant, req, make)
        except errors.RpcFailure:
            if old is not None:
                old.silent = False
            raise
        assert isinstance(stream, ChannelStream)
        self.sessions[sid] = stream

    # ------------------------------------------------------------------ events out

    async def _write(self) -> None:
        outbox = self.outbox
        wake = self.wake
        write = self.context.write
        gate = self.auth.gate
        while True:
            if not outbox and self.failure is None:
                wake.clear()
                await wake.wait()
            if self.failure is not None:
                raise self.failure
            # Building the answers is the tenant's work too (a refused flood's answers cost as
            # much as the refusals): a work item of its flow, never refused (the commands were
            # accepted), a seat an entry, so one turn builds a bounded number (by count: its
            # encoding and write, most of its cost, happen outside and are not measured).
            n = min(len(outbox), MAX_EVENTS_PER_MESSAGE, gate.chunk())
            admitted = gate.try_admit(self.tenant, n, bounded=False)
            if admitted is not None:
                await gate.wait(self.tenant, admitted)  # type: ignore[arg-type]
                if self.failure is not None:
                    raise self.failure
            # Built while the journal append is in flight, written once what it tells is
            # durable (the wait below covers every event applied so far): never tell what a
            # crash could take back.
            resp = scheduler_pb2.ChannelResponse()
            events = resp.events
            ended = False
            for _ in range(n):
                entry = outbox.popleft()
                if type(entry) is EventEntry:
                    self._lease_item(entry.stream, entry.item, events)
                elif type(entry) is AnswerEntry:
                    ev = events.add(session_id=entry.session_id, ref=entry.ref)
                    out = entry.outcome
                    if isinstance(out, errors.RpcFailure):
                        ev.error.CopyFrom(out.session_error())
                    else:  # the reply is the message of its command's answer field
                        getattr(ev, entry.answer).CopyFrom(out)  # type: ignore[arg-type]
                else:
                    ended = True
            if len(outbox) < SOFT_LIMIT:
                self.drained.set()
                if len(outbox) <= LOW_WATER:
                    self.low.set()
            await self.loop.durable()  # bound by now: the outbox holds what its commands caused
            if self.loop.shutting_down:
                raise self._down()
            if events:
                await write(resp)
            if ended:
                return

    def _lease_item(self, s: ChannelStream, item: Item, events: Any) -> None:
        kind, notice, _ = item
        if kind == CLOSE or notice is None:
            # Another stream took the session over (a shutdown ends the whole channel instead).
            if self.sessions.get(s.session_id) is s:
                del self.sessions[s.session_id]
            if s.close_reason is StreamClosed.SHUTTING_DOWN:
                raise self._down()
            if not s.silent:
                ev = events.add(session_id=s.session_id)
                ev.error.CopyFrom(errors.from_closed(StreamClosed.SUPERSEDED).session_error())
            return
        ev = events.add(session_id=s.session_id)
        convert.fill_sealed_event(self.keys, ev.event, notice)  # in place: nothing copied
        if kind == FINAL:
            if self.sessions.get(s.session_id) is s:
                del self.sessions[s.session_id]
            self.loop.detach(s)
            if s.withdrawn:  # its wait_timeout passed while queued (stream.py)
                err = events.add(session_id=s.session_id)
                err.error.CopyFrom(errors.withdrawn(s.withdrawn).session_error())
