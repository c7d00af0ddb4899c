"""What a run of the simulator (or the demo) measured, and its JSON form.

Every wait counts toward time-to-slot: the first one and each one after a yield or revoke.
Guaranteed waits are also told apart by quota (`beyond_quota`): the promise of a bounded wait
covers a request within its tenant's Guaranteed quota; one beyond it waits for the tenant's own
Guaranteed leases to end, and a driver that knows which is which (the simulator) says so.
Work lost is slot-seconds that no snapshot saved: revoked leases since their grant, and leases
that expired under a dead holder.

Per tenant (issue 23), what a platform team asks: how long after its first request a tenant
first got a slot (`first_grant_s`; the first request is the driver's `arrived`, else the start of
the tenant's earliest granted wait), and its waits overall and per class, each wait counted as
above (a re-queue after a yield or a revoke is a further wait, measured from the re-queue).

Per pool (issue 24), `pools.<name>` of `simulate --json`, beside the totals: the sessions granted
there, grants and waits (count, p50, p99, max) per class, preemptions, refusals naming the pool,
busy and capacity slot-seconds, utilisation, the pool's capacity at the end and at its peak, why
its waiters waited (`blocked`: per `BlockedReason`, the waits that were told it, each wait counted
once per reason), and per tenant its grants, slot-seconds and time-to-slot there. Every figure is
by the pool of the lease (or of the refusal, or of the `Queued`), as the decider stamps it. A
refusal naming a pool the policy lacks (`unknown_pool`) is no pool's: it counts in `refusals` and
`refusals_by_reason` only.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.types import (
    Decision,
    Ended,
    Expired,
    Granted,
    Lease,
    Queued,
    Refused,
    Revoked,
    YieldCancelled,
    YieldCause,
    YieldRequested,
)
from scheduler.policy.model import Policy
from scheduler.sim.decider import Decider, views

CLASS_KEYS = ("guaranteed", "burstable", "besteffort")


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), 0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def waits_json(w: list[float]) -> dict[str, float | int | None]:
    """count, p50, p99, max of some waits; null figures when there is none (no wait measured is
    not a 0 s wait)."""
    return {
        "count": len(w),
        "p50": round(percentile(w, 50), 3) if w else None,
        "p99": round(percentile(w, 99), 3) if w else None,
        "max": round(max(w), 3) if w else None,
    }


@dataclass
class Sample:
    t: float
    capacity: int
    busy: int
    pending: int
    held_by_tenant: dict[str, int]
    # With several pools, each pool's (capacity, held, pending): a slot idle in one pool is no
    # room for a session waiting in another.
    by_pool: dict[str, tuple[int, int, int]] = field(default_factory=dict)


@dataclass
class SimStats:
    policy: Policy
    waits: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in CLASS_KEYS})
    slot_seconds: dict[str, dict[str, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    # The Guaranteed waits (also in `waits`) of requests made beyond the tenant's quota:
    beyond_quota: list[float] = field(default_factory=list)
    preemptions: int = 0
    revocations: int = 0
    expiries: int = 0
    refusals: int = 0
    work_lost: float = 0.0
    completed: int = 0
    unfinished: int = 0
    end_s: float = 0.0
    busy_slot_seconds: float = 0.0
    capacity_slot_seconds: float = 0.0
    worker_seconds: float = 0.0
    scale_actions: int = 0
    samples: list[Sample] = field(default_factory=list)
    # Per tenant: its waits by class (the same waits as `waits`), its first request and first grant.
    tenant_waits: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    first_arrival: dict[str, float] = field(default_factory=dict)
    first_grant: dict[str, float] = field(default_factory=dict)
    _first_wait_start: dict[str, float] = field(default_factory=dict)
    # Set when the run was cut short because it could make no more progress (simulator.py):
    stopped_at_s: float | None = None
    stop_note: str = ""
    _cap_at: float = 0.0
    _cap: int = 0
    # Per pool (see the module docstring): waits by class, sessions granted, counters, slot-seconds.
    pool_waits: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    pool_sessions: dict[str, set[str]] = field(default_factory=dict)
    pool_counts: dict[str, Counter[str]] = field(default_factory=dict)
    pool_busy: dict[str, float] = field(default_factory=dict)
    pool_capacity_s: dict[str, float] = field(default_factory=dict)
    pool_peak: dict[str, int] = field(default_factory=dict)
    _pool_cap: dict[str, int] = field(default_factory=dict)
    _pool_cap_at: float = 0.0
    refusals_by_reason: Counter[str] = field(default_factory=Counter)
    # Per pool: the waits told each BlockedReason; per pool and tenant: waits and slot-seconds.
    pool_blocked: dict[str, Counter[str]] = field(default_factory=dict)
    pool_tenant_waits: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    pool_tenant_busy: dict[str, dict[str, float]] = field(default_factory=dict)
    _told: dict[str, set[str]] = field(default_factory=dict)  # a waiter's reasons in this wait

    def _pool(self, name: str) -> Counter[str]:
        if name not in self.pool_counts:
            self.pool_counts[name] = Counter()
            self.pool_waits[name] = {k: [] for k in CLASS_KEYS}
            self.pool_sessions[name] = set()
            self.pool_busy.setdefault(name, 0.0)
            self.pool_capacity_s.setdefault(name, 0.0)
            self.pool_blocked[name] = Counter()
            self.pool_tenant_waits[name] = {}
            self.pool_tenant_busy.setdefault(name, {})
        return self.pool_counts[name]

    def _record_pool(self, d: Decision) -> None:
        if isinstance(d, Granted):
            lease = d.lease
            n = self._pool(lease.pool)
            n["grants"] += 1
            self.pool_waits[lease.pool][lease.qos.value].append(d.waited_s)
            self.pool_tenant_waits[lease.pool].setdefault(lease.tenant, []).append(d.waited_s)
            self.pool_sessions[lease.pool].add(lease.session)
            self._told.pop(lease.session, None)  # this wait is over
        elif isinstance(d, Queued):
            told = self._told.setdefault(d.session, set())
            if d.reason not in told:
                told.add(d.reason)
                self._pool(d.pool)
                self.pool_blocked[d.pool][d.reason.value] += 1
        elif isinstance(d, YieldRequested) and d.cause is not YieldCause.DRAIN:
            self._pool(d.lease.pool)["preemptions"] += 1
        elif isinstance(d, YieldCancelled):
            self._pool(d.lease.pool)["preemptions"] -= 1
        elif isinstance(d, Revoked):
            self._pool(d.lease.pool)["revocations"] += 1
        elif isinstance(d, Refused):
            self._told.pop(d.session, None)
            if d.pool in self.policy.pool_names():  # an unknown pool's refusal is no pool's
                self._pool(d.pool)["refusals"] += 1
        elif isinstance(d, Ended):
            self._told.pop(d.session, None)  # a waiter withdrawn (or a holder gone)

    def pool_capacity_changed(self, now: float, caps: dict[str, int]) -> None:
        """Each pool's capacity from now on (integrated into its capacity slot-seconds)."""
        for name, cap in self._pool_cap.items():
            self._pool(name)
            self.pool_capacity_s[name] += cap * max(0.0, now - self._pool_cap_at)
        self._pool_cap_at, self._pool_cap = now, dict(caps)
        for name, cap in caps.items():
            self._pool(name)
            self.pool_peak[name] = max(self.pool_peak.get(name, 0), cap)

    def pools_json(self) -> dict[str, Any]:
        """`pools.<name>`: sessions, grants and waits per class, utilisation, preemptions, capacity."""
        out: dict[str, Any] = {}
        for name in self.pool_counts:
            n, waits = self.pool_counts[name], self.pool_waits[name]
            cap_s = self.pool_capacity_s[name]
            out[name] = {
                "sessions": len(self.pool_sessions[name]),
                "grants": {k: len(waits[k]) for k in CLASS_KEYS},
                "waits": {k: waits_json(w) for k, w in waits.items()},
                "max_wait_s": round(max((x for w in waits.values() for x in w), default=0.0), 3)
                if any(waits.values())
                else None,
                "blocked": dict(sorted(self.pool_blocked[name].items())),
                "tenants": self._pool_tenants(name),
                "preemptions": n["preemptions"],
                "revocations": n["revocations"],
                "refusals": n["refusals"],
                "busy_slot_seconds": round(self.pool_busy[name], 3),
                "capacity_slot_seconds": round(cap_s, 3),
                "utilization": round(self.pool_busy[name] / cap_s, 4) if cap_s else 0.0,
                "capacity": {"end": self._pool_cap.get(name, 0), "peak": self.pool_peak.get(name, 0)},
            }
        return out

    def _pool_tenants(self, name: str) -> dict[str, Any]:
        """`pools.<name>.tenants.<t>`: grants, slot-seconds and time-to-slot in that pool."""
        waits, busy = self.pool_tenant_waits[name], self.pool_tenant_busy.get(name, {})
        return {
            t: {
                "grants": len(waits.get(t, [])),
                "slot_seconds": round(busy.get(t, 0.0), 3),
                "time_to_slot": waits_json(waits.get(t, [])),
            }
            for t in sorted(set(waits) | set(busy))
        }

    def record(self, d: Decision, now: float) -> None:
        self._record_pool(d)
        if isinstance(d, Granted):
            self.waits[d.lease.qos.value].append(d.waited_s)
            tenant = d.lease.tenant
            by = self.tenant_waits.setdefault(tenant, {k: [] for k in CLASS_KEYS})
            by[d.lease.qos.value].append(d.waited_s)
            self.first_grant.setdefault(tenant, now)
            start = now - d.waited_s
            if start < self._first_wait_start.get(tenant, math.inf):
                self._first_wait_start[tenant] = start
        elif isinstance(d, YieldRequested):
            if d.cause is not YieldCause.DRAIN:
                self.preemptions += 1
        elif isinstance(d, YieldCancelled):
            # Only a yield for a waiter is ever cancelled; the holder ran on, so it was no
            # preemption after all (a later re-ask counts again).
            self.preemptions -= 1
        elif isinstance(d, Revoked):
            self.revocations += 1
            self.work_lost += d.lost_slot_seconds
            self._held(d.lease, now)
        elif isinstance(d, Expired):
            self.expiries += 1
            self.work_lost += d.lost_slot_seconds
            self._held(d.lease, now)
        elif isinstance(d, Ended) and d.lease is not None:
            self._held(d.lease, now)
        elif isinstance(d, Refused):
            self.refusals += 1
            self.refusals_by_reason[d.reason.value] += 1

    def arrived(self, tenant: str, now: float) -> None:
        """A session of `tenant` asked for a slot (the driver says so; the first one counts)."""
        self.first_arrival.setdefault(tenant, now)

    def first_grant_s(self, tenant: str) -> float | None:
        """Seconds from the tenant's first request to its first grant; None if never granted."""
        granted = self.first_grant.get(tenant)
        if granted is None:
            return None
        asked = self.first_arrival.get(tenant, self._first_wait_start.get(tenant, granted))
        return max(0.0, granted - asked)

    def tenant_json(self, tenant: str) -> dict[str, Any]:
        """`tenants.<t>` of `simulate --json`: slot-seconds (total, by class), first_grant_s,
        time_to_slot over all its waits and waits_by_class, each {count, p50, p99, max}."""
        by = self.slot_seconds.get(tenant, {})
        waits = self.tenant_waits.get(tenant, {})
        first = self.first_grant_s(tenant)
        return {
            "slot_seconds": round(sum(by.values()), 3),
            "by_class": {c: round(by.get(c, 0.0), 3) for c in CLASS_KEYS},
            "first_grant_s": None if first is None else round(first, 3),
            "time_to_slot": waits_json([w for c in CLASS_KEYS for w in waits.get(c, [])]),
            "waits_by_class": {c: waits_json(waits.get(c, [])) for c in CLASS_KEYS},
        }

    def blocked_json(self) -> dict[str, int]:
        """`blocked`: over every pool, the waits told each BlockedReason (`pools.<p>.blocked`)."""
        total: Counter[str] = Counter()
        for counts in self.pool_blocked.values():
            total.update(counts)
        return dict(sorted(total.items()))

    def guaranteed_waits(self, beyond_quota: bool) -> list[float]:
        """The Guaranteed waits of requests beyond their tenant's quota, or all the others."""
        if beyond_quota:
            return list(self.beyond_quota)
        left = Counter(self.beyond_quota)
        out = []
        for w in self.waits["guaranteed"]:
            if left[w]:
                left[w] -= 1
            else:
                out.append(w)
        return out

    def _held(self, lease: Lease, end: float) -> None:
        secs = max(0.0, end - lease.granted_at)
        self.slot_seconds[lease.tenant][lease.qos.value] += secs
        self.busy_slot_seconds += secs
        self._pool(lease.pool)
        self.pool_busy[lease.pool] += secs
        by = self.pool_tenant_busy[lease.pool]
        by[lease.tenant] = by.get(lease.tenant, 0.0) + secs

    def capacity_changed(self, now: float, capacity: int) -> None:
        self.capacity_slot_seconds += self._cap * (now - self._cap_at)
        self._cap_at, self._cap = now, capacity

    def sample(self, now: float, core: Decider) -> None:
        every = list(views(core).values())
        held: dict[str, int] = {}
        for view in every:
            for t in view.tenants:
                held[t.name] = held.get(t.name, 0) + sum(t.held)
        self.samples.append(
            Sample(
                now,
                sum(v.capacity for v in every),
                sum(sum(v.held) for v in every),
                sum(sum(v.pending) for v in every),
                held,
                {v.name: (v.capacity, sum(v.held), sum(v.pending)) for v in every} if len(every) > 1 else {},
            )
        )

    def finish(self, end: float, core: Decider, counts: tuple[int, int]) -> None:
        self.end_s = end
        for lease, _state in list(core.leases()):
            self._held(lease, end)  # still held at the end: count its time so far
        self.capacity_changed(end, self._cap)
        self.pool_capacity_changed(end, self._pool_cap)
        self.completed, self.unfinished = counts

    @property
    def utilization(self) -> float:
        return self.busy_slot_seconds / self.capacity_slot_seconds if self.capacity_slot_seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        """`simulate --json`. Every class and every tenant of the policy is listed: a class with no
        grant has null waits (no wait was measured, which is not a 0 s wait), a tenant that got
        nothing has 0 slot-seconds (absent would read as "not in the run"), a null first_grant_s
        and null waits."""
        classes = {}
        for k in CLASS_KEYS:
            w = self.waits[k]
            tts: dict[str, float | None] = {
                "p50": round(percentile(w, 50), 3) if w else None,
                "p95": round(percentile(w, 95), 3) if w else None,
                "p99": round(percentile(w, 99), 3) if w else None,
                "max": round(max(w), 3) if w else None,
            }
            classes[k] = {"count": len(w), "time_to_slot": tts}
        names = sorted(
            {t.name for t in self.policy.tenants} | set(self.slot_seconds) | set(self.tenant_waits)
        )
        tenants = {name: self.tenant_json(name) for name in names}
        return {
            "classes": classes,
            "tenants": tenants,
            "preemptions": self.preemptions,
            "revocations": self.revocations,
            "expiries": self.expiries,
            "refusals": self.refusals,
            "refusals_by_reason": dict(sorted(self.refusals_by_reason.items())),
            "blocked": self.blocked_json(),
            "work_lost_slot_seconds": round(self.work_lost, 3),
            "utilization": round(self.utilization, 4),
            "completed": self.completed,
            "unfinished": self.unfinished,
            "stopped": None
            if self.stopped_at_s is None
            else {"at_s": round(self.stopped_at_s, 3), "reason": self.stop_note},
            "pools": self.pools_json(),
        }
