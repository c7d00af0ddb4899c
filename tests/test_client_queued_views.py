"""Issue 20 item 10: a session's lease shortcuts (`.lease_id`, `.epoch`, `.worker_address`,
`.slot`) follow `.lease`: None while it is None (queued, ended), never a RuntimeError, on the
async session and its blocking twin alike.
"""

from __future__ import annotations

import asyncio

from scheduler.client import AsyncClient, AsyncSession, Client, Phase, QoS, Session
from tests.grpc_fixtures import TOKENS, policy_yaml, running_server

ACME = TOKENS["acme"]
SHORTCUTS = ("lease_id", "epoch", "worker_address", "slot")


def _views(s: AsyncSession | Session) -> dict[str, object]:
    return {name: getattr(s, name) for name in SHORTCUTS}


def _one_slot() -> str:
    return policy_yaml(workers=1, slots_per_worker=1, floor=0)


def test_a_queued_async_session_reads_none_like_its_lease() -> None:
    with running_server(_one_slot()) as server:

        async def body() -> None:
            async with AsyncClient(server.target, token=ACME) as client:
                async with client.session("holder", QoS.BURSTABLE) as holder:
                    waiter = client.session("waiter", QoS.BURSTABLE)
                    waiter.start()
                    await waiter.wait_until(lambda s: s.phase is Phase.QUEUED, 5)
                    assert waiter.lease is None
                    assert _views(waiter) == dict.fromkeys(SHORTCUTS)
                    lease = holder.lease
                    assert lease is not None
                    assert _views(holder) == {
                        "lease_id": lease.lease_id,
                        "epoch": lease.epoch,
                        "worker_address": lease.worker_address,
                        "slot": lease.slot,
                    }
                got = await waiter.wait_granted(5)  # the slot passes to the waiter
                assert waiter.slot == got.slot and waiter.lease_id == got.lease_id
                await waiter.release()
                assert waiter.lease is None and _views(waiter) == dict.fromkeys(SHORTCUTS)
                assert holder.phase is Phase.ENDED and _views(holder) == dict.fromkeys(SHORTCUTS)

        asyncio.run(body())


def test_a_queued_blocking_session_reads_none_too() -> None:
    with running_server(_one_slot()) as server, Client(server.target, token=ACME) as client:
        with client.session("holder", QoS.BURSTABLE) as holder:
            waiter = client.session("waiter", QoS.BURSTABLE)
            waiter.start()
            waiter.wait_until(lambda s: s.phase is Phase.QUEUED, 5)
            assert waiter.lease is None and _views(waiter) == dict.fromkeys(SHORTCUTS)
            assert holder.slot is not None and holder.epoch is not None
        waiter.wait_granted(5)
        assert waiter.slot is not None
        waiter.release()
