"""The S3 store's write path: concurrent parts, buffers lent rather than copied, integrity in transit.

Why: a large checkpoint is on the critical path of a yield, so the S3 store uploads several parts at
once, sends them straight from the caller's buffers and skips a second hash where botocore's signed
one already checks the bytes (bench/yield.py). None of that may cost a guarantee: a part failing
while others are in flight aborts the upload and leaves nothing visible, the caller's buffers are
free again when `put` returns, and every body still carries a check the server verifies.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from slots.worker.actor import Actor
from snapshots.config import store_from_url
from snapshots.errors import SnapshotUnavailable
from snapshots.s3 import S3SnapshotStore, _Body

pytest.register_assert_rewrite("tests.fixtures_s3")  # imported before pytest loads it as a plugin
from tests.fixtures_s3 import s3_client  # noqa: E402

pytest_plugins = ["tests.fixtures_s3"]

MiB = 1 << 20
PART = 5 * MiB


def _store(endpoint: str, bucket: str, **kwargs: Any) -> S3SnapshotStore:
    options: dict[str, Any] = {"multipart_threshold": PART, "max_attempts": 2, "read_timeout": 10}
    options.update(kwargs)
    return S3SnapshotStore(bucket, "snaps", endpoint_url=endpoint, region="us-east-1", **options)


def _leftovers(endpoint: str, bucket: str) -> list[str]:
    raw = s3_client(endpoint)
    objects = [o["Key"] for o in raw.list_objects_v2(Bucket=bucket).get("Contents", [])]
    uploads = [f"upload:{u['Key']}" for u in raw.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    return sorted(objects + uploads)


def _part_number(request: Any) -> int:
    return int(parse_qs(urlsplit(request.url).query)["partNumber"][0])


def test_parts_go_up_concurrently_bounded_and_assemble_in_order(
    s3_server: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(s3_server, s3_bucket, upload_concurrency=3)
    lock = threading.Lock()
    active = peak = 0
    upload = store._upload_part

    def tracked(key: str, upload_id: str, number: int, body: _Body) -> dict[str, Any]:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        try:
            time.sleep(0.4 if number == 1 else 0.05)  # part 1 finishes after later ones
            return upload(key, upload_id, number, body)
        finally:
            with lock:
                active -= 1

    monkeypatch.setattr(store, "_upload_part", tracked)
    data = random.Random(5).randbytes(6 * PART + 1234)
    ref = store.put("acme", "s1", (data[i : i + MiB] for i in range(0, len(data), MiB)))

    assert peak == 3  # concurrent, and never more than upload_concurrency in flight
    assert ref.sha256 == hashlib.sha256(data).hexdigest() and ref.size_bytes == len(data)
    assert store.get(ref, "acme") == data
    head = s3_client(s3_server).head_object(Bucket=s3_bucket, Key=urlsplit(ref.uri).path.lstrip("/"))
    assert head["ETag"].strip('"').endswith("-7")


@pytest.mark.parametrize("known_hash", [True, False], ids=["sha256-hint", "staged"])
def test_a_part_failing_while_others_are_in_flight_aborts_and_leaves_nothing(
    s3_server: str, s3_bucket: str, known_hash: bool
) -> None:
    store = _store(s3_server, s3_bucket, upload_concurrency=3, max_attempts=1)  # part 3 fails at once
    earlier = store.put("acme", "s1", [b"last good snapshot"], created=1.0)
    data = random.Random(6).randbytes(12 * PART)
    read = 0

    def chunks() -> Iterator[bytes]:
        nonlocal read
        for i in range(0, len(data), MiB):
            read += MiB
            yield data[i : i + MiB]

    def fail_part_3(request: Any, **_: Any) -> None:
        number = _part_number(request)
        if number == 3:
            raise botocore.exceptions.EndpointConnectionError(endpoint_url=s3_server)
        time.sleep(0.2)  # keep the other parts in flight meanwhile

    store.client.meta.events.register("before-send.s3.UploadPart", fail_part_3)
    sha = hashlib.sha256(data).hexdigest() if known_hash else None
    with pytest.raises(SnapshotUnavailable) as err:
        store.put("acme", "s1", chunks(), sha256=sha)
    assert "UploadPart" in str(err.value)
    assert isinstance(err.value.__cause__, botocore.exceptions.EndpointConnectionError)

    # The reading stopped at the failure, not at the end of the stream: at most the parts in
    # flight with part 3, the one being filled and one chunk more were read.
    assert read <= (3 + 3 + 1) * PART + MiB < len(data)
    # Aborted after the parts in flight finished: no object, no open upload, the earlier one intact.
    assert store.list("acme", "s1") == [earlier]
    assert _leftovers(s3_server, s3_bucket) == [urlsplit(earlier.uri).path.lstrip("/")]


@pytest.mark.parametrize("size", [3 * MiB, 12 * MiB], ids=["one-put", "multipart"])
def test_the_actors_buffer_is_free_again_when_put_returns(s3_server: str, s3_bucket: str, size: int) -> None:
    """The store sends views of the actor's history; once `put` returns none may pin it, or the next
    turn would have to copy the whole history instead of growing it in place."""
    store = _store(s3_server, s3_bucket)
    actor = Actor("s1", size)
    actor.take_turn()
    ref = store.put("acme", "s1", actor.state_chunks(), sha256=actor.state_sha256())
    history = actor.history
    actor.take_turn()
    assert actor.history is history  # grown in place: no view of it survived the upload
    assert store.get(ref, "acme")[:size] == bytes(history[:size])


def _signed_payloads(store: S3SnapshotStore) -> list[tuple[str, str, bool]]:
    """(operation, x-amz-content-sha256, has Content-MD5) of every body-carrying request sent."""
    seen: list[tuple[str, str, bool]] = []

    def record(request: Any, event_name: str, **_: Any) -> None:
        headers = request.headers
        signed = headers.get("X-Amz-Content-SHA256", b"")
        signed = signed.decode() if isinstance(signed, bytes) else signed
        seen.append((event_name.rsplit(".", 1)[-1], signed, "Content-MD5" in headers))

    for op in ("PutObject", "UploadPart"):
        store.client.meta.events.register(f"before-send.s3.{op}", record)
    return seen


def _is_sha256(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def test_every_body_carries_a_check_the_server_verifies(s3_server: str, s3_bucket: str) -> None:
    store = _store(s3_server, s3_bucket)
    seen = _signed_payloads(store)
    shas = []
    for size in (100_000, 3 * MiB, 12 * MiB):  # joined PutObject, PutObject from views, multipart
        data = random.Random(size).randbytes(size)
        shas.append(hashlib.sha256(data).hexdigest())
        ref = store.put("acme", "s1", (data[i : i + MiB] for i in range(0, size, MiB)), sha256=shas[-1])
        assert store.get(ref, "acme") == data
    assert [op for op, _, _ in seen] == ["PutObject", "PutObject"] + ["UploadPart"] * 3
    # Signed payload hashes and no redundant MD5; a whole snapshot's signed hash is its own.
    assert all(_is_sha256(signed) and not md5 for _, signed, md5 in seen)
    assert [signed for _, signed, _ in seen[:2]] == shas[:2]

    # A client that does not sign payloads gets a Content-MD5 on every body instead.
    raw = boto3.session.Session().client(
        "s3",
        endpoint_url=s3_server,
        region_name="us-east-1",
        config=Config(s3={"payload_signing_enabled": False, "addressing_style": "path"}),
    )
    plain = S3SnapshotStore(s3_bucket, "snaps", client=raw, multipart_threshold=PART)
    seen = _signed_payloads(plain)
    for size in (100_000, 3 * MiB, 12 * MiB):
        data = random.Random(size).randbytes(size)
        ref = plain.put("acme", "s2", [data], sha256=hashlib.sha256(data).hexdigest())
        assert plain.get(ref, "acme") == data
    assert seen and all(signed == "UNSIGNED-PAYLOAD" and md5 for _, signed, md5 in seen)


def test_body_reads_and_seeks_across_views() -> None:
    data = b"abcdefghij"
    body = _Body([memoryview(data[:3]), memoryview(data[3:4]), memoryview(data[4:])])
    assert len(body) == 10 and body.tell() == 0
    out = []
    while piece := body.read(4):
        out.append(bytes(piece))
        assert len(piece) <= 4
    assert b"".join(out) == data and body.tell() == 10
    assert body.seek(5) == 5 and bytes(body.read(3)) == b"fgh"
    assert body.seek(-2, 2) == 8 and bytes(body.read()) == b"ij"
    assert body.seek(0) == 0 and bytes(body.read()) == data  # a retry re-reads the same bytes
    assert body.read(1) == b""
    with pytest.raises(ValueError):
        body.seek(-1)
    body.release()


def test_upload_concurrency_option(s3_server: str, s3_bucket: str) -> None:
    store = store_from_url(
        f"s3://{s3_bucket}/p?endpoint_url={s3_server}&region=us-east-1&upload_concurrency=2"
    )
    assert isinstance(store, S3SnapshotStore) and store.upload_concurrency == 2
    for bad in (0, -1):
        with pytest.raises(ValueError, match="upload_concurrency"):
            S3SnapshotStore(s3_bucket, endpoint_url=s3_server, upload_concurrency=bad)
