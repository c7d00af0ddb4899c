"""The wire under the async SDK: channel options, call metadata, the connect deadline, and what a
session needs of its client (`ClientLink`).

Why apart from `AsyncClient`: the session's parts (attach, renew, yield, release) read the
client's timeouts, retry policies and stubs through this narrow Protocol, so the session modules
do not import the client module that constructs them (no cycle).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

import grpc
import grpc.aio

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import scheduler_pb2_grpc
from scheduler.client.forward import Forward
from scheduler.client.reactions import Call, Reaction, codes
from scheduler.client.retry import RetryPolicy
from scheduler.client.transport import ChannelCall, SessionTransport
from scheduler.client.wake import Wake

#: Stream failures after which the session re-attaches (the server keeps the session meanwhile):
#: the ATTACH column of `reactions.STATUS_TABLE`.
REATTACH_CODES = codes(Call.ATTACH, Reaction.REATTACH)
#: How long a session that never reached the server keeps trying before it fails (seconds).
DEFAULT_CONNECT_TIMEOUT_S = 10.0

#: HTTP/2 keepalive: after this long without traffic the client pings, and a replica that does not
#: answer the ping within KEEPALIVE_TIMEOUT_MS is a lost connection. A frozen (SIGSTOP) or
#: partitioned process keeps its TCP connections open, so without pings every call and stream
#: on it would wait until it woke up, long after a standby took over. The server accepts pings
#: this often (scheduler/server/app.py: older servers answer GOAWAY too_many_pings).
KEEPALIVE_TIME_MS = 1000
KEEPALIVE_TIMEOUT_MS = 1500
#: A replica that answers nothing for this long while a call or a command waits on it counts as
#: lost, as a failed ping does (its process lives, and its gRPC core answers pings, but it serves
#: nothing): an attempt of a unary call is cut there and tried on the next replica (follow.py),
#: a Channel breaks and its sessions re-attach (mux.py). Well above any answer a serving leader
#: gives (a journal append), so a busy leader is not left for it.
SILENCE_S = 3.0

#: Reconnect quickly after a server restart; gRPC's defaults (1 s growing to 120 s) would make a
#: re-attach wait far longer than a lease TTL. Keepalive as above, also with no call open (an
#: idle Channel between renewals is a call, but a client's only calls may be rare GetSessions),
#: and unlimited pings between data frames (gRPC's default, 2, would stop them on a quiet stream).
#: gRPC's core enforces the timeout of every ping (keepalive's and its own bandwidth probes') as
#: `grpc.http2.ping_timeout_ms`, default a minute, and not `keepalive_timeout_ms` (grpc/grpc#39239):
#: both are set.
DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)


class NoAnswer(Exception):
    """The first Acquire of a session got no answer within the connect deadline."""


def merged_options(overrides: Sequence[tuple[str, Any]] | None) -> list[tuple[str, Any]]:
    """`DEFAULT_CHANNEL_OPTIONS` with `overrides` merged over them."""
    options = dict(DEFAULT_CHANNEL_OPTIONS)
    options.update(dict(overrides or ()))
    return list(options.items())


def call_metadata(token: str | None, tenant: str | None) -> tuple[tuple[str, str], ...]:
    """`authorization: Bearer <token>` and `x-slotsched-tenant` (the server's insecure dev mode only)."""
    md: list[tuple[str, str]] = []
    if token is not None:
        md.append((wire.AUTHORIZATION, f"{wire.BEARER}{token}"))
    if tenant is not None:
        md.append((wire.TENANT, tenant))
    return tuple(md)


#: A PEM file's path, or its bytes.
PemSource = str | os.PathLike[str] | bytes


def _pem(value: PemSource | None, name: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    try:
        with open(value, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read {name} {os.fspath(value)}: {e.strerror or e}") from None


def tls_credentials(
    tls_ca: PemSource | None = None,
    tls_cert: PemSource | None = None,
    tls_key: PemSource | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.ChannelCredentials | None:
    """Channel credentials from PEM files (paths or bytes): `tls_ca` verifies the server (the
    system roots without it), `tls_cert` + `tls_key` are this client's certificate for a server
    that requires one (mTLS). None when nothing is given (plaintext). `credentials` (already
    built) is passed through, and may not be combined with the files."""
    if credentials is not None:
        if tls_ca is not None or tls_cert is not None or tls_key is not None:
            raise ValueError("give either credentials or tls_ca/tls_cert/tls_key, not both")
        return credentials
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together: give both or neither")
    if tls_ca is None and tls_cert is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_pem(tls_ca, "tls_ca"),
        private_key=_pem(tls_key, "tls_key"),
        certificate_chain=_pem(tls_cert, "tls_cert"),
    )


def open_channel(
    target: str, options: list[tuple[str, Any]], credentials: grpc.ChannelCredentials | None
) -> grpc.aio.Channel:
    """A TLS channel when `credentials` are given, else a plaintext one (in the running loop)."""
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials, options=options)
    return grpc.aio.insecure_channel(target, options=options)


class ClientLink(Protocol):
    """What a session reads of its client: `AsyncClient` itself (its default route), or the
    `routes.PoolRoute` of the session's pool."""

    target: str
    metadata: tuple[tuple[str, str], ...]
    rpc_timeout_s: float
    reattach_timeout_s: float
    connect_timeout_s: float
    renew_interval_s: float | None
    #: A session's re-attach (and first attach) backoff.
    reattach: RetryPolicy
    #: The waits between two tries of a command (how many tries: `calls.py`).
    command_backoff: RetryPolicy
    #: Whether a command whose replica was lost is sent again to the leader, and for how long.
    follow_leader: bool
    failover_timeout_s: float
    #: Ends the backoff sleeps of its sessions when the server answers again (`wake.py`).
    wake: Wake
    #: The client's live sessions, released by its `close()`.
    sessions: set[Any]

    def stub(self) -> scheduler_pb2_grpc.SchedulerStub: ...

    def open_channel(self) -> ChannelCall:
        """A new `Scheduler.Channel` stream to the leader, with the client's credential (for the
        channel multiplexer, `mux.py`)."""
        ...

    def transport(self) -> SessionTransport:
        """Where sessions' Acquire, Renew, Yield and Release go: the channel multiplexer or the
        per-session rpcs (neither sends a command again: `calls.py` does)."""
        ...


class ForwardedSettings:
    """A `ClientLink`'s settings read live from the link it serves under (`_settings`: a pool's
    route reads its client's, a budget's permits the link they go through now), declared once."""

    _settings: Any
    target = Forward[str]("_settings")
    metadata = Forward[tuple[tuple[str, str], ...]]("_settings")
    rpc_timeout_s = Forward[float]("_settings")
    reattach_timeout_s = Forward[float]("_settings")
    connect_timeout_s = Forward[float]("_settings")
    renew_interval_s = Forward[float | None]("_settings")
    reattach = Forward[RetryPolicy]("_settings")
    command_backoff = Forward[RetryPolicy]("_settings")
    follow_leader = Forward[bool]("_settings")
    failover_timeout_s = Forward[float]("_settings")
    wake = Forward[Wake]("_settings")
    sessions = Forward[set[Any]]("_settings")


_GRPC_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:", "xds:")


def parse_targets(target: str | Sequence[str]) -> list[str]:
    """One address, "host1:port,host2:port", or a list of them. A gRPC URI whose scheme takes a
    comma-separated list itself (`ipv4:a,b`) is one target."""
    if isinstance(target, str):
        text = target.strip()
        items = [text] if text.startswith(_GRPC_SCHEMES) else text.split(",")
    else:
        items = list(target)
    targets = [t.strip() for t in items if t.strip()]
    if not targets:
        raise ValueError(f"no scheduler address in target {target!r}")
    return targets
