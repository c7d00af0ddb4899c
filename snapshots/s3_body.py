"""The bytes an S3 request sends: views over the caller's buffers (cut into parts without copying),
a seekable body botocore can sign, send and resend from them, a Content-MD5, and the check that a
signed payload hash is the one the caller expected.

No boto3 here: these are plain byte views; `s3_client.py` and `s3.py` hand them to botocore.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from snapshots.errors import ChecksumMismatch, SnapshotError
from snapshots.ref import SnapshotRef
from snapshots.store import Chunk


def content_md5(views: Iterable[Chunk]) -> str:
    """The base64 MD5 of `views`, for a Content-MD5 header."""
    md5 = hashlib.md5(usedforsecurity=False)
    for v in views:
        md5.update(v)
    return base64.b64encode(md5.digest()).decode("ascii")


def check_signed_sha256(request: Any, **_: Any) -> None:
    """botocore `before-send` hook: refuse to send a body whose signed sha256 is not the one expected.

    With SigV4 payload signing, `x-amz-content-sha256` is the hash of exactly the bytes about to be
    sent (and S3 checks the body against it), so comparing it with the caller's hash verifies the
    snapshot before anything is stored, without hashing it a second time.
    """
    body = getattr(request, "body", None)
    if not isinstance(body, Body) or body.expected is None:
        return
    ref = body.expected
    signed = request.headers.get("X-Amz-Content-SHA256", "")
    if isinstance(signed, bytes):
        signed = signed.decode("ascii", "replace")
    if signed != ref.sha256:
        if re.fullmatch(r"[0-9a-f]{64}", signed):
            raise ChecksumMismatch(ref, ref.sha256, signed)
        raise SnapshotError(f"cannot verify {ref.uri}: the request carries no payload hash ({signed!r})")


def flat_view(chunk: Chunk) -> memoryview:
    """The store's own flat byte view of a caller's chunk (no copy), released when sent."""
    return memoryview(chunk).cast("B")


def release_views(views: Iterable[memoryview]) -> None:
    """Release each view, so none keeps the caller's buffer pinned."""
    for v in views:
        v.release()


class Views:
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
        release_views(self._views)
        self._views.clear()
        self.size = 0


class Body:
    """A read-only, seekable file over byte views, so botocore can sign, send and, on a retry, resend
    a part straight from the caller's buffers instead of one joined copy of it."""

    def __init__(self, views: list[memoryview]) -> None:
        self.views = views
        #: Set when the request's signed payload hash must be this ref's (see `check_signed_sha256`).
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
        release_views(self._lent)
        release_views(self.views)
        self._lent.clear()
