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
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.client.channel import ClientLink, NoAnswer
from scheduler.client.errors import ResourceExhausted, SlotschedError, Unavailable
from scheduler.client.events import EventApplier
from scheduler.client.phases import Phase
from scheduler.client.reactions import Call, Reaction, from_rpc_error, react
from scheduler.client.state import SessionState, log
from scheduler.client.transport import LeaseCall


class StreamAttacher:
    """The stream task of one session: attach, apply events, re-attach (module doc)."""

    def __init__(self, state: SessionState, client: ClientLink, events: EventApplier) -> None:
        self._state = state
        self._client = client
        self._events = events
        self._first: LeaseCall | None = None  # attached by `begin`, before the task first runs

    def begin(self) -> None:
        """Send the first Acquire now, from the caller (`start()`), rather than when the stream
        task first runs: on a channel it goes out in the writer's next batch, a loop turn
        sooner. Whatever fails here is met by `run`, which attaches again."""
        try:
            self._first = self._client.transport().attach(self._request(), self._client.metadata)
        except Exception:  # (e.g. a closed client): `run` attaches and meets the error
            self._first = None
        else:
            self._state.attached = True

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

    async def run(self) -> None:
        state, client = self._state, self._client
        loop = asyncio.get_running_loop()
        backoff = client.reattach.backoff()
        outage_since: float | None = None
        # The next event shows the server answers: told to the client's sessions asleep in
        # backoff (`wake.py`). Set for a new session's first event and after each sleep, so it
        # is told once per attach, never per event.
        announce = True
        wakeable = True  # one early wake per run of failures: until an event, sleep in full
        started = loop.time()

        def heard() -> None:
            nonlocal announce, outage_since, wakeable
            announce, outage_since, wakeable = False, None, True
            backoff.reset()
            client.wake.heard()

        while not state.closing:
            failure: SlotschedError
            try:
                call, self._first = self._first, None
                if call is None:
                    call = client.transport().attach(self._request(), client.metadata)
                state.attached = True
                events = call.__aiter__()
                if not state.reached:
                    # A black-holed address must not hang the first attach: the server answers an
                    # Acquire at once (Queued or Granted), so wait for that within the deadline.
                    left = max(0.05, client.connect_timeout_s - (loop.time() - started))
                    try:
                        async with asyncio.timeout(left):  # (no task made, as wait_for would)
                            first = await anext(events, None)
                    except TimeoutError:
                        call.cancel()
                        raise NoAnswer(f"no answer within {left:.1f}s") from None
                    if first is not None:
                        state.reached = True
                        heard()
                        self._events.apply(first)
                async for ev in events:
                    if announce:
                        # The server answers (after an outage, or for the first time): the
                        # client's sessions asleep in backoff try again now, not at their wake-up.
                        heard()
                    state.reached = True
                    self._events.apply(ev)
                if state.phase is Phase.ENDED:
                    state.ended.set()  # after the status: waiters see the final error
                    return
                failure = Unavailable("Acquire stream closed before the session ended", None)
            except NoAnswer as e:
                failure = Unavailable(str(e), grpc.StatusCode.UNAVAILABLE)
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e)
                err.__cause__ = e
                if state.phase is Phase.ENDED:
                    # Closing status after the final event: DEADLINE_EXCEEDED names the withdrawal.
                    if e.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                        state.error = err
                    state.ended.set()
                    return
                if state.closing:
                    return
                reaction = react(Call.ATTACH, e)
                told = err.retry_after_s if isinstance(err, ResourceExhausted) else None
                if reaction is Reaction.WAIT_REATTACH and state.reached and told is not None:
                    backoff.at_least(client.reattach.told(told))
                    wakeable = False  # the server said when: another session's answer does not change it
                elif reaction is not Reaction.REATTACH:
                    state.fail(err)
                    return
                failure = err
            finally:
                state.attached = False
                state.notify()
            if state.release_requested or state.closing:
                return
            now = loop.time()
            if not state.reached:
                # Tried until the deadline itself: the last sleep is cut to end there and one more
                # attempt follows, so a server coming up late in the window is still reached.
                waited = now - started
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
                    return
                pause = min(backoff.current, left)
                log.warning(
                    "slotsched: cannot reach the scheduler at %s for session %s (%s); retrying in %.2fs",
                    client.target,
                    state.session_id,
                    failure.message,
                    pause,
                )
                announce = True
                wakeable = await self._sleep(pause, wakeable)
                backoff.grow()
                continue
            if outage_since is None:
                outage_since = now
            if now - outage_since + backoff.current > client.reattach_timeout_s:
                gave_up = Unavailable(
                    f"gave up re-attaching session {state.session_id!r} after "
                    f"{now - outage_since:.1f}s: {failure.message}",
                    grpc.StatusCode.UNAVAILABLE,
                )
                gave_up.__cause__ = failure
                state.fail(gave_up)
                return
            log.info(
                "slotsched: stream of %s broke (%s); re-attaching in %.2fs",
                state.session_id,
                failure,
                backoff.current,
            )
            announce = True
            wakeable = await self._sleep(backoff.current, wakeable)
            backoff.grow()
            state.reattaches += 1

    async def _sleep(self, delay: float, wakeable: bool) -> bool:
        """Sleep before the next attach, cut short by the client hearing from the server again
        (wake.py) if `wakeable`; whether the next sleep may be cut short too (not after a wake:
        only an event makes it so again)."""
        if not wakeable:
            await asyncio.sleep(delay)
            return False
        return not await self._client.wake.sleep(delay, self._client.reattach.initial_s)
