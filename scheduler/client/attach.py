"""A session's attachment to the server: its Acquire stream (or its place on the client's
channel), consumed into the session's state by `events.py`, and attached again when it breaks.

How a broken stream is met is `reactions.py`'s ATTACH column: REATTACH with the client's
`reattach` backoff for `reattach_timeout_s` (the server keeps the session meanwhile, and replays
its state); WAIT_REATTACH, for a session the server knew that was refused with a retry-after (every
session of a client re-attaches at once after a restart, past the tenant's burst), after that
long, jittered; anything else ends the session with its typed error. A session that never reached
the server retries the same way, with a WARNING each time, but only for `connect_timeout_s`; then
it fails with `Unavailable` saying where it tried. The backoff sleeps are the client's `Wake`'s:
the first event of an attach (a new session's, or one after a sleep) ends the sleeps of the
client's other sessions.

On a channel (`mux.MuxCall`) the first attach needs no task: the channel's reader hands each
event to `event` and the stream's end to `closed` (a `Sink`), and the first-answer deadline is an
entry in the loop's deadlines (`ticks.py`). A stream task (`run`) is made only when that attach
fails, to sleep and attach again; it consumes every later stream as an async iterator, as it does
the per-session Acquire streams. Why: a task, its wake-ups and a future per event were a fifth of
what an acquire+release pair cost the SDK (decision 0020).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import grpc
import grpc.aio

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.client.channel import ClientLink, NoAnswer
from scheduler.client.errors import ResourceExhausted, SlotschedError, Unavailable
from scheduler.client.events import EventApplier
from scheduler.client.phases import Phase
from scheduler.client.reactions import Call, Reaction, from_rpc_error, react
from scheduler.client.state import SessionState, log
from scheduler.client.ticks import Tick, ticks
from scheduler.client.transport import LeaseCall


class StreamAttacher:
    """The attachment of one session: attach, apply events, re-attach (module doc)."""

    def __init__(self, state: SessionState, client: ClientLink, events: EventApplier) -> None:
        self._state = state
        self._client = client
        self._events = events
        self._first: LeaseCall | None = None  # attached by `begin`, before the task first runs
        #: The stream task, once one is needed (None while the first attach is fed directly).
        self.task: asyncio.Task[None] | None = None
        self._direct: LeaseCall | None = None  # the call feeding `event`/`closed`, if any
        self._deadline: Tick | None = None  # its first answer's, while the server was not reached
        self._no_answer: str | None = None  # why the deadline cancelled it
        self._backoff = client.reattach.backoff()
        self._outage_since: float | None = None
        # The next event shows the server answers: told to the client's sessions asleep in
        # backoff (`wake.py`). Set for a new session's first event and after each sleep, so it
        # is told once per attach, never per event.
        self._announce = True
        self._wakeable = True  # one early wake per run of failures: until an event, sleep in full
        self._started = 0.0

    def begin(self) -> None:
        """Send the first Acquire now, from the caller (`start()`): on a channel it goes out in
        the writer's next batch, and its events are fed to this attacher directly (module doc).
        Otherwise, or if it fails, the stream task (`run`) attaches and meets the error."""
        loop = asyncio.get_running_loop()
        self._started = loop.time()
        try:
            call = self._client.transport().attach(self._request(), self._client.metadata)
        except Exception:  # (e.g. a closed client): `run` attaches and meets the error
            self._spawn(None)
            return
        self._state.attached = True
        if not hasattr(call, "sink"):  # a per-session Acquire stream: read by the task
            self._first = call
            self._spawn(None)
            return
        self._direct = call
        cast(Any, call).sink = self
        if not self._state.reached:
            left = max(0.05, self._client.connect_timeout_s)
            self._deadline = ticks().call_at(loop.time() + left, self._unanswered, call, left)

    def _spawn(self, failure: SlotschedError | None) -> None:
        name = f"slotsched-stream-{self._state.session_id}"
        self.task = asyncio.get_running_loop().create_task(self.run(failure), name=name)

    def stop(self) -> None:
        """Stop listening (the session's shutdown): a directly fed call is cancelled, as the
        stream task's is with it."""
        call, self._direct = self._direct, None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if call is not None:
            cast(Any, call).sink = None
            call.cancel()

    # ------------------------------------------------------------- Sink (mux.MuxCall feeds these)

    def event(self, ev: scheduler_pb2.LeaseEvent) -> None:
        """One event of the directly fed call."""
        state = self._state
        if not state.reached:
            state.reached = True
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
        if self._announce:
            self._heard()
        self._events.apply(ev)

    def closed(self, err: BaseException | None) -> None:
        """The directly fed call ended: OK (None) after the session's end, or with `err`."""
        self._direct = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        state = self._state
        failure: SlotschedError | None
        try:
            if self._no_answer is not None:
                failure = Unavailable(self._no_answer, grpc.StatusCode.UNAVAILABLE)
            elif err is None:
                failure = self._ended_ok()
            elif isinstance(err, grpc.aio.AioRpcError):
                failure = self._failed(err)
            else:
                raise err
        finally:
            state.attached = False
            state.notify()
        if failure is not None and not (state.release_requested or state.closing):
            self._spawn(failure)

    def _unanswered(self, call: LeaseCall, left: float) -> None:
        """The first answer's deadline passed (a black-holed address must not hang the attach)."""
        self._deadline = None
        if self._direct is call and not self._state.reached:
            self._no_answer = f"no answer within {left:.1f}s"
            call.cancel()

    # ----------------------------------------------------------------------------- the task

    def _request(self) -> scheduler_pb2.AcquireRequest:
        state, spec = self._state, self._state.spec
        req = scheduler_pb2.AcquireRequest(
            session_id=spec.session_id, qos=spec.qos.to_proto(), pool=spec.pool
        )
        if spec.selector:
            req.selector.update(spec.selector)
        if spec.fallback:
            req.fallback_pools.extend(spec.fallback)
        # On a re-attach the server ignores these; if it lost the session they start it afresh
        # from the latest snapshot we know of.
        if state.resume_from is not None:
            req.resume_from.CopyFrom(state.resume_from.to_proto())
        if spec.wait_timeout_s is not None:
            req.wait_timeout.FromNanoseconds(round(spec.wait_timeout_s * 1e9))
        return req

    def _heard(self) -> None:
        self._announce, self._outage_since, self._wakeable = False, None, True
        self._backoff.reset()
        self._client.wake.heard()

    def _ended_ok(self) -> SlotschedError | None:
        """A stream closed OK: the session's end (None), or a failure to re-attach after."""
        state = self._state
        if state.phase is Phase.ENDED:
            state.ended.set()  # after the status: waiters see the final error
            return None
        return Unavailable("Acquire stream closed before the session ended", None)

    def _failed(self, e: grpc.aio.AioRpcError) -> SlotschedError | None:
        """A stream failed: the failure to re-attach after, or None (the session is over)."""
        state = self._state
        err = from_rpc_error(e)
        err.__cause__ = e
        if state.phase is Phase.ENDED:
            # Closing status after the final event: DEADLINE_EXCEEDED names the withdrawal.
            if e.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                state.error = err
            state.ended.set()
            return None
        if state.closing:
            return None
        reaction = react(Call.ATTACH, e)
        told = err.retry_after_s if isinstance(err, ResourceExhausted) else None
        if reaction is Reaction.WAIT_REATTACH and state.reached and told is not None:
            self._backoff.at_least(self._client.reattach.told(told))
            self._wakeable = False  # the server said when: another session's answer does not change it
        elif reaction is not Reaction.REATTACH:
            state.fail(err)
            return None
        return err

    async def run(self, failure: SlotschedError | None = None) -> None:
        """Attach (after `failure`'s backoff, if given) and consume the stream, again and again."""
        state = self._state
        loop = asyncio.get_running_loop()
        if not self._started:
            self._started = loop.time()
        while not state.closing:
            if failure is None:
                failure = await self._attach_once()
                if failure is None:
                    return
            if state.release_requested or state.closing:
                return
            if not await self._pause(failure, loop.time()):
                return
            failure = None

    async def _attach_once(self) -> SlotschedError | None:
        """One attach, consumed to its end: None once the session is over, else the failure."""
        state, client = self._state, self._client
        loop = asyncio.get_running_loop()
        try:
            call, self._first = self._first, None
            if call is None:
                call = client.transport().attach(self._request(), client.metadata)
            state.attached = True
            events = call.__aiter__()
            if not state.reached:
                # A black-holed address must not hang the first attach: the server answers an
                # Acquire at once (Queued or Granted), so wait for that within the deadline.
                left = max(0.05, client.connect_timeout_s - (loop.time() - self._started))
                try:
                    async with asyncio.timeout(left):  # (no task made, as wait_for would)
                        first = await anext(events, None)
                except TimeoutError:
                    call.cancel()
                    raise NoAnswer(f"no answer within {left:.1f}s") from None
                if first is not None:
                    state.reached = True
                    self._heard()
                    self._events.apply(first)
            async for ev in events:
                if self._announce:
                    # The server answers (after an outage, or for the first time): the
                    # client's sessions asleep in backoff try again now, not at their wake-up.
                    self._heard()
                state.reached = True
                self._events.apply(ev)
            return self._ended_ok()
        except NoAnswer as e:
            return Unavailable(str(e), grpc.StatusCode.UNAVAILABLE)
        except grpc.aio.AioRpcError as e:
            return self._failed(e)
        finally:
            state.attached = False
            state.notify()

    async def _pause(self, failure: SlotschedError, now: float) -> bool:
        """The backoff before the next attach; False when the session failed instead (gave up)."""
        state, client, backoff = self._state, self._client, self._backoff
        if not state.reached:
            # Tried until the deadline itself: the last sleep is cut to end there and one more
            # attempt follows, so a server coming up late in the window is still reached.
            waited = now - self._started
            left = client.connect_timeout_s - waited
            if left <= 0:
                err = Unavailable(
                    f"could not connect to the slotsched scheduler at {client.target} for session "
                    f"{state.session_id!r}: tried for {waited:.1f}s (connect_timeout_s="
                    f"{client.connect_timeout_s:g}): {failure.message}",
                    grpc.StatusCode.UNAVAILABLE,
                )
                err.__cause__ = failure
                state.fail(err)
                return False
            pause = min(backoff.current, left)
            log.warning(
                "slotsched: cannot reach the scheduler at %s for session %s (%s); retrying in %.2fs",
                client.target,
                state.session_id,
                failure.message,
                pause,
            )
            self._announce = True
            self._wakeable = await self._sleep(pause, self._wakeable)
            backoff.grow()
            return True
        if self._outage_since is None:
            self._outage_since = now
        if now - self._outage_since + backoff.current > client.reattach_timeout_s:
            gave_up = Unavailable(
                f"gave up re-attaching session {state.session_id!r} after "
                f"{now - self._outage_since:.1f}s: {failure.message}",
                grpc.StatusCode.UNAVAILABLE,
            )
            gave_up.__cause__ = failure
            state.fail(gave_up)
            return False
        log.info(
            "slotsched: stream of %s broke (%s); re-attaching in %.2fs",
            state.session_id,
            failure,
            backoff.current,
        )
        self._announce = True
        self._wakeable = await self._sleep(backoff.current, self._wakeable)
        backoff.grow()
        state.reattaches += 1
        return True

    async def _sleep(self, delay: float, wakeable: bool) -> bool:
        """Sleep before the next attach, cut short by the client hearing from the server again
        (wake.py) if `wakeable`; whether the next sleep may be cut short too (not after a wake:
        only an event makes it so again)."""
        if not wakeable:
            await asyncio.sleep(delay)
            return False
        return not await self._client.wake.sleep(delay, self._client.reattach.initial_s)
