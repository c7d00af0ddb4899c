"""Issue 20 item 11: a frozen leader (SIGSTOP: its connections stay open and never answer) no
longer holds the SDK until it wakes. Leader and hot standby are `slotsched serve --state redis://`
subprocesses on a redis-server of our own; the SDK is given both addresses. While the leader is
stopped, a Release on its open Channel, the re-attach of a holder and a session started at the
freeze all complete on the standby soon after it serves (keepalive's ping timeout; the channel's
silence bound), well before the 12 s freeze ends.

The bound asserted is generous (4 s after the standby serves, twice the "about two seconds"
asked); bench/frozen_leader.py measures it. The freeze itself is long (30 s; SIGCONT follows as
soon as the client is done), so that on a busy machine the standby's take-over is not raced
against the old leader waking: what is asserted is that the client is done on the standby
before that, within the bound after the standby serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time

import pytest

from scheduler.client import AsyncClient, Phase, QoS
from tests.grpc_fixtures import TOKENS, policy_yaml, write_policy
from tests.test_state_redis import NOT_SERVING, REDIS_BIN, SERVING, RedisProc, Sched

ACME = TOKENS["acme"]
FREEZE_S = 30.0
AFTER_SERVING_S = 4.0

pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_BIN) and not os.environ.get("CI"), reason="redis-server not installed"
)


@pytest.mark.slow
@pytest.mark.parametrize("multiplex", [True, False])
def test_a_frozen_leaders_client_carries_on_against_the_standby(multiplex: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="slotsched-frozen-") as d:
        r = RedisProc(d).start()
        policy = write_policy(d, policy_yaml(workers=2, slots_per_worker=2, floor=0, lease_ttl_s=30))
        a = Sched(policy, r.url, "a", ttl=1.0)
        started = [a]
        try:
            a.wait_health(SERVING)
            b = Sched(policy, r.url, "b", ttl=1.0)
            started.append(b)
            b.wait_health(NOT_SERVING)

            async def body() -> None:
                async with AsyncClient([a.target, b.target], token=ACME, multiplex=multiplex) as client:
                    leaving, staying = client.session("leaving", QoS.BURSTABLE), client.session("staying")
                    await leaving.wait_granted(10)
                    await staying.wait_granted(10)
                    kept = (staying.lease_id, staying.epoch)
                    a.proc.send_signal(signal.SIGSTOP)
                    frozen = time.monotonic()
                    try:
                        release = asyncio.create_task(leaving.release())
                        fresh = client.session("fresh", QoS.BURSTABLE)
                        granted = asyncio.create_task(fresh.wait_granted(FREEZE_S))
                        # Polled in a thread: a blocking Check on this loop would stall the SDK
                        # (its keepalive, its re-attach) for up to a second at each poll.
                        while await asyncio.to_thread(b.health) != SERVING:
                            assert time.monotonic() - frozen < FREEZE_S - AFTER_SERVING_S, (
                                "standby never served"
                            )
                            await asyncio.sleep(0.02)
                        serving = time.monotonic()
                        await asyncio.wait_for(release, AFTER_SERVING_S)
                        await asyncio.wait_for(granted, AFTER_SERVING_S)
                        await staying.wait_until(lambda s: s.reattaches >= 1 and s.lease is not None, 4)
                        done = time.monotonic()
                        assert leaving.end_reason == "released", leaving.end_reason
                        assert (staying.lease_id, staying.epoch) == kept and not staying.lost_lease.is_set()
                        assert fresh.phase is Phase.HOLDING and client.leader == b.target
                        assert done - frozen < FREEZE_S, done - frozen  # while the leader is still stopped
                        print(
                            f"\nfrozen leader: the standby served {serving - frozen:.2f} s after the freeze; "
                            f"release, new grant and re-attach done {done - serving:.2f} s after that"
                        )
                    finally:
                        a.proc.send_signal(signal.SIGCONT)
                    # Woken, the old leader finds its lease taken and steps down.
                    await asyncio.to_thread(a.wait_health, NOT_SERVING)
                    await fresh.release()
                    await staying.release()

            asyncio.run(body())
        finally:
            for s in started:
                with contextlib.suppress(OSError):
                    s.proc.send_signal(signal.SIGCONT)
                s.kill()
            r.kill()
            for s in started:
                with contextlib.suppress(OSError):
                    os.unlink(s.log.name)
