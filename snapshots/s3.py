"""`S3SnapshotStore`: snapshots in any S3-compatible object store (AWS S3, MinIO, Ceph RGW) via boto3.

Why it is built this way:

* Atomic by construction: S3 makes an object visible only once a `PutObject` or a
  `CompleteMultipartUpload` succeeds, so a checkpoint interrupted mid-way is never readable. Failed
  multipart uploads are aborted (best effort: if the store itself is gone the abort cannot reach it
  either, so buckets should also carry an `AbortIncompleteMultipartUpload` lifecycle rule).
* Streaming: snapshots above `multipart_threshold` are uploaded part by part as the chunks arrive;
  at most max(threshold, part size) bytes plus one incoming chunk are held in memory.
* Verified: the sha256 and size are stored as object metadata (`x-amz-meta-sha256`,
  `x-amz-meta-size`) and every read is checked against the ref's sha256 (or that metadata). S3 fixes
  metadata when an upload *starts*, but a streamed snapshot's hash is only known at its end, and the
  key embeds the hash too. So a large snapshot is first uploaded to a hidden staging key
  (`<tenant>/<session>/.partial/...`, never listed), then committed with a server-side multipart
  copy (`UploadPartCopy`, no bytes through this process) to its final key with the metadata set,
  and the staging object is deleted. Small snapshots are hashed in memory and need one `PutObject`.
  A caller that already knows the hash (`put(..., sha256=...)`, e.g. an actor hashing its state as
  it grows) skips the staging: parts go straight to the final key, and the streamed bytes are
  checked against the hash before the upload is completed (a mismatch aborts it).
* Each part and small object carries Content-MD5, so the store rejects a body damaged in transit.
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
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import boto3
import botocore.exceptions as bexc
from botocore.config import Config

from scheduler.core.types import SnapshotRef
from snapshots.errors import (
    ChecksumMismatch,
    SnapshotError,
    SnapshotNotFound,
    SnapshotUnavailable,
    TenantMismatch,
)
from snapshots.store import (
    NAME_RE,
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


def _content_md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")


class S3SnapshotStore:
    """A `SnapshotStore` in `bucket` under `prefix`.

    `multipart_threshold`: snapshots larger than this are streamed as a multipart upload with parts of
    `part_size` bytes (default: the threshold, at least 5 MiB); smaller ones use one `PutObject`.
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
        multipart_threshold: int = 8 * MiB,
        client: Any | None = None,
        *,
        part_size: int | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_attempts: int = 3,
        addressing_style: str | None = None,
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
        self.part_size = part_size if part_size is not None else max(multipart_threshold, MIN_PART_SIZE)
        if not MIN_PART_SIZE <= self.part_size <= MAX_PART_SIZE:
            raise ValueError(f"part_size must be between 5 MiB and 5 GiB, got {self.part_size}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if client is None:
            style = addressing_style or ("path" if endpoint_url else "auto")
            if style not in ("auto", "path", "virtual"):
                raise ValueError(f"addressing_style must be auto, path or virtual, not {style!r}")
            options: dict[str, Any] = {
                "connect_timeout": connect_timeout,
                "read_timeout": read_timeout,
                "retries": {"total_max_attempts": max_attempts, "mode": "standard"},
                "s3": {"addressing_style": style},
            }
            if "request_checksum_calculation" in Config.OPTION_DEFAULTS:  # botocore >= 1.36
                options["request_checksum_calculation"] = "when_required"
                options["response_checksum_validation"] = "when_required"
            config = Config(**options)
            client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=config
            )
        self._client: Any = client

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
        chunks: Iterable[bytes],
        created: float | None = None,
        *,
        sha256: str | None = None,
    ) -> SnapshotRef:
        base = self._session_prefix(validate_name("tenant", tenant), validate_name("session", session))
        ms = created_ms(created)
        expected = validate_sha256(sha256)
        it = iter(chunks)
        digest = hashlib.sha256()
        head = bytearray()
        # Read just past the threshold to learn whether one PutObject suffices.
        while len(head) <= self.multipart_threshold:
            chunk = next(it, None)
            if chunk is None:
                return self._put_small(base, ms, bytes(head), digest.hexdigest(), expected)
            head += chunk
            digest.update(chunk)
        return self._put_multipart(base, ms, head, it, digest, expected)

    def _put_small(
        self, base: str, ms: int, body: bytes, sha: str, expected: str | None = None
    ) -> SnapshotRef:
        key = base + snapshot_name(ms, sha)
        if expected is not None and sha != expected:
            raise ChecksumMismatch(SnapshotRef(self._uri(key), len(body), expected, ms / 1000), expected, sha)
        self._call(
            "PutObject",
            key,
            lambda: self._client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=body,
                ContentMD5=_content_md5(body),
                ContentType="application/octet-stream",
                Metadata={"sha256": sha, "size": str(len(body))},
            ),
        )
        return SnapshotRef(self._uri(key), len(body), sha, ms / 1000)

    def _put_multipart(
        self,
        base: str,
        ms: int,
        buf: bytearray,
        rest: Iterator[bytes],
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
        size = len(buf)
        upload_id: str = self._call(
            "CreateMultipartUpload",
            staging,
            lambda: self._client.create_multipart_upload(
                Bucket=self.bucket, Key=staging, ContentType="application/octet-stream", **create_extra
            ),
        )["UploadId"]
        parts: list[dict[str, Any]] = []

        def send(data: bytes) -> None:
            number = len(parts) + 1
            if number > MAX_PARTS:
                raise SnapshotError(
                    f"snapshot exceeds {MAX_PARTS} parts of {self.part_size} bytes; raise part_size"
                )
            resp = self._call(
                "UploadPart",
                staging,
                lambda: self._client.upload_part(
                    Bucket=self.bucket,
                    Key=staging,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=data,
                    ContentMD5=_content_md5(data),
                ),
            )
            parts.append({"ETag": resp["ETag"], "PartNumber": number})

        try:
            while True:
                while len(buf) >= self.part_size:
                    with memoryview(buf) as view:
                        part = bytes(view[: self.part_size])
                    del buf[: self.part_size]
                    send(part)
                    del part
                chunk = next(rest, None)
                if chunk is None:
                    break
                buf += chunk
                digest.update(chunk)
                size += len(chunk)
            if buf or not parts:
                send(bytes(buf))
            buf.clear()
            if expected is not None and digest.hexdigest() != expected:
                ref = SnapshotRef(self._uri(staging), size, expected, ms / 1000)
                raise ChecksumMismatch(ref, expected, digest.hexdigest())
            self._call(
                "CompleteMultipartUpload",
                staging,
                lambda: self._client.complete_multipart_upload(
                    Bucket=self.bucket, Key=staging, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )
        except BaseException:
            self._abort(staging, upload_id)
            raise

        sha = digest.hexdigest()
        if expected is not None:
            return SnapshotRef(self._uri(staging), size, sha, ms / 1000)
        key = base + snapshot_name(ms, sha)
        try:
            self._commit_copy(staging, key, size, sha)
        finally:
            self._delete_quietly(staging)
        return SnapshotRef(self._uri(key), size, sha, ms / 1000)

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
