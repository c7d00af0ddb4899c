"""The seam under the replica: what a durable state store does for one replica (`Replica`,
`Standby`), and the two errors it may raise. The replica's logic (election, take-over,
journaling, the standby's following) names nothing of any store; `RedisStore`
(redis_store.py: one Redis, Sentinel or Cluster) is the one store there is.

What every store must guarantee, each a test of tests/test_state_store_contract.py (run against
every store and topology):

* **one leader**: `try_lead` wins only while no other replica holds an unexpired lease; the
  lease lapses `ttl` after the last `try_lead`/`extend_lead`, by the store's clock;
* **a term per win**: a won lease is a new term, its `token` one never given out before (also
  when the same replica wins again), so work left from an earlier term is fenced like another
  replica's;
* **fenced writes**: `append`, `save_snapshot` and `publish_address` with a token that is not
  the lease's current one are refused (`StaleTerm`, or False) and leave nothing visible;
* **renewal**: `extend_lead` keeps the lease of its own term only (False otherwise) and records
  the leader's clock (`alive`);
* **an ordered journal**: an append's entries, all or none, follow every earlier one's;
  `journal_after(p)` gives every entry after `p` (`START`: all), in order, in chunks;
* **snapshot and trim**: `save_snapshot(covers=p)` stores the snapshot and drops the entries up
  to the previous snapshot's `p'` (none after it; the first snapshot drops none), so one
  snapshot's worth of journal stays for a standby reading a little behind; once any were dropped
  `trimmed()`, and `trimmed_past(q)` for every `q` before `p'`;
* **the tail**: `tail(p)` waits up to `block_ms` for entries after `p`; `gap` says entries after
  `p` were trimmed before they were read (the standby then reloads the snapshot);
* **the leader's address**: `publish_address` is fenced; `leader_address` is the current term's
  only, never an earlier term's;
* **one failure type**: whatever stops the store doing a call (unreachable, an error reply,
  replicas that did not confirm in time) is `StoreUnavailable`: the replica names no client's
  types.

Positions are the store's own strings, opaque to the replica except for `START` (before the
first entry); only the store compares them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "START",
    "AppendDone",
    "Entry",
    "Position",
    "StaleTerm",
    "StateStore",
    "StoreUnavailable",
    "StoredSnapshot",
    "Tail",
]

#: A journal position, as the store gives it out (Redis: a stream id).
Position = str
#: Before the first entry: `journal_after(START)` is the whole journal.
START: Position = ""
#: One journal entry: its position and the record (scheduler/state/codec.py).
Entry = tuple[Position, bytes]
#: Told the outcome of `append_nowait`: the last entry's position, or the failure.
AppendDone = Callable[[Position | BaseException], None]


class StoreUnavailable(Exception):
    """The store did not do the call: unreachable, an error reply, replicas behind. The replica
    retries, or steps down; never told to a caller as such (that is ports.StateUnavailable)."""


class StaleTerm(Exception):
    """A fenced write refused: the token is not the lease's current term (another replica leads,
    or this one won again since). Nothing of the write is visible."""


@dataclass(frozen=True)
class StoredSnapshot:
    """A state snapshot as stored: the document (state_write.py), what wrote it, the journal
    position it covers (the entries after it follow it), and the leader's clock then."""

    data: bytes
    fingerprint: str
    covers: Position
    at: float


@dataclass(frozen=True)
class Tail:
    """What a standby's `tail` read: the entries after its position, and whether entries after
    it were trimmed before they were read (`gap`: reload the snapshot)."""

    entries: list[Entry]
    gap: bool


class StateStore(Protocol):
    """One replica's view of the shared durable state (see the module docstring's guarantees).
    Every call may raise StoreUnavailable; the fenced writes also StaleTerm."""

    replica_id: str
    token: str  # this replica's term: the one it last won (new at every win)
    #: How long a standby's `tail` may wait for entries on this store (its connection's timeout
    #: covers that wait), or 0: only well within the call timeout (the replica's default).
    idle_tail_ms: int

    @property
    def where(self) -> str:
        """The store's address for messages (no password)."""
        ...

    async def close(self) -> None: ...

    # ---------------------------------------------------------------- the lease and its term

    async def try_lead(self, ttl_s: float) -> bool:
        """Win a new term (a new `token`): the lease is free, or still this replica's."""
        ...

    async def extend_lead(self, ttl_s: float, now: float) -> bool:
        """Keep the lease of this term; record `now` (the leader's clock) as when it was alive."""
        ...

    async def alive(self) -> float | None:
        """When the last leader last renewed its lease (its clock), if one ever did."""
        ...

    async def resign(self) -> None:
        """Give the lease up now (a graceful exit), if it is still this term's."""
        ...

    async def publish_address(self, address: str, token: str) -> bool:
        """Record `address` as the leader's of the term `token`; False if that term is over."""
        ...

    async def leader(self) -> str | None:
        """The term token of the lease's holder now (`<replica id>:…`), if any: who leads, for
        an operator (Admin.DescribePool)."""
        ...

    async def leader_address(self) -> str | None:
        """The address the current term's leader published, if it did."""
        ...

    # ---------------------------------------------------------------- the journal

    async def append(self, records: list[bytes], token: str) -> Position:
        """Append `records` in order, all or none, fenced by the term `token`: the last one's
        position. Raises StaleTerm."""
        ...

    def append_nowait(self, records: list[bytes], token: str, done: AppendDone) -> bool:
        """`append`, sent now, `done` told from the event loop when it lands or fails. False
        (nothing sent) if this store cannot send now: the replica awaits `append` instead."""
        ...

    def journal_after(self, after: Position, chunk: int = 2000) -> AsyncIterator[list[Entry]]:
        """Every entry after `after` (START: all), in order, in chunks."""
        ...

    async def tail(self, after: Position, block_ms: int, count: int = 2000) -> Tail:
        """The entries after `after` (at most `count`), waiting up to `block_ms` for the first
        (see `Tail`)."""
        ...

    async def trimmed_past(self, after: Position) -> bool:
        """Entries after `after` were trimmed: the journal cannot be read on from there."""
        ...

    async def trimmed(self) -> bool:
        """The journal was ever trimmed (it no longer starts at the beginning)."""
        ...

    # ---------------------------------------------------------------- state snapshots

    async def save_snapshot(
        self, data: bytes, fingerprint: str, covers: Position, at: float, token: str
    ) -> None:
        """Store the snapshot covering the journal up to `covers`, then trim what it covers;
        fenced by the term `token` (StaleTerm)."""
        ...

    async def load_snapshot(self) -> StoredSnapshot | None: ...
