"""Every session of one `AsyncClient` on one `Scheduler.Channel` stream (the multiplexer), or on a
few when one is full.

Why: each session used to hold its own server-streaming Acquire and make unary Renew, Yield and
Release calls, and grpc.aio's per-call cost capped a runtime hosting many sessions. On a channel a
message costs a fraction of a call, and commands (and events) ready at the same moment travel as
one message.

Transparent to the session code: `SessionMux` is a `SessionTransport` (transport.py), as the
per-session rpcs are: `attach` returns the session's stream, whose async iterator yields its
LeaseEvents and raises `grpc.aio.AioRpcError` as the per-session stream would (a per-session
error event is turned into the same status, details and trailing metadata); `send` sends a
command by its row's Channel field and returns the answer or raises `AioRpcError`. So the
session's state machine, its re-attach with backoff, its one retry layer (`calls.py`) and its
error mapping (`reactions.py`) are the ones the per-session rpcs use; the multiplexer itself
never sends a command again.

A channel carries at most as many sessions as the server allows (10,000: an acquire past that is
refused RESOURCE_EXHAUSTED, reason CHANNEL_FULL). Such an acquire is sent again on another channel
of the client's small pool (opened for it if every one is full); the session never sees the
refusal. A session stays on the channel it was placed on (its Renew, Yield and Release go there
too, after its events), a channel that refused is not offered new sessions until one of its own
leaves, and a channel other than the first is closed once no session or command is left on it.
So a client with fewer sessions than the cap keeps exactly one channel, as before.

A broken channel fails every call on it with UNAVAILABLE (whatever status ended it, except a
verdict on what the client sent: UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT; the
CHANNEL column of `reactions.py`), so each session re-attaches as after a broken Acquire stream
and its commands in flight are sent again (by `calls.py`):
its next `Acquire` goes on a channel that works (a new one if none, opened through
`client.open_channel()` afresh, so a client that follows the leader reaches the new one). A channel
is left the same way, its replica counted as lost by the client's follower, when the replica
answers nothing for `SILENCE_S` while a command or an acquire waits on it (frozen, or hung: its
connection stays open), or refuses a command NOT_LEADER (a leader that stepped down under its
open channels answers every command so). The first
response on a channel (often to a renewal retried through an outage) wakes the client's sessions
asleep in re-attach backoff (`wake.py`), so their acquires follow at once, batched on it. A server
without `Channel` (UNIMPLEMENTED) switches the client back to the per-session rpcs (`unsupported`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message

from scheduler.api import commands, wire
from scheduler.api.commands import Command
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.client import channel
from scheduler.client.channel import ClientLink
from scheduler.client.reactions import Reaction, reason_of_status, rule
from scheduler.client.ticks import ticks
from scheduler.client.transport import ChannelCall, Sink

#: Older servers refused an acquire on a full channel RATE_LIMITED, saying this in the message.
_CHANNEL_FULL_TEXT = "open another channel"
_CODES = {c.value[0]: c for c in grpc.StatusCode}
_END = object()  # a session's stream ended with OK after its last event


def rpc_error(
    code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str | bytes], ...] = ()
) -> grpc.aio.AioRpcError:
    """The error a per-session call would have raised."""
    md = grpc.aio.Metadata(*trailers)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), md, details, None)


def from_session_error(err: pb.SessionError) -> grpc.aio.AioRpcError:
    status = err.status
    trailers: list[tuple[str, str | bytes]] = list(err.trailers.items())
    if status.details:
        trailers.append((wire.DETAILS, status.SerializeToString()))
    return rpc_error(_CODES.get(status.code, grpc.StatusCode.UNKNOWN), status.message, tuple(trailers))


def on_channel(err: pb.SessionError) -> Reaction:
    """What a per-session error means for its channel (`reactions.py`, CHANNEL column): leave it
    (FOLLOW_LEADER: its replica does not lead), place the acquire elsewhere (PLACE_ELSEWHERE:
    the channel is full), or nothing more than the session's own error."""
    status = err.status
    code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
    reason = reason_of_status(status)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and _CHANNEL_FULL_TEXT in status.message:
        reason = wire.Reason.CHANNEL_FULL
    reaction = rule(code, reason).channel
    return reaction if reaction in (Reaction.FOLLOW_LEADER, Reaction.PLACE_ELSEWHERE) else Reaction.FAIL


def _about_elsewhere(err: grpc.aio.AioRpcError, link: ClientLink) -> bool:
    """A permit's NOT_LEADER naming its budget's home pool, not this channel's route's pool: it
    says where that budget is counted (client/permit_routes.py re-routes the permit), nothing of
    this channel's replica, which is not left for it."""
    md = dict((k, v) for k, v in err.trailing_metadata() or ())
    return wire.BUDGET in md and md.get(wire.POOL) != getattr(link, "key", "")


class MuxCall:
    """One session's stream on the channel, shaped like a server-streaming Acquire call, or
    handing its events to a `sink` directly."""

    def __init__(self, request: pb.AcquireRequest) -> None:
        self.request = request  # sent again on another channel if this one is full
        self.session_id = request.session_id
        self.conn: _Conn | None = None
        self.ref = 0
        # What the reader fed and the session has not taken yet, and the future it sleeps on
        # while there is none (a deque and a future: an asyncio.Queue costs more per event).
        self.items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.done = False
        #: Set (by the session's attacher) to be handed each event and the end at once, from
        #: the channel's reader, instead of queueing them for an iterating task.
        self.sink: Sink | None = None

    def feed(self, item: Any) -> None:
        if self.done:
            return
        sink = self.sink
        if sink is not None:  # handed over at once: no queue, no wake-up (transport.Sink)
            try:  # a session's fault stays its own: never the channel reader's
                if item is _END or isinstance(item, BaseException):
                    self.done, self.sink = True, None
                    sink.closed(item if isinstance(item, BaseException) else None)
                else:
                    sink.event(item)
            except Exception as e:
                asyncio.get_running_loop().call_exception_handler(
                    {"message": f"slotsched: session {self.session_id} failed on an event", "exception": e}
                )
            return
        self.done = item is _END or isinstance(item, BaseException)
        self.items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> AsyncIterator[pb.LeaseEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[pb.LeaseEvent]:
        items = self.items
        while True:
            while not items:
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter
            self._waiter = None
            item = items.popleft()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def cancel(self) -> bool:
        """Stop listening (the server keeps the session, as after a cancelled Acquire)."""
        if self.conn is not None:
            self.conn.forget(self)
        self.feed(rpc_error(grpc.StatusCode.CANCELLED, "cancelled by the client"))
        return True


class Following:
    """A command answered more than once on its ref (`Command.follows`: a queued permit, then
    its grant): the first answer is `first`'s, every later one goes to `tell` (an answer
    message, or an AioRpcError), until `more(answer)` says it was the last. Once answered it is
    not waited on for the channel's silence watch: a permit may wait long, the server silent."""

    def __init__(self, tell: Callable[[Any], None], more: Callable[[Any], bool]) -> None:
        self.first: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.first.add_done_callback(_consume)
        self._tell = tell
        self._more = more
        self.over = False

    @property
    def answered(self) -> bool:
        return self.first.done()

    def feed(self, answer: Any) -> bool:
        """Hand one answer out; whether more are to come."""
        more = not isinstance(answer, BaseException) and self._more(answer)
        self.over = not more
        if not self.first.done():
            if isinstance(answer, BaseException):
                self.first.set_exception(answer)
            else:
                self.first.set_result(answer)
        else:
            self._tell(answer)
        return more

    def done(self) -> bool:
        return self.over

    def set_exception(self, err: BaseException) -> None:
        self.feed(err)


class _Conn:
    """One open Channel call: a writer that batches commands, a reader that dispatches events."""

    def __init__(self, mux: SessionMux) -> None:
        self.mux = mux
        client = mux.client
        self.call: ChannelCall = client.open_channel()
        self.call.resend = self._resend  # told what to send again if it re-opens at the leader
        self.sessions: dict[str, MuxCall] = {}
        self.waiting: dict[int, asyncio.Future[Any] | MuxCall | Following] = {}
        self.pending: list[pb.ChannelCommand] = []
        self.ready = asyncio.Event()
        self.broken: grpc.aio.AioRpcError | None = None
        self.full = False  # refused a session as full: none placed here until one of ours leaves
        self._clock = asyncio.get_running_loop().time
        # Since when something of ours waits for an answer with nothing heard (None: not waiting).
        self.quiet_since: float | None = None
        self.tasks = (
            asyncio.create_task(self._write(), name="slotsched-channel-write"),
            asyncio.create_task(self._read(), name="slotsched-channel-read"),
            asyncio.create_task(self._watch(), name="slotsched-channel-watch"),
        )

    def now(self) -> float:
        return self._clock()

    def send(self, command: pb.ChannelCommand) -> None:
        self.pending.append(command)
        self.ready.set()
        if self.quiet_since is None:
            self.quiet_since = self._clock()

    def _resend(self) -> list[pb.ChannelRequest]:
        """The channel was opened again at another replica before it answered anything (a standby
        refused it, or its replica was lost): what to write on the new stream. The acquires
        written and not answered go again (placing a session is the channel's job: the session
        never sees it); the commands written are failed UNAVAILABLE instead, and `calls.py`, the
        one layer that sends a command again, sends them (to the leader: on this channel). What
        is not written yet is written as usual."""
        unwritten = {c.ref for c in self.pending}
        err = rpc_error(
            grpc.StatusCode.UNAVAILABLE, "the channel moved to another replica before it answered"
        )
        acquires: list[pb.ChannelCommand] = []
        for ref, target in list(self.waiting.items()):
            if ref in unwritten:
                continue
            if isinstance(target, MuxCall):
                if commands.ACQUIRE.resend:  # (commands.py: a re-attach, nothing queued twice)
                    acquires.append(pb.ChannelCommand(ref=ref, acquire=target.request))
                else:
                    del self.waiting[ref]
                    target.feed(err)
                continue
            del self.waiting[ref]
            if not target.done():
                target.set_exception(err)
        return [
            pb.ChannelRequest(commands=acquires[i : i + wire.MAX_CHANNEL_COMMANDS])
            for i in range(0, len(acquires), wire.MAX_CHANNEL_COMMANDS)
        ]

    async def _watch(self) -> None:
        """Leave a replica that answers nothing for `SILENCE_S` while we wait on it (a frozen or
        hung process: keepalive catches the first only if its gRPC core stops too)."""
        while True:
            bound = channel.SILENCE_S
            since, now = self.quiet_since, self._clock()
            if since is not None and not self.waiting:
                since = self.quiet_since = None  # what we waited for was given up on
            if since is not None and now - since >= bound:
                why = f"no answer from the scheduler for {now - since:.1f}s"
                self._lost(rpc_error(grpc.StatusCode.UNAVAILABLE, why))
                return
            await asyncio.sleep(bound / 4 if since is None else max(0.05, since + bound - now))

    def _lost(self, err: grpc.aio.AioRpcError) -> None:
        """This channel's replica is lost or does not lead: the client's follower moves on from
        it, as after a failed read (`_FollowingBidi.abandon`), and the channel breaks."""
        self.call.abandon(err)
        self._break(err)

    def forget(self, call: MuxCall) -> None:
        if self.sessions.get(call.session_id) is call:
            del self.sessions[call.session_id]
            self.full = False
        if self.waiting.get(call.ref) is call:
            del self.waiting[call.ref]
        self.mux.idle(self)

    async def _write(self) -> None:
        try:
            while True:
                await self.ready.wait()
                self.ready.clear()
                batch, self.pending = self.pending, []
                write = self.call.write
                if len(batch) <= wire.MAX_CHANNEL_COMMANDS:
                    await write(pb.ChannelRequest(commands=batch))
                    continue
                for i in range(0, len(batch), wire.MAX_CHANNEL_COMMANDS):  # more would end the channel
                    await write(pb.ChannelRequest(commands=batch[i : i + wire.MAX_CHANNEL_COMMANDS]))
        except grpc.aio.AioRpcError as e:
            self._break(e)
        except (grpc.aio.UsageError, RuntimeError) as e:  # the call ended under the write
            self._break(rpc_error(grpc.StatusCode.UNAVAILABLE, f"channel write failed: {e}"))

    async def _read(self) -> None:
        try:
            resp = await self.call.read()
            if resp is not grpc.aio.EOF:
                # The server answers on a new channel (once per channel): after an outage, the
                # sessions asleep in re-attach backoff try again now, on this channel.
                self.mux.client.wake.heard()
            while resp is not grpc.aio.EOF:
                if not self._dispatch(resp):
                    return  # left: this replica does not lead
                resp = await self.call.read()
        except grpc.aio.AioRpcError as e:
            self._break(e)
            return
        self._break(rpc_error(grpc.StatusCode.UNAVAILABLE, "the scheduler closed the channel"))

    def _dispatch(self, resp: pb.ChannelResponse) -> bool:
        """Hand out the events and answers of one message; False once this channel was left."""
        finishing: list[MuxCall] = []
        refused_here: grpc.aio.AioRpcError | None = None
        for ev in resp.events:
            kind = ev.WhichOneof("kind")
            if kind == "event":
                call = self.sessions.get(ev.session_id)
                if call is None:
                    continue  # a session this client stopped listening to
                if call.ref and self.waiting.get(call.ref) is call:
                    del self.waiting[call.ref]  # attached: an error now ends the stream (ref 0)
                lease_event = ev.event
                call.feed(lease_event)
                if lease_event.WhichOneof("event") == "ended" and lease_event.ended.session_over:
                    self.sessions.pop(ev.session_id, None)  # (the session may have left on its event)
                    self.full = False
                    finishing.append(call)
            elif kind == "error":
                err = from_session_error(ev.error)
                reaction = on_channel(ev.error)
                if reaction is Reaction.FOLLOW_LEADER and not _about_elsewhere(err, self.mux.client):
                    refused_here = err
                target = self.waiting.pop(ev.ref, None) if ev.ref else None
                answer = target is not None  # to the command with this ref (an acquire's: refused)
                # With a ref nobody waits on, the answer to a command whose caller gave up (timed
                # out): dropped. With none, the session's stream ends with it.
                if target is None and not ev.ref:
                    target = self.sessions.pop(ev.session_id, None)
                    if target is not None:
                        self.full = False  # one of ours left: room again
                    else:  # after the last event: its stream's closing status
                        target = next((c for c in finishing if c.session_id == ev.session_id), None)
                if isinstance(target, MuxCall):
                    self.forget(target)
                    if answer and reaction is Reaction.PLACE_ELSEWHERE and self.sessions:
                        # Not the session's fault: place it on another channel. (A channel that
                        # refuses with none of ours on it would refuse anywhere: told.)
                        self.full = True
                        self.mux.place(target)
                        continue
                    target.feed(err)
                elif target is not None and not target.done():
                    target.set_exception(err)
            else:
                fut = self.waiting.pop(ev.ref, None)
                if isinstance(fut, asyncio.Future) and not fut.done():
                    fut.set_result(getattr(ev, kind))
                elif isinstance(fut, Following) and fut.feed(getattr(ev, kind)):
                    self.waiting[ev.ref] = fut  # its next answer comes on the same ref
        for call in finishing:
            call.feed(_END)  # no error followed its last event in the same message: OK
        # Heard: the clock starts again, if anything still waits for a first answer.
        waits = any(not isinstance(t, Following) or not t.answered for t in self.waiting.values())
        self.quiet_since = self._clock() if waits else None
        if refused_here is not None:
            # Every command here would be refused the same: the sessions re-attach, and their
            # commands go again, on a channel to the leader the refusal names.
            self._lost(refused_here)
            return False
        self.mux.idle(self)
        return True

    def _break(self, err: grpc.aio.AioRpcError) -> None:
        if self.broken is not None:
            return
        reaction = rule(err.code()).channel
        if reaction is Reaction.REATTACH and err.code() is not grpc.StatusCode.UNAVAILABLE:
            # A broken channel is never a verdict on one session: grpc reports a call that died
            # under a write (the server killed) as INTERNAL or UNKNOWN, and the server ends a
            # channel whose reader fell behind RESOURCE_EXHAUSTED. Said as UNAVAILABLE, every
            # session on it re-attaches (the server keeps them) and its Renew/Release/Yield are
            # sent again (to the leader).
            why = f"the channel broke: {err.code().name}: {err.details()}"
            err = rpc_error(grpc.StatusCode.UNAVAILABLE, why)
        self.broken = err
        if reaction is Reaction.FALL_BACK:
            self.mux.unsupported = True
            err = rpc_error(
                grpc.StatusCode.UNAVAILABLE, "no Channel on this server: per-session rpcs from now on"
            )
        self.mux.drop(self)
        for call in list(self.sessions.values()):
            call.feed(err)
        for target in self.waiting.values():
            if isinstance(target, MuxCall):
                target.feed(err)
            elif not target.done():
                target.set_exception(err)
        self.sessions.clear()
        self.waiting.clear()
        self.stop()

    def stop(self) -> None:
        self.call.cancel()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()

    async def close(self) -> None:
        self.stop()
        for task in self.tasks:
            with contextlib.suppress(BaseException):
                await task


class SessionMux:
    """The client's channels: the first opened on first use, another when all are full (module
    doc), each re-opened (as a new one) after it breaks."""

    def __init__(self, client: ClientLink) -> None:
        self.client = client
        self.conns: list[_Conn] = []  # open, the first one first
        self.unsupported = False
        self._ref = 0
        self._closing: set[asyncio.Task[None]] = set()

    def _room(self) -> _Conn:
        """The first channel with room for a new session (a new one if every one is full)."""
        for conn in self.conns:
            if not conn.full:
                return conn
        conn = _Conn(self)
        self.conns.append(conn)
        return conn

    def _of(self, session_id: str) -> _Conn:
        """The channel a session is on; for one on none, the first channel."""
        for conn in self.conns:
            if session_id in conn.sessions:
                return conn
        return self.conns[0] if self.conns else self._room()

    def drop(self, conn: _Conn) -> None:
        """A broken channel: no call goes on it any more."""
        if conn in self.conns:
            self.conns.remove(conn)

    def idle(self, conn: _Conn) -> None:
        """Close a channel other than the first once nothing of ours is left on it."""
        if conn.sessions or conn.waiting:
            return  # the common case, on every message: in use
        if conn.broken is not None or conn not in self.conns[1:]:
            return
        self.conns.remove(conn)
        conn.broken = rpc_error(grpc.StatusCode.CANCELLED, "closed: no session left on it")
        task = asyncio.get_running_loop().create_task(conn.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def next_ref(self) -> int:
        self._ref += 1
        return self._ref

    def acquire(self, request: pb.AcquireRequest) -> MuxCall:
        call = MuxCall(request)
        sid = request.session_id
        conn = next((c for c in self.conns if sid in c.sessions), None) or self._room()
        old = conn.sessions.get(sid)
        self._send(conn, call)  # in `old`'s place: the channel is never left empty (idle) meanwhile
        if old is not None:  # re-attached on the same channel: the server replays, no error
            conn.forget(old)
            old.feed(rpc_error(grpc.StatusCode.ABORTED, "re-attached on the same channel"))
        return call

    def place(self, call: MuxCall) -> None:
        """An acquire its channel refused as full: sent on one with room."""
        self._send(self._room(), call)

    def _send(self, conn: _Conn, call: MuxCall) -> None:
        call.conn, call.ref = conn, self.next_ref()
        conn.sessions[call.session_id] = call
        conn.waiting[call.ref] = call
        conn.send(pb.ChannelCommand(ref=call.ref, acquire=call.request))

    async def command(self, timeout: float | None, **kind: Any) -> Any:
        """Send one command (e.g. `renew=request`) on its session's channel; its answer
        (`renewed`, `released`, `yielded`) or AioRpcError."""
        (request,) = kind.values()
        conn = self._of(request.session_id)
        ref = self.next_ref()
        # No done-callback (a loop handle per answer): the caller awaits `fut` at once, so reads
        # its failure, and a caller cancelled cancels `fut`, which nothing then fails.
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        conn.waiting[ref] = fut
        conn.send(pb.ChannelCommand(ref=ref, **kind))
        # The bare future and a deadline (ticks.py) that fails it: no shield, no wait_for, no
        # timeout scope (the cheapest wait asyncio has; every Renew and Release waits here). Its
        # answer, if it comes after, is dropped (`_dispatch` skips a done future).
        timer = None if timeout is None else ticks().call_at(conn.now() + timeout, _expire, fut)
        try:
            return await fut
        except _Expired:
            conn.waiting.pop(ref, None)
            conn.mux.idle(conn)
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        finally:
            if timer is not None:
                timer.cancel()

    async def command_following(
        self, timeout: float | None, tell: Callable[[Any], None], more: Callable[[Any], bool], **kind: Any
    ) -> Any:
        """Send one command answered more than once (`Following`); its first answer."""
        (request,) = kind.values()
        conn = self._of(request.session_id)
        ref = self.next_ref()
        following = Following(tell, more)
        conn.waiting[ref] = following
        conn.send(pb.ChannelCommand(ref=ref, **kind))
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(following.first)
        except TimeoutError:
            conn.waiting.pop(ref, None)
            conn.mux.idle(conn)
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None

    # ------------------------------------------------ SessionTransport (transport.py)

    def attach(self, request: pb.AcquireRequest, metadata: Any = None) -> MuxCall:
        """A session's place on a channel (the channel's credential is the client's)."""
        return self.acquire(request)

    async def send(self, command: Command, request: Message, metadata: Any, timeout: float) -> Any:
        """A unary command, as its row's Channel field (`commands.py`)."""
        if command.field is None or command.streaming:
            raise ValueError(f"{command.name} is not a unary command sent on a Channel")
        return await self.command(timeout, **{command.field: request})

    async def send_following(
        self, command: Command, request: Message, metadata: Any, tell: Callable[[Any], None],
        more: Callable[[Any], bool], timeout: float,
    ) -> Any:  # fmt: skip
        """A following command (`Command.follows`), as its row's Channel field."""
        assert command.field is not None and command.follows
        return await self.command_following(timeout, tell, more, **{command.field: request})

    async def close(self) -> None:
        conns, self.conns = self.conns, []
        for conn in conns:
            await conn.close()
        for task in list(self._closing):
            with contextlib.suppress(BaseException):
                await task


class _Expired(Exception):
    """A command's deadline passed before its answer (raised into its future by `_expire`)."""


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
