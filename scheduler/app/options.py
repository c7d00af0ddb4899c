"""What a running server is built from, beyond the policy: where durable state lives."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class StateOptions:
    """Where durable state lives (`slotsched serve --state`); memory keeps none."""

    #: memory, or a state store's URL (scheduler/state/config.py: redis[+sentinel|+cluster]://…)
    state: str = "memory"
    prefix: str = "slotsched"
    replica_id: str | None = None  # default hostname-pid
    #: The leader lease (scheduler/state/replica.py, "Election timing"): renewed every TTL/4, a
    #: dead leader is replaced within about TTL + campaign_interval_s.
    leader_ttl_s: float = 1.0
    campaign_interval_s: float = 0.1
    snapshot_every: int = 1000
    snapshot_interval_s: float = 60.0
    #: HOST:PORT clients are sent to while this replica leads (NOT_LEADER names it); default the
    #: listen address, or $POD_IP / the hostname with the bound port when listening on all.
    advertise: str | None = None
    #: "replica": one leader runs every pool; "pool": each pool its own leader, the pools spread
    #: over the replicas (scheduler/app/pools.py).
    leadership: str = "replica"

    def replica(self) -> str:
        """This replica's id: given, else hostname-pid."""
        return self.replica_id or f"{os.uname().nodename}-{os.getpid()}"

    def call_timeout_s(self) -> float:
        """One slow store call must not outlast the leader lease it is meant to keep."""
        return min(1.0, self.leader_ttl_s / 3)
