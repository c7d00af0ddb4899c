"""`S3SnapshotStore`: snapshots in any S3-compatible object store (AWS S3, MinIO, Ceph RGW) via boto3.

This file holds the store's operations (put, get, open, list, delete, retain) and its key layout.
Beside it: `s3_client.py` (the boto3 client, typed errors), `s3_body.py` (request bodies over the
caller's buffers), `s3_multipart.py` (streamed multipart uploads and the staging copy).

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

import builtins
import datetime as dt
import functools
import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from snapshots.errors import ChecksumMismatch, SnapshotNotFound, TenantMismatch
from snapshots.ref import SnapshotRef
from snapshots.s3_body import Body, Views, check_signed_sha256, content_md5, flat_view, release_views
from snapshots.s3_client import build_client, signs_payload
from snapshots.s3_multipart import MAX_PART_SIZE, MAX_PARTS, MIN_PART_SIZE, STAGING_DIR, MiB, MultipartUploads
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

#: The old private name of the request body (tests import it from here).
_Body = Body

__all__ = ["MAX_PART_SIZE", "MAX_PARTS", "MIN_PART_SIZE", "STAGING_DIR", "MiB", "S3SnapshotStore"]

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


class S3SnapshotStore(MultipartUploads):
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
            client = build_client(
                endpoint_url,
                region,
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                max_attempts=max_attempts,
                addressing_style=addressing_style,
                upload_concurrency=upload_concurrency,
            )
        self._client: Any = client
        self._md5 = not signs_payload(client)
        # Only for a client built here is it known that every PutObject carries its payload's sha256
        # (SigV4, no checksum trailers): then a known hash is checked against the signed one.
        self._verify_signed = own_client and not self._md5
        if self._verify_signed:
            client.meta.events.register(
                "before-send.s3.PutObject", check_signed_sha256, unique_id="slotsched-check-signed-sha256"
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
        head = Views()
        try:
            # Read just past the threshold to learn whether one PutObject suffices.
            while head.size <= self.multipart_threshold:
                chunk = next(it, None)
                if chunk is None:
                    return self._put_small(base, ms, head, expected)
                head.add(flat_view(chunk))
            digest = hashlib.sha256()
            for view in head.views():
                digest.update(view)
            return self._put_multipart(base, ms, head, it, digest, expected)
        finally:
            head.release()  # whatever was not sent: the caller's buffers are its own again

    def _put_small(self, base: str, ms: int, views: Views, expected: str | None) -> SnapshotRef:
        size = views.size
        parts = views.take(size)
        # Small bodies are joined (a cheap copy, no Expect: 100-continue round trip); larger ones are
        # sent from the caller's buffers as they are.
        body: bytes | Body = b"".join(parts) if size <= _JOIN_MAX else Body(parts)
        try:
            if expected is not None and isinstance(body, Body) and self._verify_signed:
                # botocore hashes the body to sign it; `check_signed_sha256` compares that hash with
                # the expected one before a byte is sent, so the bytes are not hashed twice.
                sha = expected
                body.expected = SnapshotRef(self._uri(base + snapshot_name(ms, sha)), size, sha, ms / 1000)
            else:
                digest = hashlib.sha256()
                for view in parts if isinstance(body, Body) else [body]:
                    digest.update(view)
                sha = digest.hexdigest()
            key = base + snapshot_name(ms, sha)
            if expected is not None and sha != expected:
                raise ChecksumMismatch(SnapshotRef(self._uri(key), size, expected, ms / 1000), expected, sha)
            extra = (
                {"ContentMD5": content_md5([body] if isinstance(body, bytes) else parts)} if self._md5 else {}
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
            if isinstance(body, Body):
                body.release()
            else:
                release_views(parts)
        return SnapshotRef(self._uri(key), size, sha, ms / 1000)

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

    def _tenant_prefix(self, tenant: str) -> str:
        return f"{self.prefix}/{tenant}/" if self.prefix else f"{tenant}/"

    def _session_prefix(self, tenant: str, session: str) -> str:
        return f"{self._tenant_prefix(tenant)}{session}/"

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
