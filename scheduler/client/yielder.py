"""The yield path of one session: checkpoint via `on_yield`, then `Yield` (sent through
`calls.py`); called off by YieldCancelled. The rules (what a failed `on_yield` means, when a
called-off yield still goes on) are told in `scheduler.client.session`.

A Yield is idempotent from the runtime's view: a retry whose first attempt was applied (the leader
applied it and died before answering, or a channel broke under the answer) is refused
FAILED_PRECONDITION, a stale epoch, since the lease already ended YIELDED (and the session may
have been re-granted). The yield is then read back (`_applied`, the RECHECK of `reactions.py`)
and, where it can be told from a revocation, counted as done rather than recorded in
`callback_errors`, as `release.py` does for a Release retried after it applied.

A checkpoint that completes after the lease was revoked at its yield deadline is still sent, as a
late Yield quoting the revoked lease: while the session waits for a slot again the scheduler
keeps its snapshot as the one the session resumes from (docs/design.md, "Checkpoint-and-yield
preemption", step 4). The deadline protects the waiter's latency, not the snapshot's validity.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import replace
from typing import Any

import grpc
import grpc.aio

from scheduler.api import commands
from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.client.callbacks import CallbackQueue, invoke
from scheduler.client.calls import Abandoned, SessionCalls, Verdict
from scheduler.client.channel import ClientLink
from scheduler.client.phases import Phase, SessionEvent
from scheduler.client.reactions import from_rpc_error
from scheduler.client.state import SessionState, log
from scheduler.client.types import ClientSnapshotRef, LeaseInfo, SessionInfo, lease_key

Key = tuple[str, int]


class Yielder:
    """Yields of one session: which lease's yield is under way, sent, or done."""

    def __init__(
        self, state: SessionState, client: ClientLink, calls: SessionCalls, queue: CallbackQueue
    ) -> None:
        self._state = state
        self._client = client
        self._calls = calls
        self._queue = queue
        self.started: Key | None = None  # the lease whose yield is under way
        self.sent: Key | None = None  # the lease whose Yield we sent
        self._ref: tuple[Key, ClientSnapshotRef] | None = None  # the snapshot that Yield carried
        self._yielded: Key | None = None  # the last lease counted as yielded
        self._revoked: Key | None = None  # the last lease revoked at its yield deadline
        self._answered: Key | None = None  # the last lease whose Yield was answered OK
        self._gen = 0  # bumped by every yield started or cancelled: stale ones stop
        self._background: set[asyncio.Task[Any]] = set()

    def count(self, key: Key) -> None:
        """`key` was yielded (counted once, however many times it is reported)."""
        if self._yielded != key:
            self._yielded = key
            self._state.yields += 1

    def snapshot_of(self, key: Key) -> ClientSnapshotRef | None:
        """The snapshot our Yield of `key` carried, if we sent one."""
        return self._ref[1] if self._ref is not None and self._ref[0] == key else None

    def kept_snapshot(self, key: Key) -> ClientSnapshotRef | None:
        """The snapshot of our Yield of `key` that the scheduler accepted, if any: after a
        revocation it is still the one the session resumes from (a late snapshot)."""
        return self.snapshot_of(key) if self._answered == key else None

    def revoked(self, key: Key) -> None:
        """`key` was revoked: a checkpoint of it still under way is sent late when it completes."""
        self._revoked = key

    def start(self, lease: LeaseInfo) -> None:
        if self.started == lease.key or self._state.release_requested:
            return
        self.started = lease.key
        self._gen += 1
        gen = self._gen
        self._queue.put(lambda: self._run(lease, gen))

    async def _run(self, lease: LeaseInfo, gen: int) -> None:
        state = self._state

        def wanted() -> bool:
            # Gone, releasing, or called off before (or between) the tries: the lease stays as is.
            return (
                state.is_current(lease.lease_id, lease.epoch)
                and not state.release_requested
                and gen == self._gen
            )

        if not wanted():
            return
        ref: ClientSnapshotRef | None
        if state.spec.on_yield is None:
            ref = state.resume_from
        else:
            try:
                result = await invoke(state.spec.on_yield, lease)
            except Exception as e:  # do not yield without a snapshot we believe in
                log.warning("slotsched: on_yield for %s failed, not yielding: %r", state.session_id, e)
                state.callback_errors.append(e)
                state.notify()
                return
            if result is not None and not isinstance(result, ClientSnapshotRef):
                bad = TypeError(f"on_yield must return a SnapshotRef or None, not {type(result).__name__}")
                state.callback_errors.append(bad)
                state.notify()
                return
            ref = result
        if gen != self._gen:
            # Called off while on_yield ran: keep the lease; the checkpoint stays unused.
            log.info("slotsched: %s checkpointed for a yield since called off; holding on", state.session_id)
            return

        def late() -> bool:
            # Revoked at its deadline while on_yield ran, and the session waits for a slot again:
            # the snapshot is still the one it should resume from, so the Yield goes out late.
            return (
                ref is not None
                and self._revoked == lease.key
                and state.lease is None
                and not state.release_requested
                and not state.ended.is_set()
                and gen == self._gen
            )

        if not wanted() and not late():
            return
        req = scheduler_pb2.YieldRequest(
            session_id=state.session_id, lease_id=lease.lease_id, epoch=lease.epoch
        )
        if ref is not None:
            req.snapshot.CopyFrom(ref.to_proto())
            self._ref = (lease.key, ref)
        self.sent = lease.key

        async def recheck(err: grpc.aio.AioRpcError, more: bool) -> Verdict:
            if await self._applied(lease, ref):
                log.info("slotsched: yield of %s was applied before its answer was lost", state.session_id)
                return Verdict.DONE
            return Verdict.FAIL

        try:
            await self._calls.send(
                commands.YIELD,
                lambda: req,
                timeout=self._client.rpc_timeout_s,
                wanted=lambda: wanted() or late(),
                recheck=recheck,
            )
        except Abandoned:
            return
        except grpc.aio.AioRpcError as e:
            if self._revoked == lease.key:  # granted again first: it resumed from the older one
                log.warning(
                    "slotsched: the late snapshot of %s (lease %s) was refused: %s",
                    state.session_id, lease.lease_id, e.details(),
                )  # fmt: skip
                return
            err = from_rpc_error(e)
            err.__cause__ = e
            state.callback_errors.append(err)
            state.notify()
            return
        self._answered = lease.key
        if ref is not None and (state.lease is None or state.is_current(lease.lease_id, lease.epoch)):
            state.resume_from = ref  # (a re-grant that raced ahead already carries it)
        if self._revoked == lease.key:
            log.info(
                "slotsched: %s was revoked at its yield deadline; its late snapshot is kept", state.session_id
            )
            state.notify()
            return
        self.count(lease.key)
        if state.is_current(lease.lease_id, lease.epoch):
            state.drop_lease(involuntary=False)
            state.move(SessionEvent.YIELDED)
        state.notify()

    async def _applied(self, lease: LeaseInfo, ref: ClientSnapshotRef | None) -> bool:
        """Our Yield of `lease` was refused as stale: was it applied already (by an attempt whose
        answer was lost)? Yes if the stream saw the lease end YIELDED; else if the session, read
        with GetSession, is live, no longer holds the lease and moved on (queued again, or on a
        newer lease) from the snapshot this Yield carried (uri, size, sha256 and time alike). A
        revocation keeps the previous snapshot, so with a fresh checkpoint it is told apart; a
        Yield without one (no `on_yield`, or it returned None) cannot be, and is reported as
        before, as is one that did not hold the lease or a server that cannot be asked."""
        if self._yielded == lease.key:
            return True
        try:
            msg = await self._client.stub().GetSession(
                scheduler_pb2.GetSessionRequest(session_id=self._state.session_id),
                metadata=self._client.metadata,
                timeout=self._client.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError:
            return False
        info = SessionInfo.from_proto(msg)
        if info.phase is Phase.ENDED:
            return False
        now = info.lease
        if now is not None and now.key == lease.key:
            return False  # still ours: refused for another reason
        if ref is None:
            return False  # a revocation looks the same from here: report it, as before
        resumes = info.last_snapshot or (now.resume_from if now is not None else None)
        return resumes == ref  # the whole ref: a runtime may reuse one checkpoint path

    def called_off(self, lease_id: str, epoch: int) -> None:
        """YieldCancelled for our lease: keep holding it (see `scheduler.client.session`)."""
        state = self._state
        key = lease_key(lease_id, epoch)
        if not state.is_current(lease_id, epoch) or self.started != key:
            return  # not yielding it (any more): nothing to call off
        held = replace(state.require_lease(), yield_deadline=None)
        keep = True
        on_cancelled = state.spec.on_yield_cancelled
        if on_cancelled is not None:
            try:
                result = on_cancelled(held)
                if inspect.isawaitable(result):  # a coroutine function: run it, keep the lease
                    task = asyncio.ensure_future(result)
                    self._background.add(task)
                    task.add_done_callback(self._background_done)
                else:
                    keep = result is not False
            except Exception as e:
                log.warning("slotsched: on_yield_cancelled for %s failed: %r", state.session_id, e)
                state.callback_errors.append(e)
        if not keep:
            log.info("slotsched: yield of %s called off too late (actor stopped); yielding", state.session_id)
            return
        self.started = None
        self._gen += 1  # a checkpoint in progress finishes, and no Yield follows it
        state.yields_cancelled += 1
        state.lease = held
        state.move(SessionEvent.YIELD_CALLED_OFF)
        log.info("slotsched: yield of %s (lease %s) called off; holding on", state.session_id, lease_id)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._state.callback_errors.append(task.exception())  # type: ignore[arg-type]
            self._state.notify()
