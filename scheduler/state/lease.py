"""How a `Replica`'s leader keeps its lease (the half of replica.py that renews it).

Election timing. The leader lease lasts `leader_ttl_s` (default 1 s) in the store (by the store's
clock; Redis: `SET NX PX`) and is renewed every TTL/4; a standby campaigns every `campaign_interval_s`
(default 100 ms, ±50 % jitter). A dead leader is thus replaced within TTL + one campaign
interval (+ the take-over, milliseconds for a hot standby). The leader serves only until its
local deadline, t + TTL − 10 % (t: when it *sent* the last successful renewal, on its monotonic
clock): the store's expiry is at least TTL after t, so the leader stops answering before a successor
can win. That assumes the two clocks' *rates* differ by less than 10 % over one TTL (ordinary
clocks drift by parts per million), not that they agree on the time. A renewal that runs late (a
busy or paused event loop) finds the deadline passed: the leader gate refuses calls meanwhile,
and if the lease is gone the replica steps down; every write is fenced anyway (a successor's
token), so a paused leader can never journal after a successor took over.

Renewals on a grid. A renewal falls due on the multiples of the renewal interval on the
monotonic clock (`next_renewal`), never later than an interval after the last was sent; every
pool's replica in a process uses the same grid, so the renewals of all the pools it leads fall due
in the same loop turn and go out to the store in one write (redis_store.py, resp_shared.py): an
idle replica's cost is a round trip a tick, not one per pool.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from scheduler.ports import ReplicaHost, StateUnavailable
from scheduler.state.store import StateStore, StoreUnavailable

if TYPE_CHECKING:
    from scheduler.state.reach import StoreReach

__all__ = ["DEFAULT_LEADER_TTL_S", "MARGIN", "LeaderLease", "next_renewal", "unavailable"]

log = logging.getLogger("slotsched.state")

RETRY_AFTER_S = 1.0
#: A 1 s lease renewed every 250 ms: a dead leader is replaced within about a second.
DEFAULT_LEADER_TTL_S = 1.0
#: The leader stops serving this fraction of the TTL before its lease could lapse in the store.
MARGIN = 0.1
#: A renewal this fraction of an interval before a grid point counts as on it (`next_renewal`).
GRID_SLACK = 1e-6


def unavailable(message: str) -> StateUnavailable:
    return StateUnavailable(message, RETRY_AFTER_S)


def next_renewal(sent: float, step: float) -> float:
    """When the renewal after one sent at `sent` falls due: the next multiple of `step` after it,
    so never later than an interval after the last. A renewal sent a hair before a grid point (a
    timer woken early, float rounding) counts as sent on it: the next is one step on, not at once.
    """
    return (math.floor(sent / step + GRID_SLACK) + 1) * step


class LeaderLease:
    """The lease-keeping half of a `Replica` (which sets every attribute below)."""

    store: StateStore
    loop: ReplicaHost
    reach: StoreReach
    leader_ttl_s: float
    renew_interval_s: float
    margin_s: float
    _deadline: float
    _renew_at: float

    async def _step_down(self, why: str) -> None:
        raise NotImplementedError  # Replica's

    async def _renew(self) -> None:
        """Extend the lease. The new local deadline counts from when the extend was *sent*:
        The store's expiry is later than that by the round trip, never earlier."""
        t0 = time.monotonic()
        if t0 >= self._deadline:
            log.warning(
                "leader lease renewal %.3f s late (busy loop?): not serving until renewed",
                t0 - self._deadline,
            )
        try:
            ok = await self.store.extend_lead(self.leader_ttl_s, self.loop.now())
        except StoreUnavailable as e:
            if time.monotonic() < self._deadline:  # one failed call is not a lost lease: retry soon
                log.warning("leader lease renewal failed (%s): retrying", e)
                await self.reach.failed(e)
                self._renew_at = time.monotonic() + min(0.05, self.renew_interval_s)
                return
            raise
        if self.reach.ok is not True:
            await self.reach.answered()
        if not ok:
            await self._step_down("lost the leader lease")
            return
        self._deadline = t0 + self.leader_ttl_s - self.margin_s
        self._renew_at = next_renewal(t0, self.renew_interval_s)

    async def _renew_if_due(self) -> None:
        """During a long take-over (a full recovery), keep the lease it is done under."""
        if time.monotonic() >= self._renew_at:
            t0 = time.monotonic()
            if not await self.store.extend_lead(self.leader_ttl_s, self.loop.now()):
                raise unavailable("lost the leader lease while recovering")
            self._deadline = t0 + self.leader_ttl_s - self.margin_s
            self._renew_at = next_renewal(t0, self.renew_interval_s)
