"""`slotsched worker`: run a reference worker that serves actors in slots for a scheduler.

Imports are lazy, like the other subcommands, so `slotsched --help` stays fast.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from slots.worker.defaults import DEFAULT_SNAPSHOTS
from snapshots.config import URL_FORMS

if TYPE_CHECKING:
    from scheduler.grants import GrantVerifier


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    mult = units.get(t[-1:], 1)
    number = t[:-1] if t[-1:] in units else t
    try:
        value = int(float(number) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size like 4096, 64KiB or 1MiB: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text}")
    return value


VERIFY_GRANTS_ENV = "SLOTSCHED_VERIFY_GRANTS"
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def grant_verifier(args: argparse.Namespace, env: Mapping[str, str]) -> GrantVerifier | None:
    """What the worker checks grants with, or None (no checks: dev). On with --verify-grants or
    $SLOTSCHED_VERIFY_GRANTS=1 (the keys come from the scheduler, in its Register and Heartbeat
    answers); --grant-public-keys ($SLOTSCHED_GRANT_PUBLIC_KEYS) turns them on as well and also
    accepts the g1 grants of a scheduler not upgraded yet. ValueError names a bad env value;
    GrantKeyError a bad public key file."""
    from scheduler.grants import GRANT_PUBLIC_KEYS_ENV, GrantVerifier

    if args.grant_public_keys:
        return GrantVerifier.load(args.grant_public_keys)
    if env.get(GRANT_PUBLIC_KEYS_ENV, "").strip():
        return GrantVerifier.parse(env[GRANT_PUBLIC_KEYS_ENV], GRANT_PUBLIC_KEYS_ENV)
    verify = args.verify_grants
    if not verify:
        value = env.get(VERIFY_GRANTS_ENV, "").strip().lower()
        if value not in _ON + _OFF:
            raise ValueError(f"${VERIFY_GRANTS_ENV}={value!r}: expected 1 or 0 (true/false, yes/no, on/off)")
        verify = value in _ON
    return GrantVerifier() if verify else None


def _worker(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from scheduler.grants import GrantKeyError
    from scheduler.listen import TlsFiles
    from slots.worker.actor import ActorConfig
    from slots.worker.main import run_worker

    try:
        tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_ca)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    config = ActorConfig(args.bytes_per_turn, args.turn_interval, args.max_turns)
    token = args.token if args.token is not None else os.environ.get("SLOTSCHED_TOKEN")
    try:
        grants = grant_verifier(args, os.environ)
    except (GrantKeyError, ValueError) as e:
        print(f"slotsched worker: cannot start: {e}", file=sys.stderr)
        return 2
    rc: int = asyncio.run(
        run_worker(
            args.scheduler,
            args.worker_id,
            args.slots,
            args.listen,
            args.snapshots,
            token=token,
            tenant=args.tenant,
            pool=args.pool,
            advertise=args.advertise,
            actor_config=config,
            accept_token_hashes=tuple(args.accept_token_hash or ()),
            metrics_listen=args.metrics_listen,
            fallback=not args.strict_restore,
            drain_yield_s=args.drain_yield,
            drain_timeout_s=args.drain_timeout,
            verify_leases=not args.no_verify_leases,
            grants=grants,
            admin_token_hashes=tuple(args.admin_token_hash or ()),
            tls=tls,
        )
    )
    return rc


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = sub.add_parser(
        "worker", help="run a reference worker: actors with real state in slots, checkpointed on yield"
    )
    w.add_argument(
        "--scheduler",
        default="127.0.0.1:50051",
        help="scheduler HOST:PORT, or every replica's comma-separated: calls follow the leader "
        "(default %(default)s)",
    )
    w.add_argument("--worker-id", required=True, help="unique id of this worker in the pool")
    w.add_argument("--slots", type=int, default=2, help="actors it runs at once (default %(default)s)")
    w.add_argument(
        "--pool",
        default="",
        help="the pool it joins (spec.pools[].name; its credential's spec.access.workers entry must list "
        "it); default: the policy's only pool, or the one named default",
    )
    w.add_argument("--listen", default="127.0.0.1:0", help="Worker service HOST:PORT (default %(default)s)")
    w.add_argument("--advertise", default=None, help="HOST:PORT clients dial (default: the listen address)")
    w.add_argument(
        "--snapshots",
        default=DEFAULT_SNAPSHOTS,
        help=f"snapshot store URL: {URL_FORMS} (default %(default)s; $SLOTSCHED_SNAPSHOTS sets it)",
    )
    w.add_argument(
        "--token",
        default=None,
        help="worker bearer token for the scheduler's Workers service, its hash listed under "
        "spec.access.workers of the policy (or $SLOTSCHED_TOKEN); tenant tokens are refused",
    )
    w.add_argument(
        "--tenant",
        default=None,
        help="x-slotsched-tenant header (dev mode; the Workers service needs none there)",
    )
    w.add_argument(
        "--accept-token-hash",
        action="append",
        metavar="[TENANT=]sha256:HEX",
        help="accept Worker calls bearing this token (repeatable); TENANT= binds it to a tenant (it may "
        "then act on, and see in Status, only that tenant's actors); none = accept anyone (dev only)",
    )
    w.add_argument(
        "--admin-token-hash",
        action="append",
        metavar="sha256:HEX",
        help="a token that sees every actor in Status (repeatable; operators)",
    )
    w.add_argument(
        "--verify-grants",
        action="store_true",
        help="Start, Checkpoint and Stop need the lease's grant (PERMISSION_DENIED without), checked "
        "with the keys the scheduler hands this worker when it registers and heartbeats (default "
        "$SLOTSCHED_VERIFY_GRANTS: 1 turns it on). Without (nor --grant-public-keys): grants are "
        "not checked (dev)",
    )
    w.add_argument(
        "--grant-public-keys",
        default=None,
        metavar="PATH",
        help="as --verify-grants, and also accept the Ed25519 (g1) grants of a scheduler not upgraded "
        "yet, with its public keys, KID:BASE64 lines (`python -m scheduler.grants public KEYFILE`; "
        "default $SLOTSCHED_GRANT_PUBLIC_KEYS)",
    )
    w.add_argument("--metrics-listen", default=None, help="Prometheus /metrics HOST:PORT (default: off)")
    w.add_argument("--bytes-per-turn", type=_size, default=4096, help="state an actor adds per turn")
    w.add_argument("--turn-interval", type=_positive_float, default=0.25, help="seconds between turns")
    w.add_argument("--max-turns", type=int, default=None, help="turns after which an actor idles")
    w.add_argument(
        "--strict-restore",
        action="store_true",
        help="fail Start with DATA_LOSS on a bad snapshot instead of falling back to an older one",
    )
    w.add_argument(
        "--no-verify-leases",
        action="store_true",
        help="start actors without checking that the scheduler granted their lease (tenant, session, "
        "slot, epoch, snapshot) on this worker; for standalone use without a scheduler only. By "
        "default a Start no live lease matches is refused PERMISSION_DENIED (FAILED_PRECONDITION for a "
        "stale epoch, UNAVAILABLE while the scheduler cannot be reached)",
    )
    w.add_argument("--drain-yield", type=float, default=10.0, help="yield deadline when draining on exit")
    w.add_argument(
        "--drain-timeout", type=float, default=30.0, help="longest wait for actors to leave on exit"
    )
    w.add_argument(
        "--tls-cert",
        default=None,
        metavar="PEM",
        help="this worker's certificate: served on --listen and shown to the scheduler as its client "
        "certificate (so it needs both server and client use)",
    )
    w.add_argument("--tls-key", default=None, metavar="PEM", help="the certificate's private key")
    w.add_argument(
        "--tls-ca",
        default=None,
        metavar="PEM",
        help="CA of the scheduler's certificate and of the runtimes' client certificates: with it "
        "the Worker service requires a client certificate it signed (mTLS), and the channel to the "
        "scheduler verifies the scheduler against it",
    )
    w.set_defaults(func=_worker)
