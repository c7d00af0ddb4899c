"""`SnapshotStore.put(..., sha256=known)`: the hash given up front, for both backends.

Why: the reference worker's actor hashes its state as it grows, so it can tell the store the
hash before streaming it; the S3 store then uploads straight to the final key instead of a staging
object plus a server-side copy (the bulk of the yield time for large snapshots, see
bench/yield.py). The hint must never weaken the contract: bytes that do not match it are refused
with ChecksumMismatch and leave nothing behind — small (one PutObject) and multipart alike.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshots.errors import ChecksumMismatch
from snapshots.local import LocalSnapshotStore
from snapshots.s3 import S3SnapshotStore
from snapshots.store import SnapshotStore

pytest.register_assert_rewrite("tests.fixtures_s3")  # imported before pytest loads it as a plugin
from tests.fixtures_s3 import make_bucket, s3_client  # noqa: E402

pytest_plugins = ["tests.fixtures_s3"]

MiB = 1 << 20


def chunked(data: bytes, step: int = 1 << 20) -> Iterator[bytes]:
    for i in range(0, len(data), step):
        yield data[i : i + step]


@pytest.fixture(params=["local", "s3-small", "s3-multipart"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SnapshotStore, object]]:
    if request.param == "local":
        yield LocalSnapshotStore(tmp_path), lambda: sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
        return
    endpoint: str = request.getfixturevalue("s3_server")
    bucket = make_bucket(endpoint)
    threshold = 64 * MiB if request.param == "s3-small" else 5 * MiB
    s3 = S3SnapshotStore(
        bucket, "p", endpoint_url=endpoint, region="us-east-1", multipart_threshold=threshold
    )
    raw = s3_client(endpoint)

    def leftovers() -> list[str]:
        objects = [o["Key"] for o in raw.list_objects_v2(Bucket=bucket).get("Contents", [])]
        uploads = [u["Key"] for u in raw.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
        return sorted(objects + uploads)

    yield s3, leftovers


def test_put_with_the_right_hash_stores_and_verifies(store: tuple[SnapshotStore, object]) -> None:
    s, _ = store
    data = random.Random(1).randbytes(6 * MiB + 123)  # past the multipart threshold of s3-multipart
    sha = hashlib.sha256(data).hexdigest()
    ref = s.put("acme", "sess", chunked(data), sha256=sha)
    assert (ref.sha256, ref.size_bytes) == (sha, len(data))
    assert s.get(ref, "acme") == data
    assert s.list("acme", "sess") == [ref]


def test_put_with_a_wrong_hash_stores_nothing(store: tuple[SnapshotStore, object]) -> None:
    s, leftovers = store
    data = random.Random(2).randbytes(6 * MiB)
    wrong = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(ChecksumMismatch) as info:
        s.put("acme", "sess", chunked(data), sha256=wrong)
    assert info.value.expected == wrong and info.value.actual == hashlib.sha256(data).hexdigest()
    assert s.list("acme", "sess") == []
    assert leftovers() == []  # type: ignore[operator]


def test_malformed_hash_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sha256"):
        LocalSnapshotStore(tmp_path).put("acme", "sess", [b"x"], sha256="ABC")
