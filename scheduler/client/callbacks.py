"""The runtime's callbacks (`on_grant`, `on_yield`, `on_yield_cancelled`): their types, how the
SDK calls them (coroutine functions awaited, plain functions run in a thread so they may block)
and the queue that runs them in order (`CallbackQueue`).

When each is called, and what its result means, is told in `scheduler.client.session`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
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


Action: TypeAlias = Callable[[], Awaitable[None]]


class CallbackQueue:
    """The session's callbacks run one after the other by one task, so the stream is never
    blocked by them and `on_grant` and `on_yield` never overlap; a callback that raises is
    reported to `failed` (logged and kept in `callback_errors`) and the next one runs.

    The task exists only while there is something to run (made by `put` once `start` was
    called, gone when the queue is empty): a session without callbacks makes none, and a
    queue `stop`ped runs nothing more."""

    def __init__(self, name: str, failed: Callable[[BaseException], None]) -> None:
        self._name = name
        self._failed = failed
        self._actions: deque[Action] = deque()
        self._started = False
        self.stopped = False
        self.task: asyncio.Task[None] | None = None

    def put(self, action: Action) -> None:
        self._actions.append(action)
        self._kick()

    def start(self) -> None:
        self._started = True
        self._kick()

    def stop(self) -> None:
        """Nothing more runs (the session's shutdown cancels `task`)."""
        self.stopped = True
        self._actions.clear()

    def _kick(self) -> None:
        if self._started and not self.stopped and self._actions and (self.task is None or self.task.done()):
            self.task = asyncio.create_task(self._run(), name=f"slotsched-actions-{self._name}")

    async def _run(self) -> None:
        actions = self._actions
        while actions and not self.stopped:
            action = actions.popleft()
            try:
                await action()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._failed(e)
