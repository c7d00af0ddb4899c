"""One table of applied events: per type, its journal name and field codec, and the loop's
bookkeeping around `Core.handle`. Adding an event (or an RPC that submits a new one) is one row
here; the loop (`submit` and `replay` run the same hooks), the journal codec (state/codec.py) and
recovery (state/replica.py) all read this table instead of keeping isinstance chains.

Neutral ground like scheduler/ports.py: the server and the state store both import it, it
imports neither. The hooks drive the loop through `Books`, which SchedulerLoop implements.

Journal fields per record (the on-disk format, documented in state/codec.py) are written by
`encode` into the record's dict and read back by `decode`; the codec adds `v`, `at` and `t`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from scheduler.core.types import (
    Acquire,
    Decision,
    LeaseId,
    QoS,
    Refused,
    Rejected,
    Release,
    Renew,
    Renewed,
    Resumed,
    SessionId,
    SnapshotRef,
    Tick,
    WorkerAdded,
    WorkerDraining,
    WorkerId,
    WorkerRemoved,
    Yield,
)
from scheduler.policy.yaml_io import parse_policy, policy_to_yaml
from scheduler.ports import NO_EXTRAS, Applied, Extras, PolicyApplied

Doc = dict[str, Any]


def ref_to_doc(ref: SnapshotRef | None) -> Doc | None:
    """A snapshot ref as JSON (None stays None): the one form, in journal records and in state
    snapshots (state_write.py)."""
    if ref is None:
        return None
    doc: Doc = {"uri": ref.uri, "size_bytes": ref.size_bytes, "sha256": ref.sha256, "created": ref.created}
    if ref.pool:  # a ref of before pools has neither key, and reads back the same
        doc["pool"] = ref.pool
    if ref.labels:
        doc["labels"] = [[k, v] for k, v in ref.labels]
    return doc


def ref_from_doc(doc: Any) -> SnapshotRef | None:
    if doc is None:
        return None
    labels = tuple((str(k), str(v)) for k, v in doc.get("labels") or ())
    return SnapshotRef(
        str(doc["uri"]),
        int(doc["size_bytes"]),
        str(doc["sha256"]),
        float(doc["created"]),
        str(doc.get("pool", "")),
        labels,
    )


class Books(Protocol):
    """The loop's bookkeeping that the hooks keep (SchedulerLoop implements it)."""

    def begin_session(self, key: SessionId, qos: QoS, wait_timeout_s: float | None) -> None: ...

    def forget(self, key: SessionId) -> None: ...

    def set_address(self, worker: WorkerId, address: str) -> None: ...

    def drop_address(self, worker: WorkerId) -> None: ...

    def shift_yields(self, since: float, now: float) -> None: ...


@dataclass(frozen=True, slots=True)
class EventSpec:
    type: type
    name: str  # the journal's `t`
    encode: Callable[[Any, Doc, Extras], None]  # the record's fields into the journal doc
    decode: Callable[[Doc], tuple[Any, Extras]]  # and back
    # Loop bookkeeping: before Core.handle; after it, before the fan-out; after the fan-out.
    before: Callable[[Books, Any, Extras], None] | None = None
    decided: Callable[[Books, Any, list[Decision]], None] | None = None
    after: Callable[[Books, Any, float], None] | None = None
    membership: bool = False  # the worker registry mirrors it on replay
    # What of the event the journal keeps, given its decisions (None: nothing); unset: the event.
    journal_as: Callable[[Any, list[Decision]], Any] | None = None


# ------------------------------------------------------------------ per event


_QOS = {q.value: q for q in QoS}  # an unknown value: KeyError, which the codec reports


def _enc_acquire(e: Acquire, doc: Doc, x: Extras) -> None:
    doc.update(session=e.session, tenant=e.tenant, qos=e.qos.value, resume_from=ref_to_doc(e.resume_from))
    if x.wait_timeout_s is not None:
        doc["wait_timeout_s"] = x.wait_timeout_s
    if e.pool:  # where it asked to go; replayed, placement picks the same pool again
        doc["pool"] = e.pool
    if e.selector:
        doc["selector"] = [[k, v] for k, v in e.selector]
    if e.fallback:
        doc["fallback"] = list(e.fallback)


def _dec_acquire(doc: Doc) -> tuple[Acquire, Extras]:
    # A follower decodes every Acquire its leader took: the common case (no selector, fallback
    # or wait timeout) builds nothing it does not need, and a qos is a dict lookup, not an enum call.
    # SessionId and TenantName are str at run time: no NewType call per field.
    selector, fallback, ref = doc.get("selector"), doc.get("fallback"), doc.get("resume_from")
    e = Acquire(
        doc["session"],
        doc["tenant"],
        _QOS[doc["qos"]],
        None if ref is None else ref_from_doc(ref),
        str(doc.get("pool", "")),
        tuple((str(k), str(v)) for k, v in selector) if selector else (),
        tuple(str(p) for p in fallback) if fallback else (),
    )
    wt = doc.get("wait_timeout_s")
    return e, NO_EXTRAS if wt is None else Extras(wait_timeout_s=float(wt))


def _acquire_before(b: Books, e: Acquire, x: Extras) -> None:
    b.begin_session(e.session, e.qos, x.wait_timeout_s)


def _acquire_decided(b: Books, e: Acquire, decisions: list[Decision]) -> None:
    for d in decisions:
        if type(d) is Refused and d.session == e.session:  # exact type: a follower's every Acquire
            b.forget(e.session)  # nothing of a refused request stays
            return


def _enc_lease_op(e: Renew | Release, doc: Doc, x: Extras) -> None:
    doc.update(session=e.session, lease_id=e.lease_id, epoch=e.epoch)


def _enc_renew(e: Renew, doc: Doc, x: Extras) -> None:
    doc.update(session=e.session, lease_id=e.lease_id, epoch=e.epoch)
    if e.until is not None:
        doc["until"] = e.until


def _dec_renew(doc: Doc) -> tuple[Renew, Extras]:
    until = doc.get("until")
    session, lease_id = SessionId(doc["session"]), LeaseId(doc["lease_id"])
    return Renew(session, lease_id, int(doc["epoch"]), None if until is None else float(until)), NO_EXTRAS


def _dec_renew_exact(doc: Doc) -> tuple[Renew, Extras]:
    """A `renew` record of before steps: its leader set now + TTL, so does its replay (until 0)."""
    return Renew(SessionId(doc["session"]), LeaseId(doc["lease_id"]), int(doc["epoch"]), 0.0), NO_EXTRAS


def _renew_journaled(e: Renew, decisions: list[Decision]) -> Renew | None:
    """Nothing of a quiet renewal (it changed nothing); of one that moved the expiry, that
    expiry, which its replay sets again (the follower need not know the step rule)."""
    for d in decisions:
        if isinstance(d, Renewed) and d.lease.session == e.session:
            return None if d.quiet else Renew(e.session, e.lease_id, e.epoch, d.lease.expires_at)
    return e  # refused: replayed, refused again


def _dec_release(doc: Doc) -> tuple[Release, Extras]:
    e = Release(doc["session"], doc.get("lease_id"), int(doc["epoch"]))  # NewTypes: str at run time
    return e, NO_EXTRAS


def _enc_yield(e: Yield, doc: Doc, x: Extras) -> None:
    doc.update(session=e.session, lease_id=e.lease_id, epoch=e.epoch, snapshot=ref_to_doc(e.snapshot))


def _dec_yield(doc: Doc) -> tuple[Yield, Extras]:
    session, lease_id = SessionId(doc["session"]), LeaseId(doc["lease_id"])
    e = Yield(session, lease_id, int(doc["epoch"]), ref_from_doc(doc.get("snapshot")))
    return e, NO_EXTRAS


def _enc_nothing(e: Any, doc: Doc, x: Extras) -> None:
    pass


def _dec_tick(doc: Doc) -> tuple[Tick, Extras]:
    return Tick(), NO_EXTRAS


def _enc_resumed(e: Resumed, doc: Doc, x: Extras) -> None:
    doc["since"] = e.since


def _dec_resumed(doc: Doc) -> tuple[Resumed, Extras]:
    return Resumed(float(doc["since"])), NO_EXTRAS


def _resumed_after(b: Books, e: Resumed, now: float) -> None:
    b.shift_yields(e.since, now)  # the wire's yield deadlines move out by the outage, as the core's


def _enc_worker_added(e: WorkerAdded, doc: Doc, x: Extras) -> None:
    doc.update(worker=e.worker, slots=e.slots, address=e.address)
    if e.pool:
        doc["pool"] = e.pool
    if e.epochs:  # replayed, it raises the counters as it did on the leader
        doc["epochs"] = [[i, epoch] for i, epoch in e.epochs]
    if x.labels:
        doc["labels"] = dict(x.labels)
    if x.static:
        doc["static"] = True


def _dec_worker_added(doc: Doc) -> tuple[WorkerAdded, Extras]:
    epochs = tuple((int(i), int(epoch)) for i, epoch in doc.get("epochs") or ())
    e = WorkerAdded(
        WorkerId(doc["worker"]), int(doc["slots"]), str(doc["address"]), epochs, str(doc.get("pool", ""))
    )
    labels = {str(k): str(v) for k, v in (doc.get("labels") or {}).items()}
    return e, Extras(labels=labels, static=bool(doc.get("static", False)))


def _worker_added_decided(b: Books, e: WorkerAdded, decisions: list[Decision]) -> None:
    if not any(isinstance(d, Rejected) for d in decisions):
        b.set_address(e.worker, e.address)  # before the fan-out: grants quote it


def _enc_worker_draining(e: WorkerDraining, doc: Doc, x: Extras) -> None:
    doc.update(worker=e.worker, yield_within_s=e.yield_within_s)


def _dec_worker_draining(doc: Doc) -> tuple[WorkerDraining, Extras]:
    within = doc.get("yield_within_s")
    return WorkerDraining(WorkerId(doc["worker"]), None if within is None else float(within)), NO_EXTRAS


def _enc_worker_removed(e: WorkerRemoved, doc: Doc, x: Extras) -> None:
    doc["worker"] = e.worker


def _dec_worker_removed(doc: Doc) -> tuple[WorkerRemoved, Extras]:
    return WorkerRemoved(WorkerId(doc["worker"])), NO_EXTRAS


def _worker_removed_after(b: Books, e: WorkerRemoved, now: float) -> None:
    b.drop_address(e.worker)  # after the fan-out: revocations still quote it


def _enc_policy(e: PolicyApplied, doc: Doc, x: Extras) -> None:
    doc["yaml"] = policy_to_yaml(e.policy)


def _dec_policy(doc: Doc) -> tuple[PolicyApplied, Extras]:
    return PolicyApplied(parse_policy(doc["yaml"])[0]), NO_EXTRAS


TABLE: tuple[EventSpec, ...] = (
    EventSpec(
        WorkerAdded,
        "worker_added",
        _enc_worker_added,
        _dec_worker_added,
        decided=_worker_added_decided,
        membership=True,
    ),
    EventSpec(WorkerDraining, "worker_draining", _enc_worker_draining, _dec_worker_draining, membership=True),
    EventSpec(
        WorkerRemoved,
        "worker_removed",
        _enc_worker_removed,
        _dec_worker_removed,
        after=_worker_removed_after,
        membership=True,
    ),
    EventSpec(
        Acquire, "acquire", _enc_acquire, _dec_acquire, before=_acquire_before, decided=_acquire_decided
    ),
    EventSpec(Release, "release", _enc_lease_op, _dec_release),
    # `renew_until`, not `renew`: a build that would replay it as now + TTL refuses it instead.
    EventSpec(Renew, "renew_until", _enc_renew, _dec_renew, journal_as=_renew_journaled),
    EventSpec(Yield, "yield", _enc_yield, _dec_yield),
    EventSpec(Tick, "tick", _enc_nothing, _dec_tick),
    EventSpec(Resumed, "resumed", _enc_resumed, _dec_resumed, after=_resumed_after),
    EventSpec(PolicyApplied, "policy", _enc_policy, _dec_policy),
)
#: Records older builds wrote, still read (replayed as they were meant), never written.
READ_ONLY: tuple[EventSpec, ...] = (EventSpec(Renew, "renew", _enc_lease_op, _dec_renew_exact),)
BY_TYPE: dict[type, EventSpec] = {s.type: s for s in TABLE}
BY_NAME: dict[str, EventSpec] = {s.name: s for s in (*TABLE, *READ_ONLY)}


def spec_of(event: Applied) -> EventSpec:
    return BY_TYPE[type(event)]
