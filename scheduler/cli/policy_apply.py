"""`slotsched policy apply FILE`: validate a SchedulingPolicy locally, then put it in force on a
running scheduler through Admin.ApplyPolicy (the path the Kubernetes object takes too), showing
what changes against the policy in force (Admin.GetPolicy).

`--dry-run` asks the server to validate (its warnings include what only it knows, e.g. worker
tokens removed) and applies nothing. The server's trailing metadata (scheduler/server/
policy_log.py) gives the policy generation and whether its state outlives a restart: with
in-memory state a restart silently goes back to the policy file, so the output says so.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, TextIO

import grpc

from scheduler.api.gen.slotsched.v1 import admin_pb2, admin_pb2_grpc
from scheduler.cli.admin_call import Tls, call_metadata, failure_lines, field_violations, open_channel
from scheduler.policy.diff import PolicyDiff, diff_lines, diff_policies
from scheduler.policy.errors import PolicyError
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import check_policy_file, parse_policy
from scheduler.server.policy_log import BUILT_IN, GENERATION_KEY, KUBERNETES, ORIGIN_KEY, STATE_KEY


def durability_note(md: Mapping[str, str]) -> str | None:
    """What happens to an applied policy at the next restart, from the server's metadata (None
    from a server that does not say)."""
    state, origin = md.get(STATE_KEY), md.get(ORIGIN_KEY, "")
    if state is None:
        return None
    if origin.startswith(KUBERNETES):
        return (
            f"note: this server reads its policy from {origin}: that object's next change (and a "
            "restart) puts the object's policy back in force; change the object to keep this one"
        )
    if state == "memory" and origin == BUILT_IN:
        return (
            "note: this server keeps its state in memory: a restart goes back to the built-in policy; "
            "start it with --policy FILE (or durable --state) to keep this one"
        )
    if state == "memory":
        return (
            f"note: this server keeps its state in memory: a restart goes back to its --policy file "
            f"{origin}; update that file too to keep this policy"
        )
    return (
        f"note: the policy is journaled in the server's state store ({state}): restarts and failovers keep it"
    )


def _print_diff(d: PolicyDiff, head: str, out: TextIO) -> None:
    if d.empty:
        print(f"{head}: nothing (the policy in force is the same)", file=out)
        return
    print(f"{head}:", file=out)
    for line in diff_lines(d):
        print(f"  {line}", file=out)


def _trailers(call: Any) -> dict[str, str]:
    return {k: v for k, v in (call.trailing_metadata() or ()) if isinstance(v, str)}


def _local(path: str, err: TextIO) -> tuple[Policy, str, list[str]] | None:
    """The file's policy, text and warnings (`policy validate`'s very checks), or None after
    printing its errors (key paths)."""
    try:
        policy, warnings = check_policy_file(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except PolicyError as e:
        for p in e.problems:
            print(f"error: {p}", file=err)
        n = len(e.problems)
        print(f"{path}: invalid policy, {n} error{'s' if n != 1 else ''}: nothing sent", file=err)
        return None
    except (OSError, UnicodeDecodeError) as e:  # changed since it was validated
        print(f"error: {path}: cannot read policy file: {e}", file=err)
        return None
    return policy, text, [str(w) for w in warnings]


def _refused(e: grpc.RpcError, target: str, token: str | None, err: TextIO) -> int:
    violations = field_violations(e)
    for path, what in violations:
        print(f"error: {path}: {what}", file=err)
    if violations:
        print(f"slotsched policy apply: {target} refused the policy: nothing applied", file=err)
        return 1
    for line in failure_lines(e, target, token, "policy apply"):
        print(f"slotsched policy apply: {line}", file=err)
    return 1


def apply_main(
    path: str,
    target: str,
    token: str | None,
    tls: Tls = (None, None, None),
    dry_run: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """0 when applied (or, with `dry_run`, when the server would accept it); 1 when the file is
    invalid or the server refuses it or cannot be reached; 2 for unusable TLS files."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    local = _local(path, err)
    if local is None:
        return 1
    policy, text, warnings = local
    for w in warnings:  # before sending: what validate says, whether or not the server refuses it
        print(f"warning: {w}", file=out)
    try:
        channel = open_channel(target, tls)
    except ValueError as e:
        print(f"slotsched policy apply: {e}", file=err)
        return 2
    md = call_metadata(token)
    try:
        with channel:
            stub = admin_pb2_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
            current, got = stub.GetPolicy.with_call(admin_pb2.GetPolicyRequest(), metadata=md, timeout=10)
            request = admin_pb2.ApplyPolicyRequest(yaml=text, dry_run=dry_run)
            result, applied = stub.ApplyPolicy.with_call(request, metadata=md, timeout=30)
    except grpc.RpcError as e:
        return _refused(e, target, token, err)
    before, after = _trailers(got), _trailers(applied)
    for w in result.warnings:
        if w not in warnings:  # said above, from the file
            print(f"warning: {w}", file=out)
    try:
        in_force = parse_policy(current.yaml)[0]
    except PolicyError as e:  # a newer server's schema: say so rather than guess a diff
        print(f"note: cannot compare with the policy in force ({e})", file=out)
        in_force = None
    d = diff_policies(in_force, policy) if in_force is not None else None
    was = before.get(GENERATION_KEY)
    against = f"policy {current.name}" + (f", generation {was}" if was else "")
    if dry_run:
        print(f"dry run: {path} is valid for {target} ({against}); nothing applied", file=out)
        if d is not None:
            _print_diff(d, "would change", out)
        return 0
    gen = after.get(GENERATION_KEY)
    print(
        f"applied: policy {policy.name} in force on {target}" + (f", generation {gen}" if gen else ""),
        file=out,
    )
    if d is not None:
        _print_diff(d, f"changed (against {against})", out)
    if was and gen and was.isdigit() and gen.isdigit() and int(gen) != int(was) + 1:
        print(f"note: another policy was applied between generation {was} and this one", file=out)
    note = durability_note(after)
    if note:
        print(note, file=out)
    return 0
