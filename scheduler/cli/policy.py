"""`slotsched policy validate FILE`: check a SchedulingPolicy file, print every error and warning.
`slotsched policy apply FILE`: the same checks, then put it in force on a running scheduler (or,
with --dry-run, show what would change); policy_apply.py.
`slotsched policy crd`: print the SchedulingPolicy CustomResourceDefinition generated from the same
validator (deploy/crd/ holds the committed copy)."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from scheduler.cli.help import add_admin_client_flags


def validate_main(path: str, out: TextIO | None = None) -> int:
    """Validate a policy file, print its errors and warnings; 1 on any error, else 0."""
    from scheduler.policy.errors import PolicyError
    from scheduler.policy.model import ADMIN, WORKER
    from scheduler.policy.yaml_io import check_policy_file

    stream = sys.stdout if out is None else out
    try:
        policy, warnings = check_policy_file(path)
    except PolicyError as e:
        for p in e.problems:
            print(f"error: {p}", file=stream)
        for w in e.warnings:
            print(f"warning: {w}", file=stream)
        n = len(e.problems)
        print(f"{path}: invalid policy, {n} error{'s' if n != 1 else ''}", file=stream)
        return 1
    for w in warnings:
        print(f"warning: {w}", file=stream)
    pools = policy.pool_specs()
    caps = [p.workers * p.slots_per_worker for p in pools]
    n = len(policy.tenants)
    roles = "".join(
        f", {k} {role} token{'s' if k != 1 else ''}"
        for role, k in ((ADMIN, len(policy.access.admins)), (WORKER, len(policy.access.workers)))
        if k
    )
    several = f"{len(pools)} pools, " if len(pools) > 1 else ""
    floor = sum(spec.floor_slots(cap) for spec, cap in zip(pools, caps, strict=True))
    print(
        f"policy {policy.name} is valid: {n} tenant{'s' if n != 1 else ''}, {several}capacity {sum(caps)} "
        f"slots, floor {floor}{roles}",
        file=stream,
    )
    if len(pools) > 1:
        for spec, cap in zip(pools, caps, strict=True):
            labels = ", ".join(f"{k}={v}" for k, v in spec.labels) or "none"
            compat = f"; compatibility {', '.join(spec.compatibility)}" if spec.compatibility else ""
            print(
                f"  pool {spec.name}: labels {labels}{compat}; capacity {cap} slots "
                f"({spec.workers} workers x {spec.slots_per_worker}), floor {spec.floor_slots(cap)}",
                file=stream,
            )
    return 0


def _policy_validate(args: argparse.Namespace) -> int:
    return validate_main(args.file)


def _policy_apply(args: argparse.Namespace) -> int:
    from scheduler.cli.policy_apply import apply_main

    tls = (args.tls_ca, args.tls_cert, args.tls_key)
    rc: int = apply_main(args.file, args.target, args.token, tls, args.dry_run)
    return rc


def _policy_crd(args: argparse.Namespace) -> int:
    from scheduler.policy.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pol = sub.add_parser("policy", help="policy file tools")
    polsub = pol.add_subparsers(dest="policy_command", required=True)
    v = polsub.add_parser("validate", help="check a SchedulingPolicy file; non-zero exit on any error")
    v.add_argument("file")
    v.set_defaults(func=_policy_validate)
    a = polsub.add_parser(
        "apply",
        help="validate a SchedulingPolicy file, then put it in force on a running scheduler "
        "(Admin.ApplyPolicy): prints the warnings, the new generation and what changed",
        description="Validate FILE locally (errors name the key path; non-zero exit), then apply it "
        "on the scheduler at --target and print the warnings, the new policy generation and what "
        "changed against the policy in force: tenants added and removed, quotas and pool changed. "
        "A server whose state is in memory goes back to its --policy file when it restarts: the "
        "output says so.",
    )
    a.add_argument("file")
    add_admin_client_flags(a)
    a.add_argument(
        "--dry-run",
        action="store_true",
        help="only show the server's warnings and what would change against its policy (GetPolicy); "
        "apply nothing",
    )
    a.set_defaults(func=_policy_apply)
    c = polsub.add_parser(
        "crd",
        help="print the SchedulingPolicy CustomResourceDefinition (its schema is generated from the "
        "validator's rules): slotsched policy crd | kubectl apply -f -",
    )
    c.set_defaults(func=_policy_crd)
