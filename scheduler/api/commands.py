"""The session commands of the Scheduler service, in one table: what each is on the wire.

Why one table: Acquire, Renew, Release, Yield, Withdraw and GetSession used to be listed by hand
in the per-session servicer, the Channel servicer, the rate limiter's flows, and the SDK's
multiplexer and retrying stub; a new command had to be remembered in each. Both sides read this
table instead (the server binds each row to its session operation in
scheduler/server/session_ops.py), and tests/test_api_commands.py fails when the proto gains a
Channel command or a Scheduler rpc the table lacks.

Wire-level facts, and how the SDK sends each (`resend`, `meets`, `attempts`: its retry layer,
scheduler/client/calls.py, and its reactions, client/reactions.py, read them): no server import
here (the SDK imports this module). A new session command is its row here, its operation in
scheduler/server/session_ops.py, and the core's event and step (core/types.py, core/engine.py,
its row in scheduler/dispatch.py); the servicer, the Channel, the rate limiter and the SDK's
transports and retries follow from the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Final

from google.protobuf.message import Message

from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb


class Flow(Enum):
    """The rate-limit bucket a command is charged to (spec.rateLimits; scheduler/server/ratelimit.py)."""

    TENANT = "tenant"  # the tenant's calls: spec.tenants[i].rateLimit, else spec.rateLimits.tenant
    # The tenant's renewals, a bucket of their own: an Acquire flood must never fail the tenant's
    # renewals (its leases would expire) nor keep a slot given back waiting.
    RENEWALS = "renewals"


@dataclass(frozen=True, slots=True)
class Command:
    """One session command."""

    name: str  # the command's own name (Withdraw has no rpc of its own)
    rpc: str  # the Scheduler rpc it is, or stands for; the rate limiter's and metrics' label
    field: str | None  # its ChannelCommand `command` oneof field; None: not sent on a Channel
    answer: str | None  # the ChannelEvent `kind` field answering it; None: its lease events do
    request: type[Message]
    flow: Flow
    streaming: bool  # the per-session rpc streams its answers (Acquire: the lease events)
    resend: bool  # may the SDK send it again after a broken channel or a failover
    why: str  # why resending is safe (or not)
    #: The SDK's column of client/reactions.py meeting its failures (a `reactions.Call` value:
    #: "renew", "yield", "release"); "" for a command no session part sends through calls.py.
    meets: str = ""
    #: The tries the SDK's retry layer (client/calls.py) gives it; 0 when it does not send it.
    attempts: int = 0
    #: A first answer that waits (a queued permit) is followed by more answers on the same
    #: Channel `ref` (its grant); the per-session rpc answers once the wait is over.
    follows: bool = False
    #: Routed by its budget, not its session: under per-pool leadership it goes to the replica
    #: leading the budget's home pool (docs/design.md, "Token budgets"), wherever its session is.
    by_budget: bool = False


ACQUIRE: Final = Command(
    "Acquire",
    "Acquire",
    "acquire",
    None,
    pb.AcquireRequest,
    Flow.TENANT,
    streaming=True,
    resend=True,
    why="a live session of the same id and tenant is re-attached, its state replayed: nothing queued twice",
)
RENEW: Final = Command(
    "Renew",
    "Renew",
    "renew",
    "renewed",
    pb.RenewRequest,
    Flow.RENEWALS,
    streaming=False,
    resend=True,
    why="renewing extends the lease from now: twice is as once (lease id and epoch fence a moved-on lease)",
    meets="renew",
    attempts=1,  # one: the renewal schedule sends the next before the lease expires
)
RELEASE: Final = Command(
    "Release",
    "Release",
    "release",
    "released",
    pb.ReleaseRequest,
    Flow.RENEWALS,
    streaming=False,
    resend=True,
    why="a repeat of an applied release is answered released (its session's last end was a release)",
    meets="release",
    attempts=5,
)
YIELD: Final = Command(
    "Yield",
    "Yield",
    "yield_slot",
    "yielded",
    pb.YieldRequest,
    Flow.RENEWALS,
    streaming=False,
    resend=True,
    why="lease id and epoch fence it: a repeat of an applied yield cannot yield a later lease",
    meets="yield",
    attempts=5,
)
WITHDRAW: Final = Command(
    "Withdraw",
    "Release",  # Release with an empty lease id
    "withdraw",
    "released",
    pb.WithdrawRequest,
    Flow.RENEWALS,
    streaming=False,
    resend=True,
    why="withdrawing twice changes nothing: the repeat finds no queued request (NOT_FOUND)",
)
GET_SESSION: Final = Command(
    "GetSession",
    "GetSession",
    None,
    None,
    pb.GetSessionRequest,
    Flow.TENANT,
    streaming=False,
    resend=True,
    why="a read",
)

REQUEST_PERMIT: Final = Command(
    "RequestPermit",
    "RequestPermit",
    "request_permit",
    "permit",
    pb.RequestPermitRequest,
    Flow.TENANT,
    streaming=False,
    resend=False,
    why="each request is a new permit (the scheduler names it): sent twice, two permits would wait",
    meets="renew",  # met as a renewal: one try, never sent again (resend)
    attempts=1,
    follows=True,
    by_budget=True,
)
SETTLE_PERMIT: Final = Command(
    "SettlePermit",
    "SettlePermit",
    "settle_permit",
    "settled",
    pb.SettlePermitRequest,
    # Settling gives tokens back, as a release gives a slot back: a permit flood must not refuse it.
    Flow.RENEWALS,
    streaming=False,
    resend=True,
    why="a repeat of an applied settle is refused PERMIT_CLOSED (counted once); at a new leader, "
    "which never knew the permit, it is charged once as a debt",
    meets="release",  # met as a release: it gives back, and is sent again through an outage
    attempts=5,
    by_budget=True,
)

#: Every session command: the Channel's in its oneof's order, then GetSession.
COMMANDS: Final = (ACQUIRE, RENEW, YIELD, RELEASE, WITHDRAW, REQUEST_PERMIT, SETTLE_PERMIT, GET_SESSION)
#: By ChannelCommand oneof field: what a Channel carries.
BY_FIELD: Final = MappingProxyType({c.field: c for c in COMMANDS if c.field is not None})
#: By Scheduler rpc name: what the per-session servicer serves (Release, not Withdraw).
BY_RPC: Final = MappingProxyType({c.rpc: c for c in COMMANDS if c.name == c.rpc})
#: The Scheduler rpcs that are not session commands.
NOT_COMMANDS: Final = frozenset({"Channel"})  # the stream the commands travel on
#: "set one of ..." for a ChannelCommand with no command set.
FIELDS_TEXT: Final = ", ".join(BY_FIELD)

__all__ = [
    "ACQUIRE",
    "BY_FIELD",
    "BY_RPC",
    "COMMANDS",
    "FIELDS_TEXT",
    "GET_SESSION",
    "NOT_COMMANDS",
    "RELEASE",
    "RENEW",
    "REQUEST_PERMIT",
    "SETTLE_PERMIT",
    "WITHDRAW",
    "YIELD",
    "Command",
    "Flow",
]
