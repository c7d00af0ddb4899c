"""The reference actor and its host: state that grows, round trips, verification, fallback, fencing.

Why these tests: a resume is only as good as what it proves. Each test pins one promise of
`slots/worker/actor.py` and `host.py` — the state is real bytes that grow turn by turn, a
checkpoint restores to the same hash and turn count and goes on counting, a damaged snapshot is
refused with an error naming it and the previous snapshot is used, and every loss is counted.
Local-directory store for speed, and the same corruption path through a real S3 API server.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import pytest

from scheduler.core.types import SnapshotRef
from slots.worker.actor import TRAILER_SIZE, Actor, ActorConfig, StateCorrupt, turn_chunk
from slots.worker.host import ActorHost, DataLoss, FailedPrecondition, NotFound
from slots.worker.metrics import WorkerMetrics
from snapshots.local import LocalSnapshotStore
from snapshots.s3 import S3SnapshotStore
from snapshots.store import SnapshotStore

pytest.register_assert_rewrite("tests.fixtures_s3")  # imported before pytest loads it as a plugin
from tests.fixtures_s3 import MotoServer, make_bucket  # noqa: E402

pytest_plugins = ["tests.fixtures_s3"]

T = TypeVar("T")
FAST = ActorConfig(bytes_per_turn=1000, turn_interval_s=0.01)


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await coro_fn()

    return asyncio.run(main())


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def lost(m: WorkerMetrics, reason: str) -> float:
    value = m.registry.get_sample_value("slotsched_worker_work_lost_slot_seconds_total", {"reason": reason})
    return value or 0.0


def failures(m: WorkerMetrics, reason: str) -> float:
    return m.registry.get_sample_value("slotsched_worker_resume_failures_total", {"reason": reason}) or 0.0


# ------------------------------------------------------------------------------------ the actor


def test_state_grows_turn_by_turn_with_deterministic_chunks() -> None:
    a = Actor("sess-1", 100)
    sizes = [a.state_size]
    for _ in range(5):
        a.take_turn()
        sizes.append(a.state_size)
    assert sizes == [TRAILER_SIZE + 100 * n for n in range(6)]
    assert a.turns == 5
    assert bytes(a.history) == b"".join(turn_chunk("sess-1", t, 100) for t in range(5))
    state = a.state_bytes()
    assert a.state_sha256() == hashlib.sha256(state).hexdigest()
    assert b"".join(a.state_chunks(chunk_size=64)) == state
    # Another session writes other bytes.
    b = Actor("sess-2", 100)
    b.take_turn()
    assert bytes(b.history) != bytes(a.history[:100])


def test_state_chunks_lend_read_only_views_and_a_view_kept_does_not_block_a_turn() -> None:
    a = Actor("sess-1", 100)
    for _ in range(3):
        a.take_turn()
    chunks = list(a.state_chunks(chunk_size=64))
    assert all(isinstance(c, memoryview) and c.readonly for c in chunks[:-1])  # no copy of the history
    assert b"".join(chunks) == a.state_bytes()
    # A view still held (say by a failed upload's traceback) pins the bytearray; the turn grows a copy.
    kept = chunks[0]
    del chunks
    a.take_turn()
    assert a.turns == 4 and a.state_sha256() == hashlib.sha256(a.state_bytes()).hexdigest()
    assert bytes(kept) == turn_chunk("sess-1", 0, 100)[:64]  # the view still sees what it lent


def test_restore_round_trip_keeps_hash_and_counts_on() -> None:
    a = Actor("sess-1", 256)
    for _ in range(7):
        a.take_turn()
    state, sha = a.state_bytes(), a.state_sha256()
    r = Actor.restore(state, "sess-1", "file:///snap/1.snap", sha)
    assert (r.turns, r.state_sha256(), r.bytes_per_turn) == (7, sha, 256)
    r.take_turn()
    a.take_turn()
    assert r.turns == 8
    assert bytes(r.history) == bytes(a.history)  # the same conversation as if never interrupted


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda s: s[:-1] + bytes([s[-1] ^ 1]), "sha256"),  # one flipped bit, caught by the hash
        (lambda s: s[:10], "shorter than"),
    ],
)
def test_restore_refuses_damaged_state_naming_the_snapshot(
    damage: Callable[[bytes], bytes], message: str
) -> None:
    a = Actor("sess-1", 64)
    for _ in range(3):
        a.take_turn()
    uri = "s3://bucket/t/sess-1/000000000000001-abcdef012345.snap"
    with pytest.raises(StateCorrupt, match=message) as info:
        Actor.restore(damage(a.state_bytes()), "sess-1", uri, a.state_sha256())
    assert info.value.uri == uri and uri in str(info.value)


def test_restore_checks_internal_consistency_even_when_the_hash_matches() -> None:
    a = Actor("sess-1", 64)
    for _ in range(3):
        a.take_turn()
    state = bytearray(a.state_bytes())
    state[5] ^= 0xFF  # forge turn 0 and hand over a matching hash, as a buggy store might
    forged = bytes(state)
    with pytest.raises(StateCorrupt, match="turn 0"):
        Actor.restore(forged, "sess-1", "file:///x.snap", hashlib.sha256(forged).hexdigest())
    with pytest.raises(StateCorrupt, match="another session"):
        Actor.restore(a.state_bytes(), "sess-OTHER", "file:///x.snap", a.state_sha256())
    truncated = a.state_bytes()[32:]  # history length no longer matches the trailer
    with pytest.raises(StateCorrupt, match="history bytes"):
        Actor.restore(truncated, "sess-1", "file:///x.snap")


# ------------------------------------------------------------------------------------ the host


def _host(store: SnapshotStore, slots: int = 2, **kw: object) -> ActorHost:
    return ActorHost("w1", slots, store, FAST, WorkerMetrics(), **kw)  # type: ignore[arg-type]


def test_checkpoint_restore_on_another_slot(tmp_path: Path) -> None:
    async def go() -> None:
        host = _host(LocalSnapshotStore(tmp_path))
        started = await host.start("s1", "acme", 0, "lease-1", 1)
        assert started.turns == 0
        await until(lambda: (a := host.running("s1")) is not None and a.turns >= 5)
        ref = await host.checkpoint("s1")
        assert await host.stop("s1")
        actor_turns = (ref.size_bytes - TRAILER_SIZE) // FAST.bytes_per_turn
        assert Path(urlsplit(ref.uri).path).exists()

        res = await host.start("s1", "acme", 1, "lease-2", 2, resume_from=ref)
        assert res.turns == actor_turns and res.state_sha256 == ref.sha256
        assert res.restored_from == ref and res.refused == ()
        assert host.metrics.resumes_verified_total() == 1
        await until(lambda: (a := host.running("s1")) is not None and a.turns > actor_turns)
        assert host.metrics.work_lost_total() == 0.0  # yield, stop, resume: nothing lost
        await host.aclose()

    run(go)


def test_checkpoint_is_consistent_and_pushes_the_next_turn_back(tmp_path: Path) -> None:
    async def go() -> None:
        cfg = ActorConfig(bytes_per_turn=1000, turn_interval_s=0.2)
        host = ActorHost("w1", 1, LocalSnapshotStore(tmp_path), cfg, WorkerMetrics())
        await host.start("s1", "acme", 0, "l1", 1)
        await until(lambda: (a := host.running("s1")) is not None and a.turns >= 1, timeout=2)
        actor = host.running("s1")
        assert actor is not None
        ref = await host.checkpoint("s1")
        turns_at_checkpoint = actor.turns
        assert ref.sha256 == actor.state_sha256()  # nothing moved while the store read it
        await asyncio.sleep(0.1)  # less than one interval after the checkpoint
        assert actor.turns == turns_at_checkpoint
        await host.aclose()

    run(go)


def test_corrupted_snapshot_refused_naming_it_and_previous_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slotsched.worker")

    async def go() -> None:
        store = LocalSnapshotStore(tmp_path)
        host = _host(store)
        await host.start("s1", "acme", 0, "l1", 1)
        await until(lambda: (a := host.running("s1")) is not None and a.turns >= 3)
        first = await host.checkpoint("s1")
        await until(lambda: (a := host.running("s1")) is not None and a.turns >= 10)
        second = await host.checkpoint("s1")
        await host.stop("s1")
        path = Path(urlsplit(second.uri).path)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))  # bit rot in the newest snapshot

        res = await host.start("s1", "acme", 1, "l2", 2, resume_from=second)
        assert res.restored_from == first
        assert res.state_sha256 == first.sha256
        assert res.turns == (first.size_bytes - TRAILER_SIZE) // FAST.bytes_per_turn
        assert [uri for uri, _ in res.refused] == [second.uri]
        assert second.uri in res.refused[0][1]
        m = host.metrics
        assert failures(m, "corrupt") == 1
        assert m.resumes_verified_total() == 1  # the previous snapshot, verified
        assert lost(m, "snapshot_refused") > 0  # the turns between the two snapshots
        await host.aclose()

    run(go)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("refused snapshot" in e and "s1" in e for e in errors), errors
    warnings = [r.getMessage() for r in caplog.records if "work lost" in r.getMessage()]
    assert any("session s1" in w and "slot-seconds" in w for w in warnings), warnings


def test_strict_restore_fails_with_data_loss_naming_the_ref(tmp_path: Path) -> None:
    async def go() -> None:
        host = _host(LocalSnapshotStore(tmp_path), fallback=False)
        await host.start("s1", "acme", 0, "l1", 1)
        ref = await host.checkpoint("s1")
        await host.stop("s1")
        bad = SnapshotRef(ref.uri, ref.size_bytes, "0" * 64, ref.created)
        with pytest.raises(DataLoss, match=ref.uri):
            await host.start("s1", "acme", 0, "l2", 2, resume_from=bad)
        missing = SnapshotRef(ref.uri.replace(".snap", "0.snap"), 10, "0" * 64)
        with pytest.raises(NotFound):
            await host.start("s1", "acme", 0, "l3", 3, resume_from=missing)
        await host.aclose()

    run(go)


def test_no_good_snapshot_starts_fresh_and_counts_the_loss(tmp_path: Path) -> None:
    async def go() -> None:
        host = _host(LocalSnapshotStore(tmp_path))
        await host.start("s1", "acme", 0, "l1", 1)
        await until(lambda: (a := host.running("s1")) is not None and a.turns >= 3)
        ref = await host.checkpoint("s1")
        await host.stop("s1")
        Path(urlsplit(ref.uri).path).write_bytes(b"garbage")
        res = await host.start("s1", "acme", 0, "l2", 2, resume_from=ref)
        assert res.turns == 0 and res.restored_from is None
        assert lost(host.metrics, "snapshot_refused") > 0
        await host.aclose()

    run(go)


def test_resuming_from_an_older_snapshot_counts_the_newer_work_as_lost(tmp_path: Path) -> None:
    async def go() -> None:
        host = _host(LocalSnapshotStore(tmp_path))
        await host.start("s1", "acme", 0, "l1", 1)
        await until(lambda: (a := host.running("s1")) is not None and a.turns >= 2)
        old = await host.checkpoint("s1")
        await until(lambda: (a := host.running("s1")) is not None and a.turns >= 8)
        await host.checkpoint("s1")  # written, but (say) the yield came too late to use it
        await host.stop("s1")
        res = await host.start("s1", "acme", 1, "l2", 2, resume_from=old)
        assert res.state_sha256 == old.sha256
        assert lost(host.metrics, "snapshot_superseded") > 0
        await host.aclose()

    run(go)


def test_any_session_id_gets_a_store_name(tmp_path: Path) -> None:
    async def go() -> None:
        host = _host(LocalSnapshotStore(tmp_path))
        sid = "user 42/chat #7"  # not a valid path segment
        await host.start(sid, "acme", 0, "l1", 1)
        await until(lambda: (a := host.running(sid)) is not None and a.turns >= 2)
        ref = await host.checkpoint(sid)
        await host.stop(sid)
        res = await host.start(sid, "acme", 1, "l2", 2, resume_from=ref)
        assert res.state_sha256 == ref.sha256
        await host.aclose()

    run(go)


def test_fencing_by_epoch_and_by_heartbeat(tmp_path: Path) -> None:
    async def go() -> None:
        host = _host(LocalSnapshotStore(tmp_path))
        await host.start("a", "acme", 0, "la", 5)
        again = await host.start("a", "acme", 0, "la", 5)  # idempotent
        assert again.already_running
        with pytest.raises(FailedPrecondition, match="older"):
            await host.start("b", "acme", 0, "lb", 4)
        with pytest.raises(FailedPrecondition, match="runs session 'a'"):
            await host.start("b", "acme", 0, "lb", 5)
        with pytest.raises(FailedPrecondition, match="out of range"):
            await host.start("b", "acme", 7, "lb", 1)
        await asyncio.sleep(0.05)
        await host.start("b", "acme", 0, "lb", 6)  # slot granted again: a's lease is gone
        assert host.running("a") is None
        fenced_once = lost(host.metrics, "fenced")
        assert fenced_once > 0

        await host.start("c", "acme", 1, "lc", 1)
        await asyncio.sleep(0.02)
        stopped = host.fence([(0, "lb", 6)], since=asyncio.get_running_loop().time() + 1e9)
        assert stopped == ["c"] and host.running("b") is not None
        assert lost(host.metrics, "fenced") > fenced_once
        assert host.highest_epoch[0] == 6
        await host.aclose()

    run(go)


def test_s3_corrupted_object_refused_and_previous_used(s3_server: str, s3_bucket: str) -> None:
    async def go() -> None:
        store = S3SnapshotStore(s3_bucket, prefix="snaps", endpoint_url=s3_server, region="us-east-1")
        host = _host(store)
        await host.start("s1", "acme", 0, "l1", 1)
        await until(lambda: (a := host.running("s1")) is not None and a.turns >= 3)
        first = await host.checkpoint("s1")
        await until(lambda: (a := host.running("s1")) is not None and a.turns >= 6)
        second = await host.checkpoint("s1")
        await host.stop("s1")
        key = urlsplit(second.uri).path.lstrip("/")
        client = store.client
        head = client.head_object(Bucket=s3_bucket, Key=key)
        body = bytearray(client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
        body[3] ^= 0x01
        client.put_object(Bucket=s3_bucket, Key=key, Body=bytes(body), Metadata=head["Metadata"])

        res = await host.start("s1", "acme", 1, "l2", 2, resume_from=second)
        assert res.restored_from is not None and res.restored_from.uri == first.uri
        assert res.state_sha256 == first.sha256
        assert res.refused and res.refused[0][0] == second.uri and second.uri in res.refused[0][1]
        assert failures(host.metrics, "corrupt") == 1
        await host.aclose()

    run(go)


def test_late_checkpoint_is_abandoned_deleted_and_not_counted_as_saved(fresh_s3_server: MotoServer) -> None:
    """S3 hangs (SIGSTOP) during a yield checkpoint: the caller's deadline passes, the snapshot
    nobody holds a ref to is removed once the store answers again, and the actor's work since its
    start still counts as unsaved when its lease goes."""
    s3 = fresh_s3_server
    bucket = make_bucket(s3.endpoint_url)
    store = S3SnapshotStore(
        bucket, endpoint_url=s3.endpoint_url, region="us-east-1", read_timeout=3, max_attempts=1
    )

    async def go() -> None:
        host = _host(store)
        await host.start("s1", "acme", 0, "l1", 1)
        await until(lambda: (a := host.running("s1")) is not None and a.turns >= 3)
        s3.pause()
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(host.checkpoint("s1"), 0.5)
        finally:
            s3.resume()
        await until(lambda: not store.list("acme", "s1"), timeout=10)  # written late, then deleted
        assert host.fence([], since=float("inf")) == ["s1"]
        assert lost(host.metrics, "fenced") >= 0.5  # since the start: the late snapshot saved nothing
        await host.aclose()

    run(go)
