"""A session released while its stream is detached, after the server moved it to a new lease.

What bench/failover.py saw after a leader kill (`StaleLease: lease local-28/0#6 epoch 6 is stale:
session alpha/alpha-1437 holds local-19/1#6`): the leader applied the session's Yield and
re-granted it a new lease, then died before answering; on the new leader the session's Release
quoted the old lease while its stream had not re-attached yet (nothing told it of the new one).
The server was right (its state is the journal's); the SDK gave up with StaleLease and left the
new lease held until it expired. Now it reads the session's lease (GetSession) and releases that.

Here the server stays up: a cut connection detaches the stream (a long re-attach backoff keeps it
detached), and the Yield is sent on another connection, as the dead leader had applied it.
"""

from __future__ import annotations

import asyncio

import pytest

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from scheduler.client import AsyncClient, Phase, QoS
from tests.grpc_fixtures import TOKENS, Client, policy_yaml, running_server
from tests.test_client_sdk import CuttableProxy

ACME = TOKENS["acme"]


@pytest.mark.parametrize("multiplex", [True, False], ids=["channel", "per-session"])
def test_a_release_while_detached_releases_the_lease_the_server_moved_the_session_to(
    multiplex: bool,
) -> None:
    policy = policy_yaml(workers=1, slots_per_worker=1, floor=0, lease_ttl_s=30)
    with running_server(policy) as server:

        async def body() -> None:
            proxy = await CuttableProxy(server.port).start()
            try:
                async with (
                    AsyncClient(
                        f"127.0.0.1:{proxy.port}", token=ACME, backoff_initial_s=5.0, multiplex=multiplex
                    ) as client,
                    AsyncClient(server.target, token=ACME) as direct,
                    Client(server.target, ACME) as raw,
                ):
                    s = client.session("moved", QoS.BURSTABLE)
                    old = await s.wait_granted(5)
                    assert proxy.cut() >= 1
                    await s.wait_until(lambda s: not s._attached, 5)
                    # The Yield the dying leader applied: the session is re-granted the free slot.
                    lid, epoch = old.lease_id, old.epoch
                    req = scheduler_pb2.YieldRequest(session_id="moved", lease_id=lid, epoch=epoch)
                    await raw.scheduler.Yield(req, metadata=raw.md, timeout=5)
                    now = await direct.get_session("moved")
                    assert now.lease is not None and now.lease.epoch > old.epoch
                    assert not s._attached and s.lease == old  # the SDK has not heard of it

                    await s.release()  # before: StaleLease, the new lease held until it expired

                    after = await direct.get_session("moved")
                    assert after.phase is Phase.ENDED and after.end_reason == "released"
                    nxt = direct.session("next", QoS.BURSTABLE)  # the one slot is free again
                    await nxt.wait_granted(5)
                    await nxt.release()
            finally:
                await proxy.close()

        asyncio.run(body())
