"""How the SDK meets each gRPC status (scheduler/client/reactions.py), row by row, and the one
layer that sends a session's command again (scheduler/client/calls.py): a Renew, Yield or
Release is tried as its row and its RetryPolicy say, and nowhere else (the channel multiplexer
re-sends only acquires when its channel moves to another replica)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import grpc
import grpc.aio
import pytest
from google.rpc import error_details_pb2, status_pb2

from scheduler.api import commands, wire
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.api.wire import Reason
from scheduler.client import calls as calls_module
from scheduler.client import mux
from scheduler.client.calls import Abandoned, SessionCalls, Verdict
from scheduler.client.channel import REATTACH_CODES
from scheduler.client.errors import (
    AcquireTimeout,
    InvalidArgument,
    NoQuota,
    NotFound,
    PermissionDenied,
    QueueFull,
    RateLimited,
    SlotschedError,
    StaleLease,
    Unauthenticated,
    Unavailable,
)
from scheduler.client.reactions import STATUS_TABLE, Call, Reaction, from_rpc_error, react
from scheduler.client.retry import RetryPolicy
from scheduler.client.wake import Wake

C = grpc.StatusCode
R = Reaction
CH, AT, RN, YI, RL = Call.CHANNEL, Call.ATTACH, Call.RENEW, Call.YIELD, Call.RELEASE


def _error(
    code: grpc.StatusCode, reason: str = "", retry_after_ms: int | None = None
) -> grpc.aio.AioRpcError:
    """A failed call as the server ends it: the status, its ErrorInfo, its trailers."""
    trailers: list[tuple[str, str | bytes]] = []
    if reason:
        status = status_pb2.Status(code=code.value[0], message="refused")
        status.details.add().Pack(error_details_pb2.ErrorInfo(reason=reason, domain=wire.DOMAIN))
        trailers.append((wire.DETAILS, status.SerializeToString()))
    if retry_after_ms is not None:
        trailers.append((wire.RETRY_AFTER_MS, str(retry_after_ms)))
    return mux.rpc_error(code, "refused", tuple(trailers))


# (status, reason, call, reaction): what the SDK did before the table, now read from it.
REACTIONS = [
    # A session's stream: re-attach after a broken stream, wait when told, else the answer.
    (C.UNAVAILABLE, "", AT, R.REATTACH),
    (C.UNAVAILABLE, Reason.NOT_LEADER, AT, R.REATTACH),
    (C.INTERNAL, "", AT, R.REATTACH),
    (C.UNKNOWN, "", AT, R.REATTACH),
    (C.CANCELLED, "", AT, R.REATTACH),
    (C.RESOURCE_EXHAUSTED, Reason.RATE_LIMITED, AT, R.WAIT_REATTACH),
    (C.RESOURCE_EXHAUSTED, Reason.QUEUE_FULL, AT, R.WAIT_REATTACH),
    (C.DEADLINE_EXCEEDED, "", AT, R.FAIL),
    (C.PERMISSION_DENIED, Reason.NO_QUOTA, AT, R.FAIL),
    (C.FAILED_PRECONDITION, "", AT, R.FAIL),
    (C.NOT_FOUND, "", AT, R.FAIL),
    (C.ABORTED, "", AT, R.FAIL),
    # Renewals: a lease refused is lost; a lost replica followed; the rest waits for the next tick.
    (C.NOT_FOUND, "", RN, R.LEASE_LOST),
    (C.FAILED_PRECONDITION, Reason.STALE_EPOCH, RN, R.LEASE_LOST),
    (C.UNAVAILABLE, "", RN, R.FOLLOW_LEADER),
    (C.UNAVAILABLE, Reason.NOT_LEADER, RN, R.FOLLOW_LEADER),
    (C.DEADLINE_EXCEEDED, "", RN, R.SKIP),
    (C.RESOURCE_EXHAUSTED, Reason.RATE_LIMITED, RN, R.SKIP),
    (C.INTERNAL, "", RN, R.SKIP),
    (C.PERMISSION_DENIED, "", RN, R.SKIP),
    # Yields: transient failures tried again, a stale refusal read back, the rest recorded.
    (C.UNAVAILABLE, "", YI, R.FOLLOW_LEADER),
    (C.DEADLINE_EXCEEDED, "", YI, R.RETRY),
    (C.FAILED_PRECONDITION, "", YI, R.RECHECK),
    (C.NOT_FOUND, "", YI, R.FAIL),
    (C.INVALID_ARGUMENT, "", YI, R.FAIL),
    # Releases: over already is done; stale is read back; transient tried again.
    (C.NOT_FOUND, "", RL, R.SETTLED),
    (C.FAILED_PRECONDITION, Reason.NOT_HOLDER, RL, R.RECHECK),
    (C.UNAVAILABLE, "", RL, R.FOLLOW_LEADER),
    (C.DEADLINE_EXCEEDED, "", RL, R.RETRY),
    (C.PERMISSION_DENIED, "", RL, R.FAIL),
    # Refused for load: the slot would stay held until its TTL, so sent again after retry-after.
    (C.RESOURCE_EXHAUSTED, Reason.RATE_LIMITED, RL, R.RETRY),
    (C.RESOURCE_EXHAUSTED, "", RL, R.RETRY),
    (C.RESOURCE_EXHAUSTED, Reason.RATE_LIMITED, YI, R.RETRY),
    # The channel: a verdict on the client passes on; anything else makes its sessions re-attach.
    (C.UNAUTHENTICATED, "", CH, R.FAIL),
    (C.PERMISSION_DENIED, "", CH, R.FAIL),
    (C.INVALID_ARGUMENT, "", CH, R.FAIL),
    (C.UNIMPLEMENTED, "", CH, R.FALL_BACK),
    (C.UNAVAILABLE, "", CH, R.REATTACH),
    (C.RESOURCE_EXHAUSTED, "", CH, R.REATTACH),
    (C.INTERNAL, "", CH, R.REATTACH),
    (C.DEADLINE_EXCEEDED, "", CH, R.REATTACH),
    (C.RESOURCE_EXHAUSTED, Reason.CHANNEL_FULL, CH, R.PLACE_ELSEWHERE),
    (C.UNAVAILABLE, Reason.NOT_LEADER, CH, R.FOLLOW_LEADER),
]


@pytest.mark.parametrize(("code", "reason", "call", "reaction"), REACTIONS)
def test_each_status_is_met_as_its_row_says(
    code: grpc.StatusCode, reason: str, call: Call, reaction: Reaction
) -> None:
    assert react(call, _error(code, reason)) is reaction


# (status, reason, error class): the typed error a caller sees.
ERRORS = [
    (C.PERMISSION_DENIED, Reason.NO_QUOTA, NoQuota),
    (C.PERMISSION_DENIED, Reason.CREDENTIAL_DENIED, PermissionDenied),
    (C.PERMISSION_DENIED, "", PermissionDenied),
    (C.RESOURCE_EXHAUSTED, Reason.RATE_LIMITED, RateLimited),
    (C.RESOURCE_EXHAUSTED, Reason.QUEUE_FULL, QueueFull),
    (C.RESOURCE_EXHAUSTED, Reason.CHANNEL_FULL, QueueFull),
    (C.RESOURCE_EXHAUSTED, "", QueueFull),
    (C.FAILED_PRECONDITION, Reason.STALE_EPOCH, StaleLease),
    (C.NOT_FOUND, "", NotFound),
    (C.DEADLINE_EXCEEDED, "", AcquireTimeout),
    (C.UNAVAILABLE, Reason.NOT_LEADER, Unavailable),
    (C.UNAUTHENTICATED, "", Unauthenticated),
    (C.INVALID_ARGUMENT, "", InvalidArgument),
    (C.ABORTED, "", SlotschedError),
    (C.INTERNAL, "", SlotschedError),
]


@pytest.mark.parametrize(("code", "reason", "cls"), ERRORS)
def test_each_status_gives_the_error_its_row_names(
    code: grpc.StatusCode, reason: str, cls: type[SlotschedError]
) -> None:
    err = from_rpc_error(_error(code, reason, retry_after_ms=1500))
    assert type(err) is cls and err.code is code
    if isinstance(err, RateLimited | QueueFull):
        assert err.retry_after_s == 1.5 and err.reason == reason


def test_the_reattach_codes_are_the_attach_column() -> None:
    assert {C.UNAVAILABLE, C.INTERNAL, C.UNKNOWN, C.CANCELLED} == REATTACH_CODES


# ------------------------------------------------------------------------- the one retry layer


class _Client:
    """What SessionCalls reads of its client, with a session transport answering from a script."""

    def __init__(self, answers: list[grpc.StatusCode | None], follow: bool = True) -> None:
        self.metadata: tuple[tuple[str, str], ...] = ()
        self.follow_leader = follow
        self.failover_timeout_s = 5.0
        self.command_backoff = RetryPolicy(initial_s=0.001)
        self.wake = Wake()
        self.sent: list[str] = []
        self._answers = answers

    def transport(self) -> Any:
        client = self

        class Transport:
            async def send(
                self, command: commands.Command, request: Any, metadata: Any, timeout: float
            ) -> Any:
                client.sent.append(command.rpc)
                code = client._answers.pop(0) if client._answers else None
                if code is not None:
                    raise _error(code)
                return f"{command.rpc} answered"

        return Transport()


def _send(client: _Client, command: commands.Command, **kw: Any) -> Any:
    return asyncio.run(SessionCalls(client).send(command, pb.RenewRequest, timeout=1.0, **kw))  # type: ignore[arg-type]


def test_a_renew_whose_replica_was_lost_is_sent_again_to_the_leader() -> None:
    client = _Client([C.UNAVAILABLE, C.UNAVAILABLE, None])
    assert _send(client, commands.RENEW) == "Renew answered"
    assert client.sent == ["Renew"] * 3


@pytest.mark.parametrize("code", [C.DEADLINE_EXCEEDED, C.INTERNAL, C.NOT_FOUND])
def test_a_renew_is_otherwise_sent_once(code: grpc.StatusCode) -> None:
    client = _Client([code, None])
    with pytest.raises(grpc.aio.AioRpcError):
        _send(client, commands.RENEW)
    assert client.sent == ["Renew"]


def test_not_following_the_leader_a_lost_renew_is_not_sent_again() -> None:
    client = _Client([C.UNAVAILABLE, None], follow=False)
    with pytest.raises(grpc.aio.AioRpcError):
        _send(client, commands.RENEW)
    assert client.sent == ["Renew"]


def test_a_yield_timing_out_is_tried_as_its_policy_allows() -> None:
    client = _Client([C.DEADLINE_EXCEEDED] * 9)
    with pytest.raises(grpc.aio.AioRpcError):
        _send(client, commands.YIELD)
    assert client.sent == ["Yield"] * 5


def test_a_release_of_a_session_over_already_is_settled() -> None:
    client = _Client([C.NOT_FOUND])
    assert _send(client, commands.RELEASE) is None and client.sent == ["Release"]


@pytest.mark.parametrize(("verdict", "sent"), [(Verdict.AGAIN, 2), (Verdict.DONE, 1), (Verdict.FAIL, 1)])
def test_a_stale_refusal_is_rechecked(verdict: Verdict, sent: int) -> None:
    client = _Client([C.FAILED_PRECONDITION, None])

    async def recheck(err: grpc.aio.AioRpcError, more: bool) -> Verdict:
        assert more
        return verdict

    if verdict is Verdict.FAIL:
        with pytest.raises(grpc.aio.AioRpcError):
            _send(client, commands.RELEASE, recheck=recheck)
    else:
        assert _send(client, commands.RELEASE, recheck=recheck) == (
            None if verdict is Verdict.DONE else "Release answered"
        )
    assert len(client.sent) == sent


def test_a_call_no_longer_wanted_is_not_sent() -> None:
    client = _Client([C.UNAVAILABLE, None])
    tries = iter([True, False])
    with pytest.raises(Abandoned):
        _send(client, commands.YIELD, wanted=lambda: next(tries))
    assert client.sent == ["Yield"]


def test_a_command_its_row_says_not_to_resend_is_not_sent_again() -> None:
    once = dataclasses.replace(commands.RENEW, resend=False)
    client = _Client([C.UNAVAILABLE, None])
    with pytest.raises(grpc.aio.AioRpcError):
        _send(client, once)
    assert client.sent == ["Renew"]


class _Bidi:
    """A Channel call that records what is written, with the following stub's `resend` hook."""

    def __init__(self) -> None:
        self.written: list[pb.ChannelRequest] = []
        self.resend: Any = None
        self.closed = asyncio.Event()

    async def write(self, message: pb.ChannelRequest) -> None:
        self.written.append(message)

    async def read(self) -> Any:
        await self.closed.wait()
        return grpc.aio.EOF

    def cancel(self) -> bool:
        self.closed.set()
        return True

    def abandon(self, err: Any) -> None:
        self.cancel()


def test_a_channel_moved_before_it_answered_resends_its_acquires_and_hands_back_its_commands() -> None:
    async def body() -> None:
        bidi = _Bidi()

        class Client:
            metadata: tuple[tuple[str, str], ...] = ()
            wake = Wake()

            def open_channel(self) -> _Bidi:
                return bidi

        m = mux.SessionMux(Client())  # type: ignore[arg-type]
        m.acquire(pb.AcquireRequest(session_id="s1"))
        renew = asyncio.create_task(m.command(5, renew=pb.RenewRequest(session_id="s1")))
        while not any(c.HasField("renew") for msg in bidi.written for c in msg.commands):
            await asyncio.sleep(0)
        assert bidi.resend is not None  # the multiplexer says what goes again
        again = bidi.resend()
        kinds = [c.WhichOneof("command") for msg in again for c in msg.commands]
        assert kinds == ["acquire"]  # the session's place, re-sent: it never sees the move
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await renew  # the command goes back to calls.py, the one layer that sends it again
        assert failed.value.code() is C.UNAVAILABLE
        await m.close()

    asyncio.run(body())


def test_every_unary_channel_command_has_its_call_row_and_column() -> None:
    """A new session command (commands.py) fails here until the SDK says how to meet it."""
    unary = {c.rpc for c in commands.BY_RPC.values() if c.field is not None and not c.streaming}
    # Its row's SDK columns (commands.py): the tries calls.py gives it, the column meeting it.
    assert {c.rpc for c in commands.COMMANDS if c.attempts} == unary
    for command in commands.COMMANDS:
        if command.attempts:
            call = calls_module.column(command)
            assert all(isinstance(rule.on(call), Reaction) for rule in STATUS_TABLE.values())
