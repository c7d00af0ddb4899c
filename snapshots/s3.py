"""`S3SnapshotStore`: snapshots in any S3-compatible object store (AWS S3, MinIO, Ceph RGW) via boto3.

Why it is built this way:

* Atomic by construction: S3 makes an object visible only once a `PutObject` or a
  `CompleteMultipartUpload` succeeds, so a checkpoint interrupted mid-way is never readable. Failed
  multipart uploads are aborted (best effort: if the store itself is gone the abort cannot reach it
  either, so buckets should also carry an `AbortIncompleteMultipartUpload` lifecycle rule).
* Streaming: snapshots above `multipart_threshold` are uploaded part by part as the chunks arrive,
  up to `upload_concurrency` parts at a time while the next ones are read and hashed; reading
  stops at the first failed part. Chunks are sent from the caller's buffers (views, no copies):
  at most max(threshold, (upload_concurrency + 1) x part size) bytes plus one incoming chunk are
  referenced at a time, and none once `put` returns.
* Verified: the sha256 and size are stored as object metadata (`x-amz-meta-sha256`,
  `x-amz-meta-size`) and every read is checked against the ref's sha256 (or that metadata). S3 fixes
  metadata when an upload *starts*, but a streamed snapshot's hash is only known at its end, and the
  key embeds the hash too. So a large snapshot is first uploaded to a hidden staging key
  (`<tenant>/<session>/.partial/...`, never listed), then committed with a server-side multipart
  copy (`UploadPartCopy`, no bytes through this process) to its final key with the metadata set,
  and the staging object is deleted. Small snapshots are hashed in memory and need one `PutObject`.
  A caller that already knows the hash (`put(..., sha256=...)`, e.g. an actor hashing its state as
  it grows) skips the staging: parts go straight to the final key, and the streamed bytes are
  checked against the hash before the upload is completed (a mismatch aborts it). For one
  `PutObject` the hash botocore signs (below) is compared with the known one before a byte is sent.
* Integrity in transit: with SigV4 (the default), botocore signs every body's sha256
  (`x-amz-content-sha256`), over HTTP and, when no Content-MD5 is sent, over HTTPS too, and S3
  refuses a body that does not match it. A Content-MD5 would check the same again at the cost of
  one more pass over the bytes, so one is only sent when the client does not sign payloads.
* Failures are typed: connection errors, timeouts and 5xx/throttling after botocore's retries become
  `SnapshotUnavailable` (temporary, transport error chained); timeouts and retry counts are set here.
  Flexible request checksums are only sent when an operation requires them, because several
  S3-compatible stores reject the CRC trailers recent botocore sends by default.

Credentials come from the standard boto3 chain (environment, shared config/credentials files, web
identity, container/instance metadata); nothing here reads or stores them.
Keys: `<prefix>/<tenant>/<session>/<created-ms>-<sha256[:12]>.snap`;
URIs: `s3://<bucket>/<prefix>/<tenant>/<session>/<name>.snap`.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import datetime as dt
import functools
import hashlib
import math
import re
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

import boto3
import botocore.exceptions as bexc
from botocore.config import Config

from snapshots.errors import (
    ChecksumMismatch,
    SnapshotError,
    SnapshotNotFound,
    SnapshotUnavailable,
    TenantMismatch,
)
from snapshots.ref import SnapshotRef
from snapshots.store import (
    NAME_RE,
    Chunk,
    created_ms,
    name_created,
    snapshot_name,
    validate_keep,
    validate_name,
    validate_sha256,
)

MiB = 1 << 20
MIN_PART_SIZE = 5 * MiB  # S3's minimum for every part but the last
MAX_PART_SIZE = 5 * 1024 * MiB
MAX_PARTS = 10_000
STAGING_DIR = ".partial"
STAGING_TTL = dt.timedelta(hours=1)  # retain() sweeps staging objects older than this
_READ_CHUNK = 1 * MiB
# One PutObject up to 256 MiB: measured on the S3 server the tests run (bench/yield.py), a
# multipart upload of 128 MiB paid ~0.5 s more than one PutObject, all in CompleteMultipartUpload,
# and a yield is on a Guaranteed session's critical path. The price is holding up to that much of a
# streamed snapshot in memory (the reference actor holds its state anyway). Above it: 16 MiB parts,
# 4 in flight. Tune both per store with the URL options multipart_threshold and upload_concurrency.
DEFAULT_MULTIPART_THRESHOLD = 256 * MiB
DEFAULT_PART_SIZE = 16 * MiB
DEFAULT_UPLOAD_CONCURRENCY = 4
_JOIN_MAX = 1 * MiB  # a PutObject body up to this size is joined into one bytes object

_T = TypeVar("_T")

# Transport-level failures: the store is down, unreachable, or too slow. All temporary.
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    bexc.ConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError
    bexc.HTTPClientError,  # ReadTimeoutError, ConnectionClosedError, ResponseStreamingError
    bexc.IncompleteReadError,
)
_TEMPORARY_CODES = frozenset(
    {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling", "ThrottlingException"}
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


def _content_md5(views: Iterable[Chunk]) -> str:
    md5 = hashlib.md5(usedforsecurity=False)
    for v in views:
        md5.update(v)
    return base64.b64encode(md5.digest()).decode("ascii")


def _signs_payload(client: Any) -> bool:
    """Whether `client` signs every request body's sha256 (SigV4 with payload signing not turned off).

    botocore then sends `x-amz-content-sha256`, which S3 checks against the body, so a body damaged
    in transit is refused; without Content-MD5 it signs the payload over HTTPS too. A Content-MD5
    would check the same thing again, at the cost of another pass over the bytes.
    """
    config = getattr(getattr(client, "meta", None), "config", None)
    if config is None:
        return False
    s3 = getattr(config, "s3", None) or {}
    return config.signature_version in (None, "s3v4", "v4") and s3.get("payload_signing_enabled") is not False


def _check_signed_sha256(request: Any, **_: Any) -> None:
    """botocore `before-send` hook: refuse to send a body whose signed sha256 is not the one expected.

    With SigV4 payload signing, `x-amz-content-sha256` is the hash of exactly the bytes about to be
    sent (and S3 checks the body against it), so comparing it with the caller's hash verifies the
    snapshot before anything is stored, without hashing it a second time.
    """
    body = getattr(request, "body", None)
    if not isinstance(body, _Body) or body.expected is None:
        return
    ref = body.expected
    signed = request.headers.get("X-Amz-Content-SHA256", "")
    if isinstance(signed, bytes):
        signed = signed.decode("ascii", "replace")
    if signed != ref.sha256:
        if re.fullmatch(r"[0-9a-f]{64}", signed):
            raise ChecksumMismatch(ref, ref.sha256, signed)
        raise SnapshotError(f"cannot verify {ref.uri}: the request carries no payload hash ({signed!r})")


def _flat(chunk: Chunk) -> memoryview:
    """The store's own flat byte view of a caller's chunk (no copy), released when sent."""
    return memoryview(chunk).cast("B")


def _release(views: Iterable[memoryview]) -> None:
    for v in views:
        v.release()


class _Views:
    """Byte views waiting to be sent, in stream order; `take` cuts them into parts without copying."""

    def __init__(self) -> None:
        self._views: deque[memoryview] = deque()
        self.size = 0

    def add(self, view: memoryview) -> None:
        if len(view):
            self._views.append(view)
            self.size += len(view)
        else:
            view.release()

    def take(self, n: int) -> list[memoryview]:
        """The first `n` bytes (n <= size) as views; a view straddling the cut is split in two."""
        out: list[memoryview] = []
        while n > 0:
            view = self._views.popleft()
            if len(view) > n:
                out.append(view[:n])
                self._views.appendleft(view[n:])
                view.release()
                view = out[-1]
            else:
                out.append(view)
            n -= len(view)
            self.size -= len(view)
        return out

    def views(self) -> Iterator[memoryview]:
        return iter(self._views)

    def release(self) -> None:
        _release(self._views)
        self._views.clear()
        self.size = 0


class _Body:
    """A read-only, seekable file over byte views, so botocore can sign, send and, on a retry, resend
    a part straight from the caller's buffers instead of one joined copy of it."""

    def __init__(self, views: list[memoryview]) -> None:
        self.views = views
        #: Set when the request's signed payload hash must be this ref's (see `_check_signed_sha256`).
        self.expected: SnapshotRef | None = None
        self._lent: list[memoryview] = []  # slices handed out by `read`, released with the views
        self._size = sum(len(v) for v in views)
        self._pos = 0
        self._index = 0  # the view holding byte `_pos`
        self._offset = 0  # and where in it

    def __len__(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        start = {0: 0, 1: self._pos, 2: self._size}[whence]
        if start + offset < 0:
            raise ValueError(f"negative seek position {start + offset}")
        self._pos = rest = min(start + offset, self._size)
        self._index = 0
        while self._index < len(self.views) and rest >= len(self.views[self._index]):
            rest -= len(self.views[self._index])
            self._index += 1
        self._offset = rest
        return self._pos

    def read(self, size: int | None = -1) -> bytes | memoryview:
        """Up to `size` bytes (all that is left if None or negative), as a view where possible."""
        if size is None or size < 0:
            out = b"".join(self.views[self._index :])[self._offset :]
            self.seek(0, 2)
            return out
        if self._index >= len(self.views) or size == 0:
            return b""
        view = self.views[self._index]
        piece = view[self._offset : self._offset + size]
        self._lent.append(piece)
        self._pos += len(piece)
        self._offset += len(piece)
        if self._offset == len(view):
            self._index, self._offset = self._index + 1, 0
        return piece

    def release(self) -> None:
        """Drop the views: a traceback or request object that outlives the upload then holds
        nothing of the caller's buffer (a live view would keep, e.g., a bytearray from growing)."""
        _release(self._lent)
        _release(self.views)
        self._lent.clear()


class S3SnapshotStore:
    """A `SnapshotStore` in `bucket` under `prefix`.

    `multipart_threshold` (default 256 MiB): snapshots larger than this are streamed as a multipart
    upload with parts of `part_size` bytes (default: the threshold up to 16 MiB, at least 5 MiB);
    smaller ones use one `PutObject`. `upload_concurrency` (default 4): how many parts of one
    snapshot are uploaded at a time (and so referenced in memory, see the module docstring). Where
    completing a multipart upload is costly (moto re-assembles the object: ~0.6 s at 128 MiB, see
    bench/yield.py) a higher threshold makes larger snapshots one request; against AWS S3, parallel
    parts should upload faster than one stream.
    `connect_timeout`/`read_timeout` (seconds) and `max_attempts` (total attempts per request,
    including the first) bound how long a call can hang when the store is down. `addressing_style`
    defaults to "path" when `endpoint_url` is set (MinIO/Ceph need no wildcard DNS then) and to
    botocore's "auto" otherwise. Pass `client` to use a ready boto3 S3 client instead (the endpoint,
    region, timeout and retry arguments are then ignored).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        client: Any | None = None,
        *,
        part_size: int | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_attempts: int = 3,
        addressing_style: str | None = None,
        upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"S3 bucket must be a bare bucket name, got {bucket!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            for seg in self.prefix.split("/"):
                validate_name("S3 prefix segment", seg)
        if multipart_threshold < 0:
            raise ValueError(f"multipart_threshold must be >= 0, got {multipart_threshold}")
        self.multipart_threshold = multipart_threshold
        self.part_size = (
            part_size
            if part_size is not None
            else max(min(multipart_threshold, DEFAULT_PART_SIZE), MIN_PART_SIZE)
        )
        if not MIN_PART_SIZE <= self.part_size <= MAX_PART_SIZE:
            raise ValueError(f"part_size must be between 5 MiB and 5 GiB, got {self.part_size}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if (
            isinstance(upload_concurrency, bool)
            or not isinstance(upload_concurrency, int)
            or upload_concurrency < 1
        ):
            raise ValueError(f"upload_concurrency must be an integer >= 1, got {upload_concurrency!r}")
        self.upload_concurrency = upload_concurrency
        own_client = client is None
        if client is None:
            style = addressing_style or ("path" if endpoint_url else "auto")
            if style not in ("auto", "path", "virtual"):
                raise ValueError(f"addressing_style must be auto, path or virtual, not {style!r}")
            options: dict[str, Any] = {
                "connect_timeout": connect_timeout,
                "read_timeout": read_timeout,
                "retries": {"total_max_attempts": max_attempts, "mode": "standard"},
                "s3": {"addressing_style": style},
                "max_pool_connections": max(10, upload_concurrency + 2),  # parts + reads alongside
            }
            if "request_checksum_calculation" in Config.OPTION_DEFAULTS:  # botocore >= 1.36
                options["request_checksum_calculation"] = "when_required"
                options["response_checksum_validation"] = "when_required"
            config = Config(**options)
            client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=config
            )
        self._client: Any = client
        self._md5 = not _signs_payload(client)
        # Only for a client built here is it known that every PutObject carries its payload's sha256
        # (SigV4, no checksum trailers): then a known hash is checked against the signed one.
        self._verify_signed = own_client and not self._md5
        if self._verify_signed:
            client.meta.events.register(
                "before-send.s3.PutObject", _check_signed_sha256, unique_id="slotsched-check-signed-sha256"
            )

    @property
    def client(self) -> Any:
        """The boto3 S3 client in use (for tests and operational tooling)."""
        return self._client

    def __repr__(self) -> str:
        return f"S3SnapshotStore(bucket={self.bucket!r}, prefix={self.prefix!r})"

    # --- writing -------------------------------------------------------------------------------

    def put(
        self,
        tenant: str,
        session: str,
        chunks: Iterable[Chunk],
        created: float | None = None,
        *,
        sha256: str | None = None,
    ) -> SnapshotRef:
        base = self._session_prefix(validate_name("tenant", tenant), validate_name("session", session))
        ms = created_ms(created)
        expected = validate_sha256(sha256)
        it = iter(chunks)
        head = _Views()
        try:
            # Read just past the threshold to learn whether one PutObject suffices.
            while head.size <= self.multipart_threshold:
                chunk = next(it, None)
                if chunk is None:
                    return self._put_small(base, ms, head, expected)
                head.add(_flat(chunk))
            digest = hashlib.sha256()
            for view in head.views():
                digest.update(view)
            return self._put_multipart(base, ms, head, it, digest, expected)
        finally:
            head.release()  # whatever was not sent: the caller's buffers are its own again

    def _put_small(self, base: str, ms: int, views: _Views, expected: str | None) -> SnapshotRef:
        size = views.size
        parts = views.take(size)
        # Small bodies are joined (a cheap copy, no Expect: 100-continue round trip); larger ones are
        # sent from the caller's buffers as they are.
        body: bytes | _Body = b"".join(parts) if size <= _JOIN_MAX else _Body(parts)
        try:
            if expected is not None and isinstance(body, _Body) and self._verify_signed:
                # botocore hashes the body to sign it; `_check_signed_sha256` compares that hash with
                # the expected one before a byte is sent, so the bytes are not hashed twice.
                sha = expected
                body.expected = SnapshotRef(self._uri(base + snapshot_name(ms, sha)), size, sha, ms / 1000)
            else:
                digest = hashlib.sha256()
                for view in parts if isinstance(body, _Body) else [body]:
                    digest.update(view)
                sha = digest.hexdigest()
            key = base + snapshot_name(ms, sha)
            if expected is not None and sha != expected:
                raise ChecksumMismatch(SnapshotRef(self._uri(key), size, expected, ms / 1000), expected, sha)
            extra = (
                {"ContentMD5": _content_md5([body] if isinstance(body, bytes) else parts)}
                if self._md5
                else {}
            )
            self._call(
                "PutObject",
                key,
                lambda: self._client.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=body,
                    ContentType="application/octet-stream",
                    Metadata={"sha256": sha, "size": str(size)},
                    **extra,
                ),
            )
        finally:
            if isinstance(body, _Body):
                body.release()
            else:
                _release(parts)
        return SnapshotRef(self._uri(key), size, sha, ms / 1000)

    def _put_multipart(
        self,
        base: str,
        ms: int,
        pending: _Views,
        rest: Iterator[Chunk],
        digest: Any,
        expected: str | None = None,
    ) -> SnapshotRef:
        # With the hash known up front the final key and its metadata are known too: upload there
        # directly and check the hash before completing (nothing is visible until then). Without
        # it, upload to a hidden staging key and copy to the final key once the hash is known.
        if expected is not None:
            staging = base + snapshot_name(ms, expected)
            create_extra: dict[str, Any] = {"Metadata": {"sha256": expected}}
        else:
            staging = f"{base}{STAGING_DIR}/{ms:015d}-{uuid.uuid4().hex}.part"
            create_extra = {}
        size = pending.size
        upload_id: str = self._call(
            "CreateMultipartUpload",
            staging,
            lambda: self._client.create_multipart_upload(
                Bucket=self.bucket, Key=staging, ContentType="application/octet-stream", **create_extra
            ),
        )["UploadId"]
        # Parts go up concurrently while the stream is read and hashed in this thread; at most
        # `upload_concurrency` parts are in flight, so memory stays bounded, and the reading stops
        # as soon as a part fails.
        pool = ThreadPoolExecutor(self.upload_concurrency, thread_name_prefix="s3-part")
        inflight: set[Future[dict[str, Any]]] = set()
        parts: list[dict[str, Any]] = []

        def collect(block: bool) -> None:
            done = (
                wait(inflight, return_when=FIRST_COMPLETED)[0] if block else {f for f in inflight if f.done()}
            )
            for f in done:
                inflight.discard(f)
                parts.append(f.result())  # a failed part raises here

        def send(views: list[memoryview]) -> None:
            try:
                number = len(parts) + len(inflight) + 1
                if number > MAX_PARTS:
                    raise SnapshotError(
                        f"snapshot exceeds {MAX_PARTS} parts of {self.part_size} bytes; raise part_size"
                    )
                collect(block=False)
                while len(inflight) >= self.upload_concurrency:
                    collect(block=True)
            except BaseException:
                _release(views)  # never handed to a part: ours to release
                raise
            inflight.add(pool.submit(self._upload_part, staging, upload_id, number, _Body(views)))

        try:
            while True:
                while pending.size >= self.part_size:
                    send(pending.take(self.part_size))
                chunk = next(rest, None)
                if chunk is None:
                    break
                view = _flat(chunk)
                digest.update(view)
                pending.add(view)
                size += len(view)
            if pending.size or not (parts or inflight):
                send(pending.take(pending.size))
            while inflight:
                collect(block=True)
            if expected is not None and digest.hexdigest() != expected:
                ref = SnapshotRef(self._uri(staging), size, expected, ms / 1000)
                raise ChecksumMismatch(ref, expected, digest.hexdigest())
            parts.sort(key=lambda p: int(p["PartNumber"]))
            self._call(
                "CompleteMultipartUpload",
                staging,
                lambda: self._client.complete_multipart_upload(
                    Bucket=self.bucket, Key=staging, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )
        except BaseException:
            # Let the parts in flight finish (each is bounded by the timeouts) so that none lands
            # after the abort, then abort: nothing of this upload stays behind.
            wait(inflight)
            self._abort(staging, upload_id)
            raise
        finally:
            pool.shutdown(wait=True)

        sha = digest.hexdigest()
        if expected is not None:
            return SnapshotRef(self._uri(staging), size, sha, ms / 1000)
        key = base + snapshot_name(ms, sha)
        try:
            self._commit_copy(staging, key, size, sha)
        finally:
            self._delete_quietly(staging)
        return SnapshotRef(self._uri(key), size, sha, ms / 1000)

    def _upload_part(self, key: str, upload_id: str, number: int, body: _Body) -> dict[str, Any]:
        """Upload one part (in a pool thread); its views are released whatever happens."""
        try:
            extra = {"ContentMD5": _content_md5(body.views)} if self._md5 else {}
            resp = self._call(
                "UploadPart",
                key,
                lambda: self._client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body, **extra
                ),
            )
        finally:
            body.release()
        return {"ETag": resp["ETag"], "PartNumber": number}

    def _commit_copy(self, source: str, key: str, size: int, sha: str) -> None:
        """Server-side multipart copy of the staged object to its final key, with its metadata."""
        upload_id: str = self._call(
            "CreateMultipartUpload",
            key,
            lambda: self._client.create_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                ContentType="application/octet-stream",
                Metadata={"sha256": sha, "size": str(size)},
            ),
        )["UploadId"]
        step = min(MAX_PART_SIZE, max(self.part_size, math.ceil(size / MAX_PARTS)))
        parts: list[dict[str, Any]] = []
        try:
            for number, start in enumerate(range(0, size, step), start=1):
                end = min(start + step, size) - 1
                resp = self._call(
                    "UploadPartCopy",
                    key,
                    functools.partial(
                        self._client.upload_part_copy,
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        CopySource={"Bucket": self.bucket, "Key": source},
                        CopySourceRange=f"bytes={start}-{end}",
                    ),
                )
                parts.append({"ETag": resp["CopyPartResult"]["ETag"], "PartNumber": number})
            self._call(
                "CompleteMultipartUpload",
                key,
                lambda: self._client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )
        except BaseException:
            self._abort(key, upload_id)
            raise

    def delete(self, ref: SnapshotRef, tenant: str) -> None:
        key = self._resolve(ref, tenant)
        self._call("DeleteObject", key, lambda: self._client.delete_object(Bucket=self.bucket, Key=key))

    def retain(self, tenant: str, session: str, keep: int) -> int:
        base = self._session_prefix(validate_name("tenant", tenant), validate_name("session", session))
        validate_keep(keep)
        objects = self._list_objects(base, recursive=True)
        names = sorted(o["Key"][len(base) :] for o in objects if NAME_RE.match(o["Key"][len(base) :]))
        doomed = [base + n for n in (names[: len(names) - keep] if keep else names)]
        cutoff = dt.datetime.now(dt.UTC) - STAGING_TTL
        stale = [
            o["Key"]
            for o in objects
            if o["Key"].startswith(f"{base}{STAGING_DIR}/") and o["LastModified"] < cutoff
        ]
        self._delete_keys(doomed + stale)
        return len(doomed)

    # --- reading -------------------------------------------------------------------------------

    def get(self, ref: SnapshotRef, tenant: str) -> bytes:
        key = self._resolve(ref, tenant)
        resp = self._call("GetObject", key, lambda: self._client.get_object(Bucket=self.bucket, Key=key), ref)
        body = resp["Body"]
        try:
            data: bytes = self._call("GetObject", key, body.read, ref)
        finally:
            body.close()
        expected = ref.sha256 or resp.get("Metadata", {}).get("sha256", "")
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise ChecksumMismatch(ref, expected, actual)
        return data

    def open(self, ref: SnapshotRef, tenant: str) -> Iterator[bytes]:
        key = self._resolve(ref, tenant)
        resp = self._call("GetObject", key, lambda: self._client.get_object(Bucket=self.bucket, Key=key), ref)
        expected = ref.sha256 or resp.get("Metadata", {}).get("sha256", "")
        return self._stream(ref, key, resp["Body"], expected)

    def _stream(self, ref: SnapshotRef, key: str, body: Any, expected: str) -> Iterator[bytes]:
        digest = hashlib.sha256()
        try:
            chunks = body.iter_chunks(_READ_CHUNK)
            while True:
                chunk: bytes | None = self._call("GetObject", key, lambda: next(chunks, None), ref)
                if chunk is None:
                    break
                digest.update(chunk)
                yield chunk
        finally:
            body.close()
        actual = digest.hexdigest()
        if actual != expected:
            raise ChecksumMismatch(ref, expected, actual)

    def list(self, tenant: str, session: str) -> builtins.list[SnapshotRef]:
        base = self._session_prefix(validate_name("tenant", tenant), validate_name("session", session))
        refs: builtins.list[SnapshotRef] = []
        objects = sorted(self._list_objects(base, recursive=False), key=lambda o: str(o["Key"]))
        for obj in objects:
            name = obj["Key"][len(base) :]
            created = name_created(name)
            if created is None:
                continue
            key = obj["Key"]
            try:
                head = self._call(
                    "HeadObject",
                    key,
                    functools.partial(self._client.head_object, Bucket=self.bucket, Key=key),
                    SnapshotRef(self._uri(key)),
                )
            except SnapshotNotFound:
                continue  # deleted while we looked
            sha = head.get("Metadata", {}).get("sha256", "")
            refs.append(SnapshotRef(self._uri(key), int(obj["Size"]), sha, created))
        return refs

    # --- helpers -------------------------------------------------------------------------------

    def _call(self, action: str, key: str, fn: Callable[[], _T], ref: SnapshotRef | None = None) -> _T:
        """Run one S3 call, translating botocore's errors into the store's typed errors."""
        try:
            return fn()
        except bexc.ClientError as e:
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if ref is not None and code != "NoSuchBucket" and (code in _NOT_FOUND_CODES or status == 404):
                raise SnapshotNotFound(ref) from e
            where = f"s3://{self.bucket}/{key}"
            if status >= 500 or code in _TEMPORARY_CODES:
                raise SnapshotUnavailable(f"S3 {action} {where} failed temporarily: {code} {status}") from e
            raise SnapshotError(f"S3 {action} {where} failed: {code}: {err.get('Message', '')}") from e
        except _UNAVAILABLE_ERRORS as e:
            raise SnapshotUnavailable(
                f"S3 store at {self._client.meta.endpoint_url} unavailable during {action} "
                f"s3://{self.bucket}/{key}: {e}"
            ) from e
        except bexc.BotoCoreError as e:  # e.g. NoCredentialsError: configuration, not temporary
            raise SnapshotError(f"S3 {action} s3://{self.bucket}/{key} failed: {e}") from e

    def _abort(self, key: str, upload_id: str) -> None:
        with contextlib.suppress(Exception):
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)

    def _delete_quietly(self, key: str) -> None:
        with contextlib.suppress(Exception):
            self._client.delete_object(Bucket=self.bucket, Key=key)

    def _delete_keys(self, keys: builtins.list[str]) -> None:
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            resp = self._call(
                "DeleteObjects",
                batch[0],
                functools.partial(
                    self._client.delete_objects,
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                ),
            )
            errors = resp.get("Errors") or []
            if errors:
                first = errors[0]
                raise SnapshotError(
                    f"S3 DeleteObjects failed for {len(errors)} key(s), first "
                    f"s3://{self.bucket}/{first.get('Key')}: {first.get('Code')}: {first.get('Message')}"
                )

    def _list_objects(self, base: str, recursive: bool) -> builtins.list[dict[str, Any]]:
        def run() -> builtins.list[dict[str, Any]]:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base}
            if not recursive:
                kwargs["Delimiter"] = "/"
            out: builtins.list[dict[str, Any]] = []
            for page in self._client.get_paginator("list_objects_v2").paginate(**kwargs):
                out.extend(page.get("Contents", []))
            return out

        return self._call("ListObjectsV2", base, run)

    def _tenant_prefix(self, tenant: str) -> str:
        return f"{self.prefix}/{tenant}/" if self.prefix else f"{tenant}/"

    def _session_prefix(self, tenant: str, session: str) -> str:
        return f"{self._tenant_prefix(tenant)}{session}/"

    def _uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _resolve(self, ref: SnapshotRef, tenant: str) -> str:
        """Map a ref to its key, refusing anything outside `<prefix>/<tenant>/` in this bucket."""
        tenant_prefix = self._tenant_prefix(validate_name("tenant", tenant))
        expected = f"s3://{self.bucket}/{tenant_prefix}"
        scheme, sep, rest = ref.uri.partition("://")
        bucket, _, key = rest.partition("/")
        if scheme != "s3" or not sep or bucket != self.bucket:
            raise TenantMismatch(ref, tenant, f"expected a uri under {expected}")
        if any(seg in ("", ".", "..") for seg in key.split("/")) or "?" in key or "#" in key:
            raise TenantMismatch(ref, tenant, "empty or relative key segments are not allowed")
        if not key.startswith(tenant_prefix):
            raise TenantMismatch(ref, tenant, f"expected a uri under {expected}")
        inner = key[len(tenant_prefix) :].split("/")
        if len(inner) != 2 or inner[0].startswith(".") or not NAME_RE.match(inner[1]):
            raise SnapshotNotFound(ref)
        return key
