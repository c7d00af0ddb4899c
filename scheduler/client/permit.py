"""Token budget permits for the SDK (docs/agent-runtimes.md, "Token budgets"):

    async with session.permit("anthropic-sonnet", estimate=(input_tokens, max_tokens)) as p:
        response = await llm.messages.create(...)
        await p.settle(response)        # reads response.usage: tokens charged, the rest refunded

A permit waits while its budget has no room (`p.queue`, and `on_queued(info)` on each update:
position, estimated wait, reason); it is refused with a typed error (`UnknownBudget`, `NoQuota`
for no share, `QueueFull` with `retry_after_s`, `InvalidArgument` naming the field). A call the
provider throttled is reported with `await p.throttled(retry_after_s)`. Leaving the block
without either settles the permit with its estimate at once (what the scheduler's TTL would
charge anyway, later): so the budget's count is closed as soon as the call is over, and an
exception in the block (a call whose usage is unknown) is counted at its bound.

`usage_of` reads the common response shapes without importing any provider's library: an object
or a dict, its `usage` (or itself), with `input_tokens` / `output_tokens` (Anthropic),
`prompt_tokens` / `completion_tokens` (OpenAI and most gateways), or `prompt_token_count` /
`candidates_token_count` (Gemini's `usage_metadata`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import grpc.aio

from scheduler.api import commands
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.client.calls import SessionCalls
from scheduler.client.channel import ClientLink
from scheduler.client.errors import SlotschedError
from scheduler.client.ratelimits import stated_limits
from scheduler.client.reactions import from_rpc_error


@dataclass(frozen=True)
class TokenUsage:
    """What a call costs (or may cost): input and output tokens, requests (1 per call)."""

    input_tokens: float = 0.0
    output_tokens: float = 0.0
    requests: float = 1.0

    def pb(self) -> pb.TokenUsage:
        return pb.TokenUsage(
            input_tokens=self.input_tokens, output_tokens=self.output_tokens, requests=self.requests
        )


@dataclass(frozen=True)
class PermitQueue:
    """Where a waiting permit stands: permits ahead of it, an estimate (None: no refill in
    sight), and why it waits (`budget_exhausted`, `tenant_budget`, `provider_throttled`)."""

    position: int
    estimated_wait_s: float | None
    reason: str


@dataclass(frozen=True)
class Settled:
    """A permit closed: what its budget counts, and the estimate less that (negative: beyond)."""

    charged: TokenUsage
    refunded: TokenUsage
    withdrawn: bool = False
    orphan: bool = False  # not known to the scheduler (granted before a failover): charged as debt


OnPermitQueued = Callable[[PermitQueue], None]

_INPUT = ("input_tokens", "prompt_tokens", "prompt_token_count", "inputTokens", "promptTokens")
_OUTPUT = ("output_tokens", "completion_tokens", "candidates_token_count", "outputTokens", "completionTokens")


def _field(obj: Any, names: tuple[str, ...]) -> float | None:
    for n in names:
        v = obj.get(n) if isinstance(obj, Mapping) else getattr(obj, n, None)
        if v is not None:
            return float(v)
    return None


def usage_of(response: Any) -> TokenUsage:
    """The usage a provider reported, from its response (or its usage) as an object or a dict;
    a `TokenUsage` or an `(input, output)` pair as is. ValueError naming what is missing."""
    if isinstance(response, TokenUsage):
        return response
    if isinstance(response, tuple) and len(response) == 2:
        return TokenUsage(float(response[0]), float(response[1]))
    for key in ("usage", "usage_metadata", "usageMetadata"):
        inner = response.get(key) if isinstance(response, Mapping) else getattr(response, key, None)
        if inner is not None:
            response = inner
            break
    inp, out = _field(response, _INPUT), _field(response, _OUTPUT)
    if inp is None or out is None:
        raise ValueError(
            "usage: expected input_tokens and output_tokens (or prompt_tokens and completion_tokens) "
            f"on the response or its .usage, got {type(response).__name__}"
        )
    return TokenUsage(inp, out)


def _dur(d: Any) -> float:
    return float(d.seconds) + float(d.nanos) / 1e9


class Permit:
    """One permit of a session on a budget (module doc). Use as `async with`."""

    def __init__(
        self, client: ClientLink, session_id: str, budget: str, estimate: TokenUsage,
        on_queued: OnPermitQueued | None = None, timeout_s: float | None = None,
    ) -> None:  # fmt: skip
        self._client = client
        self.session_id = session_id
        self.budget = budget
        self.estimate = estimate
        self.on_queued = on_queued
        self.timeout_s = timeout_s
        self.permit_id: str | None = None
        self.queue: PermitQueue | None = None  # while waiting
        self.expires_at: float | None = None  # wall clock: settle before this
        self.settled: Settled | None = None
        self._granted: asyncio.Future[Any] | None = None

    # ------------------------------------------------------------------ asking

    def _tell(self, answer: Any) -> None:
        if isinstance(answer, pb.PermitEvent) and answer.WhichOneof("state") == "queued":
            self._queued(answer)
            return
        fut = self._granted
        if fut is not None and not fut.done():
            if isinstance(answer, BaseException):
                fut.set_exception(answer)
            else:
                fut.set_result(answer)

    def _queued(self, ev: pb.PermitEvent) -> None:
        q = ev.queued
        self.permit_id = ev.permit_id
        wait = _dur(q.estimated_wait) if q.HasField("estimated_wait") else None
        self.queue = PermitQueue(q.position, wait, q.reason)
        if self.on_queued is not None:
            self.on_queued(self.queue)

    async def request(self) -> Self:
        """Ask, and wait until granted (or refused: the typed error)."""
        loop = asyncio.get_running_loop()
        self._granted = loop.create_future()
        self._granted.add_done_callback(lambda f: f.cancelled() or f.exception())
        req = pb.RequestPermitRequest(
            session_id=self.session_id, budget=self.budget, estimate=self.estimate.pb()
        )
        transport = self._client.transport()
        timeout = self.timeout_s if self.timeout_s is not None else 10 * 365 * 86400.0

        def more(answer: Any) -> bool:
            return isinstance(answer, pb.PermitEvent) and answer.WhichOneof("state") == "queued"

        try:
            first = await transport.send_following(
                commands.REQUEST_PERMIT, req, self._client.metadata, self._tell, more, timeout
            )
            if more(first):
                self._queued(first)
                first = await asyncio.wait_for(asyncio.shield(self._granted), self.timeout_s)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from e
        except TimeoutError:
            await self.withdraw()
            raise
        self.permit_id = first.permit_id
        self.queue = None
        self.expires_at = first.granted.expires_at.seconds + first.granted.expires_at.nanos / 1e9
        return self

    # ------------------------------------------------------------------ closing

    async def _send(self, req: pb.SettlePermitRequest) -> Settled:
        try:  # through calls.py, the one layer that sends a command again (its row's tries)
            ans = await SessionCalls(self._client).send(
                commands.SETTLE_PERMIT, lambda: req, timeout=self._client.rpc_timeout_s
            )
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from e
        if ans is None:
            raise SlotschedError(f"permit {self.permit_id}: the settle's answer was lost")
        c, r = ans.charged, ans.refunded
        self.settled = Settled(
            TokenUsage(c.input_tokens, c.output_tokens, c.requests),
            TokenUsage(r.input_tokens, r.output_tokens, r.requests),
            ans.withdrawn,
            ans.orphan,
        )
        return self.settled

    def _base(self) -> pb.SettlePermitRequest:
        if self.permit_id is None:
            raise SlotschedError("the permit was not granted: nothing to settle")
        return pb.SettlePermitRequest(
            session_id=self.session_id, permit_id=self.permit_id, budget=self.budget
        )

    async def settle(self, usage: Any, headers: Any = None) -> Settled:
        """Settle with the usage the provider reported (`usage_of` reads the response), and the
        limit its rate-limit headers state (`headers`, else the response's: `ratelimits`)."""
        req = self._base()
        req.usage.CopyFrom(usage_of(usage).pb())
        if limits := stated_limits(usage, headers):
            req.provider_limits.CopyFrom(pb.ProviderLimits(**limits))
        return await self._send(req)

    async def throttled(
        self, retry_after_s: float | None = None, usage: Any = None, headers: Any = None
    ) -> Settled:
        """The provider throttled the call (HTTP 429, with its retry-after when it gave one;
        `headers`: the 429's, whose stated limit the budget adopts)."""
        req = self._base()
        req.throttled = True
        if retry_after_s is not None:
            req.retry_after.FromNanoseconds(round(retry_after_s * 1e9))
        if usage is not None:
            req.usage.CopyFrom(usage_of(usage).pb())
        if limits := stated_limits(usage, headers):
            req.provider_limits.CopyFrom(pb.ProviderLimits(**limits))
        return await self._send(req)

    async def withdraw(self) -> None:
        """Give up a permit still waiting (quietly: it may have been granted meanwhile)."""
        if self.permit_id is None:
            return
        req = self._base()
        req.withdraw = True
        with contextlib.suppress(SlotschedError):
            await self._send(req)

    async def __aenter__(self) -> Self:
        return await self.request()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.settled is None and self.permit_id is not None:
            await self.settle(self.estimate)  # the module doc: counted at its bound, now


def estimate_of(estimate: Any) -> TokenUsage:
    """`(input_tokens, max_output_tokens)`, a TokenUsage, or a dict/object usage_of reads."""
    return usage_of(estimate)


__all__ = ["OnPermitQueued", "Permit", "PermitQueue", "Settled", "TokenUsage", "estimate_of", "usage_of"]
