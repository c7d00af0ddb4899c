"""`slotsched serve`: run the scheduler service (gRPC, metrics, optional durable state and
autoscaler). Imports the server lazily, so other subcommands do not pay for gRPC.
"""

from __future__ import annotations

import argparse
import os
import sys

from scheduler.cli.help import positive
from slots.actuators.factory import KINDS


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from scheduler.listen import TlsFiles
    from scheduler.serve import StateOptions, serve_forever

    state = StateOptions(
        state=args.state,
        prefix=args.state_prefix,
        replica_id=args.replica_id,
        leader_ttl_s=args.leader_ttl,
        campaign_interval_s=args.campaign_interval,
        advertise=args.advertise,
        snapshot_every=args.snapshot_every,
        snapshot_interval_s=args.snapshot_interval,
        leadership=args.leadership,
    )
    try:
        tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_ca)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rc: int = asyncio.run(
        serve_forever(
            policy_path=args.policy,
            policy_source=args.policy_source,
            listen=args.listen,
            metrics_listen=args.metrics_listen,
            static_pool=not args.no_static_pool,
            autoscaler=args.autoscaler,
            state=state,
            grant_key_file=args.grant_key_file,
            tls=tls,
            metrics_tls=args.metrics_tls,
        )
    )
    return rc


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("serve", help="run the scheduler service (embedded defaults with no flags)")
    s.add_argument("--policy", help="SchedulingPolicy YAML; without it: built-in policy, INSECURE dev mode")
    s.add_argument(
        "--policy-source",
        metavar="kubernetes://NAMESPACE/NAME",
        help="instead of --policy: read the policy from this SchedulingPolicy object (CRD: "
        "`slotsched policy crd`), apply its changes live and report them in its status",
    )
    s.add_argument("--listen", default="127.0.0.1:50051", help="gRPC address (default %(default)s)")
    s.add_argument(
        "--metrics-listen", default="127.0.0.1:9464", help="Prometheus /metrics address (default %(default)s)"
    )
    s.add_argument(
        "--autoscaler",
        choices=KINDS,  # the factory's one list of actuator kinds
        default=None,
        help="companion autoscaler (default: $SLOTSCHED_AUTOSCALER or off): one loop per pool that "
        "sizes the pool between its minWorkers and maxWorkers by demand, draining a worker before "
        "removing it. local: starts and stops worker processes on this machine (`slotsched worker "
        "--scheduler ADDR --worker-id worker-N --slots SLOTS [--pool POOL]`, or "
        "$SLOTSCHED_WORKER_COMMAND with {worker_id} {slots} {scheduler} {pool}; in secure mode give "
        "them a worker token in $SLOTSCHED_TOKEN), e.g. `slotsched serve --autoscaler local "
        "--no-static-pool`; kubernetes: scales each pool's target (spec.pools[].target or "
        "$SLOTSCHED_AUTOSCALER_TARGET, Deployment/NAME...; see deploy/); dry-run: changes nothing, "
        "logs and counts what it would do",
    )
    s.add_argument(
        "--no-static-pool",
        action="store_true",
        help="register no local-N workers (of several pools: local-POOL-N, each in its pool): workers "
        "join with `slotsched worker` (or the autoscaler)",
    )
    s.add_argument(
        "--state",
        default=os.environ.get("SLOTSCHED_STATE", "memory"),
        help="memory, or Redis for journal, snapshots and leader election: redis://HOST:PORT/DB, "
        "redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB] or "
        "redis+cluster://HOST:PORT[,HOST:PORT...] (rediss... for TLS; [USER:PASSWORD@] before the "
        "hosts); options ?replicas=N (acknowledge an append once N replicas hold it; default 1 with "
        "Sentinel, else 0), replica_timeout_ms=MS (500), sentinel_auth=1 (default %(default)s, from "
        "$SLOTSCHED_STATE if set)",
    )
    s.add_argument(
        "--state-prefix",
        default="slotsched",
        help="Redis key namespace (default %(default)s; with redis+cluster the keys are {PREFIX}:...)",
    )
    s.add_argument(
        "--leadership",
        choices=("replica", "pool"),
        default="replica",
        help="with --state redis…: replica (default) = one leader runs every pool, the others are hot "
        "standbys; pool = each pool has its own leader lease in Redis, the pools spread evenly over the "
        "live replicas (all serve; a call for a pool led elsewhere is NOT_LEADER naming that pool's "
        "leader; health slotsched.pool/NAME is SERVING where it is led)",
    )
    s.add_argument(
        "--replica-id", default=None, help="this replica's name in the leader key (default host-pid)"
    )
    s.add_argument(
        "--leader-ttl",
        type=positive,
        default=1.0,
        help="seconds a leader lease lasts unrenewed (renewed every TTL/4; the leader stops serving "
        "at 90%% of it without a renewal): a dead leader is replaced within about this "
        "(default %(default)s)",
    )
    s.add_argument(
        "--campaign-interval",
        type=positive,
        default=0.1,
        help="seconds between a standby's tries for the leader lease, ±50%% jitter (default %(default)s)",
    )
    s.add_argument(
        "--advertise",
        default=None,
        metavar="HOST:PORT",
        help="the address clients reach this replica at; standbys name the leader's in their "
        "NOT_LEADER refusals (default: the --listen address, or $POD_IP / the hostname with the "
        "port when listening on all interfaces)",
    )
    s.add_argument(
        "--snapshot-every",
        type=int,
        default=1000,
        help="snapshot the state and trim the journal once the journal tail holds N events or 5%% "
        "of the live sessions, whichever is more, and at least 20 times the last snapshot's own "
        "time after it (so snapshots take at most about 5%% of the leader's time) (default %(default)s)",
    )
    s.add_argument(
        "--snapshot-interval",
        type=positive,
        default=60.0,
        help="... or every this many seconds with events since the last (default %(default)s)",
    )
    s.add_argument(
        "--grant-key-file",
        default=None,
        metavar="PATH",
        help="grant secrets, KID:BASE64 lines of 32 random bytes (the first makes grants, all verify; "
        "`python -m scheduler.grants new KID` makes one), the same file on every replica; default "
        "$SLOTSCHED_GRANT_KEYS, else a key generated at start. Each worker gets its own key, derived "
        "from them, in its Register and Heartbeat answers",
    )
    add_tls_flags(s, "this server's")
    s.add_argument(
        "--metrics-tls",
        action="store_true",
        help="serve /metrics over HTTPS with --tls-cert/--tls-key (and require client certificates "
        "of --tls-ca if given); without it metrics stay plain HTTP: keep that port cluster-internal",
    )
    s.set_defaults(func=_serve)


def add_tls_flags(p: argparse.ArgumentParser, whose: str) -> None:
    """--tls-cert/--tls-key/--tls-ca of a serving command (`serve`, `worker`)."""
    p.add_argument("--tls-cert", default=None, metavar="PEM", help=f"{whose} TLS certificate (chain)")
    p.add_argument("--tls-key", default=None, metavar="PEM", help=f"{whose} TLS private key")
    p.add_argument(
        "--tls-ca",
        default=None,
        metavar="PEM",
        help="CA of the client certificates: with it, every caller must present one it signed "
        "(mTLS; without a certificate the handshake fails); without it, TLS without client certificates",
    )
