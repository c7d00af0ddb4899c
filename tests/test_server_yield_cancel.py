"""A yield exists for a waiter: when the waiter leaves, the holder is told `YieldCancelled`, Renew
says ACTIVE again and nothing is revoked at the old deadline. Real gRPC over loopback.

The scenario of issue 10, item 1: one slot; beta (nominal 0) holds it; alpha (nominal 1)
acquires with `wait_timeout` 1 s, so beta is asked to yield (NOMINAL); alpha is withdrawn at 1 s.
"""

from __future__ import annotations

import asyncio
import time

import grpc
from google.protobuf.duration_pb2 import Duration

from scheduler.api.gen.slotsched.v1 import common_pb2
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from tests.grpc_fixtures import TOKENS, B, Client, next_event, policy_yaml, running_server, status_of
from tests.test_server_ops import scrape

TENANTS = [
    {"name": "acme", "guaranteed": 0, "burstable": {"nominal": 1, "limit": 1}},  # alpha
    {"name": "globex", "guaranteed": 0, "burstable": {"nominal": 0, "limit": 1}},  # beta
]
GRACE_S = 2.0


def test_a_withdrawn_waiter_cancels_the_yield_it_caused() -> None:
    with running_server(policy_yaml(TENANTS, workers=1, floor=0, yield_grace_s=GRACE_S)) as srv:

        async def go() -> None:
            async with (
                Client(srv.target, token=TOKENS["acme"]) as alpha,
                Client(srv.target, token=TOKENS["globex"]) as beta,
            ):
                b = beta.acquire("beta-1", B)
                lease = (await next_event(b)).granted.lease
                renew = pb.RenewRequest(session_id="beta-1", lease_id=lease.lease_id, epoch=lease.epoch)

                a = alpha.acquire("alpha-1", B, wait_timeout=Duration(seconds=1))
                assert (await next_event(a)).WhichOneof("event") == "queued"
                ask = (await next_event(b)).yield_requested
                assert (ask.lease_id, ask.cause) == (lease.lease_id, pb.YIELD_CAUSE_NOMINAL)
                deadline = ask.deadline.seconds + ask.deadline.nanos / 1e9
                resp = await beta.scheduler.Renew(renew, metadata=beta.md)
                assert resp.state == common_pb2.LEASE_STATE_YIELDING

                # Alpha's wait_timeout withdraws it at 1 s; beta hears the yield is off.
                ended = (await next_event(a)).ended
                assert ended.reason == pb.END_REASON_WITHDRAWN and ended.session_over
                assert (await status_of(a))[0] == grpc.StatusCode.DEADLINE_EXCEEDED
                ev = await next_event(b)
                assert ev.WhichOneof("event") == "yield_cancelled", ev
                yc = ev.yield_cancelled
                assert (yc.lease_id, yc.epoch) == (lease.lease_id, lease.epoch)
                resp = await beta.scheduler.Renew(renew, metadata=beta.md)
                assert resp.state == common_pb2.LEASE_STATE_ACTIVE and not resp.HasField("yield_deadline")

                # Past the old deadline: the lease still stands (no revoke, same epoch).
                await asyncio.sleep(max(0.0, deadline - time.time()) + 0.5)
                resp = await beta.scheduler.Renew(renew, metadata=beta.md)
                assert resp.state == common_pb2.LEASE_STATE_ACTIVE
                state = await beta.scheduler.GetSession(
                    pb.GetSessionRequest(session_id="beta-1"), metadata=beta.md
                )
                assert state.state == pb.SESSION_PHASE_HOLDING and state.lease.epoch == lease.epoch

                m = scrape(srv.metrics_url)
                assert m[("slotsched_yields_cancelled_total", ())] == 1
                assert m[("slotsched_revocations_total", (("reason", "yield_deadline"),))] == 0
                assert m[("slotsched_work_lost_slot_seconds_total", ())] == 0

                # The stream's next event is the end of our own release: nothing came between.
                rel = pb.ReleaseRequest(session_id="beta-1", lease_id=lease.lease_id, epoch=lease.epoch)
                await beta.scheduler.Release(rel, metadata=beta.md)
                assert (await next_event(b)).ended.reason == pb.END_REASON_RELEASED

        asyncio.run(go())
