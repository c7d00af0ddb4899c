"""`slotsched status`: show pool, workers, floor, classes, tenants and queue of a running scheduler."""

from __future__ import annotations

import argparse


def _status(args: argparse.Namespace) -> int:
    from scheduler.cli.status_table import status_main

    rc: int = status_main(args.target, args.json, args.token, args.tenant)
    return rc


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    st = sub.add_parser(
        "status", help="show pool, workers (state, leases), floor, classes, tenants and queue"
    )
    st.add_argument(
        "--target", default="127.0.0.1:50051", help="scheduler gRPC address (default %(default)s)"
    )
    st.add_argument("--json", action="store_true", help="print the pool description as JSON")
    st.add_argument(
        "--token", default=None, help="admin bearer token (secure mode; its hash is in spec.access.admins)"
    )
    st.add_argument(
        "--tenant", default=None, help="x-slotsched-tenant header (dev mode; Admin needs none there)"
    )
    st.set_defaults(func=_status)
