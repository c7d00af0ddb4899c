"""One replica's part in spreading pools over replicas (issue 25): beat into the membership,
keep the owners table true (`pool_owners.assign` over the live replicas, written by
compare-and-set), and say which pools this replica should lead now.

Each pool's own leader lease and fencing term (the pool's `StateStore`) decide who *does*
lead it; this table only says who should *try*. So a wrong or stale table can cost a pool time,
never safety: two replicas believing they own a pool still meet at its lease, and a replica that
lost it can append nothing (fenced). A pool's `Replica` asks `should_lead(pool)` before each
campaign, and a leader of a pool the table gives another hands it over (it makes its state
durable, resigns the lease, follows again); the new owner, a hot standby of the pool, wins within
a campaign interval.

Successors. The table also names each pool's successor (`pool_owners.follow`, stored under
`NEXT` + pool): the one replica besides the owner that follows the pool hot
(`should_follow`) and takes it if the owner leaves. The owner campaigns; the successor only once
the owner is out of the membership; every other replica holds nothing of the pool and asks the
store nothing about it (docs/design.md, "Pools across replicas").

Timing. `beat_interval_s` (default 250 ms) and `member_ttl_s` (default 1 s, as the leader
lease): a replica frozen or cut from the store drops out of the membership within a TTL, the
next beat of any other replica rewrites the table, and the new owners campaign for its pools,
whose leases lapse within their own TTL. A replica claims its pools only while its membership
surely holds in the store: until TTL − 10 % after it *sent* its last successful beat, on its
monotonic clock (the leader lease's rule, replica.py). So one slow or failed beat costs nothing
(the others still see it live, and it keeps its pools), while a replica cut from the store,
or frozen past that, claims nothing: `should_lead` is false for every pool until a beat
succeeds again, before the others can have reassigned them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from scheduler.state.members import Member, Members
from scheduler.state.pool_owners import assign, follow
from scheduler.state.store import StoreUnavailable

__all__ = ["Ownership"]

#: The owners table holds each pool's successor under this prefix + the pool (not a pool name).
NEXT = "\x01"

#: A replica stops claiming its pools this fraction of the member TTL before its membership
#: could lapse in the store (clock-rate drift, as the leader lease's MARGIN).
MARGIN = 0.1

log = logging.getLogger("slotsched.state")


class Ownership:
    """This replica's view of the owners table; `step` once per beat (`run` loops it)."""

    def __init__(
        self,
        members: Members,
        replica_id: str,
        address: str,
        pools: Callable[[], Iterable[str]],
        *,
        member_ttl_s: float = 1.0,
        beat_interval_s: float = 0.25,
    ) -> None:
        self.members = members
        self.replica_id = replica_id
        self.address = address
        self._pools = pools
        self.member_ttl_s = member_ttl_s
        self.beat_interval_s = beat_interval_s
        self.live: list[Member] = []
        self.table: dict[str, str] = {}
        self.next: dict[str, str] = {}  # pool -> its successor (pool_owners.successors)
        self._live_ids: frozenset[str] = frozenset()
        self.version = 0
        self.reachable = False  # what the last beat found
        self.writes = 0  # tables this replica wrote (a change seen by several is written once)
        self._claim_until = float("-inf")  # monotonic: see the module doc

    @property
    def member(self) -> bool:
        """This replica's membership surely holds in the store now (module doc)."""
        return time.monotonic() < self._claim_until

    def should_lead(self, pool: str) -> bool:
        """Campaign for (or keep leading) `pool`: this replica owns it, or is its successor and
        its owner is out of the membership (the next table gives it here anyway: taking the
        lease once it lapses saves a beat). Every other replica asks the store nothing of it."""
        if not self.member:
            return False
        owner = self.table.get(pool)
        if owner == self.replica_id:
            return True
        return self.next.get(pool) == self.replica_id and owner not in self._live_ids

    def should_follow(self, pool: str) -> bool:
        """Hold `pool` hot (follow its journal): its owner or its successor, or no table yet."""
        if not self.table:
            return True
        return self.replica_id in (self.table.get(pool), self.next.get(pool))

    def mine(self) -> tuple[str, ...]:
        if not self.member:
            return ()
        return tuple(sorted(p for p, r in self.table.items() if r == self.replica_id))

    def address_of(self, pool: str) -> str | None:
        """Where the pool's owner serves (what a NOT_LEADER for the pool names), if known."""
        owner = self.table.get(pool)
        return next((m.address for m in self.live if m.replica_id == owner), None)

    async def step(self) -> None:
        """Beat; if the table is not what the live replicas and the pools call for, write it."""
        t0 = time.monotonic()
        try:
            self.live = await self.members.beat(self.replica_id, self.address, self.member_ttl_s)
            self._claim_until = t0 + self.member_ttl_s * (1 - MARGIN)
            version, raw = await self.members.owners()
            live = [m.replica_id for m in self.live]
            table, nxt = _split(raw)
            want = assign(self._pools(), live, table, nxt)
            want_next = follow(self._pools(), want.owners, live, nxt)
            if _join(want.owners, want_next) != raw:
                # Written only if the membership is still `live` (members.py): else the next beat,
                # which reads it anew, decides.
                if await self.members.set_owners(version, _join(want.owners, want_next), live):
                    self.writes += 1
                    log.info(
                        "pools: owners table v%d by %s, %d moved: %s",
                        version + 1,
                        self.replica_id,
                        len(want.moved),
                        ", ".join(want.moved[:10]) + (" ..." if len(want.moved) > 10 else ""),
                    )
                    version, table, nxt = version + 1, dict(want.owners), want_next
                else:  # another replica wrote first, or the membership moved: take what is there
                    version, raw = await self.members.owners()
                    table, nxt = _split(raw)
        except StoreUnavailable as e:
            if self.reachable:
                log.warning(
                    "pools: membership unreachable (%s): its pools kept until its membership could lapse", e
                )
            self.reachable = False
            return
        self.version, self.table, self.reachable = version, table, True
        self._live_ids = frozenset(live)
        self.next = nxt

    async def peek(self) -> None:
        """Before joining: the table as it will be once this replica is a member (read, not
        written), so that its replicas load the pools it will own or follow before it beats."""
        try:
            live = sorted({m.replica_id for m in await self.members.live()} | {self.replica_id})
            _, raw = await self.members.owners()
        except StoreUnavailable:
            return  # no table: every pool is followed until the first beat
        table, nxt = _split(raw)
        self.table = dict(assign(self._pools(), live, table, nxt).owners)
        self._live_ids = frozenset(live)
        self.next = follow(self._pools(), self.table, live, nxt)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.beat_interval_s)

    async def leave(self) -> None:
        """A graceful exit: out of the membership at once (the others take its pools)."""
        self.reachable = False
        self._claim_until = float("-inf")
        try:
            await self.members.leave(self.replica_id)
        except StoreUnavailable as e:
            log.warning("pools: could not leave the membership (%s): it lapses by itself", e)


def _split(raw: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The stored table: (pool -> owner, pool -> successor)."""
    owners = {k: v for k, v in raw.items() if not k.startswith(NEXT)}
    return owners, {k[len(NEXT) :]: v for k, v in raw.items() if k.startswith(NEXT)}


def _join(owners: Mapping[str, str], nxt: Mapping[str, str]) -> dict[str, str]:
    return {**owners, **{NEXT + k: v for k, v in nxt.items()}}
