"""Who is calling: the tenant, derived from the caller's credential, never from a request field.

Secure mode (a policy file was given): `authorization: Bearer <token>` is hashed and matched
against the token hashes in the policy in force (`tenant_for_token`); no credential is
UNAUTHENTICATED, an unknown token PERMISSION_DENIED. Results are cached by the digest of the
header per policy, so the hot path pays one sha256 and a dict lookup.

Insecure dev mode (no policy file): the tenant is whatever `x-slotsched-tenant` says, as long as
the policy has it. The server warns about this at startup.

Admin and Workers are meant for an internal port: they accept any authenticated caller (any
tenant's token in secure mode, anyone in dev mode). There are no roles yet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from scheduler.policy import Policy
from scheduler.policy_load import tenant_for_token
from scheduler.server import errors

AUTH_HEADER = "authorization"
TENANT_HEADER = "x-slotsched-tenant"
_CACHE_MAX = 4096


class Authenticator:
    def __init__(self, secure: bool, policy: Callable[[], Policy]) -> None:
        """`policy` returns the policy in force (it changes with ApplyPolicy)."""
        self.secure = secure
        self._policy = policy
        self._cache: dict[bytes, str | None] = {}
        self._cached_for: Policy | None = None

    def tenant(self, context: Any) -> str:
        """The caller's tenant, or raise UNAUTHENTICATED / PERMISSION_DENIED."""
        md = context.invocation_metadata() or ()
        if self.secure:
            return self._from_token(md)
        for key, value in md:
            if key == TENANT_HEADER:
                name = value if isinstance(value, str) else value.decode()
                if self._policy().tenant(name) is None:
                    raise errors.permission_denied(f"tenant {name!r} is not in the policy")
                return name
        raise errors.unauthenticated(f"insecure dev mode: send the tenant in the {TENANT_HEADER} header")

    def caller(self, context: Any) -> str | None:
        """For Admin/Workers: any authenticated tenant in secure mode, anyone in dev mode."""
        if not self.secure:
            return None
        return self._from_token(context.invocation_metadata() or ())

    def _from_token(self, md: Any) -> str:
        for key, value in md:
            if key == AUTH_HEADER:
                return self._lookup(value if isinstance(value, str) else value.decode())
        raise errors.unauthenticated("missing credential: send 'authorization: Bearer <token>'")

    def _lookup(self, header: str) -> str:
        """Tenant for an authorization header, cached by the header's digest (never in clear)."""
        policy = self._policy()
        if policy is not self._cached_for:  # tokens change with ApplyPolicy
            self._cache.clear()
            self._cached_for = policy
        digest = hashlib.sha256(header.encode()).digest()
        try:
            tenant = self._cache[digest]
        except KeyError:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise errors.unauthenticated("authorization must be 'Bearer <token>'") from None
            tenant = tenant_for_token(policy, token.strip())
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[digest] = tenant
        if tenant is None:
            raise errors.permission_denied("the bearer token names no tenant of the policy")
        return tenant
