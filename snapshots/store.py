"""The `SnapshotStore` contract every backend honours, and the naming rules they share.

Preemption is only safe if a yielded session can come back exactly where it left off, so the store's
guarantees are the point of this module, stated once here and checked for every backend by one
contract-test suite (tests/test_snapshot_contract.py). Backends: `snapshots.local` (the embedded
default) and `snapshots.s3` (any S3-compatible store).

Layout shared by all backends: `<tenant>/<session>/<created-ms, 15 digits>-<sha256[:12]>.snap`.
The zero-padded creation time makes a plain name sort a time sort, so `list` and `retain` need no
index; the hash prefix keeps two snapshots taken in the same millisecond apart.
"""

from __future__ import annotations

import builtins
import math
import re
import time
from collections.abc import Iterable, Iterator
from typing import Protocol, TypeAlias, runtime_checkable

from snapshots.ref import SnapshotRef

#: What `put` accepts as a chunk: any flat bytes-like object. A memoryview lets a caller lend a slice
#: of its own buffer instead of copying it (see `put`).
Chunk: TypeAlias = bytes | bytearray | memoryview

SNAPSHOT_SUFFIX = ".snap"
_MS_DIGITS = 15
NAME_RE = re.compile(r"^(?P<ms>\d{15})-(?P<sha>[0-9a-f]{12})\.snap$")
# Tenant and session names become path components and key segments verbatim, so only characters that
# need no quoting in a file path, a file:// URI or an S3 key are allowed; a leading dot is refused so
# `.`/`..` and the stores' hidden staging names can never be addressed.
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:@=+-]{0,199}$")


@runtime_checkable
class SnapshotStore(Protocol):
    """Durable, verified storage of actor checkpoints, partitioned by tenant and session.

    Guarantees every implementation gives (and the contract suite checks):

    * Atomic: a snapshot is either completely stored and visible, or absent. A `put` that fails or is
      interrupted (the chunk iterator raises, the process dies, the store goes away) never leaves a
      torn snapshot that `get`, `open` or `list` could return.
    * Verified: every read recomputes the sha256 of the bytes and compares it with `ref.sha256` (or,
      if the ref carries none, with the hash recorded at `put`); a mismatch raises `ChecksumMismatch`
      naming the ref, never returns the bytes as good.
    * Isolated: every call names the calling tenant; a ref outside that tenant's prefix raises
      `TenantMismatch` before any byte is read or deleted.
    * Typed failures: missing -> `SnapshotNotFound`; store unreachable or timing out ->
      `SnapshotUnavailable` (temporary; the transport error is chained); bad tenant/session name ->
      `ValueError`. Everything else the store raises on purpose derives from `SnapshotError`.
    """

    def put(
        self,
        tenant: str,
        session: str,
        chunks: Iterable[Chunk],
        created: float | None = None,
        *,
        sha256: str | None = None,
    ) -> SnapshotRef:
        """Store the concatenation of `chunks` as a new snapshot of `session` and return its ref.

        `chunks` is consumed once, as a stream; the whole snapshot never has to be in memory.
        A chunk may be a view of the caller's own buffer: the store may keep referring to it (not
        copy it) until `put` returns or raises, never after, so the caller may change or reuse the
        buffer once `put` is done.
        `created` (unix seconds, default now) is rounded to milliseconds; the returned ref carries
        the rounded value, so it compares equal to the ref `list` returns. The ref's `sha256` is the
        hex digest of the bytes and `size_bytes` their length. If the iterator raises, the exception
        propagates and nothing is stored.

        `sha256`: the hex digest of the bytes when the caller already knows it (an actor that hashes
        its state as it grows). A backend may then write to the final location directly (S3: no
        staging object and server-side copy); the bytes are still hashed as they stream and, if
        they do not match, nothing is stored and `ChecksumMismatch` is raised.
        """
        ...

    def get(self, ref: SnapshotRef, tenant: str) -> bytes:
        """Return the snapshot's bytes, verified against its sha256 before they are returned."""
        ...

    def open(self, ref: SnapshotRef, tenant: str) -> Iterator[bytes]:
        """Stream the snapshot's bytes in chunks.

        Not-found and tenant errors are raised by this call, before iteration. The hash is checked when
        the stream is exhausted: the last `next()` raises `ChecksumMismatch` instead of ending, so a
        consumer must not commit restored state until the iterator has finished cleanly.
        """
        ...

    def delete(self, ref: SnapshotRef, tenant: str) -> None:
        """Remove the snapshot. Idempotent: deleting an absent snapshot is not an error."""
        ...

    def list(self, tenant: str, session: str) -> builtins.list[SnapshotRef]:
        """All complete snapshots of `session`, oldest first (newest last); empty if none."""
        ...

    def retain(self, tenant: str, session: str, keep: int) -> int:
        """Delete all but the newest `keep` snapshots of `session`; return how many were deleted."""
        ...


def validate_name(kind: str, value: str) -> str:
    """Return `value` if it is a safe tenant/session segment, else raise a ValueError saying why."""
    if not isinstance(value, str) or value == "":
        raise ValueError(f"{kind} name must be a non-empty string, got {value!r}")
    if "/" in value or "\\" in value:
        raise ValueError(f"{kind} name {value!r} must not contain a path separator")
    if value in (".", "..") or value.startswith("."):
        raise ValueError(f"{kind} name {value!r} must not start with '.'")
    if not _SEGMENT_RE.match(value):
        raise ValueError(
            f"{kind} name {value!r} is invalid: use at most 200 of A-Z a-z 0-9 and . _ : @ = + -"
        )
    return value


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def validate_sha256(value: str | None) -> str | None:
    """`value` if it is None or a lower-case hex SHA-256, else a ValueError."""
    if value is not None and not (isinstance(value, str) and _SHA256_RE.match(value)):
        raise ValueError(f"sha256 must be 64 lower-case hex digits, got {value!r}")
    return value


def validate_keep(keep: int) -> int:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ValueError(f"keep must be a non-negative integer, got {keep!r}")
    return keep


def created_ms(created: float | None) -> int:
    """Creation time in whole milliseconds (now if None); refuses negative or absurd times."""
    seconds = time.time() if created is None else float(created)
    if not math.isfinite(seconds) or not 0 <= round(seconds * 1000) < 10**_MS_DIGITS:
        raise ValueError(f"created must be unix seconds between 0 and year ~33000, got {created!r}")
    return round(seconds * 1000)


def snapshot_name(ms: int, sha256_hex: str) -> str:
    return f"{ms:0{_MS_DIGITS}d}-{sha256_hex[:12]}{SNAPSHOT_SUFFIX}"


def name_created(name: str) -> float | None:
    """Creation time (seconds) encoded in a snapshot file/object name, or None if it is not one."""
    m = NAME_RE.match(name)
    return int(m.group("ms")) / 1000 if m else None
