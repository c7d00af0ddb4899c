"""The replicas alive now (issue 25: pools across replicas): the seam of the membership every
replica beats into and reads, so that each computes the same owners of the pools
(`pool_owners.assign`) from the same live set.

What a membership guarantees (tests/test_state_members.py, against every Redis topology):

* a replica is live from its `beat` until `ttl_s` after its latest one, by the store's clock
  (one clock for every replica: no two replicas disagree on who is live because their clocks
  differ), or until it `leave`s;
* `beat` answers the live set as of that beat, the beating replica included, with each
  member's advertised address (what a NOT_LEADER names for the pools it leads);
* whatever stops a call is `StoreUnavailable` (store.py), as for the state store.

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

    async def leave(self, replica_id: str) -> None:
        """Drop out now (a graceful exit), so the others take its pools at once."""
        ...

    async def close(self) -> None: ...
