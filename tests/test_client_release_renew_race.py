"""A Renew refused because our own Release got there first is not a lost lease.

What bench/failover.py --no-standby saw (`leases_lost` 2-4 per run, every one `ended released`
with `lost_lease` set and the renew error `NOT_FOUND: session ... holds no lease`): a holder's
stream broke at a leader kill; its hold ended during the outage, so `release()` began (renewals
stopped) while the stream was re-attaching. The re-attach replayed the Granted, and the replay
started the renewals again at once; that Renew reached the new leader right behind our Release
(journal: Renewed, Release -> Ended{RELEASED}, Renew -> Rejected NOT_FOUND), and the refusal,
handled before the stream's Ended, was taken for a lease the server had taken away. The server
kept the lease across the restart; the SDK misread the end of its own release.

The state is driven directly (no server): a replayed grant after the release began starts no
renewal, and a refusal of a Renew in flight when the release began is not a loss. Without a
release under way the same refusal still is one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.client import AsyncClient, LeaseInfo, QoS, Slot
from scheduler.client.phases import SessionEvent
from scheduler.client.session import AsyncSession


def _lease(epoch: int) -> LeaseInfo:
    return LeaseInfo("s", f"w/0#{epoch}", epoch, Slot("w", 0), "w:1", None, None, QoS.BURSTABLE)


def _granted(lease: LeaseInfo) -> scheduler_pb2.LeaseEvent:
    msg = lease.to_proto()
    msg.expires_at.GetCurrentTime()
    msg.expires_at.seconds += 3
    return scheduler_pb2.LeaseEvent(granted=scheduler_pb2.Granted(lease=msg))


class RefusingStub:
    """A session transport whose Renew is answered with `code` (after `gate` opens, if given)."""

    def __init__(self, code: grpc.StatusCode, gate: asyncio.Event | None = None) -> None:
        self.code = code
        self.gate = gate
        self.renews = 0

    async def send(self, command: Any, request: Any, metadata: Any, timeout: float) -> Any:
        assert command.rpc == "Renew", command
        self.renews += 1
        if self.gate is not None:
            await self.gate.wait()
        md = grpc.aio.Metadata()
        raise grpc.aio.AioRpcError(self.code, md, md, "session s holds no lease", None)


def _hold(s: AsyncSession, lease: LeaseInfo) -> None:
    """The session holds `lease` (as after its grant), its state set directly."""
    s._state.lease = lease
    s._state.move(SessionEvent.GRANTED)


def _session(stub: RefusingStub) -> tuple[AsyncClient, AsyncSession]:
    client = AsyncClient("127.0.0.1:1", token="t", renew_interval_s=0.01)  # never dialled
    client.transport = lambda: stub  # type: ignore[method-assign,assignment,return-value]
    return client, client.session("s", QoS.BURSTABLE)


@pytest.mark.parametrize("replay", [True, False], ids=["replayed-grant", "new-grant"])
def test_a_grant_that_arrives_after_the_release_began_is_not_renewed(replay: bool) -> None:
    async def body() -> None:
        stub = RefusingStub(grpc.StatusCode.NOT_FOUND)
        _, s = _session(stub)
        lease = _lease(4)
        if replay:  # held before the outage; the re-attach replays the same lease
            _hold(s, lease)
        s._state.release_requested = True  # release() began while the stream was detached
        s._events.apply(_granted(lease))
        await asyncio.sleep(0.05)  # several renew intervals
        assert s._renewer.task is None and stub.renews == 0
        assert not s.lost_lease.is_set() and s.lease is not None and s.lease.key == lease.key

    asyncio.run(body())


@pytest.mark.parametrize(
    ("code", "releasing", "lost"),
    [
        (grpc.StatusCode.NOT_FOUND, True, False),  # our Release went first: not a loss
        (grpc.StatusCode.FAILED_PRECONDITION, True, False),
        (grpc.StatusCode.NOT_FOUND, False, True),  # gone while we hold on: a loss
        (grpc.StatusCode.FAILED_PRECONDITION, False, True),
    ],
)
def test_a_renew_refused_behind_our_release_is_not_a_lost_lease(
    code: grpc.StatusCode, releasing: bool, lost: bool
) -> None:
    async def body() -> None:
        gate = asyncio.Event()
        stub = RefusingStub(code, gate)
        _, s = _session(stub)
        lease = _lease(4)
        _hold(s, lease)
        s._renewer.start(lease, 0.01, immediate=True)
        while stub.renews == 0:  # the Renew is on the wire
            await asyncio.sleep(0.001)
        s._state.release_requested = releasing  # release() began; its Ended has not arrived yet
        gate.set()  # the refusal comes back before the stream's Ended{RELEASED}
        await asyncio.sleep(0.02)
        assert s.lost_lease.is_set() is lost
        assert (s.lease is None) is lost
        assert s.renew_error is not None and s.renew_error.code is code
        s._renewer.stop()

    asyncio.run(body())


def test_the_release_still_reports_the_end_as_ours() -> None:
    """After the refused Renew, the stream's Ended{RELEASED} ends the session as released."""

    async def body() -> None:
        gate = asyncio.Event()
        stub = RefusingStub(grpc.StatusCode.NOT_FOUND, gate)
        _, s = _session(stub)
        lease = _lease(4)
        _hold(s, lease)
        s._renewer.start(lease, 0.01, immediate=True)
        while stub.renews == 0:
            await asyncio.sleep(0.001)
        s._state.release_requested = True
        gate.set()
        await asyncio.sleep(0.02)
        ended = scheduler_pb2.Ended(
            reason=scheduler_pb2.END_REASON_RELEASED,
            lease_id=lease.lease_id,
            epoch=lease.epoch,
            session_over=True,
        )
        s._events.apply(scheduler_pb2.LeaseEvent(ended=ended))
        assert s.end_reason == "released" and s.error is None and not s.lost_lease.is_set()

    asyncio.run(body())
