"""Snapshots of the scheduler's state: a pickle of the core and the server-side bookkeeping.

Why pickle: the core's indexes (versioned heaps, Fenwick trees, per-tenant queues) are its state;
re-deriving them from a logical dump would duplicate the core. The price is that a pickle is only
readable by the same code, so every snapshot carries a fingerprint (state format, Python
version, hash of the core's and the state store's sources) and a mismatch is refused with
`SnapshotMismatch` — recovery then replays the whole journal if it was never trimmed, or stops.

The core's heaps hold two closures (`Core.__init__.<locals>.current` / `current_victims`: is a
tenant's heap entry current?), which pickle cannot store. The pickler below stores each as a
`_VersionCheck` over the same tenants dict, which behaves identically; any other local function
makes snapshotting fail with `SnapshotError` (the journal is then simply never compacted).
"""

from __future__ import annotations

import hashlib
import io
import pickle
import sys
import types
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.core.types import WorkerId
from scheduler.server.loop import LoopState
from scheduler.server.registry import WorkerEntry

STATE_FORMAT = "slotsched-state/1"
# Closures of Core.__init__ and the tenant attribute each compares with the entry's version.
_CLOSURES = {
    "Core.__init__.<locals>.current": "version",
    "Core.__init__.<locals>.current_victims": "vversion",
}


class SnapshotError(Exception):
    """The state cannot be snapshotted or restored."""


class SnapshotMismatch(SnapshotError):
    """A snapshot written by a different build."""


def fingerprint() -> str:
    """Identifies which code can read a snapshot: a change to any of these files changes it."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"{STATE_FORMAT} py{sys.version_info[0]}.{sys.version_info[1]}".encode())
    # Every module whose classes are pickled: the core, the policy, and the server bookkeeping
    # (LoopState, EndedSession, WorkerEntry).
    files = sorted((root / "core").glob("*.py")) + [
        root / "policy.py",
        root / "server" / "loop.py",
        root / "server" / "registry.py",
        Path(__file__).resolve(),
    ]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return f"{STATE_FORMAT}:{h.hexdigest()[:16]}"


_FINGERPRINT = fingerprint()


class _VersionCheck:
    """Picklable stand-in for the core's `current` closures: is tenant `name` at `version`?"""

    __slots__ = ("tenants", "attr")

    def __init__(self, tenants: dict[str, Any], attr: str) -> None:
        self.tenants = tenants
        self.attr = attr

    def __call__(self, name: str, version: int) -> bool:
        return bool(getattr(self.tenants[name], self.attr) == version)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_VersionCheck, (self.tenants, self.attr))


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.FunctionType) and "<locals>" in obj.__qualname__:
            attr = _CLOSURES.get(obj.__qualname__)
            closure = obj.__closure__
            if attr is None or closure is None or len(closure) != 1 or attr not in obj.__code__.co_names:
                raise SnapshotError(f"cannot snapshot the local function {obj.__qualname__}")
            return (_VersionCheck, (closure[0].cell_contents, attr))
        return NotImplemented


@dataclass
class State:
    """Everything a snapshot holds."""

    loop: LoopState
    workers: dict[WorkerId, WorkerEntry]
    last_now: float  # the latest `now` applied: recovery carries leases from here


def dumps(state: State) -> bytes:
    buf = io.BytesIO()
    try:
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise SnapshotError(f"cannot snapshot the scheduler state: {e}") from e
    return buf.getvalue()


def loads(data: bytes, written_by: str) -> State:
    """Unpickle a snapshot written by `written_by` (its fingerprint); refuse another build's."""
    if written_by != _FINGERPRINT:
        raise SnapshotMismatch(
            f"snapshot written by {written_by!r}, this build reads {_FINGERPRINT!r} (core, policy or "
            "state code changed)"
        )
    try:
        state = pickle.loads(data)  # noqa: S301 - our own store, guarded by the fingerprint
    except Exception as e:  # noqa: BLE001 - any failure means the snapshot is unusable
        raise SnapshotError(f"cannot read the snapshot: {e}") from e
    if not isinstance(state, State) or not isinstance(state.loop.ended, OrderedDict):
        raise SnapshotError("the snapshot does not hold a slotsched state")
    return state


def current_fingerprint() -> str:
    return _FINGERPRINT
