"""Large snapshots as S3 multipart uploads: parts streamed as the chunks arrive, several in flight
while the next are read and hashed, and, when the hash was not known up front, a server-side copy
from a hidden staging key to the final key with its metadata. A failed upload is aborted.
"""

from __future__ import annotations

import functools
import math
import uuid
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from snapshots.errors import ChecksumMismatch, SnapshotError
from snapshots.ref import SnapshotRef
from snapshots.s3_body import Body, Views, content_md5, flat_view, release_views
from snapshots.s3_client import S3Calls
from snapshots.store import Chunk, snapshot_name

MiB = 1 << 20
MIN_PART_SIZE = 5 * MiB  # S3's minimum for every part but the last
MAX_PART_SIZE = 5 * 1024 * MiB
MAX_PARTS = 10_000
STAGING_DIR = ".partial"


class MultipartUploads(S3Calls):
    """The multipart side of `S3SnapshotStore` (its part size, concurrency and MD5 choice)."""

    part_size: int
    upload_concurrency: int
    _md5: bool

    def _put_multipart(
        self,
        base: str,
        ms: int,
        pending: Views,
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
                release_views(views)  # never handed to a part: ours to release
                raise
            inflight.add(pool.submit(self._upload_part, staging, upload_id, number, Body(views)))

        try:
            while True:
                while pending.size >= self.part_size:
                    send(pending.take(self.part_size))
                chunk = next(rest, None)
                if chunk is None:
                    break
                view = flat_view(chunk)
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

    def _upload_part(self, key: str, upload_id: str, number: int, body: Body) -> dict[str, Any]:
        """Upload one part (in a pool thread); its views are released whatever happens."""
        try:
            extra = {"ContentMD5": content_md5(body.views)} if self._md5 else {}
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
