"""One contract suite for every `SnapshotStore` backend, plus the fault tests each backend needs.

Why one suite: the scheduler only knows the `SnapshotStore` protocol, so whatever the local directory
store guarantees, the S3 store must guarantee too (and vice versa). Every test in the first part runs
against both backends; the S3 one talks HTTP to a real moto server (tests/fixtures_s3.py). Corruption
is injected behind the store's back through the backend's own storage (a file write, a boto3
put_object), the way a bad disk or a stray writer would.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import botocore.exceptions
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.types import SnapshotRef
from snapshots.config import store_from_url
from snapshots.errors import (
    ChecksumMismatch,
    SnapshotError,
    SnapshotNotFound,
    SnapshotUnavailable,
    TenantMismatch,
)
from snapshots.local import LocalSnapshotStore
from snapshots.s3 import S3SnapshotStore
from snapshots.store import SnapshotStore

pytest.register_assert_rewrite("tests.fixtures_s3")  # imported here before pytest loads it as a plugin
from tests.fixtures_s3 import MotoServer, make_bucket, s3_client  # noqa: E402

pytest_plugins = ["tests.fixtures_s3"]

MiB = 1 << 20
PART = 5 * MiB  # the S3 store under test uses a 5 MiB multipart threshold and part size


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def chunked(data: bytes, step: int = 256 * 1024) -> Iterator[bytes]:
    for i in range(0, len(data), step):
        yield data[i : i + step]


def s3_key(ref: SnapshotRef) -> str:
    return urlsplit(ref.uri).path.lstrip("/")


def local_path(ref: SnapshotRef) -> Path:
    return Path(unquote(urlsplit(ref.uri).path))


@dataclass
class Backend:
    name: str
    store: SnapshotStore
    corrupt: Callable[[SnapshotRef, bytes], None]  # overwrite the stored bytes behind the store's back
    leftovers: Callable[[], list[str]]  # everything physically stored (files, objects, open uploads)


def _local_backend(root: Path) -> Backend:
    def corrupt(ref: SnapshotRef, data: bytes) -> None:
        local_path(ref).write_bytes(data)

    def leftovers() -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    return Backend("local", LocalSnapshotStore(root), corrupt, leftovers)


def _s3_backend(endpoint_url: str, bucket: str) -> Backend:
    store = S3SnapshotStore(
        bucket,
        prefix="snaps/v1",
        endpoint_url=endpoint_url,
        region="us-east-1",
        multipart_threshold=PART,
        connect_timeout=2,
        read_timeout=10,
        max_attempts=2,
    )
    raw = s3_client(endpoint_url)

    def corrupt(ref: SnapshotRef, data: bytes) -> None:
        head = raw.head_object(Bucket=bucket, Key=s3_key(ref))
        raw.put_object(Bucket=bucket, Key=s3_key(ref), Body=data, Metadata=head["Metadata"])

    def leftovers() -> list[str]:
        objects = [o["Key"] for o in raw.list_objects_v2(Bucket=bucket).get("Contents", [])]
        uploads = [f"upload:{u['Key']}" for u in raw.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
        return sorted(objects + uploads)

    return Backend("s3", store, corrupt, leftovers)


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        return _local_backend(tmp_path / "snapshots")
    endpoint = request.getfixturevalue("s3_server")
    return _s3_backend(endpoint, request.getfixturevalue("s3_bucket"))


# --- the contract -------------------------------------------------------------------------------


def test_is_a_snapshot_store(backend: Backend) -> None:
    assert isinstance(backend.store, SnapshotStore)


@pytest.mark.parametrize("size", [0, 1, 3 * MiB, 12 * MiB], ids=["empty", "1B", "3MiB", "12MiB"])
def test_round_trip_bytes_and_stream(backend: Backend, size: int) -> None:
    data = payload(size, seed=size)
    ref = backend.store.put("acme", "sess-1", chunked(data), created=1_700_000_000.25)

    assert ref.size_bytes == size
    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert ref.created == 1_700_000_000.25
    assert ref.uri.startswith("file://" if backend.name == "local" else "s3://")
    assert "/acme/sess-1/" in ref.uri
    assert backend.store.get(ref, "acme") == data
    stream = backend.store.open(ref, "acme")
    parts = list(stream)
    assert b"".join(parts) == data
    assert all(len(p) <= 4 * MiB for p in parts)  # streamed, not one big read


def test_put_accepts_any_chunking_and_rounds_created_to_ms(backend: Backend) -> None:
    data = payload(1000, seed=7)
    one = backend.store.put("acme", "s", [data], created=10.0004)
    many = backend.store.put("acme", "s", [bytes([b]) for b in data] + [b""], created=10.0016)
    assert one.sha256 == many.sha256 == hashlib.sha256(data).hexdigest()
    assert (one.created, many.created) == (10.0, 10.002)
    assert one.uri != many.uri
    assert backend.store.get(many, "acme") == data


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.binary(max_size=4096), cuts=st.lists(st.integers(0, 4096), max_size=8))
def test_chunk_boundaries_do_not_matter(backend: Backend, data: bytes, cuts: list[int]) -> None:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    chunks = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    ref = backend.store.put("acme", "prop", chunks)
    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert backend.store.get(ref, "acme") == data
    backend.store.delete(ref, "acme")


def test_list_is_newest_last_and_per_session(backend: Backend) -> None:
    store = backend.store
    assert store.list("acme", "never-written") == []
    t0 = 1_700_000_000.0
    refs = {}
    for offset in (2.0, 0.0, 3.5, 1.0):  # written out of order
        refs[offset] = store.put("acme", "s1", [f"state@{offset}".encode()], created=t0 + offset)
    store.put("acme", "s2", [b"other session"], created=t0 + 9)
    store.put("globex", "s1", [b"other tenant"], created=t0 + 9)

    listed = store.list("acme", "s1")
    assert listed == [refs[k] for k in sorted(refs)]  # equal refs: uri, size, sha256, created
    assert [r.created for r in listed] == sorted(r.created for r in listed)
    assert len(store.list("acme", "s2")) == 1
    assert len(store.list("globex", "s1")) == 1


def test_retention_keeps_the_last_n(backend: Backend) -> None:
    store = backend.store
    refs = [store.put("acme", "s1", [b"v%d" % i], created=100.0 + i) for i in range(5)]
    other = store.put("acme", "s2", [b"keep me"], created=50.0)

    assert store.retain("acme", "s1", keep=2) == 3
    assert store.list("acme", "s1") == refs[-2:]
    assert store.retain("acme", "s1", keep=2) == 0
    for gone in refs[:3]:
        with pytest.raises(SnapshotNotFound):
            store.get(gone, "acme")
    assert store.retain("acme", "s1", keep=10) == 0
    assert store.retain("acme", "s1", keep=0) == 2
    assert store.list("acme", "s1") == []
    assert store.list("acme", "s2") == [other]
    assert store.retain("acme", "empty", keep=1) == 0
    with pytest.raises(ValueError, match="keep"):
        store.retain("acme", "s1", keep=-1)


def test_delete_is_idempotent(backend: Backend) -> None:
    store = backend.store
    ref = store.put("acme", "s1", [b"bye"])
    keep = store.put("acme", "s1", [b"stay"], created=ref.created + 1)
    store.delete(ref, "acme")
    with pytest.raises(SnapshotNotFound):
        store.get(ref, "acme")
    store.delete(ref, "acme")  # again: no error
    assert store.list("acme", "s1") == [keep]


def test_not_found_names_the_ref(backend: Backend) -> None:
    real = backend.store.put("acme", "s1", [b"x"], created=1.0)
    missing = SnapshotRef(real.uri.replace("000000000001000-", "000000000002000-"), 1, real.sha256, 2.0)
    for read in (backend.store.get, backend.store.open):
        with pytest.raises(SnapshotNotFound) as err:
            read(missing, "acme")  # open raises at the call, before iteration
        assert missing.uri in str(err.value)
        assert err.value.ref == missing


def test_checksum_mismatch_is_refused_and_names_the_ref(backend: Backend) -> None:
    store = backend.store
    data = payload(64 * 1024, seed=3)
    ref = store.put("acme", "s1", chunked(data, 4096))
    tampered = bytearray(data)
    tampered[1000] ^= 0xFF
    backend.corrupt(ref, bytes(tampered))

    with pytest.raises(ChecksumMismatch) as err:
        store.get(ref, "acme")
    assert ref.uri in str(err.value)
    assert err.value.ref == ref
    assert err.value.expected == ref.sha256
    assert err.value.actual == hashlib.sha256(tampered).hexdigest()

    stream = store.open(ref, "acme")
    with pytest.raises(ChecksumMismatch, match=ref.uri):
        for _ in stream:
            pass

    # A ref whose recorded hash is wrong is refused too, even though the stored bytes are intact.
    good = store.put("acme", "s1", [b"intact"], created=ref.created + 1)
    forged = SnapshotRef(good.uri, good.size_bytes, "0" * 64, good.created)
    with pytest.raises(ChecksumMismatch, match=good.uri):
        store.get(forged, "acme")


def test_refs_outside_the_callers_tenant_are_refused(backend: Backend) -> None:
    store = backend.store
    ref = store.put("acme", "s1", [b"acme's secret"])
    escape = SnapshotRef(ref.uri.replace("/acme/", "/globex/../acme/"), ref.size_bytes, ref.sha256)
    foreign_scheme = SnapshotRef(
        ("s3://bucket/" if backend.name == "local" else "file:///tmp/")
        + "acme/s1/"
        + ref.uri.rsplit("/", 1)[1]
    )
    for bad_ref in (ref, escape):
        for call in (store.get, store.open, store.delete):
            with pytest.raises(TenantMismatch) as err:
                call(bad_ref, "globex")
            assert bad_ref.uri in str(err.value) and "globex" in str(err.value)
    with pytest.raises(TenantMismatch):
        store.get(escape, "acme")
    with pytest.raises(TenantMismatch):
        store.get(foreign_scheme, "acme")
    assert store.get(ref, "acme") == b"acme's secret"  # the refused delete deleted nothing


@pytest.mark.parametrize("bad", ["", "a/b", "..", ".", ".hidden", "a b", "x\x00y", "a\\b", "é"])
def test_invalid_names_are_refused(backend: Backend, bad: str) -> None:
    store = backend.store
    with pytest.raises(ValueError, match="name"):
        store.put(bad, "s1", [b"x"])
    with pytest.raises(ValueError, match="name"):
        store.put("acme", bad, [b"x"])
    with pytest.raises(ValueError, match="name"):
        store.list("acme", bad)
    with pytest.raises(ValueError, match="name"):
        store.retain(bad, "s1", 1)
    ref = store.put("acme", "s1", [b"x"])
    with pytest.raises(ValueError, match="name"):
        store.get(ref, bad)


def _failing_after(data: bytes, fail_at: int, on_reach: Callable[[], None] | None = None) -> Iterator[bytes]:
    sent = 0
    for chunk in chunked(data, MiB):
        if sent >= fail_at:
            if on_reach is not None:
                on_reach()
            raise RuntimeError("actor crashed mid-checkpoint")
        yield chunk
        sent += len(chunk)


@pytest.mark.parametrize("fail_at", [MiB, 7 * MiB], ids=["before-threshold", "after-first-part"])
def test_interrupted_put_leaves_nothing_behind(backend: Backend, fail_at: int) -> None:
    with pytest.raises(RuntimeError, match="mid-checkpoint"):
        backend.store.put("acme", "s1", _failing_after(payload(12 * MiB), fail_at))
    assert backend.store.list("acme", "s1") == []
    assert backend.leftovers() == []  # no file, temp file, sidecar, object or open multipart upload


# --- S3 specifics ---------------------------------------------------------------------------------


def test_s3_large_snapshot_is_multipart_with_recorded_sha256(s3_server: str, s3_bucket: str) -> None:
    backend = _s3_backend(s3_server, s3_bucket)
    raw = s3_client(s3_server)
    big = payload(12 * MiB, seed=12)
    small = payload(3 * MiB, seed=3)
    big_ref = backend.store.put("acme", "s1", chunked(big, MiB))
    small_ref = backend.store.put("acme", "s1", chunked(small, MiB))

    head = raw.head_object(Bucket=s3_bucket, Key=s3_key(big_ref))
    assert head["ETag"].strip('"').endswith("-3")  # three 5 MiB-max parts: a multipart object
    assert head["Metadata"] == {"sha256": big_ref.sha256, "size": str(12 * MiB)}
    assert raw.head_object(Bucket=s3_bucket, Key=s3_key(big_ref), PartNumber=1)["PartsCount"] == 3
    small_head = raw.head_object(Bucket=s3_bucket, Key=s3_key(small_ref))
    assert "-" not in small_head["ETag"]
    assert small_head["Metadata"]["sha256"] == small_ref.sha256
    # keys are <prefix>/<tenant>/<session>/<created-ms>-<sha256[:12]>.snap; no staging object is left
    assert (
        s3_key(big_ref) == f"snaps/v1/acme/s1/{round(big_ref.created * 1000):015d}-{big_ref.sha256[:12]}.snap"
    )
    assert backend.leftovers() == sorted([s3_key(big_ref), s3_key(small_ref)])


def test_s3_refs_into_another_bucket_or_prefix_are_refused(s3_server: str, s3_bucket: str) -> None:
    store = _s3_backend(s3_server, s3_bucket).store
    ref = store.put("acme", "s1", [b"x"])
    other_bucket = SnapshotRef(ref.uri.replace(s3_bucket, "someone-elses-bucket"), 1, ref.sha256)
    other_prefix = SnapshotRef(ref.uri.replace("/snaps/v1/", "/snaps/v2/"), 1, ref.sha256)
    for bad in (other_bucket, other_prefix):
        with pytest.raises(TenantMismatch, match="expected a uri under"):
            store.get(bad, "acme")


def test_s3_missing_bucket_is_a_clear_error(s3_server: str) -> None:
    store = S3SnapshotStore("no-such-bucket-here", endpoint_url=s3_server, region="us-east-1")
    with pytest.raises(SnapshotError, match="NoSuchBucket"):
        store.put("acme", "s1", [b"x"])
    ref = SnapshotRef(f"s3://no-such-bucket-here/acme/s1/{1000:015d}-{'0' * 12}.snap", 1, "0" * 64)
    with pytest.raises(SnapshotError, match="NoSuchBucket") as err:
        store.get(ref, "acme")
    assert not isinstance(err.value, SnapshotNotFound)  # a misconfigured store is not a lost snapshot


def _fault_store(server: MotoServer, bucket: str) -> S3SnapshotStore:
    return S3SnapshotStore(
        bucket,
        endpoint_url=server.endpoint_url,
        region="us-east-1",
        multipart_threshold=PART,
        connect_timeout=0.5,
        read_timeout=1.0,
        max_attempts=2,
    )


def _one_part_uploaded(server: MotoServer, bucket: str, timeout: float = 10.0) -> None:
    """Wait until exactly one part of the one open upload is stored (parts go up concurrently with
    the reading, so the first may still be in flight when the stream has moved on)."""
    raw = server.client()
    uploads = raw.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert len(uploads) == 1
    deadline = time.monotonic() + timeout
    while True:
        parts = raw.list_parts(Bucket=bucket, Key=uploads[0]["Key"], UploadId=uploads[0]["UploadId"])
        if parts.get("Parts"):
            assert len(parts["Parts"]) == 1  # only 7 MiB of the stream was read: one 5 MiB part
            return
        assert time.monotonic() < deadline, "the first part was never uploaded"
        time.sleep(0.01)


@pytest.mark.slow
def test_s3_killed_mid_checkpoint_is_unavailable_quickly_and_nothing_is_torn(
    fresh_s3_server: MotoServer,
) -> None:
    server = fresh_s3_server
    bucket = make_bucket(server.endpoint_url)
    store = _fault_store(server, bucket)
    data = payload(12 * MiB)

    def chunks() -> Iterator[bytes]:
        for i, chunk in enumerate(chunked(data, MiB)):
            if i == 7:  # part 1 (bytes 0..5 MiB) is uploaded once 6 MiB were read
                _one_part_uploaded(server, bucket)
                server.kill()
            yield chunk

    started = time.monotonic()
    with pytest.raises(SnapshotUnavailable) as err:
        store.put("acme", "s1", chunks())
    elapsed = time.monotonic() - started
    assert elapsed < 15, f"took {elapsed:.1f}s to give up"
    assert isinstance(err.value.__cause__, botocore.exceptions.BotoCoreError)
    assert server.endpoint_url in str(err.value)

    with pytest.raises(SnapshotUnavailable):
        store.list("acme", "s1")

    server.start()  # same port; moto's state is in memory, so the bucket is gone with the process
    make_bucket(server.endpoint_url, bucket)
    assert store.list("acme", "s1") == []
    ref = store.put("acme", "s1", [b"after the outage"])
    assert store.get(ref, "acme") == b"after the outage"


@pytest.mark.slow
def test_s3_frozen_mid_checkpoint_times_out_and_leaves_no_visible_object(fresh_s3_server: MotoServer) -> None:
    server = fresh_s3_server
    bucket = make_bucket(server.endpoint_url)
    store = _fault_store(server, bucket)
    earlier = store.put("acme", "s1", [b"last good snapshot"], created=1.0)
    data = payload(12 * MiB)

    def chunks() -> Iterator[bytes]:
        for i, chunk in enumerate(chunked(data, MiB)):
            if i == 7:
                _one_part_uploaded(server, bucket)
                server.pause()  # SIGSTOP: connects succeed, nothing ever answers
            yield chunk

    started = time.monotonic()
    try:
        with pytest.raises(SnapshotUnavailable) as err:
            store.put("acme", "s1", chunks())
    finally:
        server.resume()
    elapsed = time.monotonic() - started
    assert elapsed < 20, f"took {elapsed:.1f}s to give up"
    assert isinstance(err.value.__cause__, botocore.exceptions.BotoCoreError)

    # The server kept its state: the interrupted snapshot is not visible, the earlier one is intact.
    assert store.list("acme", "s1") == [earlier]
    assert store.get(earlier, "acme") == b"last good snapshot"
    objects = [o["Key"] for o in server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert objects == [s3_key(earlier)]


# --- local specifics ------------------------------------------------------------------------------


def test_local_uris_are_absolute_file_uris(tmp_path: Path) -> None:
    store = LocalSnapshotStore(tmp_path / "rel" / ".." / "snaps")
    ref = store.put("acme", "s1", [b"abc"], created=2.5)
    assert (
        ref.uri
        == (tmp_path.resolve() / "snaps" / "acme" / "s1" / f"{2500:015d}-{ref.sha256[:12]}.snap").as_uri()
    )
    assert local_path(ref).read_bytes() == b"abc"
    assert (local_path(ref).parent / (local_path(ref).name + ".sha256")).read_text().strip() == ref.sha256


@pytest.mark.slow
def test_local_process_killed_mid_write_leaves_no_torn_snapshot(tmp_path: Path) -> None:
    """SIGKILL the writer half way: no cleanup code runs, yet nothing partial is ever listed or read."""
    root = tmp_path / "snaps"
    marker = tmp_path / "half-written"
    script = textwrap.dedent(
        f"""
        import pathlib, time
        from snapshots.local import LocalSnapshotStore

        def chunks():
            for i in range(100):
                if i == 3:
                    pathlib.Path({str(marker)!r}).touch()
                    time.sleep(60)
                yield b"x" * 65536

        LocalSnapshotStore({str(root)!r}).put("acme", "s1", chunks())
        """
    )
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert proc.poll() is None, "writer exited early"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()

    store = LocalSnapshotStore(root)
    assert store.list("acme", "s1") == []
    files = [p.name for p in (root / "acme" / "s1").iterdir()]
    assert len(files) == 1 and files[0].startswith(".tmp-")  # only an unlisted temp file remains
    assert store.retain("acme", "s1", keep=0) == 0


# --- configuration --------------------------------------------------------------------------------


def test_store_from_url(tmp_path: Path, s3_server: str) -> None:
    plain = store_from_url(str(tmp_path / "a"))
    assert isinstance(plain, LocalSnapshotStore) and plain.root == (tmp_path / "a").resolve()
    as_uri = store_from_url((tmp_path / "b").as_uri())
    assert isinstance(as_uri, LocalSnapshotStore) and as_uri.root == (tmp_path / "b").resolve()

    bucket = make_bucket(s3_server)
    s3 = store_from_url(
        f"s3://{bucket}/team/snaps?endpoint_url={s3_server}&region=eu-west-1"
        "&multipart_threshold=6MiB&read_timeout=3&max_attempts=4"
    )
    assert isinstance(s3, S3SnapshotStore)
    assert (s3.bucket, s3.prefix, s3.multipart_threshold) == (bucket, "team/snaps", 6 * MiB)
    assert s3.client.meta.endpoint_url == s3_server
    assert s3.client.meta.region_name == "eu-west-1"
    ref = s3.put("acme", "s1", [b"via url"])
    assert ref.uri.startswith(f"s3://{bucket}/team/snaps/acme/s1/")
    assert s3.get(ref, "acme") == b"via url"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("", "empty"),
        ("gs://bucket/x", "unsupported scheme 'gs'"),
        ("s3:///prefix", "names no bucket"),
        ("s3://bucket/p?endpoint=http://x", "unknown option 'endpoint'"),
        ("s3://bucket/p?read_timeout=soon", "read_timeout='soon' is not a valid number"),
        ("s3://bucket/p?multipart_threshold=big", "multipart_threshold='big' is not a size"),
        ("s3://bucket/../p", "prefix segment name '..'"),
        ("file://otherhost/x", "must be local"),
    ],
)
def test_store_from_url_refuses_bad_urls(url: str, problem: str) -> None:
    with pytest.raises(ValueError) as err:
        store_from_url(url)
    assert problem in str(err.value)
