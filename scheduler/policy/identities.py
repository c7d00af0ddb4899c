"""Credentials -> identities: how a bearer token is stored in a policy (its hash) and which tenant or
role a presented token speaks for."""

from __future__ import annotations

import hashlib
import hmac

from scheduler.policy.model import ADMIN, WORKER, Policy, Role


def hash_token(token: str) -> str:
    """The form a bearer token is stored in a policy: "sha256:" + hex digest of its UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def tenant_for_token(policy: Policy, token: str) -> str | None:
    """The tenant a bearer token authenticates as, or None.

    Compares against every stored hash with hmac.compare_digest and does not stop at a match,
    so the time taken does not tell which tenant (or how many hashes) matched.
    """
    if not token:
        return None
    digest = hash_token(token).encode("ascii")
    found: str | None = None
    for tenant in policy.tenants:
        for stored in tenant.tokens:
            if hmac.compare_digest(digest, stored.encode("ascii", "replace")) and found is None:
                found = tenant.name
    return found


def role_for_token(policy: Policy, token: str) -> Role | None:
    """The role ("admin" or "worker") a bearer token carries, or None.

    Constant-time in the same way as tenant_for_token: every stored hash is compared.
    """
    if not token:
        return None
    digest = hash_token(token).encode("ascii")
    found: Role | None = None
    roles: tuple[tuple[Role, tuple[str, ...]], ...] = (
        (ADMIN, policy.access.admins),
        (WORKER, policy.access.workers),
    )
    for role, hashes in roles:
        for stored in hashes:
            if hmac.compare_digest(digest, stored.encode("ascii", "replace")) and found is None:
                found = role
    return found
