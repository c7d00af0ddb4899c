"""The runtime's callbacks (`on_grant`, `on_yield`, `on_yield_cancelled`): their types and how the
SDK calls them (coroutine functions awaited, plain functions run in a thread so they may block).

When each is called, and what its result means, is told in `scheduler.client.session`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from scheduler.client.types import LeaseInfo, SnapshotRef

#: `on_yield(lease)`: checkpoint the actor and return where the snapshot is (or None).
OnYield: TypeAlias = Callable[[LeaseInfo], SnapshotRef | None | Awaitable[SnapshotRef | None]]
#: `on_grant(lease)`: start (or restore from `lease.resume_from`) the actor on the new slot.
OnGrant: TypeAlias = Callable[[LeaseInfo], None | Awaitable[None]]
#: `on_yield_cancelled(lease)`: the yield asked of `lease` is called off (see
#: `scheduler.client.session`); called at once on the SDK's loop, so it must not block.
#: False = too late, yield.
OnYieldCancelled: TypeAlias = Callable[[LeaseInfo], bool | None | Awaitable[None]]


async def invoke(fn: Callable[[LeaseInfo], Any], lease: LeaseInfo) -> Any:
    """Call a user callback: coroutine functions are awaited, plain functions run in a thread."""
    if inspect.iscoroutinefunction(fn):
        return await fn(lease)
    result = await asyncio.to_thread(fn, lease)
    if inspect.isawaitable(result):
        result = await result
    return result
