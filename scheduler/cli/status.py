"""`slotsched status`: show pool, workers, floor, classes, tenants and queue of a running scheduler."""

from __future__ import annotations

import argparse

from scheduler.cli.help import add_admin_client_flags


def _status(args: argparse.Namespace) -> int:
    from scheduler.cli.status_table import status_main

    tls = (args.tls_ca, args.tls_cert, args.tls_key)
    rc: int = status_main(args.target, args.json, args.token, args.tenant, tls)
    return rc


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    st = sub.add_parser(
        "status",
        help="show each pool (labels, capacity, floor, workers), classes, tenants, and each waiter's reason",
    )
    add_admin_client_flags(st)
    st.add_argument(
        "--json",
        action="store_true",
        help='print the pool description as JSON (several pools: each under "pools")',
    )
    st.add_argument(
        "--tenant", default=None, help="x-slotsched-tenant header (dev mode; Admin needs none there)"
    )
    st.set_defaults(func=_status)
