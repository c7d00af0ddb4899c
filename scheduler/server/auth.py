"""Who is calling: a tenant or a role, derived from the caller's credential, never from a request.

Secure mode (a policy file was given): `authorization: Bearer <token>` is hashed and matched
against the token hashes in the policy in force. A token is exactly one identity (the policy
loader refuses a hash listed twice): a tenant (`spec.tenants[].tokens`), the admin role
(`spec.access.admins`: operators) or the worker role (`spec.access.workers`: worker agents).

* Scheduler service (`tenant`): tenant tokens only; a role token names no tenant.
* Admin service (`require_admin`): the admin role only, so no tenant can rewrite the policy
  (its own quotas) or read other tenants' leases.
* Workers service (`require_worker`): the worker or the admin role, so no tenant can drain or
  deregister workers (and revoke other tenants' leases).

No credential is UNAUTHENTICATED; an unknown token, or a known one without the role needed,
PERMISSION_DENIED (the message names the role and where the policy lists it). Identities are
cached by the digest of the header per policy, so the hot path (`tenant`, on every Acquire) pays
one sha256 and a dict lookup; the cache is dropped when ApplyPolicy changes the policy.

Insecure dev mode (no policy file): the tenant is whatever `x-slotsched-tenant` says, as long as
the policy has it, and Admin and Workers accept anyone. The server warns about this at startup.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from scheduler.policy.identities import role_for_token, tenant_for_token
from scheduler.policy.model import ADMIN, WORKER, Policy, Role
from scheduler.server import errors

AUTH_HEADER = "authorization"
TENANT_HEADER = "x-slotsched-tenant"
_CACHE_MAX = 4096

# Where the policy lists each role's token hashes, for error messages.
_ROLE_KEY: Final[dict[Role, str]] = {ADMIN: "spec.access.admins", WORKER: "spec.access.workers"}


@dataclass(frozen=True, slots=True)
class Identity:
    """What a bearer token speaks for in the policy in force: a tenant, a role, or nothing."""

    tenant: str | None = None
    role: Role | None = None

    def describe(self) -> str:
        if self.tenant is not None:
            return f"authenticates tenant {self.tenant!r}"
        if self.role is not None:
            return f"carries the {self.role} role ({_ROLE_KEY[self.role]})"
        return "names no tenant or role of the policy"


_NOBODY: Final = Identity()


class Authenticator:
    def __init__(self, secure: bool, policy: Callable[[], Policy]) -> None:
        """`policy` returns the policy in force (it changes with ApplyPolicy)."""
        self.secure = secure
        self._policy = policy
        self._cache: dict[bytes, Identity] = {}
        self._cached_for: Policy | None = None

    def tenant(self, context: Any) -> str:
        """The caller's tenant, or raise UNAUTHENTICATED / PERMISSION_DENIED."""
        md = context.invocation_metadata() or ()
        if self.secure:
            identity = self._from_token(md)
            if identity.tenant is None:
                raise errors.permission_denied(_no_tenant(identity))
            return identity.tenant
        for key, value in md:
            if key == TENANT_HEADER:
                name = value if isinstance(value, str) else value.decode()
                if self._policy().tenant(name) is None:
                    raise errors.permission_denied(f"tenant {name!r} is not in the policy")
                return name
        raise errors.unauthenticated(f"insecure dev mode: send the tenant in the {TENANT_HEADER} header")

    def require_admin(self, context: Any) -> None:
        """For the Admin service: the admin role in secure mode, anyone in dev mode."""
        self._require(context, "Admin", (ADMIN,))

    def require_worker(self, context: Any) -> None:
        """For the Workers service: the worker or admin role in secure mode, anyone in dev mode."""
        self._require(context, "Workers", (WORKER, ADMIN))

    def _require(self, context: Any, service: str, roles: tuple[Role, ...]) -> None:
        if not self.secure:
            return
        identity = self._from_token(context.invocation_metadata() or ())
        if identity.role in roles:
            return
        first, *others = roles
        needed = f"the {first} role (a token whose sha256 hash the policy lists under {_ROLE_KEY[first]})"
        needed += "".join(f" or the {r} role ({_ROLE_KEY[r]})" for r in others)
        raise errors.permission_denied(
            f"the {service} service needs {needed}; this bearer token {identity.describe()}"
        )

    def _from_token(self, md: Any) -> Identity:
        for key, value in md:
            if key == AUTH_HEADER:
                return self._lookup(value if isinstance(value, str) else value.decode())
        raise errors.unauthenticated("missing credential: send 'authorization: Bearer <token>'")

    def _lookup(self, header: str) -> Identity:
        """Identity for an authorization header, cached by the header's digest (never in clear)."""
        policy = self._policy()
        if policy is not self._cached_for:  # tokens and roles change with ApplyPolicy
            self._cache.clear()
            self._cached_for = policy
        digest = hashlib.sha256(header.encode()).digest()
        try:
            return self._cache[digest]
        except KeyError:
            pass
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise errors.unauthenticated("authorization must be 'Bearer <token>'")
        token = token.strip()
        tenant = tenant_for_token(policy, token)
        role = role_for_token(policy, token)
        identity = _NOBODY if tenant is None and role is None else Identity(tenant, role)
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[digest] = identity
        return identity


def _no_tenant(identity: Identity) -> str:
    if identity.role is None:
        return "the bearer token names no tenant of the policy"
    return (
        f"the bearer token names no tenant of the policy: it {identity.describe()}, and the "
        "Scheduler service serves tenants only (spec.tenants[].tokens)"
    )
