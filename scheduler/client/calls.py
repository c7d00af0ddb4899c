"""A session's Renew, Yield and Release: the one layer that sends one again.

Why one layer: a Renew used to be retried at four (the renew loop, a retrying wrapper around the
channel multiplexer, the leader-following stub, and the Channel stream's replay of what it had
written), each with its own bound, so how often one renewal was sent after a failover was
anybody's guess. Now the transports below only report a failure (and move the client to the
leader: `follow.py`, `mux.py`), and this layer decides, from `reactions.py`'s table and the
call's `RetryPolicy`, whether the same command goes again:

Each command's row in `scheduler/api/commands.py` says how many tries it has (`attempts`), which
column of `reactions.py` meets its failures (`meets`), and whether it may be sent again at all
(`resend`); only a command whose row says so is:

* FOLLOW_LEADER (the replica was lost, or does not lead): again to the leader, at once if a
  standby named it, else after 50-100 ms, within `failover_timeout_s` and the call's timeout;
  past that, as RETRY;
* RETRY: again after the policy's backoff, while it allows another try (a Yield or a Release:
  five tries; a Renew: one, since its schedule sends the next renewal before the lease expires);
* RECHECK: the caller reads what the server holds (`recheck`) and says whether to send again;
* SETTLED: what the call was for holds already; anything else raises the call's error.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message

from scheduler.api.commands import Command
from scheduler.client.channel import ClientLink
from scheduler.client.follow import leader_named
from scheduler.client.reactions import Call, Reaction, react, retry_after_of
from scheduler.client.retry import FAILOVER, RetryPolicy

_COLUMNS = {c.value: c for c in Call}


def column(command: Command) -> Call:
    """The column of `reactions.py` that meets `command`'s failures (its row's `meets`)."""
    found = _COLUMNS.get(command.meets)
    return found if found is not None else Call(command.meets)  # (raises for an unknown one)


class Verdict(enum.Enum):
    """What a `recheck` found."""

    AGAIN = "send again"  # (with a request built afresh)
    DONE = "done"  # what the call was for holds
    FAIL = "fail"  # the refusal stands


class Abandoned(Exception):
    """The call is not wanted any more (its lease went, the yield was called off)."""


Recheck = Callable[[grpc.aio.AioRpcError, bool], Awaitable[Verdict]]


_SEND_AGAIN = (Reaction.FOLLOW_LEADER, Reaction.RETRY)


def _always() -> bool:
    return True


class SessionCalls:
    """Sends one session's commands through the client's transport (the channel multiplexer, or
    per-session rpcs: `transport.py`), with the retries of the module doc."""

    def __init__(self, client: ClientLink) -> None:
        self._client = client

    async def send(
        self,
        command: Command,
        build: Callable[[], Message],
        *,
        timeout: float,
        wanted: Callable[[], bool] = _always,
        recheck: Recheck | None = None,
    ) -> Any:
        """The answer to `build()` sent as `command` (None when SETTLED or rechecked DONE).

        `wanted()` is asked before every try (Abandoned once it says no); `recheck(err, more)`
        after a RECHECK reaction (`more`: whether the policy allows another try)."""
        client = self._client
        call = column(command)
        policy: RetryPolicy | None = None  # made at the first failure (most calls have none)
        loop = asyncio.get_running_loop()
        tries = 0
        while True:
            tries += 1
            start = loop.time()
            follow_until = start + min(client.failover_timeout_s, timeout)
            while True:  # one try: sent again to the leader while its replica is lost
                if not wanted():
                    raise Abandoned
                transport = client.transport()
                left = max(0.001, start + timeout - loop.time())
                try:
                    return await transport.send(command, build(), client.metadata, left)
                except grpc.aio.AioRpcError as e:
                    err = e
                reaction = react(call, err)
                if reaction in _SEND_AGAIN and not command.resend:
                    raise err  # not safe to send twice (commands.py)
                if reaction is not Reaction.FOLLOW_LEADER or not client.follow_leader:
                    break
                # At once to a leader a standby named (the follower went there), else after a pause.
                pause = 0.0 if leader_named(err) else FAILOVER.delay(0)
                if loop.time() + pause >= follow_until:
                    break
                await asyncio.sleep(pause)
            if policy is None:
                policy = replace(client.command_backoff, attempts=command.attempts)
            more = policy.allows(tries)
            if reaction is Reaction.SETTLED:
                return None
            if reaction is Reaction.RECHECK and recheck is not None:
                verdict = await recheck(err, more)
                if verdict is Verdict.DONE:
                    return None
                if verdict is Verdict.AGAIN and more:
                    continue
                raise err
            if reaction in _SEND_AGAIN and more:
                await asyncio.sleep(max(policy.delay(tries - 1), retry_after_of(err)))
                continue
            raise err
