"""Credentials -> identities: how a bearer token is stored in a policy (its hash), and which tenant
or role (with, for a worker credential, its scope of worker ids and slot bound) a presented token
or a verified client certificate's name speaks for.

Certificate names are typed: a name is matched only against a subject alternative name of its own
type (a "spiffe://…" identity only a URI SAN, a DNS name only a DNS SAN), as SPIFFE and X.509
verification do. Untyped, a certificate whose e-mail or DNS SAN holds the text "spiffe://…/admin"
would be taken for that admin: a CA checks each SAN by its type (it mails an address, it resolves
a domain), never that the text of one is another type's name."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from scheduler.policy.model import ADMIN, WORKER, Policy, Role, WorkerAccess

ADMINS_KEY: Final = "spec.access.admins"
WORKERS_KEY: Final = "spec.access.workers"


def hash_token(token: str) -> str:
    """The form a bearer token is stored in a policy: "sha256:" + hex digest of its UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Identity:
    """What a credential speaks for in the policy in force: a tenant, a role, or nothing.

    `key` is where the policy lists it (``spec.tenants[0]``, ``spec.access.admins``,
    ``spec.access.workers[1]``), for error messages; `worker` is the worker entry of a worker
    credential: the worker ids it may act as and the slots one of them may claim."""

    tenant: str | None = None
    role: Role | None = None
    worker: WorkerAccess | None = None
    key: str = ""

    def describe(self) -> str:
        if self.tenant is not None:
            return f"authenticates tenant {self.tenant!r}"
        if self.role is not None:
            return f"carries the {self.role} role ({self.key})"
        return "names no tenant or role of the policy"

    def may_act_as(self, worker_id: str) -> bool:
        """Whether this identity may register, heartbeat, drain or deregister `worker_id`: an
        admin may act as any worker (an operator drains by hand), a worker credential only
        within its scope, anyone else as none."""
        if self.role == ADMIN:
            return True
        return self.role == WORKER and self.worker is not None and self.worker.allows(worker_id)


NOBODY: Final = Identity()


class SanType(StrEnum):
    """The types of subject alternative name the policy names identities by (RFC 5280's
    uniformResourceIdentifier and dNSName); a certificate's other SANs (e-mail, IP) name nobody."""

    URI = "URI"
    DNS = "DNS"


@dataclass(frozen=True, slots=True, order=True)
class CertName:
    """One name of a verified client certificate with the type of SAN it came from: the name
    `spiffe://sec/admin` from a URI SAN and the same text from a DNS SAN are different names."""

    type: SanType
    value: str

    def __str__(self) -> str:  # as openssl prints a SAN: "URI:spiffe://…", "DNS:host"
        return f"{self.type}:{self.value}"


def policy_cert_name(name: str) -> CertName:
    """The certificate name a policy identity stands for: a URI SAN for a name with a scheme
    ("spiffe://…"), a DNS SAN otherwise (a DNS name holds no ':'). The one place a policy's
    identity string is given its type."""
    return CertName(SanType.URI if ":" in name else SanType.DNS, name)


def _credentials(policy: Policy) -> Iterator[tuple[Identity, Iterable[str], Iterable[str]]]:
    """Every identity of the policy with its token hashes and its certificate names."""
    for i, t in enumerate(policy.tenants):
        yield Identity(tenant=t.name, key=f"spec.tenants[{i}]"), t.tokens, t.identities
    admin = Identity(role=ADMIN, key=ADMINS_KEY)
    yield admin, policy.access.admins, policy.access.admin_identities
    for i, w in enumerate(policy.access.workers):
        yield Identity(role=WORKER, worker=w, key=f"{WORKERS_KEY}[{i}]"), w.tokens, w.identities


def identity_for_token(policy: Policy, token: str) -> Identity:
    """The identity a bearer token authenticates as, or NOBODY.

    Compares against every stored hash with hmac.compare_digest and does not stop at a match,
    so the time taken does not tell which identity (or how many hashes) matched.
    """
    if not token:
        return NOBODY
    digest = hash_token(token).encode("ascii")
    found = NOBODY
    for identity, hashes, _ in _credentials(policy):
        for stored in hashes:
            if hmac.compare_digest(digest, stored.encode("ascii", "replace")) and found is NOBODY:
                found = identity
    return found


def identities_for_names(policy: Policy, names: Iterable[CertName]) -> list[Identity]:
    """The distinct identities a verified client certificate's typed names (`certificate_names`
    in scheduler/server/auth.py) match: a policy identity matches a name of its own type only
    (`policy_cert_name`). Certificate names are public, so a plain comparison is fine. More than
    one means the certificate names two identities: the caller refuses it rather than pick."""
    wanted = set(names)
    found: list[Identity] = []
    for identity, _, listed in _credentials(policy):
        if any(policy_cert_name(n) in wanted for n in listed) and identity not in found:
            found.append(identity)
    return found


def tenant_for_token(policy: Policy, token: str) -> str | None:
    """The tenant a bearer token authenticates as, or None (constant-time as identity_for_token)."""
    return identity_for_token(policy, token).tenant


def role_for_token(policy: Policy, token: str) -> Role | None:
    """The role ("admin" or "worker") a bearer token carries, or None."""
    return identity_for_token(policy, token).role
