"""`slotsched status`: one look at a running scheduler's pool, as an aligned table or JSON.

A thin client of Admin.DescribePool, so an operator reads exactly what the API says. Against a
scheduler in secure mode it needs an admin token (`--token`, its hash listed under
`spec.access.admins`): tenant and worker tokens are refused, as for every Admin call.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from scheduler.api.gen.slotsched.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from scheduler.server.auth import AUTH_HEADER, TENANT_HEADER

_CLASS_NAMES = {
    common_pb2.QOS_CLASS_GUARANTEED: "guaranteed",
    common_pb2.QOS_CLASS_BURSTABLE: "burstable",
    common_pb2.QOS_CLASS_BEST_EFFORT: "besteffort",
}


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = []
    for r in cells:
        # First column left-aligned (names), numbers right-aligned.
        parts = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        out.append("  ".join(parts).rstrip())
    return out


def render(pool: admin_pb2.DescribePoolResponse) -> str:
    lines = [
        f"pool: capacity {pool.capacity} slots, free {pool.free}, floor {pool.floor}, "
        f"{len(pool.workers)} workers",
        "",
    ]
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
    return "\n".join(lines)


def _hint(code: grpc.StatusCode, token: str | None) -> str | None:
    """What to do about a refused credential (the status line alone says only what went wrong)."""
    if code is grpc.StatusCode.UNAUTHENTICATED and not token:
        return (
            "this scheduler runs in secure mode: pass --token with an admin token (one whose "
            '"sha256:<hex>" hash is listed under spec.access.admins of its policy)'
        )
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return (
            'status needs an admin token: its "sha256:<hex>" hash must be listed under '
            "spec.access.admins of the policy (tenant and worker tokens are refused); compute it "
            "with: printf '%s' \"$TOKEN\" | sha256sum"
        )
    return None


def status_main(target: str, as_json: bool, token: str | None, tenant: str | None) -> int:
    """Print the pool of the scheduler at `target`; 0 on success, 1 if the call failed."""
    metadata: list[tuple[str, str]] = []
    if token:
        metadata.append((AUTH_HEADER, f"Bearer {token}"))
    if tenant:
        metadata.append((TENANT_HEADER, tenant))
    try:
        with grpc.insecure_channel(target) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
            pool = stub.DescribePool(admin_pb2.DescribePoolRequest(), metadata=metadata, timeout=10)
    except grpc.RpcError as e:
        print(f"slotsched status: {target}: {e.code().name}: {e.details()}", file=sys.stderr)
        hint = _hint(e.code(), token)
        if hint:
            print(f"slotsched status: {hint}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(MessageToDict(pool, always_print_fields_with_no_presence=True), indent=2))
    else:
        print(render(pool))
    return 0
