"""The SDK's permits over real gRPC (the Channel and the per-session rpcs), the blocking twin, and
reading the providers' usage shapes without their libraries."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from scheduler.client import AsyncClient, Client, NoQuota, PermitQueue, TokenUsage, UnknownBudget, usage_of
from scheduler.client.errors import InvalidArgument, PermitRefused
from scheduler.client.ratelimits import stated_limits
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


@pytest.mark.parametrize(
    ("response", "headers", "expected"),
    [
        (  # a raw response (httpx's, an SDK's with_raw_response): its .headers, any case
            SimpleNamespace(
                headers={
                    "Anthropic-RateLimit-Input-Tokens-Limit": "400000",
                    "anthropic-ratelimit-output-tokens-limit": "80000",
                    "anthropic-ratelimit-requests-limit": "4000",
                    "anthropic-ratelimit-tokens-limit": "80000",  # the most restrictive: not one dimension
                    "anthropic-ratelimit-input-tokens-remaining": "1000",  # not read
                }
            ),
            None,
            {"input_tokens_per_minute": 4e5, "output_tokens_per_minute": 8e4, "requests_per_minute": 4e3},
        ),
        (  # a 429's APIStatusError: its .response.headers, as pairs of bytes
            SimpleNamespace(response=SimpleNamespace(headers=[(b"x-ratelimit-limit-tokens", b"30000")])),
            None,
            {"tokens_per_minute": 3e4},
        ),
        (  # a parsed message has no headers: they are passed apart
            SimpleNamespace(usage=SimpleNamespace(input_tokens=1, output_tokens=1)),
            {"x-ratelimit-limit-requests": "500", "x-ratelimit-limit-tokens": "nonsense"},
            {"requests_per_minute": 500.0},
        ),
        ({"x-ratelimit-limit-tokens": "-1", "x-ratelimit-limit-requests": "inf"}, None, {}),
        ((10, 10), None, {}),
    ],
)
def test_the_providers_stated_limits_are_read_from_their_headers(
    response: Any, headers: Any, expected: dict[str, float]
) -> None:
    assert stated_limits(response, headers) == expected


def test_a_settle_carries_the_stated_limit_and_the_budget_adopts_it() -> None:
    """The provider states 48,000 tokens a minute where the budget configures 60,000: after one
    settle the budget's effective limit is 80% of it, no 429 needed. A server of its own: its
    budget's limit moves."""
    from scheduler.api.gen.slotsched.v1 import admin_pb2
    from tests.grpc_fixtures import ADMIN_TOKEN
    from tests.grpc_fixtures import Client as RawClient

    async def main(target: str) -> float:
        raw = SimpleNamespace(usage={"input_tokens": 5, "output_tokens": 5})
        async with (
            AsyncClient(target, TOKENS["acme"]) as client,
            client.session("stated") as s,
            s.permit(BUDGET, estimate=(10, 10), timeout_s=30) as p,
        ):
            await p.settle(raw, headers={"x-ratelimit-limit-tokens": "48000"})
        async with RawClient(target, ADMIN_TOKEN) as c:
            pool = await c.admin.DescribePool(admin_pb2.DescribePoolRequest(), metadata=c.md)
        (b,) = pool.budgets
        return b.factor

    with running_server(budget_policy_yaml(workers=4, slots_per_worker=2)) as srv:
        assert asyncio.run(main(srv.target)) == pytest.approx(0.8)


def test_a_permit_waiting_longer_than_the_silence_cut_is_not_taken_for_a_hung_replica() -> None:
    """Per-session rpcs on a client of two targets: a RequestPermit's answer comes when the wait
    is over, so its silence is the wait; it used to be cut at SILENCE_S (3 s) as a hung replica,
    tried on the other target (nothing listens there) and failed."""
    from scheduler.client import channel as sdk_channel
    from tests.fixtures_s3 import free_port

    nobody = f"127.0.0.1:{free_port()}"

    async def main(server: ServerThread) -> None:
        client = AsyncClient(f"{server.target},{nobody}", TOKENS["acme"], multiplex=False)
        async with client, client.session("patient") as s:
            loop = asyncio.get_running_loop()
            start = loop.time()
            # A server of its own: buckets start empty and refill at 1,000 tokens/s, so 5,000
            # tokens wait about 5 s.
            async with s.permit(BUDGET, estimate=(4000, 1000), timeout_s=60) as p:
                waited = loop.time() - start
                assert p.permit_id
            assert p.settled is not None
            # Proof the case was the one meant (not a timing assert on the product).
            assert waited > sdk_channel.SILENCE_S, waited

    with running_server(budget_policy_yaml(workers=1, slots_per_worker=2)) as own:
        asyncio.run(main(own))


def test_withdrawing_a_waiting_permit_ends_its_request(server: ServerThread) -> None:
    """On the Channel (where a waiting permit is told its id), `withdraw()` from another task
    while `request()` waits: the request ends PermitRefused at once (it was left waiting until
    its own timeout). Per-session rpcs tell no id while waiting: cancelling the call withdraws."""

    async def main() -> None:
        client = AsyncClient(server.target, TOKENS["acme"])
        async with client, client.session("withdraw") as s:
            told = asyncio.Event()
            p = s.permit(BUDGET, estimate=(20_000, 5_000), on_queued=lambda _q: told.set(), timeout_s=600)
            waiting = asyncio.create_task(p.request())
            await asyncio.wait_for(told.wait(), 30)
            await p.withdraw()
            with pytest.raises(PermitRefused, match="withdrawn by its session"):
                await asyncio.wait_for(waiting, 30)

    asyncio.run(main())
