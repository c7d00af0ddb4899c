"""`ClientOptions`: every setting of a client, declared once.

Why: `AsyncClient` and the blocking `Client` take the same settings, and each used to spell out
the same 17 parameters (a setting added to one and forgotten in the other was a bug once). Both
now take `options=ClientOptions(...)`, or the same names as keyword arguments (as the README's
examples do), which are laid over `options`; an unknown name is refused with its name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import grpc

from scheduler.client.channel import DEFAULT_CONNECT_TIMEOUT_S, PemSource
from scheduler.client.follow import DEFAULT_FAILOVER_TIMEOUT_S


@dataclass(frozen=True, kw_only=True)
class ClientOptions:
    """A client's settings (`AsyncClient` says what each does)."""

    #: Sent as `authorization: Bearer <token>`.
    token: str | None = None
    #: Sent as `x-slotsched-tenant` (the server's insecure dev mode only).
    tenant: str | None = None
    #: Merged over `channel.DEFAULT_CHANNEL_OPTIONS`.
    channel_options: Sequence[tuple[str, Any]] | None = None
    #: TLS: ready credentials, or the CA (and, for mTLS, this client's certificate and key).
    credentials: grpc.ChannelCredentials | None = None
    tls_ca: PemSource | None = None
    tls_cert: PemSource | None = None
    tls_key: PemSource | None = None
    rpc_timeout_s: float = 10.0
    reattach_timeout_s: float = 30.0
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 2.0
    renew_interval_s: float | None = None
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    follow_leader: bool = True
    failover_timeout_s: float = DEFAULT_FAILOVER_TIMEOUT_S
    multiplex: bool = True

    def __post_init__(self) -> None:
        if self.connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be > 0, not {self.connect_timeout_s!r}")

    @classmethod
    def of(
        cls, options: ClientOptions | None, settings: Mapping[str, Any], **positional: Any
    ) -> ClientOptions:
        """`options` (the defaults without) with `settings` (keyword arguments) laid over it, and
        the clients' positional `token`, `tenant`, `channel_options` where given (not None)."""
        unknown = sorted(set(settings) - NAMES)
        if unknown:
            known = ", ".join(sorted(NAMES))
            raise TypeError(f"unknown client setting {', '.join(unknown)}: the settings are {known}")
        changes = {k: v for k, v in positional.items() if v is not None} | dict(settings)
        base = options if options is not None else cls()
        return replace(base, **changes) if changes else base


#: The names of the settings.
NAMES = frozenset(f.name for f in fields(ClientOptions))
