"""Errors a snapshot store raises, split by what the caller should do about them.

A yielding or resuming session reacts differently to each failure: a missing or corrupt snapshot
means the work it held is lost (restart from an older snapshot, or from scratch, and count the loss),
a ref from another tenant is a bug or an attack (refuse, never serve), and an unavailable store is
temporary (retry later, keep the lease). One exception type per reaction keeps callers honest.
"""

from __future__ import annotations

from snapshots.ref import SnapshotRef


class SnapshotError(Exception):
    """Base of every error a `SnapshotStore` raises on purpose."""


class SnapshotNotFound(SnapshotError, LookupError):
    """The ref names no stored snapshot (never written, deleted, or pruned by retention)."""

    def __init__(self, ref: SnapshotRef) -> None:
        self.ref = ref
        self.uri = ref.uri
        super().__init__(f"snapshot not found: {ref.uri}")


class ChecksumMismatch(SnapshotError):
    """The stored bytes do not hash to the sha256 recorded for them: refuse to restore from them."""

    def __init__(self, ref: SnapshotRef, expected: str, actual: str) -> None:
        self.ref = ref
        self.uri = ref.uri
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"snapshot {ref.uri} is corrupt: sha256 expected {expected or '(none recorded)'}, "
            f"got {actual}; refusing to restore from it"
        )


class TenantMismatch(SnapshotError):
    """The ref lies outside the calling tenant's prefix in this store: refused, never read or deleted."""

    def __init__(self, ref: SnapshotRef, tenant: str, detail: str = "") -> None:
        self.ref = ref
        self.uri = ref.uri
        self.tenant = tenant
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"snapshot {ref.uri} is outside tenant {tenant!r}'s prefix; refused{suffix}")


class SnapshotUnavailable(SnapshotError):
    """The store could not be reached or timed out. Temporary: the same call may succeed later.

    The underlying transport error is chained as `__cause__`.
    """
