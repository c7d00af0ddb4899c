"""The replicas alive now (issue 25: pools across replicas): the seam of the membership every
replica beats into and reads, so that each computes the same owners of the pools
(`pool_owners.assign`) from the same live set.

What a membership guarantees (tests/test_state_members.py, against every Redis topology):

* a replica is live from its `beat` until `ttl_s` after its latest one, by the store's clock
  (one clock for every replica: no two replicas disagree on who is live because their clocks
  differ), or until it `leave`s;
* `beat` answers the live set as of that beat, the beating replica included, with each
  member's advertised address (what a NOT_LEADER names for the pools it leads);
* the **owners table** (pool -> replica, what `pool_owners.assign` decided) has a version;
  `set_owners(version, table, live)` writes only if the version is still the one read and the
  live set is still the one the table was computed from (a compare-and-set of both), so two
  replicas seeing the same change write one table, not two, and a replica whose read of the
  membership is a moment old (a rejoin since) writes nothing: it would write the rejoined replica
  out, which then takes pools back, three versions and three times the moves for one rejoin;
* whatever stops a call is `StoreUnavailable` (store.py), as for the state store.

Why a table and not each replica's own `assign` from who leads now: assignment is sticky, so
it depends on where pools are; computed from the leaders of the moment it would flap while a
pool is handed over (leaderless for an instant, it could be placed back). The table is the one
place pools are said to be: replicas campaign for the pools it gives them, leaders hand over
those it gives to another, and a change is written once.

A replica frozen (SIGSTOP) or cut from the store stops beating and drops out after `ttl_s`; its
pools are then assigned to the others, while the per-pool leader leases and their fencing (the
state store's) keep it from writing anything for a pool it no longer leads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Member", "Members"]


@dataclass(frozen=True, order=True)
class Member:
    replica_id: str
    address: str


class Members(Protocol):
    async def beat(self, replica_id: str, address: str, ttl_s: float) -> list[Member]:
        """Say `replica_id` is alive for `ttl_s` more; the live members, by replica id."""
        ...

    async def live(self) -> list[Member]:
        """The live members, by replica id."""
        ...

    async def owners(self) -> tuple[int, dict[str, str]]:
        """The owners table and its version (0 and empty: never written)."""
        ...

    async def set_owners(self, version: int, owners: dict[str, str], live: list[str]) -> bool:
        """Write the table (version + 1) if it is still at `version` and the live members are
        still `live` (their ids); False if another table was written or the membership moved."""
        ...

    async def leave(self, replica_id: str) -> None:
        """Drop out now (a graceful exit), so the others take its pools at once."""
        ...

    async def close(self) -> None: ...
