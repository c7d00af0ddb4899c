"""What the CLI's Admin API clients (`status`, `policy apply`) share: the channel (plaintext or
TLS), the credential metadata, and what to say about a failed call.

A client: it reads statuses and their rich details, it does not choose them.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from scheduler.client.channel import tls_credentials
from scheduler.server.auth import AUTH_HEADER, TENANT_HEADER

Tls = tuple[str | None, str | None, str | None]  # CA, client certificate, client key: PEM paths


def open_channel(target: str, tls: Tls) -> grpc.Channel:
    """A channel to `target`: TLS when a CA or client certificate is given. ValueError (naming
    the --tls-* flag) for unusable TLS files."""
    try:
        credentials = tls_credentials(*tls)
    except ValueError as e:
        raise ValueError(str(e).replace("tls_", "--tls-")) from e
    if credentials is None:
        return grpc.insecure_channel(target)
    return grpc.secure_channel(target, credentials)


def call_metadata(token: str | None, tenant: str | None = None) -> list[tuple[str, str]]:
    md: list[tuple[str, str]] = []
    if token:
        md.append((AUTH_HEADER, f"Bearer {token}"))
    if tenant:
        md.append((TENANT_HEADER, tenant))
    return md


def _details(e: grpc.RpcError) -> list[object]:
    try:
        status = rpc_status.from_call(e)
    except ValueError:  # a status whose details do not match its code or message
        return []
    if status is None:
        return []
    out: list[object] = []
    for d in status.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest):
            if d.Is(kind.DESCRIPTOR):
                msg = kind()
                d.Unpack(msg)
                out.append(msg)
    return out


def error_info(e: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    return next((d for d in _details(e) if isinstance(d, error_details_pb2.ErrorInfo)), None)


def field_violations(e: grpc.RpcError) -> list[tuple[str, str]]:
    """(key path, what is wrong) of an INVALID_ARGUMENT's BadRequest detail."""
    return [
        (v.field, v.description)
        for d in _details(e)
        if isinstance(d, error_details_pb2.BadRequest)
        for v in d.field_violations
    ]


def _hint(code: grpc.StatusCode, token: str | None, command: str) -> str | None:
    """What to do about a refused credential (the status line alone says only what went wrong)."""
    if code is grpc.StatusCode.UNAUTHENTICATED and not token:
        return (
            "this scheduler runs in secure mode: pass --token with an admin token (one whose "
            '"sha256:<hex>" hash is listed under spec.access.admins of its policy)'
        )
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return (
            f'{command} needs an admin token: its "sha256:<hex>" hash must be listed under '
            "spec.access.admins of the policy (tenant and worker tokens are refused); compute it "
            "with: printf '%s' \"$TOKEN\" | sha256sum"
        )
    return None


def failure_lines(e: grpc.RpcError, target: str, token: str | None, command: str) -> Sequence[str]:
    """What `slotsched COMMAND` prints (to stderr) for a failed Admin call: the status, and what
    to do. A replica that does not lead says why: it cannot reach its state store (its own
    words), or it is a standby (and where the leader is)."""
    code, text = e.code(), e.details() or ""
    info = error_info(e)
    if code is grpc.StatusCode.UNAVAILABLE and info is not None and info.reason == "NOT_LEADER":
        leader = info.metadata.get("leader")
        if info.metadata.get("state_store") == "unreachable":
            return [f"{target}: {text}"]
        if leader:
            return [f"{target}: standby; leader is {leader} (run it with --target {leader})"]
        return [f"{target}: standby; no leader known yet (an election may be under way): retry shortly"]
    lines = [f"{target}: {code.name}: {text}"]
    hint = _hint(code, token, command)
    return [*lines, hint] if hint else lines
