"""slotsched client SDK: hold a warm slot for an agent session, yield it when asked, get it back.

Why an SDK: the Scheduler's contract is a stream plus timed duties (renew within the TTL, yield
before a deadline, re-attach after a broken stream, release at the end). A runtime that gets one
of them wrong loses its slot or pins one forever; the SDK does all of them, so a runtime only
says what to do on a grant (start the actor) and on a yield request (checkpoint it):

    from scheduler.client import AsyncClient, QoS, SnapshotRef

    async def checkpoint(lease) -> SnapshotRef:          # may also be a plain (blocking) def
        return SnapshotRef(uri=await my_worker(lease.worker_address).checkpoint(lease.session_id))

    async with AsyncClient("scheduler:50051", token=TOKEN) as client:
        async with client.session("sess-42", qos=QoS.BESTEFFORT, on_yield=checkpoint,
                                  on_grant=lambda lease: start_actor(lease)) as lease:
            print(lease.worker_address, lease.resume_from)   # kept current across re-grants
            await run_agent(lease)                           # renewals, yields: in the background

Threaded code uses `Client` the same way (`with client.session(...) as lease:`). Refusals are
raised from entering the session as typed errors (`QueueFull`, `RateLimited`, `NoQuota`,
`PermissionDenied`, `NoEligiblePool`, `Unauthenticated`, `AcquireTimeout`, ...).

With several pools in the policy a session says where it may run:
`client.session("s1", pool="gpu-a100")`, or `selector={"kind": "cpu"}`, and `fallback=[...]`
pools to be granted in when the first is full (docs/design.md "Pools"); `session.pool` is where
it holds or waits, `session.queue.reason` why it waits.

`QoS` and `SnapshotRef` are the SDK's own (`ClientQoS`, `ClientSnapshotRef` inside it), distinct
from the scheduler's `scheduler.core.types.QoS` and `snapshots.ref.SnapshotRef`: `types.py` says
how. `Qos` is a deprecated alias of `QoS` (the SDK's first name for it), kept so old imports work.
"""

from scheduler.client.aio import AsyncClient, AsyncSession, OnGrant, OnYield, OnYieldCancelled
from scheduler.client.errors import (
    AcquireTimeout,
    GrantFailed,
    InvalidArgument,
    NoEligiblePool,
    NoQuota,
    NotFound,
    PermissionDenied,
    PermitRefused,
    QueueFull,
    RateLimited,
    ResourceExhausted,
    SessionEnded,
    SlotschedError,
    StaleLease,
    Unauthenticated,
    Unavailable,
    UnknownBudget,
)
from scheduler.client.options import ClientOptions
from scheduler.client.permit import Permit, PermitQueue, Settled, TokenUsage, usage_of
from scheduler.client.phases import Phase
from scheduler.client.reactions import from_rpc_error
from scheduler.client.sync import Client, Session
from scheduler.client.types import LeaseInfo, QoS, QueueInfo, SessionInfo, Slot, SnapshotRef

#: Deprecated: the SDK's old spelling of `QoS`.
Qos = QoS

__all__ = [
    "AcquireTimeout",
    "AsyncClient",
    "AsyncSession",
    "Client",
    "ClientOptions",
    "GrantFailed",
    "InvalidArgument",
    "LeaseInfo",
    "NoEligiblePool",
    "NoQuota",
    "NotFound",
    "OnGrant",
    "OnYield",
    "OnYieldCancelled",
    "PermissionDenied",
    "Permit",
    "PermitQueue",
    "PermitRefused",
    "Phase",
    "QoS",
    "Qos",
    "QueueFull",
    "QueueInfo",
    "RateLimited",
    "ResourceExhausted",
    "Session",
    "SessionEnded",
    "SessionInfo",
    "Settled",
    "SlotschedError",
    "Slot",
    "SnapshotRef",
    "StaleLease",
    "TokenUsage",
    "Unauthenticated",
    "Unavailable",
    "UnknownBudget",
    "from_rpc_error",
    "usage_of",
]
