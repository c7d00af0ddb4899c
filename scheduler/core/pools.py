"""Many pools: each pool is a scheduling domain of its own, one `Core` each; this routes events.

Each of the policy's pools runs a Core under `Policy.for_pool(name)`: its floor, quotas, order of
service, fair share, preemption and queue caps are that pool's alone, and nothing one pool
decides reads another. `Pools` has Core's surface (handle, apply_policy, next_deadline, the
views, the records), so the loop, the simulator and the state document drive one pool or a
hundred alike. With one pool every event goes straight to its core (the single-pool path costs
one attribute test).

Routing: an Acquire goes where placement.py puts it; a Release, Renew or Yield to the pool its
session is in; a worker's events to the pool it joined; Resumed and a policy to every pool. Before
any event, every pool's timers due by then fire (as one core fires all its timers first), found
through a heap of each pool's next deadline, so an event costs O(log pools) beyond its pool's
(the heap holds a cheap lower bound after a pool's event, made exact when it is reached).

A pool the policy no longer has is retired: it takes no new request and no new worker, its leases
and waiters go on under the last policy it had, and it is dropped once it holds nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, replace

from scheduler.core import restore
from scheduler.core.engine import Core
from scheduler.core.lifecycle import LeaseState
from scheduler.core.placement import Catalog, place
from scheduler.core.records import CoreRecords
from scheduler.core.types import (
    Acquire,
    Decision,
    Ended,
    ErrorCode,
    Event,
    Expired,
    Lease,
    LeaseCommand,
    LeaseId,
    Queued,
    Refused,
    RefuseReason,
    Rejected,
    Renew,
    Renewed,
    Resumed,
    Revoked,
    SessionId,
    SnapshotRef,
    Tick,
    WorkerAdded,
    WorkerDraining,
    WorkerId,
    WorkerRemoved,
    Yield,
)
from scheduler.core.views import PoolView, SessionView
from scheduler.policy.model import Policy

_LEAVES_BY_SESSION: frozenset[type] = frozenset({Ended, Refused})  # decisions a session may leave by
_LEAVES_BY_LEASE: frozenset[type] = frozenset({Expired, Revoked})
_LEAVES = _LEAVES_BY_SESSION | _LEAVES_BY_LEASE


def _names_a_pool(event: Event) -> bool:
    """Whether one pool's core could not take `event` as it is (it names or selects pools)."""
    if isinstance(event, Acquire):
        ref = event.resume_from
        return bool(
            event.pool or event.selector or event.fallback or (ref is not None and (ref.pool or ref.labels))
        )
    return isinstance(event, WorkerAdded) and bool(event.pool)


@dataclass(frozen=True)
class PoolsRecords:
    """Every pool's core as records (records.py), in the policy's order, retired pools last."""

    pools: tuple[tuple[str, CoreRecords], ...]


@dataclass(frozen=True)
class PoolsCapture:
    """`Pools.capture`: each pool's `restore.Capture`, taken between events."""

    pools: tuple[tuple[str, restore.Capture], ...]

    @property
    def size(self) -> int:
        return sum(c.size for _, c in self.pools)


def records_of(c: PoolsCapture) -> PoolsRecords:
    return PoolsRecords(tuple((name, restore.records_of(part)) for name, part in c.pools))


def _worker_of(lease_id: LeaseId) -> WorkerId:
    return WorkerId(lease_id.rpartition("/")[0])  # "worker/index#epoch" (engine.py)


class Pools:
    """The policy core over every pool (one loop owns it: not thread-safe by design)."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._catalog = Catalog.of(policy)
        self._cores: dict[str, Core] = {name: Core(policy.for_pool(name)) for name in policy.pool_names()}
        self._single: Core | None = None
        self._where: dict[SessionId, str] = {}  # session -> its pool (several pools only)
        self._worker_pool: dict[WorkerId, str] = {}
        self._due: dict[str, tuple[float, bool]] = {}  # pool -> (deadline or lower bound, exact)
        self._heap: list[tuple[float, str]] = []
        self._retired = False
        self._now = float("-inf")
        self._reindex()

    # ------------------------------------------------------------------ the surface of Core

    @property
    def policy(self) -> Policy:
        return self._policy

    def names(self) -> tuple[str, ...]:
        """Every pool with a core: the policy's in its order, then retired ones still draining."""
        return tuple(self._cores)

    def pool(self, name: str) -> Core:
        return self._cores[name]

    def handle(self, event: Event, now: float) -> list[Decision]:
        """Apply one event at time `now`; return every decision it caused, in order."""
        single = self._single
        if single is not None:
            # Only an Acquire or a WorkerAdded can name a pool: other events skip the test (a
            # follower replays one event per journal record through here).
            kind = type(event)
            if (kind is not Acquire and kind is not WorkerAdded) or not _names_a_pool(event):
                return single.handle(event, now)
        if now > self._now:
            self._now = now  # a pool's views are as of the latest event of any
        heap = self._heap
        fired = bool(heap) and heap[0][0] <= now
        out = self._fire_due(now) if fired else []
        if isinstance(event, Acquire):
            out += self._acquire(event, now)
        elif isinstance(event, LeaseCommand):
            # A session no pool holds (it just ended) goes where its lease was, to be refused
            # there: another pool's core must not see it (its clock and usage would move).
            lease_id = event.lease_id  # None: a withdrawal of a queued request
            name = (
                self._where.get(event.session)
                or (lease_id is not None and self._worker_pool.get(_worker_of(lease_id)))
                or self._first()
            )
            if isinstance(event, Yield) and event.snapshot is not None:
                event = replace(event, snapshot=self._stamped(name, event.snapshot))
            got = self._in(name, event, now)
            if fired and isinstance(event, Renew):  # other pools' timers ran: not quiet
                got = [replace(d, quiet=False) if isinstance(d, Renewed) else d for d in got]
            out += got
        elif isinstance(event, WorkerAdded):
            out += self._worker_added(event, now)
        elif isinstance(event, WorkerDraining | WorkerRemoved):
            name = self._worker_pool.get(event.worker) or self._first()
            out += self._in(name, event, now)
            if isinstance(event, WorkerRemoved) and not any(isinstance(d, Rejected) for d in out):
                self._worker_pool.pop(event.worker, None)
        elif isinstance(event, Resumed):
            for name in self._cores:
                out += self._in(name, event, now)
        elif not isinstance(event, Tick):
            raise TypeError(f"not an event: {event!r}")
        if self._retired:
            self._drop_retired()
        return out

    def apply_policy(self, policy: Policy, now: float) -> list[Decision]:
        """Swap in a new policy: every pool's core gets its projection, a new pool a core, a pool
        gone is retired (it drains). Leases over a lowered quota finish normally."""
        self._policy = policy
        self._catalog = Catalog.of(policy)
        out: list[Decision] = []
        for name in policy.pool_names():
            core = self._cores.get(name)
            if core is None:
                self._cores[name] = core = Core(policy.for_pool(name))
                out += core.handle(Tick(), now)
            else:
                out += core.apply_policy(policy.for_pool(name), now)
            self._set_due(name)
        order = {n: i for i, n in enumerate(policy.pool_names())}
        self._cores = dict(sorted(self._cores.items(), key=lambda kv: order.get(kv[0], len(order))))
        self._drop_retired()
        self._reindex()
        return out

    def next_deadline(self) -> float | None:
        if self._single is not None:
            return self._single.next_deadline()
        top = self._top(float("inf"))
        return None if top is None else top[0]

    def session(self, session: SessionId) -> SessionView | None:
        if self._single is not None:
            return self._single.session(session)
        name = self._where.get(session)
        return None if name is None else self._cores[name].session(session)

    def queued(self, session: SessionId) -> Queued | None:
        """What a waiter is told now: its pool's `Core.queued` (None: not waiting)."""
        if self._single is not None:
            return self._single.queued(session)
        name = self._where.get(session)
        return None if name is None else self._cores[name].queued(session)

    def leases(self) -> Iterator[tuple[Lease, LeaseState]]:
        for core in self._cores.values():
            yield from core.leases()

    def queue(self) -> Iterator[SessionView]:
        for core in self._cores.values():
            yield from core.queue()

    def yields_for(self, lease_id: LeaseId) -> SessionId | None:
        core = self._core_of(lease_id)
        return None if core is None else core.yields_for(lease_id)

    def lease(self, lease_id: LeaseId) -> Lease | None:
        core = self._core_of(lease_id)
        return None if core is None else core.lease(lease_id)

    def worker_pool(self, worker: WorkerId) -> str | None:
        """The pool `worker` joined (None: not registered)."""
        if self._single is not None:
            return next(iter(self._cores)) if self._single.has_worker(worker) else None
        return self._worker_pool.get(worker)

    def describe(self, pool: str | None = None) -> PoolView:
        """One pool's view: `pool`, or the first (the only one, in a policy of one pool)."""
        return self._cores[pool or self._first()].describe(self._now)

    def describe_all(self) -> dict[str, PoolView]:
        return {name: core.describe(self._now) for name, core in self._cores.items()}

    def export_records(self) -> CoreRecords | PoolsRecords:
        """The records of every pool; of one pool, its core's records (as before pools)."""
        if self._single is not None:
            return self._single.export_records()
        return PoolsRecords(tuple((name, core.export_records()) for name, core in self._cores.items()))

    def capture(self) -> PoolsCapture:
        return PoolsCapture(tuple((name, core.capture()) for name, core in self._cores.items()))

    @classmethod
    def from_records(cls, policy: Policy, records: PoolsRecords | CoreRecords) -> Pools:
        """Pools whose future behaviour is that of the pools `records` were exported from. A
        single core's records (a state of before pools) are the first pool's."""
        if isinstance(records, CoreRecords):
            records = PoolsRecords(((policy.pool_names()[0], records),))
        pools = cls(policy)
        first = policy.pool_names()[0]
        for name, recs in records.pools:
            if name in pools._cores:
                sub = policy.for_pool(name)
            else:  # retired before the state was written: it drains under the first pool's rules
                base = policy.for_pool(first)
                sub = replace(base, pool=replace(base.pool, name=name))
            pools._cores[name] = core = Core.from_records(sub, recs)
            core.stamp_pool()
            pools._now = max(pools._now, recs.now)
        pools._reindex()
        return pools

    # ------------------------------------------------------------------ routing

    def _first(self) -> str:
        return self._catalog.default or next(iter(self._cores))

    def _core_of(self, lease_id: LeaseId) -> Core | None:
        if self._single is not None:
            return self._single
        name = self._worker_pool.get(_worker_of(lease_id))
        return None if name is None else self._cores.get(name)

    def _in(self, name: str, event: Event, now: float) -> list[Decision]:
        core = self._cores[name]
        out = core.handle(event, now)
        if self._single is None:
            # After every event of every pool: forget the pool of each session that left it
            # (inline: one set test for most decisions), and keep a lower bound of the pool's
            # next deadline.
            where = self._where
            for d in out:
                kind = type(d)
                if kind not in _LEAVES:  # most decisions: one set test
                    continue
                if kind in _LEAVES_BY_SESSION:
                    s: SessionId = d.session  # type: ignore[union-attr,assignment]
                else:
                    s = d.lease.session  # type: ignore[union-attr]
                if where.get(s) == name and not core.has_session(s):
                    del where[s]
            self._keep(name, core.deadline_bound(), exact=False)
        return out

    def _stamped(self, name: str, ref: SnapshotRef) -> SnapshotRef:
        """A yielded snapshot as taken in pool `name`: that pool and its compatibility labels,
        whatever the client said (its claim must not widen where the session may resume)."""
        spec = self._catalog.specs.get(name)
        labels = spec.compat_labels() if spec is not None else ref.labels
        if ref.pool == name and ref.labels == labels:
            return ref
        return replace(ref, pool=name, labels=labels)

    def _acquire(self, ev: Acquire, now: float) -> list[Decision]:
        prior = self._where.get(ev.session)
        if prior is not None and not self._cores[prior].has_session(ev.session):
            del self._where[ev.session]  # not expected: every exit is tracked; never refuse for it
            prior = None
        if prior is not None:
            msg = f"session {ev.session} already holds or waits (in pool {prior!r})"
            return [Refused(ev.session, RefuseReason.DUPLICATE_SESSION, msg, pool=prior)]
        pool = ev.pool
        if pool and not ev.fallback and ev.resume_from is None and pool in self._catalog.specs:
            placed: str | Refused = pool  # one known pool named: the only candidate (placement.py)
        else:
            placed = place(self._catalog, ev, lambda name: self._cores[name].room_for(ev.tenant, ev.qos))
        if isinstance(placed, Refused):
            return [placed]
        if self._single is None:
            self._where[ev.session] = placed
        out = self._in(placed, ev, now)
        # A refusal by the pool's core (an unknown tenant, a duplicate) names the pool it was in.
        return [replace(d, pool=placed) if type(d) is Refused and not d.pool else d for d in out]

    def _worker_added(self, ev: WorkerAdded, now: float) -> list[Decision]:
        names = self._catalog.names
        name = ev.pool or self._catalog.default
        if name is None or name not in self._catalog.specs:
            why = f"unknown pool {ev.pool!r}" if ev.pool else "a worker must name its pool"
            return [
                Rejected(None, ErrorCode.INVALID, f"worker {ev.worker}: {why}; the policy's pools: {names}")
            ]
        other = self._worker_pool.get(ev.worker)
        if other is not None and other != name:
            msg = f"worker {ev.worker} is already registered in pool {other!r}"
            return [Rejected(None, ErrorCode.INVALID, msg)]
        out = self._in(name, ev, now)
        if self._single is None and not any(isinstance(d, Rejected) for d in out):
            self._worker_pool[ev.worker] = name
        return out

    # ------------------------------------------------------------------ deadlines and indexes

    def _set_due(self, name: str) -> None:
        """After an event in pool `name`: keep a lower bound of its next deadline (cheap), made
        exact only if it reaches the top of the heap by the time asked about (`_top`)."""
        self._keep(name, self._cores[name].deadline_bound(), exact=False)

    def _keep(self, name: str, at: float | None, exact: bool) -> None:
        if at is None:
            self._due.pop(name, None)
            return
        old = self._due.get(name)
        self._due[name] = (at, exact)
        if old is None or old[0] != at:
            heapq.heappush(self._heap, (at, name))

    def _top(self, upto: float) -> tuple[float, str] | None:
        """The earliest deadline of any pool; a lower bound at or before `upto` is made exact
        first (a pool's exact deadline moves only with its own events, so it can wait)."""
        heap, due = self._heap, self._due
        while heap:
            at, name = heap[0]
            entry = due.get(name)
            if entry is None or entry[0] != at:
                heapq.heappop(heap)  # stale: that pool's deadline moved
            elif entry[1] or at > upto:
                return heap[0]
            else:
                heapq.heappop(heap)
                del due[name]
                self._keep(name, self._cores[name].next_deadline(), exact=True)
        return None

    def _fire_due(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        while (top := self._top(now)) is not None and top[0] <= now:
            at, name = top
            fired = self._in(name, Tick(), now)
            out += fired
            nxt = self._cores[name].next_deadline()
            # A deadline that does not move would spin: drop it until the pool's next event.
            self._keep(name, None if nxt == at else nxt, exact=True)
        return out

    def _drop_retired(self) -> None:
        live = self._catalog.specs  # the cores are a superset of the policy's pools
        for name in [n for n in self._cores if n not in live]:
            core = self._cores[name]
            if not core.session_ids() and not core.worker_ids():
                del self._cores[name]
                self._due.pop(name, None)
        self._retired = len(self._cores) != len(live)

    def _reindex(self) -> None:
        """The single-pool path, or the indexes of several (rebuilt from the cores)."""
        self._single = next(iter(self._cores.values())) if len(self._cores) == 1 else None
        self._retired = len(self._cores) != len(self._catalog.specs)  # cores of pools gone, draining
        self._where.clear()
        self._worker_pool.clear()
        self._due.clear()
        self._heap.clear()
        if self._single is not None:
            return
        for name, core in self._cores.items():
            for s in core.session_ids():
                self._where[s] = name
            for w in core.worker_ids():
                self._worker_pool[w] = name
            self._set_due(name)
