"""A session's life as its Acquire stream tells it: yield for a Guaranteed waiter and re-grant,
re-attach after a broken stream, fencing by epoch, expiry after the TTL, and a worker lost to
missed heartbeats. Real gRPC over loopback; small TTLs so the timers fire within seconds.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from scheduler.api.gen.slotsched.v1 import admin_pb2, common_pb2, workers_pb2
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb
from scheduler.grants import core_lease_id
from tests.grpc_fixtures import (
    ADMIN_TOKEN,
    BE,
    TOKENS,
    WORKER_TOKEN,
    B,
    Client,
    G,
    next_event,
    policy_yaml,
    running_server,
    status_of,
    until,
)


def kind(ev: pb.LeaseEvent) -> str:
    return str(ev.WhichOneof("event"))


def test_best_effort_yields_for_guaranteed_and_is_regranted() -> None:
    # One slot, which is the floor: idle, it is lent to BestEffort; a Guaranteed request takes it back.
    with running_server(policy_yaml(workers=1, floor=1, yield_grace_s=10)) as srv:

        async def go() -> None:
            async with (
                Client(srv.target, token=TOKENS["batch"]) as batch,
                Client(srv.target, token=TOKENS["acme"]) as acme,
            ):
                be = batch.acquire("crawler", BE)
                first = (await next_event(be)).granted.lease
                assert first.qos == BE and first.tenant == "batch" and first.session_id == "crawler"

                g = acme.acquire("responder", G)
                assert kind(await next_event(g)) == "queued"
                ask = (await next_event(be)).yield_requested
                assert ask.lease_id == first.lease_id and ask.epoch == first.epoch
                assert ask.cause == pb.YIELD_CAUSE_GUARANTEED
                assert ask.deadline.seconds >= int(time.time()) + 5

                # Re-attach while yielding: Granted replayed, then the YieldRequested again.
                be.cancel()
                be = batch.acquire("crawler", BE)
                replay = await next_event(be)
                assert replay.granted.lease.lease_id == first.lease_id
                assert replay.granted.lease.state == common_pb2.LEASE_STATE_YIELDING
                assert (await next_event(be)).yield_requested.lease_id == first.lease_id

                snap = common_pb2.SnapshotRef(
                    uri="file:///tmp/snap/crawler-1", size_bytes=42, sha256="ab" * 32
                )
                req = pb.YieldRequest(
                    session_id="crawler", lease_id=first.lease_id, epoch=first.epoch, snapshot=snap
                )
                resp = await batch.scheduler.Yield(req, metadata=batch.md)
                assert resp.position == 0

                ended = (await next_event(be)).ended
                assert ended.reason == pb.END_REASON_YIELDED and not ended.session_over
                assert kind(await next_event(be)) == "queued"
                granted_g = (await next_event(g)).granted.lease
                assert granted_g.qos == G and granted_g.slot.worker_id == first.slot.worker_id
                assert granted_g.epoch == first.epoch + 1

                # The yielded lease is fenced: its old epoch is refused.
                renew = pb.RenewRequest(session_id="crawler", lease_id=first.lease_id, epoch=first.epoch)
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await batch.scheduler.Renew(renew, metadata=batch.md)
                assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION

                # Guaranteed work done: the BestEffort session resumes from its snapshot.
                rel = pb.ReleaseRequest(
                    session_id="responder", lease_id=granted_g.lease_id, epoch=granted_g.epoch
                )
                await acme.scheduler.Release(rel, metadata=acme.md)
                assert (await next_event(g)).ended.session_over
                assert await status_of(g) == (grpc.StatusCode.OK, "")
                again = (await until(be, "granted")).granted
                assert again.lease.resume_from.uri == snap.uri
                assert again.lease.resume_from.sha256 == snap.sha256
                assert again.lease.epoch == granted_g.epoch + 1
                be.cancel()

        asyncio.run(go())


def test_broken_stream_keeps_the_lease_and_reattach_replays_granted() -> None:
    with running_server(policy_yaml()) as srv:

        async def go() -> None:
            async with (
                Client(srv.target, token=TOKENS["acme"]) as c,
                Client(srv.target, token=ADMIN_TOKEN) as admin,
            ):
                call = c.acquire("agent-7", B)
                lease = (await next_event(call)).granted.lease
                call.cancel()  # the client goes away
                await asyncio.sleep(0.2)
                leases = await admin.admin.ListLeases(admin_pb2.ListLeasesRequest(), metadata=admin.md)
                # The Admin service shows the untagged id; tenants see it tagged.
                assert lease.lease_id != core_lease_id(lease.lease_id)
                assert [x.lease_id for x in leases.leases] == [core_lease_id(lease.lease_id)]

                first = c.acquire("agent-7", B)
                replay = (await next_event(first)).granted.lease
                assert (replay.lease_id, replay.epoch, replay.slot) == (
                    lease.lease_id,
                    lease.epoch,
                    lease.slot,
                )

                # A newer stream of the same session closes the older one with ABORTED.
                second = c.acquire("agent-7", B)
                assert (await next_event(second)).granted.lease.lease_id == lease.lease_id
                code, details = await status_of(first)
                assert code == grpc.StatusCode.ABORTED, details

                state = await c.scheduler.GetSession(
                    pb.GetSessionRequest(session_id="agent-7"), metadata=c.md
                )
                assert state.state == pb.SESSION_PHASE_HOLDING and state.lease.lease_id == lease.lease_id

                rel = pb.ReleaseRequest(session_id="agent-7", lease_id=lease.lease_id, epoch=lease.epoch)
                await c.scheduler.Release(rel, metadata=c.md)
                assert (await next_event(second)).ended.reason == pb.END_REASON_RELEASED
                assert await status_of(second) == (grpc.StatusCode.OK, "")
                state = await c.scheduler.GetSession(
                    pb.GetSessionRequest(session_id="agent-7"), metadata=c.md
                )
                assert state.state == pb.SESSION_PHASE_ENDED and state.end_reason == pb.END_REASON_RELEASED

        asyncio.run(go())


def test_reattach_while_queued_replays_position() -> None:
    with running_server(policy_yaml(workers=1, floor=0)) as srv:

        async def go() -> None:
            async with Client(srv.target, token=TOKENS["acme"]) as c:
                holder = c.acquire("holder", B)
                await next_event(holder)
                waiter = c.acquire("waiter", B)
                assert (await next_event(waiter)).queued.position == 0
                waiter.cancel()
                await asyncio.sleep(0.1)
                waiter = c.acquire("waiter", B)
                assert kind(await next_event(waiter)) == "queued"  # still queued, not lost
                holder.cancel()
                waiter.cancel()

        asyncio.run(go())


def test_queued_position_updates_are_streamed() -> None:
    with running_server(policy_yaml(workers=1, floor=0)) as srv:

        async def go() -> None:
            async with Client(srv.target, token=TOKENS["acme"]) as c:
                holder = c.acquire("holder", B)
                lease = (await next_event(holder)).granted.lease
                waiters = []
                for i in range(2):
                    waiters.append(c.acquire(f"w{i}", B))
                    assert (await next_event(waiters[-1])).queued.position == i
                rel = pb.ReleaseRequest(session_id="holder", lease_id=lease.lease_id, epoch=lease.epoch)
                await c.scheduler.Release(rel, metadata=c.md)
                assert kind(await next_event(waiters[0])) == "granted"
                moved = await next_event(waiters[1], timeout=2)
                assert moved.queued.position == 0
                for w in waiters:
                    w.cancel()

        asyncio.run(go())


def test_lease_expiry_after_ttl_gives_the_slot_to_the_next_waiter() -> None:
    with running_server(policy_yaml(workers=1, floor=0, lease_ttl_s=1)) as srv:

        async def go() -> None:
            async with Client(srv.target, token=TOKENS["acme"]) as c:
                silent = c.acquire("silent", B)
                lease = (await next_event(silent)).granted.lease
                waiter = c.acquire("waiter", B)
                assert kind(await next_event(waiter)) == "queued"

                # A renewal pushes the expiry out by the TTL...
                renew = pb.RenewRequest(session_id="silent", lease_id=lease.lease_id, epoch=lease.epoch)
                renewed = await c.scheduler.Renew(renew, metadata=c.md)
                assert renewed.expires_at.ToNanoseconds() > lease.expires_at.ToNanoseconds()
                # ...then silence: the lease expires and the waiter gets the slot.
                revoked = (await next_event(silent, timeout=10)).revoked
                assert revoked.reason == pb.REVOKE_REASON_EXPIRED and revoked.lease_id == lease.lease_id
                ended = (await next_event(silent)).ended
                assert ended.reason == pb.END_REASON_EXPIRED and ended.session_over
                assert await status_of(silent) == (grpc.StatusCode.OK, "")
                granted = (await next_event(waiter, timeout=10)).granted.lease
                # Soon after the expiry, by the server's own clock (the new lease's TTL of 1 s is
                # counted from its grant): not the test's wall clock, which a busy machine stretches.
                granted_at = granted.expires_at.ToNanoseconds() / 1e9 - 1.0
                expired_at = renewed.expires_at.ToNanoseconds() / 1e9
                assert -0.01 <= granted_at - expired_at < 1.0, granted_at - expired_at
                print(f"granted {granted_at - expired_at:.3f} s after the expiry")
                assert granted.slot == lease.slot and granted.epoch == lease.epoch + 1
                err_req = pb.RenewRequest(session_id="silent", lease_id=lease.lease_id, epoch=lease.epoch)
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await c.scheduler.Renew(err_req, metadata=c.md)
                assert ei.value.code() == grpc.StatusCode.NOT_FOUND
                waiter.cancel()

        asyncio.run(go())


def test_worker_silent_for_three_heartbeats_is_removed_and_its_leases_requeued() -> None:
    with running_server(policy_yaml(workers=0, floor=0), static_pool=False, heartbeat_interval_s=0.2) as srv:

        async def go() -> None:
            async with (
                Client(srv.target, token=TOKENS["acme"]) as c,
                Client(srv.target, token=WORKER_TOKEN) as w,
                Client(srv.target, token=ADMIN_TOKEN) as admin,  # an operator may drain by hand
            ):
                reg = workers_pb2.RegisterRequest(worker_id="w1", address="10.0.0.1:7000", slots=1)
                resp = await w.workers.Register(reg, metadata=w.md)
                assert resp.heartbeat_interval.ToMilliseconds() == 200
                await w.workers.Register(reg, metadata=w.md)  # idempotent
                call = c.acquire("s", B)
                lease = (await next_event(call)).granted.lease
                assert lease.worker_address == "10.0.0.1:7000"
                hb = await w.workers.Heartbeat(workers_pb2.HeartbeatRequest(worker_id="w1"), metadata=w.md)
                assert [x.lease_id for x in hb.leases] == [core_lease_id(lease.lease_id)] and not hb.draining
                # No more heartbeats: removed after ~3 intervals, the lease revoked, the session re-queued.
                revoked = (await next_event(call, timeout=3)).revoked
                assert revoked.reason == pb.REVOKE_REASON_WORKER_REMOVED
                assert kind(await next_event(call)) == "queued"
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await w.workers.Heartbeat(workers_pb2.HeartbeatRequest(worker_id="w1"), metadata=w.md)
                assert ei.value.code() == grpc.StatusCode.NOT_FOUND
                # A new worker arrives: the queued session is granted there.
                reg2 = workers_pb2.RegisterRequest(worker_id="w2", address="10.0.0.2:7000", slots=2)
                await w.workers.Register(reg2, metadata=w.md)
                assert (await next_event(call)).granted.lease.worker_address == "10.0.0.2:7000"
                drain = workers_pb2.DrainRequest(worker_id="w2")
                drain.yield_within.FromMilliseconds(500)
                assert (await admin.workers.Drain(drain, metadata=admin.md)).leases == 1
                ask = (await next_event(call)).yield_requested
                assert ask.cause == pb.YIELD_CAUSE_DRAIN
                dereg = await admin.workers.Deregister(
                    workers_pb2.DeregisterRequest(worker_id="w2"), metadata=admin.md
                )
                assert dereg.revoked == 1
                assert (await next_event(call)).revoked.reason == pb.REVOKE_REASON_WORKER_REMOVED
                call.cancel()

        asyncio.run(go())
