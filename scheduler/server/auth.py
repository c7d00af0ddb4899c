"""Who is calling: a tenant or a role, derived from the caller's credential, never from a request;
and whether the caller's flow still has room (rate limits, `ratelimit.RateLimiter`; the fair
admission gate and the open-stream bounds, `fairness.AdmissionGate` and `StreamBounds`, which
the servicers call once the caller is known).

Secure mode (a policy file was given). The credential is, in this order:

1. `authorization: Bearer <token>`: hashed and matched against the token hashes of the policy in
   force;
2. else a verified mTLS client certificate (the TLS layer checked it against the CA): its URI and
   DNS subject alternative names, each with its type, are matched against `identities` in the
   policy, a "spiffe://…" identity against URI SANs only and a DNS name against DNS SANs only
   (`certificate_names`). A certificate naming two identities is refused.

A credential is exactly one identity (the policy loader refuses one listed twice): a tenant
(`spec.tenants[].tokens` / `identities`), the admin role (`spec.access.admins`: operators) or a
worker entry (`spec.access.workers[i]`: worker agents, bound to the worker ids it may act as and
a slot bound).

* Scheduler service (`tenant`): tenants only; a role names no tenant.
* Admin service (`require_admin`): the admin role only, so no tenant can rewrite the policy
  (its own quotas) or read other tenants' leases.
* Workers service (`worker` + `require_scope`): a worker entry for the ids in its scope, or the
  admin role for any id (an operator drains by hand); so no tenant can drain or deregister
  workers, and no worker can heartbeat (read the leases of), drain, deregister or re-register
  another worker.

No credential is UNAUTHENTICATED; an unknown one, or one without the role or scope needed,
PERMISSION_DENIED (the message names what is needed and where the policy lists it). Identities
are cached by the digest of the header (or of the certificate's typed names) per policy, so the hot
path (`tenant`, on every Acquire) pays one sha256 and a dict lookup; the cache is dropped when
ApplyPolicy changes the policy.

Insecure dev mode (no policy file): the tenant is whatever `x-slotsched-tenant` says, as long as
the policy has it, and Admin and Workers accept anyone (as an admin). The server warns about
this at startup. Rate limits apply in both modes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Final

from scheduler.api import wire
from scheduler.api.commands import Command
from scheduler.policy.identities import (
    ADMINS_KEY,
    NOBODY,
    WORKERS_KEY,
    CertName,
    Identity,
    SanType,
    identities_for_names,
    identity_for_token,
)
from scheduler.policy.model import ADMIN, WORKER, Policy, Role
from scheduler.server import errors
from scheduler.server.fairness import AdmissionGate, MessagePermits, StreamBounds
from scheduler.server.ratelimit import RateLimiter

__all__ = ["AUTH_HEADER", "TENANT_HEADER", "Authenticator", "Identity"]

AUTH_HEADER = wire.AUTHORIZATION  # the metadata keys are the wire's (scheduler/api/wire.py)
TENANT_HEADER = wire.TENANT
_CACHE_MAX = 4096

# Where the policy lists each role's credentials, for error messages.
_ROLE_KEY: Final[dict[Role, str]] = {ADMIN: ADMINS_KEY, WORKER: WORKERS_KEY}
# What a caller in insecure dev mode is on the Admin and Workers services.
_DEV: Final = Identity(role=ADMIN, key="insecure dev mode")

# auth_context() keys grpc sets for a peer whose certificate the TLS layer verified: one per SAN
# type (its URI and DNS SANs are the names the policy lists), every SAN of any type pooled (DNS,
# URI, e-mail, IP: read only to know whether the certificate has a SAN), and the subject's CN.
_TYPED_SAN_KEYS: Final = (("peer_uri", SanType.URI), ("peer_dns", SanType.DNS))
_ANY_SAN_KEY: Final = "x509_subject_alternative_name"
_CN_KEY: Final = "x509_common_name"

_BEARER: Final = "this bearer token"
_CERT: Final = "this client certificate"


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def certificate_names(context: Any) -> list[CertName] | None:
    """The typed names of the caller's verified client certificate ([] when it has none the
    policy could list), or None when the peer did not authenticate with one (plaintext, or TLS
    without a client certificate).

    Its URI SANs and DNS SANs, each with its type; e-mail and IP SANs name nobody. The subject's
    common name is read only when the certificate has no SAN at all, and then as a DNS name: a
    CN is no URI (SPIFFE puts the ID in the URI SAN only), and a certificate with SANs is named
    by them (RFC 6125; Go and browsers ignore such a CN), so a CN can never add a name to them."""
    try:
        ac = context.auth_context() or {}
    except (AttributeError, NotImplementedError):
        return None
    if "ssl" not in {_text(v) for v in ac.get("transport_security_type", ())}:
        return None
    if not any(key.startswith("x509_") for key in ac):  # grpc's properties of a peer certificate
        return None
    names: list[CertName] = []
    for key, san_type in _TYPED_SAN_KEYS:
        names += [n for n in (CertName(san_type, _text(v)) for v in ac.get(key, ())) if n not in names]
    if not names and not ac.get(_ANY_SAN_KEY):
        names = [CertName(SanType.DNS, _text(v)) for v in ac.get(_CN_KEY, ())]
    return names


class Authenticator:
    def __init__(self, secure: bool, policy: Callable[[], Policy]) -> None:
        """`policy` returns the policy in force (it changes with ApplyPolicy)."""
        self.secure = secure
        self._policy = policy
        self._cache: dict[bytes, tuple[Identity, str]] = {}
        self._cached_for: Policy | None = None
        self.limits = RateLimiter(policy)
        self.gate = AdmissionGate(policy)  # fair admission of the server's work, per flow
        self.streams = StreamBounds(policy)  # open Channel and Acquire streams
        self.permits = MessagePermits()  # a flow's Channel messages in progress

    # ------------------------------------------------------------------ per service

    def tenant(self, context: Any, command: Command | None = None) -> str:
        """The caller's tenant, or raise UNAUTHENTICATED / PERMISSION_DENIED; with `command`, the
        call is charged to the command's flow (RESOURCE_EXHAUSTED past it)."""
        name = self._tenant(context)
        if command is not None:
            self.limits.charge(name, command)
        return name

    def require_admin(self, context: Any, rpc: str = "") -> Identity:
        """For the Admin service: the admin role in secure mode, anyone in dev mode."""
        identity = self._require(context, "Admin", (ADMIN,))
        if rpc:
            self.limits.role(identity, rpc)
        return identity

    def worker(self, context: Any, rpc: str = "") -> Identity:
        """For the Workers service: a worker entry or the admin role in secure mode, anyone (as
        an admin) in dev mode. Which worker ids it may act as is `require_scope`'s to say."""
        identity = self._require(context, "Workers", (WORKER, ADMIN))
        if rpc:
            self.limits.role(identity, rpc)
        return identity

    @staticmethod
    def require_scope(identity: Identity, worker_id: str) -> None:
        """PERMISSION_DENIED unless `identity` may act as `worker_id` (its entry's scope)."""
        if identity.may_act_as(worker_id):
            return
        w = identity.worker
        if w is None:  # not reached: `worker` admits workers and admins only
            raise errors.permission_denied(f"{identity.describe()}: not a worker credential")
        which = "workerIdPrefix" if w.worker_id_prefix is not None else "workerIds"
        raise errors.worker_out_of_scope(worker_id, f"{identity.key}.{which}", w.scope_text())

    # ------------------------------------------------------------------ identities

    def _tenant(self, context: Any) -> str:
        if self.secure:
            identity, via = self._identify(context)
            if identity.tenant is None:
                raise errors.permission_denied(_no_tenant(identity, via))
            return identity.tenant
        for key, value in context.invocation_metadata() or ():
            if key == TENANT_HEADER:
                name = _text(value)
                if self._policy().tenant(name) is None:
                    raise errors.permission_denied(f"tenant {name[:64]!r} is not in the policy")
                return name
        raise errors.unauthenticated(f"insecure dev mode: send the tenant in the {TENANT_HEADER} header")

    def _require(self, context: Any, service: str, roles: tuple[Role, ...]) -> Identity:
        if not self.secure:
            return _DEV
        identity, via = self._identify(context)
        if identity.role in roles:
            return identity
        first, *others = roles
        needed = f"the {first} role (a credential the policy lists under {_ROLE_KEY[first]})"
        needed += "".join(f" or the {r} role ({_ROLE_KEY[r]})" for r in others)
        raise errors.permission_denied(f"the {service} service needs {needed}; {via} {identity.describe()}")

    def _identify(self, context: Any) -> tuple[Identity, str]:
        """The caller's identity and what it came from: the bearer token if one is sent, else the
        verified client certificate."""
        for key, value in context.invocation_metadata() or ():
            if key == AUTH_HEADER:
                return self._lookup(_text(value)), _BEARER
        names = certificate_names(context)
        if names is not None:
            return self._from_certificate(names), _CERT
        raise errors.unauthenticated(
            "missing credential: send 'authorization: Bearer <token>' or a client certificate"
        )

    def _cached(self, digest: bytes) -> tuple[Identity, str] | None:
        policy = self._policy()
        if policy is not self._cached_for:  # credentials and roles change with ApplyPolicy
            self._cache.clear()
            self._cached_for = policy
        return self._cache.get(digest)

    def _remember(self, digest: bytes, entry: tuple[Identity, str]) -> None:
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[digest] = entry

    def _lookup(self, header: str) -> Identity:
        """Identity for an authorization header, cached by the header's digest (never in clear)."""
        digest = hashlib.sha256(b"h" + header.encode()).digest()
        hit = self._cached(digest)
        if hit is not None:
            return hit[0]
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise errors.unauthenticated("authorization must be 'Bearer <token>'")
        identity = identity_for_token(self._policy(), token.strip())
        self._remember(digest, (identity, _BEARER))
        return identity

    def _from_certificate(self, names: Sequence[CertName]) -> Identity:
        digest = hashlib.sha256(b"c" + "\0".join(str(n) for n in sorted(names)).encode()).digest()
        hit = self._cached(digest)
        if hit is not None:
            if hit[1] != _CERT:  # the certificate named two identities
                raise errors.permission_denied(hit[1])
            return hit[0]
        found = identities_for_names(self._policy(), names)
        if len(found) > 1:
            message = (
                f"{_CERT} names {len(found)} identities of the policy ("
                + ", ".join(i.key for i in found)
                + "): one certificate must be one identity"
            )
            self._remember(digest, (NOBODY, message))
            raise errors.permission_denied(message)
        identity = found[0] if found else NOBODY
        self._remember(digest, (identity, _CERT))
        return identity


def _no_tenant(identity: Identity, via: str) -> str:
    if identity.role is None:
        return f"{via} names no tenant of the policy"
    return (
        f"{via} names no tenant of the policy: it {identity.describe()}, and the Scheduler service "
        "serves tenants only (spec.tenants[].tokens or identities)"
    )
