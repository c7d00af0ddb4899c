"""`slotsched status`: show pool, workers, floor, classes, tenants and queue of a running scheduler."""

from __future__ import annotations

import argparse


def _status(args: argparse.Namespace) -> int:
    from scheduler.cli.status_table import status_main

    tls = (args.tls_ca, args.tls_cert, args.tls_key)
    rc: int = status_main(args.target, args.json, args.token, args.tenant, tls)
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
    st.add_argument(
        "--tls-ca", default=None, metavar="PEM", help="CA that signed the scheduler's certificate (TLS)"
    )
    st.add_argument(
        "--tls-cert", default=None, metavar="PEM", help="client certificate, for a scheduler requiring mTLS"
    )
    st.add_argument("--tls-key", default=None, metavar="PEM", help="the client certificate's private key")
    st.set_defaults(func=_status)
