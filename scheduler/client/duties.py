"""A held lease's timed duties: renew at TTL/3, and the yield path (checkpoint via `on_yield`,
then `Yield`; called off by YieldCancelled), with the runtime's callbacks run in order by one
action task so the stream is never blocked by them.

The rules (what a failed `on_yield` means, when a called-off yield still goes on) are told in
`scheduler.client.session`.

A Yield is idempotent from the runtime's view: a retry whose first attempt was applied (the leader
applied it and died before answering, or a channel broke under the answer) is refused
FAILED_PRECONDITION, a stale epoch, since the lease already ended YIELDED (and the session may
have been re-granted). The yield is then read back (`_yield_applied`) and, where it can be told
from a revocation, counted as done rather than recorded in `callback_errors`, as `session.py`
does for a Release retried after it applied.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import replace
from datetime import UTC
from typing import Any

import grpc
import grpc.aio

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2
from scheduler.client.callbacks import invoke
from scheduler.client.channel import TRANSIENT_CODES
from scheduler.client.errors import from_rpc_error
from scheduler.client.session_state import SessionState, log
from scheduler.client.types import LeaseInfo, Phase, SessionInfo, SnapshotRef, lease_key


class SessionDuties(SessionState):
    """Renewals, yields and the callback queue of one session."""

    # ---------------------------------------------------------------------------------- renew

    def _start_renew(self, lease: LeaseInfo, interval: float, immediate: bool) -> None:
        self._stop_renew()
        self._renew_task = asyncio.create_task(
            self._renew_loop(lease, interval, immediate), name=f"slotsched-renew-{self.session_id}"
        )

    async def _renew_loop(self, lease: LeaseInfo, interval: float, immediate: bool) -> None:
        loop = asyncio.get_running_loop()
        stub = self._client.session_stub()
        start = loop.time()
        tick = 0 if immediate else 1
        while True:
            delay = start + tick * interval - loop.time()
            tick += 1
            if delay > 0:
                await asyncio.sleep(delay)
            if not self._is_current(lease.lease_id, lease.epoch) or self._release_requested:
                return
            try:
                resp = await stub.Renew(
                    scheduler_pb2.RenewRequest(
                        # the id as last reported (its tag changes when the scheduler's key does)
                        session_id=self.session_id,
                        lease_id=(self._lease or lease).lease_id,
                        epoch=lease.epoch,
                    ),
                    metadata=self._client.metadata,
                    timeout=min(self._client.rpc_timeout_s, max(interval, 0.5)),
                )
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e)
                err.__cause__ = e
                self.renew_error = err
                if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                    # The lease is gone (expired or fenced); the stream, if attached, says why.
                    # Gone after our own Release (a Renew in flight behind it) is not a loss.
                    if self._is_current(lease.lease_id, lease.epoch) and not self._release_requested:
                        # Until the stream tells where the session stands, it is unknown.
                        self._drop_lease(involuntary=True)
                        self._phase = Phase.STARTING
                        self._notify()
                    return
                continue  # transient: the next tick retries, two chances before expiry
            if self.renew_error is not None:
                self.renew_error = None
                # Answered after failing: sessions asleep in re-attach backoff try again now.
                self._client.wake.heard()
            current = self._lease
            if current is None or current.key != lease.key:
                return
            if resp.HasField("expires_at"):
                current = replace(current, expires_at=resp.expires_at.ToDatetime(tzinfo=UTC))
                self._lease = current
            if resp.grant:  # the grant Checkpoint and Stop show the worker, valid past the new expiry
                current = replace(current, grant=resp.grant)
                self._lease = current
            if resp.state == common_pb2.LEASE_STATE_YIELDING and self._phase is Phase.HOLDING:
                # We missed YieldRequested (e.g. while re-attaching): yield now.
                self._phase = Phase.YIELDING
                if resp.HasField("yield_deadline"):
                    current = replace(current, yield_deadline=self._local(resp.yield_deadline))
                    self._lease = current
                self._start_yield(current)
            self._notify()

    # ---------------------------------------------------------------------------------- yield

    def _start_yield(self, lease: LeaseInfo) -> None:
        key = lease.key
        if self._yield_started == key or self._release_requested:
            return
        self._yield_started = key
        self._yield_gen += 1
        gen = self._yield_gen
        self._actions.put_nowait(lambda: self._do_yield(lease, gen))

    async def _do_yield(self, lease: LeaseInfo, gen: int) -> None:
        if not self._is_current(lease.lease_id, lease.epoch) or self._release_requested:
            return
        if gen != self._yield_gen:
            return  # called off before it began
        ref: SnapshotRef | None
        if self._on_yield is None:
            ref = self._resume_from
        else:
            try:
                result = await invoke(self._on_yield, lease)
            except Exception as e:  # do not yield without a snapshot we believe in
                log.warning("slotsched: on_yield for %s failed, not yielding: %r", self.session_id, e)
                self.callback_errors.append(e)
                self._notify()
                return
            if result is not None and not isinstance(result, SnapshotRef):
                bad = TypeError(f"on_yield must return a SnapshotRef or None, not {type(result).__name__}")
                self.callback_errors.append(bad)
                self._notify()
                return
            ref = result
        if gen != self._yield_gen:
            # Called off while on_yield ran: keep the lease; the checkpoint stays unused.
            log.info("slotsched: %s checkpointed for a yield since called off; holding on", self.session_id)
            return
        req = scheduler_pb2.YieldRequest(
            session_id=self.session_id, lease_id=lease.lease_id, epoch=lease.epoch
        )
        if ref is not None:
            req.snapshot.CopyFrom(ref.to_proto())
            self._yield_ref = (lease.key, ref)
        stub = self._client.session_stub()
        self._yield_sent = lease.key
        for attempt in range(5):
            if not self._is_current(lease.lease_id, lease.epoch) or self._release_requested:
                return
            if gen != self._yield_gen:
                return  # called off between attempts: the lease is still ours
            try:
                await stub.Yield(req, metadata=self._client.metadata, timeout=self._client.rpc_timeout_s)
                break
            except grpc.aio.AioRpcError as e:
                if e.code() in TRANSIENT_CODES and attempt < 4:
                    await asyncio.sleep(self._client.backoff_initial_s * 2**attempt)
                    continue
                if e.code() is grpc.StatusCode.FAILED_PRECONDITION and await self._yield_applied(lease, ref):
                    log.info("slotsched: yield of %s was applied before its answer was lost", self.session_id)
                    break
                err = from_rpc_error(e)
                err.__cause__ = e
                self.callback_errors.append(err)
                self._notify()
                return
        if ref is not None and (self._lease is None or self._is_current(lease.lease_id, lease.epoch)):
            self._resume_from = ref  # (a re-grant that raced ahead already carries it)
        self._count_yield(lease.key)
        if self._is_current(lease.lease_id, lease.epoch):
            self._drop_lease(involuntary=False)
            self._phase = Phase.QUEUED
        self._notify()

    async def _yield_applied(self, lease: LeaseInfo, ref: SnapshotRef | None) -> bool:
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
                scheduler_pb2.GetSessionRequest(session_id=self.session_id),
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

    def _yield_called_off(self, lease_id: str, epoch: int) -> None:
        """YieldCancelled for our lease: keep holding it (see `scheduler.client.session`)."""
        key = lease_key(lease_id, epoch)
        if not self._is_current(lease_id, epoch) or self._yield_started != key:
            return  # not yielding it (any more): nothing to call off
        held = replace(self._require_lease(), yield_deadline=None)
        keep = True
        if self._on_yield_cancelled is not None:
            try:
                result = self._on_yield_cancelled(held)
                if inspect.isawaitable(result):  # a coroutine function: run it, keep the lease
                    task = asyncio.ensure_future(result)
                    self._background.add(task)
                    task.add_done_callback(self._background_done)
                else:
                    keep = result is not False
            except Exception as e:
                log.warning("slotsched: on_yield_cancelled for %s failed: %r", self.session_id, e)
                self.callback_errors.append(e)
        if not keep:
            log.info("slotsched: yield of %s called off too late (actor stopped); yielding", self.session_id)
            return
        self._yield_started = None
        self._yield_gen += 1  # a checkpoint in progress finishes, and no Yield follows it
        self._yields_cancelled += 1
        self._lease = held
        self._phase = Phase.HOLDING
        log.info("slotsched: yield of %s (lease %s) called off; holding on", self.session_id, lease_id)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.callback_errors.append(task.exception())  # type: ignore[arg-type]
            self._notify()

    async def _run_actions(self) -> None:
        while True:
            action = await self._actions.get()
            try:
                await action()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("slotsched: callback for %s failed: %r", self.session_id, e)
                self.callback_errors.append(e)
                self._notify()
