"""`SnapshotRef`: where a checkpoint lives. Pure data, so the snapshot stores, the core and the
SDK share one type without `snapshots/` importing anything of `scheduler/`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SnapshotRef:
    """Where a checkpoint of an actor lives; sha256 lets the restorer verify the bytes."""

    uri: str
    size_bytes: int = 0
    sha256: str = ""
    created: float = 0.0
    # The pool it was taken on and that pool's compatibility labels (say cpuModel): it resumes
    # only on a pool whose labels match them. Empty: taken before pools, resumes anywhere asked.
    pool: str = ""
    labels: tuple[tuple[str, str], ...] = ()


__all__ = ["SnapshotRef"]
