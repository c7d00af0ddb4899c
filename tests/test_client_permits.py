"""The SDK's permits over real gRPC (the Channel and the per-session rpcs), the blocking twin, and
reading the providers' usage shapes without their libraries."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from scheduler.client import AsyncClient, Client, NoQuota, PermitQueue, TokenUsage, UnknownBudget, usage_of
from scheduler.client.errors import InvalidArgument
from tests.budget_fixtures import BUDGET, budget_policy_yaml
from tests.grpc_fixtures import TOKENS, ServerThread, running_server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_server(budget_policy_yaml(workers=4, slots_per_worker=2)) as s:
        yield s


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (SimpleNamespace(usage=SimpleNamespace(input_tokens=12, output_tokens=3)), (12, 3)),  # Anthropic
        ({"usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}, (7, 2)),  # OpenAI dict
        (SimpleNamespace(usage=SimpleNamespace(prompt_tokens=5, completion_tokens=1)), (5, 1)),
        ({"usage_metadata": {"prompt_token_count": 4, "candidates_token_count": 6}}, (4, 6)),  # Gemini
        ({"input_tokens": 1, "output_tokens": 1}, (1, 1)),  # a usage itself
        ((100, 50), (100, 50)),
        (TokenUsage(3, 4), (3, 4)),
    ],
)
def test_usage_is_read_from_the_common_shapes(response: Any, expected: tuple[float, float]) -> None:
    u = usage_of(response)
    assert (u.input_tokens, u.output_tokens) == expected


def test_a_response_without_usage_is_named() -> None:
    with pytest.raises(ValueError, match="usage: expected input_tokens and output_tokens"):
        usage_of({"choices": []})


@pytest.mark.parametrize("multiplex", [True, False], ids=["channel", "rpcs"])
def test_a_permit_waits_is_granted_and_settles_from_the_response(
    server: ServerThread, multiplex: bool
) -> None:
    async def main() -> None:
        client = AsyncClient(server.target, TOKENS["acme"], multiplex=multiplex)
        async with client, client.session(f"p-{multiplex}") as s:
            seen: list[PermitQueue] = []
            # 5,000 tokens: every bucket starts empty, so it waits (on the Channel: told so).
            async with s.permit(BUDGET, estimate=(4000, 1000), on_queued=seen.append, timeout_s=30) as p:
                assert p.permit_id and p.queue is None
                done = await p.settle({"usage": {"prompt_tokens": 3000, "completion_tokens": 200}})
            assert (done.charged.input_tokens, done.charged.output_tokens) == (3000, 200)
            assert (done.refunded.input_tokens, done.refunded.output_tokens) == (1000, 800)
            if multiplex:
                assert seen and seen[0].reason in ("budget_exhausted", "tenant_budget"), seen
            async with s.permit(BUDGET, estimate=(10, 10), timeout_s=30) as q:
                pass  # left without settling: settled with the estimate
            assert q.settled is not None and q.settled.charged.input_tokens == 10

    asyncio.run(main())


def test_refusals_are_typed(server: ServerThread) -> None:
    async def main() -> None:
        async with (
            AsyncClient(server.target, TOKENS["acme"]) as client,
            AsyncClient(server.target, TOKENS["batch"]) as batch,
        ):
            async with client.session("typed") as s:
                with pytest.raises(UnknownBudget, match="unknown budget 'nope'"):
                    await s.permit("nope", estimate=(1, 1)).request()
                with pytest.raises(InvalidArgument, match=r"estimate\.input_tokens"):
                    await s.permit(BUDGET, estimate=(-5, 1)).request()
            async with batch.session("typed", "BEST_EFFORT") as b:
                with pytest.raises(NoQuota):
                    await b.permit(BUDGET, estimate=(1, 1)).request()

    asyncio.run(main())


def test_the_blocking_client_settles_a_permit(server: ServerThread) -> None:
    with Client(server.target, TOKENS["globex"]) as client, client.session("sync-p") as s:
        with s.permit(BUDGET, estimate=(100, 100), timeout_s=30) as p:
            done = p.settle(SimpleNamespace(usage=SimpleNamespace(input_tokens=60, output_tokens=40)))
        assert done.charged.input_tokens == 60 and p.permit_id
