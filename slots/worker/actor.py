"""The reference actor: a simulated agent whose state is real bytes that grow turn by turn.

Why a simulated agent with *real* state rather than a sleep loop: checkpoint-and-yield is only
proven if what comes back after a resume is byte-for-byte what was checkpointed, on another slot,
through a real snapshot store, and if a damaged snapshot is caught. So the actor keeps a
conversation history that every turn extends with a deterministic chunk (derived from the session
id and the turn number, so anyone can recompute it), and its state is exactly those bytes plus a
fixed-size trailer:

    state = history || trailer
    trailer = magic(8) | turns u64 | bytes_per_turn u64 | history_len u64 | run_seconds f64
              | sha256(session_id)[:16]

The trailer is at the *end* so the actor can keep one running sha256 over the history and get the
state's hash at any time by hashing only the 56 trailer bytes on top of a copy: Status and Start
report the state hash of a 128 MiB actor without re-reading it. `run_seconds` is the slot time the
actor had run at its last turn (the state changes only at turns, so the hash is stable between).

A restore verifies the state two ways: its sha256 must equal the snapshot ref's (the store checks
that too; the actor re-checks what it actually restored), and it must be internally consistent
(magic, lengths, turn count, owner session, and the first and last turn's chunks recomputed).
A failure raises `StateCorrupt`, which names the snapshot's URI.
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Generator
from dataclasses import dataclass

MAGIC = b"SSACTOR1"
TRAILER = struct.Struct("<8sQQQd16s")
TRAILER_SIZE = TRAILER.size  # 56
#: How many bytes of a turn's chunk a restore recomputes to check consistency (first and last turn).
SPOT_CHECK_BYTES = 4096
#: State is streamed to the snapshot store as views of this size (no copy of the history).
STREAM_CHUNK = 8 << 20
_CHUNK_DOMAIN = b"slotsched-actor-turn\0"


class StateCorrupt(ValueError):
    """A snapshot's bytes are not a valid state of this session's actor; names the snapshot."""

    def __init__(self, uri: str, reason: str) -> None:
        self.uri = uri
        self.reason = reason
        super().__init__(f"snapshot {uri} refused: {reason}")


@dataclass(frozen=True)
class ActorConfig:
    """How a fresh actor behaves: `bytes_per_turn` appended every `turn_interval_s` seconds, at most
    `max_turns` turns (None = forever). A restored actor keeps the bytes_per_turn of its snapshot."""

    bytes_per_turn: int = 4096
    turn_interval_s: float = 0.25
    max_turns: int | None = None

    def __post_init__(self) -> None:
        if self.bytes_per_turn < 1:
            raise ValueError(f"bytes_per_turn must be at least 1, got {self.bytes_per_turn}")
        if not self.turn_interval_s > 0:
            raise ValueError(f"turn_interval_s must be positive, got {self.turn_interval_s}")
        if self.max_turns is not None and self.max_turns < 0:
            raise ValueError(f"max_turns must be >= 0, got {self.max_turns}")


def session_digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode()).digest()[:16]


def turn_chunk(session_id: str, turn: int, size: int) -> bytes:
    """The deterministic bytes turn `turn` (0-based) of `session_id` appends.

    SHAKE-256 output is prefix-stable: the first k bytes do not depend on `size`, so a restore can
    recompute a short prefix of a huge chunk to spot-check it.
    """
    seed = _CHUNK_DOMAIN + session_id.encode() + b"\0" + turn.to_bytes(8, "little")
    return hashlib.shake_256(seed).digest(size)


class Actor:
    """One session's simulated agent. Not thread-safe: the host serialises turns and checkpoints."""

    def __init__(self, session_id: str, bytes_per_turn: int) -> None:
        if bytes_per_turn < 1:
            raise ValueError(f"bytes_per_turn must be at least 1, got {bytes_per_turn}")
        self.session_id = session_id
        self.bytes_per_turn = bytes_per_turn
        self.turns = 0
        self.history = bytearray()
        self._hash = hashlib.sha256()
        #: Slot-seconds this actor had run at its last turn (what the trailer records).
        self.run_seconds = 0.0
        # Run time before this incarnation (from the snapshot), and when this incarnation began.
        self._run_base = 0.0
        self._running_since = time.monotonic()

    # ------------------------------------------------------------------ running

    def live_run_seconds(self, now: float | None = None) -> float:
        """Slot-seconds run so far, including the time since the last turn."""
        now = time.monotonic() if now is None else now
        return self._run_base + (now - self._running_since)

    def next_chunk(self) -> bytes:
        """The chunk the next turn appends (pure: safe to compute off the event loop)."""
        return turn_chunk(self.session_id, self.turns, self.bytes_per_turn)

    def take_turn(self, chunk: bytes | None = None) -> None:
        """Append the next turn's chunk (computed here unless the caller precomputed it)."""
        if chunk is None:
            chunk = self.next_chunk()
        elif len(chunk) != self.bytes_per_turn:
            raise ValueError(f"a turn appends {self.bytes_per_turn} bytes, not {len(chunk)}")
        try:
            self.history += chunk
        except BufferError:
            # A view of the history lent to a checkpoint is still alive somewhere (e.g. held by a
            # traceback): it cannot be resized, so grow a copy instead; the old buffer stays with it.
            self.history = self.history + chunk
        self._hash.update(chunk)
        self.turns += 1
        self.run_seconds = self.live_run_seconds()

    # ------------------------------------------------------------------ state

    def trailer(self) -> bytes:
        return TRAILER.pack(
            MAGIC,
            self.turns,
            self.bytes_per_turn,
            len(self.history),
            self.run_seconds,
            session_digest(self.session_id),
        )

    @property
    def state_size(self) -> int:
        return len(self.history) + TRAILER_SIZE

    def state_sha256(self) -> str:
        h = self._hash.copy()
        h.update(self.trailer())
        return h.hexdigest()

    def state_chunks(self, chunk_size: int = STREAM_CHUNK) -> Generator[bytes | memoryview, None, None]:
        """The state as read-only views of the history (no copy: a 128 MiB state is not duplicated
        to be checkpointed), then the trailer.

        The actor must not take a turn until the iterator is exhausted (the host holds its lock). A
        view that is still referenced afterwards does not break the next turn (see `take_turn`).
        """
        trailer = self.trailer()
        with memoryview(self.history) as view, view.toreadonly() as ro:
            for i in range(0, len(ro), chunk_size):
                yield ro[i : i + chunk_size]
        yield trailer

    def state_bytes(self) -> bytes:
        return bytes(self.history) + self.trailer()

    # ------------------------------------------------------------------ restore

    @classmethod
    def restore(cls, data: bytes, session_id: str, uri: str, expected_sha256: str = "") -> Actor:
        """Rebuild an actor from snapshot bytes, or raise `StateCorrupt` naming `uri`.

        Checks, in order: the sha256 of `data` against `expected_sha256` (when given), the trailer
        (magic, lengths, turns x bytes_per_turn, owner session), and the first and last turns'
        chunks recomputed (a prefix of each).
        """
        view = memoryview(data)
        if len(view) < TRAILER_SIZE:
            raise StateCorrupt(uri, f"{len(view)} bytes is shorter than the {TRAILER_SIZE}-byte trailer")
        history = view[: len(view) - TRAILER_SIZE]
        h = hashlib.sha256(history)
        trailer = bytes(view[len(view) - TRAILER_SIZE :])
        if expected_sha256:
            full = h.copy()
            full.update(trailer)
            actual = full.hexdigest()
            if actual != expected_sha256:
                raise StateCorrupt(uri, f"sha256 is {actual}, the ref says {expected_sha256}")
        magic, turns, bpt, history_len, run_seconds, owner = TRAILER.unpack(trailer)
        if magic != MAGIC:
            raise StateCorrupt(uri, f"not an actor state (magic {magic!r})")
        if history_len != len(history):
            raise StateCorrupt(uri, f"trailer says {history_len} history bytes, found {len(history)}")
        if bpt < 1 or turns * bpt != history_len:
            raise StateCorrupt(uri, f"{turns} turns x {bpt} bytes does not make {history_len} bytes")
        if owner != session_digest(session_id):
            raise StateCorrupt(uri, f"the state belongs to another session than {session_id!r}")
        if not (run_seconds >= 0.0 and run_seconds < 1e12):
            raise StateCorrupt(uri, f"implausible run_seconds {run_seconds!r}")
        for turn in {0, turns - 1} if turns else ():
            n = min(bpt, SPOT_CHECK_BYTES)
            start = turn * bpt
            if bytes(history[start : start + n]) != turn_chunk(session_id, turn, n):
                raise StateCorrupt(uri, f"turn {turn}'s content is not what the session wrote")
        actor = cls(session_id, bpt)
        actor.history = bytearray(history)
        actor._hash = h
        actor.turns = turns
        actor.run_seconds = run_seconds
        actor._run_base = run_seconds
        actor._running_since = time.monotonic()
        return actor


def read_trailer(data: bytes) -> tuple[int, int, float] | None:
    """(turns, bytes_per_turn, run_seconds) from the end of a state, or None if it has none.

    Unverified: used only to estimate how much work an unusable snapshot held.
    """
    if len(data) < TRAILER_SIZE:
        return None
    magic, turns, bpt, _len, run_seconds, _owner = TRAILER.unpack(data[-TRAILER_SIZE:])
    if magic != MAGIC:
        return None
    return turns, bpt, run_seconds
