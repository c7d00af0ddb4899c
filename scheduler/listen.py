"""Binding the listening ports of `slotsched serve` and `worker`, with errors an operator can act on.

A port clash must say which address and which flag (`cannot listen on 127.0.0.1:9464 for
--metrics-listen: address already in use`), not a bare `[Errno 98]`, and must not be preceded by
the gRPC C-core's own `E1201 … add_port.cc` log line on stderr.

Why a Python bind probe plus a captured stderr, not GRPC_VERBOSITY: the C-core reads
GRPC_VERBOSITY once, when gRPC initialises, so it cannot be lowered only around the bind, and
lowering it for the whole process would also hide the C-core errors an operator needs later. So
`add_grpc_port` first binds the address itself in Python (with SO_REUSEADDR, as the C-core does,
so a port in TIME_WAIT is not reported as taken): the usual failures (in use, not local,
privileged port, unknown host) are reported without calling the C-core at all. Only what the
probe cannot see (another process taking the port between probe and bind) reaches the C-core's
bind, and for that call alone file descriptor 2 is redirected to a temporary file: the C-core's
log lines written then are dropped (their reason kept for the message), anything else written
in that instant is passed on to stderr.

TLS (`--tls-cert/--tls-key/--tls-ca`, `TlsFiles`): with a certificate and key the port speaks TLS
only; with a CA as well it is mutual TLS: a client must present a certificate signed by that CA
or the handshake fails (the caller sees UNAVAILABLE) before any service, reflection, health or
KEDA's endpoint is reached. The verified certificate is then in each call's
`context.auth_context()` (`peer_uri` and `peer_dns`: its SANs by type; `x509_common_name`,
`x509_pem_cert`), where scheduler/server/auth.py reads an identity from its typed SANs. The
metrics port reuses the same files when asked (`--metrics-tls`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

# A C-core (absl) log line: severity+MMDD, time, thread, file.cc:line].
_CORE_LOG = re.compile(r"^[EWIF]\d{4} [\d:.]+ +\d+ [\w./-]+\.cc:\d+\]")
_CORE_BIND_REASON = re.compile(r"Error in bind for address '[^']*': ([^)]+)\)")
# One redirect of fd 2 at a time: two interleaved ones would leave stderr pointing at a temp file.
_FD2_LOCK = threading.Lock()


class ListenError(OSError):
    """A listening address that cannot be bound; the message names the address and the flag."""

    def __init__(self, address: str, flag: str, reason: str) -> None:
        super().__init__(f"cannot listen on {address} for {flag}: {reason}")
        self.address = address
        self.flag = flag
        self.reason = reason

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS port: `cert` + `key` (this server's), `ca` (clients' issuer: mTLS).

    `flags` names the command-line flags in error messages (e.g. `--tls`)."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    flags: str = "--tls"

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError(f"{self.flags}-cert and {self.flags}-key go together: give both or neither")
        if self.ca is not None and self.cert is None:
            raise ValueError(
                f"{self.flags}-ca requires {self.flags}-cert and {self.flags}-key: a port that checks "
                "client certificates must itself speak TLS"
            )

    @property
    def enabled(self) -> bool:
        return self.cert is not None

    @property
    def mutual(self) -> bool:
        return self.ca is not None

    def read(self, which: str) -> bytes:
        path = getattr(self, which)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise ValueError(f"cannot read {self.flags}-{which} {path}: {e.strerror or e}") from None

    def server_credentials(self) -> grpc.ServerCredentials:
        """TLS with this certificate; client certificates of `ca` REQUIRED when a CA is given."""
        return grpc.ssl_server_credentials(
            [(self.read("key"), self.read("cert"))],
            root_certificates=self.read("ca") if self.ca else None,
            require_client_auth=self.ca is not None,
        )

    def describe(self) -> str:
        if not self.enabled:
            return "plaintext"
        if self.mutual:
            return f"mTLS (client certificates required, issued by {self.ca})"
        return "TLS (no client certificates)"


def split_hostport(text: str, flag: str) -> tuple[str, int]:
    """`HOST:PORT` (`[v6]:PORT` too) as (host, port); a bad one is a ListenError naming `flag`."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ListenError(text, flag, "expected HOST:PORT (a port from 0 to 65535)")
    return host.strip("[]"), int(port)


def _reason(e: OSError) -> str:
    if isinstance(e, socket.gaierror):
        return f"cannot resolve the host ({e.strerror or e})"
    if e.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    if e.errno is not None:
        return os.strerror(e.errno).lower()
    return str(e)


def check_bindable(address: str, flag: str) -> None:
    """Raise ListenError unless `address` can be bound now (port 0 always can)."""
    host, port = split_hostport(address, flag)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        raise ListenError(address, flag, _reason(e)) from None
    first: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(sockaddr)
            except OSError as e:
                first = first or e
                continue
        return  # like the C-core: one resolved address that binds is enough
    if first is not None:
        raise ListenError(address, flag, _reason(first))


@contextlib.contextmanager
def _core_logs_captured() -> Iterator[list[str]]:
    """Route fd 2 to a temp file for the block; yields the C-core log lines written meanwhile."""
    core: list[str] = []
    with _FD2_LOCK, tempfile.TemporaryFile(mode="w+b") as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            yield core
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            other: list[str] = []
            for line in tmp.read().decode("utf-8", "replace").splitlines(keepends=True):
                (core if _CORE_LOG.match(line) else other).append(line)
            if other:
                sys.stderr.write("".join(other))
                sys.stderr.flush()


def add_grpc_port(server: grpc.aio.Server, address: str, flag: str, tls: TlsFiles | None = None) -> int:
    """`server.add_insecure_port(address)` (`add_secure_port` with `tls`), failing with a
    ListenError naming `flag` instead of the C-core's log line and RuntimeError. Returns the
    bound port. Unreadable TLS files raise ValueError naming their flag."""
    credentials = tls.server_credentials() if tls is not None and tls.enabled else None
    check_bindable(address, flag)
    port = 0
    # grpc raises RuntimeError for "no address added"; the reason is in the C-core's log line.
    with _core_logs_captured() as core, contextlib.suppress(RuntimeError):
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    if port == 0:
        found = [m.group(1) for line in core if (m := _CORE_BIND_REASON.search(line))]
        raise ListenError(address, flag, found[0].lower() if found else "the gRPC server could not bind it")
    return port


def start_metrics_http(address: str, flag: str, registry: Any, tls: TlsFiles | None = None) -> Any:
    """prometheus_client's /metrics HTTP server on `address` (returns its WSGIServer); a
    ListenError naming `flag` if it cannot bind. With `tls`, HTTPS with the same certificate
    (and client certificates of its CA required, if it has one)."""
    from prometheus_client import start_http_server

    host, port = split_hostport(address, flag)
    kw: dict[str, Any] = {}
    if tls is not None and tls.enabled:
        for which in ("cert", "key") + (("ca",) if tls.ca else ()):
            tls.read(which)  # a missing file is a ValueError naming its flag, like the gRPC port's
        kw = {
            "certfile": tls.cert,
            "keyfile": tls.key,
            "client_cafile": tls.ca,
            "client_auth_required": tls.mutual,
        }
    try:
        httpd, _ = start_http_server(port, host or "0.0.0.0", registry=registry, **kw)
    except OSError as e:
        raise ListenError(address, flag, _reason(e)) from None
    return httpd


def close_metrics_http(httpd: Any) -> None:
    """Stop a server `start_metrics_http` started (waits out its 0.5 s poll: call it off the loop)."""
    httpd.shutdown()
    httpd.server_close()


def default_advertise(host: str, port: int, env: Mapping[str, str] | None = None) -> str:
    """The address clients reach this replica at: the listen host, unless it listens on all
    interfaces; then $POD_IP (Kubernetes' downward API), else the hostname."""
    env = os.environ if env is None else env
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = env.get("POD_IP") or socket.gethostname()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"{host}:{port}"
