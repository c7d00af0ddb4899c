"""`slotsched status`: one look at a running scheduler's pool, as an aligned table or JSON.

A client of the Admin API, not part of the server: it reads statuses, it does not choose them.

A thin client of Admin.DescribePool (one call per pool the first answer names), Admin.ListLeases
(the leases on each worker in the table) and Admin.ListQueue (each waiter's pool and why it
waits), so an operator reads exactly what the API says. A scheduler of one pool shows it as
before pools; of several, each pool's block is headed by its name and labels. Against a
scheduler in secure mode it needs an admin token (`--token`, its hash listed under
`spec.access.admins`): tenant and worker tokens are refused, as for every Admin call.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Container, Sequence
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from scheduler.api.gen.slotsched.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from scheduler.cli.admin_call import Tls, call_metadata, failure_lines, open_channel

_CLASS_NAMES = {
    common_pb2.QOS_CLASS_GUARANTEED: "guaranteed",
    common_pb2.QOS_CLASS_BURSTABLE: "burstable",
    common_pb2.QOS_CLASS_BEST_EFFORT: "besteffort",
}


_CLASS_SHORT = {
    common_pb2.QOS_CLASS_GUARANTEED: "G",
    common_pb2.QOS_CLASS_BURSTABLE: "B",
    common_pb2.QOS_CLASS_BEST_EFFORT: "BE",
}
#: Leases listed by id on one worker's row; more are counted ("+N more") to keep rows short.
LEASES_SHOWN = 4


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: Container[int] = (0,)) -> list[str]:
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = []
    for r in cells:
        # Text columns (`left`: names by default) left-aligned, numbers right-aligned.
        parts = [
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        out.append("  ".join(parts).rstrip())
    return out


def _lease_text(lease: common_pb2.Lease) -> str:
    qos = _CLASS_SHORT.get(lease.qos, str(lease.qos))
    yielding = ", yielding" if lease.state == common_pb2.LEASE_STATE_YIELDING else ""
    return f"{lease.lease_id} {lease.tenant} ({qos}{yielding})"


def _worker_rows(
    pool: admin_pb2.DescribePoolResponse, leases: Sequence[common_pb2.Lease] | None
) -> list[tuple[Any, ...]]:
    by_worker: dict[str, list[common_pb2.Lease]] = {}
    for lease in leases or ():
        by_worker.setdefault(lease.slot.worker_id, []).append(lease)
    rows = []
    for w in pool.workers:
        state = "draining" if w.state == admin_pb2.WORKER_STATE_DRAINING else "ready"
        if w.HasField("last_heartbeat") and pool.HasField("at"):
            age = pool.at.ToNanoseconds() - w.last_heartbeat.ToNanoseconds()
            heartbeat = f"{max(age, 0) / 1e9:.0f}s ago"
        else:
            heartbeat = "-"  # a static worker of the scheduler's own: it sends none
        if leases is None:
            held = "?"  # the lease listing failed; the count is still the pool's
        else:
            mine = sorted(by_worker.get(w.worker_id, []), key=lambda lease: lease.slot.index)
            held = ", ".join(_lease_text(lease) for lease in mine[:LEASES_SHOWN]) or "-"
            if len(mine) > LEASES_SHOWN:
                held += f", +{len(mine) - LEASES_SHOWN} more"
        rows.append((w.worker_id, state, f"{w.busy}/{w.slots}", heartbeat, w.address, held))
    return rows


def _pool_title(pool: admin_pb2.DescribePoolResponse, named: bool) -> str:
    figures = (
        f"capacity {pool.capacity} slots, free {pool.free}, floor {pool.floor}, {len(pool.workers)} workers"
    )
    if not named:
        return f"pool: {figures}" + _leader_text(pool)
    labels = ", ".join(f"{k}={v}" for k, v in sorted(pool.labels.items()))
    busy = sum(c.held for c in pool.classes)
    queued = sum(c.pending for c in pool.classes)
    return (
        f"pool {pool.pool}"
        + (f" ({labels})" if labels else "")
        + f": {figures}, busy {busy}, queue {queued}"
        + _leader_text(pool)
    )


def _leader_text(pool: admin_pb2.DescribePoolResponse) -> str:
    """Per-pool leadership: the pool's leader replica, where it serves, and its term."""
    if not pool.HasField("leader"):
        return ""
    lead = pool.leader
    if not lead.replica_id:
        return "; leader: none now (being elected)"
    where = f" at {lead.address}" if lead.address else ""
    return f"; leader {lead.replica_id}{where}, term {lead.term}"


def render_queue(entries: Sequence[admin_pb2.QueuedEntry]) -> list[str]:
    """The waiters (Admin.ListQueue): each one's pool and why it waits."""
    if not entries:
        return []
    rows = [
        (
            e.session_id,
            e.tenant,
            _CLASS_NAMES.get(e.qos, str(e.qos)),
            e.pool,
            e.reason or "-",
            e.position,
            f"{e.waited.ToTimedelta().total_seconds():.0f}s",
        )
        for e in entries
    ]
    return _table(
        ("session", "tenant", "class", "pool", "reason", "position", "waited"), rows, left=(0, 1, 2, 3, 4)
    )


def render_pools(
    pools: Sequence[admin_pb2.DescribePoolResponse],
    leases: Sequence[common_pb2.Lease] | None = None,
    queue: Sequence[admin_pb2.QueuedEntry] | None = None,
) -> str:
    """Every pool (one: as `render`), then the waiters with their pool and reason."""
    named = len(pools) > 1
    blocks = [render(p, leases, named=named) for p in pools]
    text = "\n\n".join(blocks)
    waiters = render_queue(queue or ())
    return text + ("\n\n" + "\n".join(waiters) if waiters else "")


def render(
    pool: admin_pb2.DescribePoolResponse,
    leases: Sequence[common_pb2.Lease] | None = None,
    named: bool = False,
) -> str:
    """The pool as aligned tables; `leases` (every live lease, Admin.ListLeases) names each
    worker's leases (None: they could not be listed); `named`: headed by its name and labels
    (a scheduler of several pools)."""
    lines = [_pool_title(pool, named), ""]
    if pool.workers:
        lines += _table(
            ("worker", "state", "busy/slots", "heartbeat", "address", "leases"),
            _worker_rows(pool, leases),
            left=(0, 1, 4, 5),
        )
        lines.append("")
    lines += _table(
        ("class", "held", "pending", "yielding"),
        [(_CLASS_NAMES.get(c.qos, str(c.qos)), c.held, c.pending, c.yielding) for c in pool.classes],
    )
    lines.append("")
    rows = []
    for t in pool.tenants:
        be_limit = t.best_effort_limit if t.HasField("best_effort_limit") else "-"
        rows.append(
            (
                t.tenant,
                f"{t.weight:g}",
                f"{t.held.guaranteed}/{t.guaranteed_quota}",
                f"{t.held.burstable}/{t.burstable_nominal}/{t.burstable_limit}",
                f"{t.held.best_effort}/{be_limit}",
                f"{t.pending.guaranteed}/{t.pending.burstable}/{t.pending.best_effort}",
                t.borrowed,
                f"{t.fair_share:.2f}",
            )
        )
    lines += _table(
        (
            "tenant",
            "weight",
            "G held/quota",
            "B held/nom/limit",
            "BE held/limit",
            "queued G/B/BE",
            "borrowed",
            "share",
        ),
        rows,
    )
    queued = sum(c.pending for c in pool.classes)
    lines += ["", f"queue: {queued} waiting"]
    if pool.budgets:
        header = ("budget", "limit", "tokens/min", "requests/min", "available tokens", "waiting", "open")
        lines += ["", *_table(header, [_budget_row(b) for b in pool.budgets])]
    return "\n".join(lines)


def _budget_row(b: admin_pb2.BudgetStatus) -> tuple[Any, ...]:
    """A budget: its effective limit (% of configured), per minute, what is left, its permits."""
    lim, avail = list(b.limits_per_minute) or [0.0] * 4, list(b.available) or [0.0] * 4
    tokens = " ".join(
        f"{name} {lim[d]:,.0f}" for d, name in ((3, "total"), (1, "in"), (2, "out")) if lim[d] > 0
    )
    left = " ".join(f"{avail[d]:,.0f}" for d in (3, 1, 2) if lim[d] > 0)
    return (b.name, f"{b.factor:.0%}", tokens or "-", f"{lim[0]:,.0f}" if lim[0] > 0 else "-", left or "-",
            b.waiting, b.open)  # fmt: skip


def _list_all(
    rpc: Callable[..., Any],
    request: Callable[..., Any],
    field: str,
    what: str,
    metadata: Sequence[tuple[str, str]],
) -> list[Any] | None:
    """Every entry of a paged Admin listing; None if it fails (the table then shows counts)."""
    entries: list[Any] = []
    token = ""
    try:
        while True:
            page = rpc(request(page_size=1000, page_token=token), metadata=metadata, timeout=10)
            entries.extend(getattr(page, field))
            token = page.next_page_token
            if not token:
                return entries
    except grpc.RpcError as e:
        print(f"slotsched status: cannot list {what}: {e.code().name}: {e.details()}", file=sys.stderr)
        return None


def _list_leases(stub: Any, metadata: Sequence[tuple[str, str]]) -> list[common_pb2.Lease] | None:
    return _list_all(stub.ListLeases, admin_pb2.ListLeasesRequest, "leases", "leases", metadata)


def _list_queue(stub: Any, metadata: Sequence[tuple[str, str]]) -> list[admin_pb2.QueuedEntry] | None:
    return _list_all(stub.ListQueue, admin_pb2.ListQueueRequest, "entries", "the queue", metadata)


def status_main(
    target: str,
    as_json: bool,
    token: str | None,
    tenant: str | None,
    tls: Tls = (None, None, None),
) -> int:
    """Print the pool of the scheduler at `target`; 0 on success, 1 if the call failed (2 for
    unusable TLS files). `tls` is (CA, client certificate, client key), PEM paths."""
    try:
        channel = open_channel(target, tls)
    except ValueError as e:
        print(f"slotsched status: {e}", file=sys.stderr)
        return 2
    metadata = call_metadata(token, tenant)
    leases: list[common_pb2.Lease] | None = None
    queue: list[admin_pb2.QueuedEntry] | None = None
    try:
        with channel:
            stub = admin_pb2_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
            pool = stub.DescribePool(admin_pb2.DescribePoolRequest(), metadata=metadata, timeout=10)
            pools = [pool]
            for name in pool.pools:
                if name != pool.pool:
                    pools.append(
                        stub.DescribePool(
                            admin_pb2.DescribePoolRequest(pool=name), metadata=metadata, timeout=10
                        )
                    )
            if not as_json:
                leases = _list_leases(stub, metadata)
                queue = _list_queue(stub, metadata)
    except grpc.RpcError as e:
        for line in failure_lines(e, target, token, "status"):
            print(f"slotsched status: {line}", file=sys.stderr)
        return 1
    if as_json:
        docs = [MessageToDict(p, always_print_fields_with_no_presence=True) for p in pools]
        # One pool: its description, as before pools; several: each under "pools".
        print(json.dumps(docs[0] if len(docs) == 1 else {"pools": docs}, indent=2))
    else:
        print(render_pools(pools, leases, queue))
    return 0
