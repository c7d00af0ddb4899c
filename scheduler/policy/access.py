"""Parsing of who may do what: credentials (token hashes, client-certificate names), the admin
and worker roles with each worker credential's scope, and the rate limits per flow.

Why strict: a worker credential that is not bound to worker ids is the shared token of old, with
which one worker can heartbeat, deregister or re-register another (and be sent its grants). So a
plain string under `spec.access.workers` is an error that shows the new shape, two entries may
not claim the same worker id, and every credential is one identity across the whole policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler.policy.checker import Checker, describe, join, keys_text, where
from scheduler.policy.errors import Problem
from scheduler.policy.identities import SanType, policy_cert_name
from scheduler.policy.model import (
    AccessSpec,
    Policy,
    PoolSpec,
    RateLimit,
    RateLimitsSpec,
    TenantSpec,
    WorkerAccess,
)
from scheduler.policy.schema import (
    ACCESS_KEYS,
    ADMIN_ENTRY_KEYS,
    DNS_NAME_RE,
    IDENTITY_MAX_LEN,
    MAX_WORKER_SLOTS,
    RATE_LIMIT_KEYS,
    RATE_LIMITS_KEYS,
    SPIFFE_RE,
    TOKEN_HASH_RE,
    WORKER_ENTRY_KEYS,
    WORKER_ENTRY_SHAPE,
    WORKER_ID_MAX_LEN,
    Num,
    fmt_number,
)

# credential (a token hash, or a certificate name) -> the key path where it was first listed
Seen = dict[str, str]

_ONE_IDENTITY = "one credential is one identity (one tenant, or one role entry)"


def _claim(c: Checker, cred: str, path: str, seen: Seen) -> bool:
    if cred in seen:
        c.error(path, f"already listed at {seen[cred]}: {_ONE_IDENTITY}")
        return False
    seen[cred] = path
    return True


def token_hash(c: Checker, tok: object, path: str, seen: Seen) -> str | None:
    """One "sha256:<hex>" token hash, claimed in `seen`; never echoes a bad value (it may be a
    plain token pasted by mistake, i.e. a secret)."""
    if not isinstance(tok, str):
        c.error(path, f"expected a string, got {describe(tok)}")
        return None
    if not TOKEN_HASH_RE.match(tok):
        hint = " (use lowercase hex)" if TOKEN_HASH_RE.match(tok.lower()) else ""
        c.error(
            path,
            '"sha256:" followed by 64 lowercase hex digits expected: store the hash of the bearer '
            f"token, never the token itself{hint}",
        )
        return None
    if tok in seen:
        c.error(
            path,
            f"the same token hash is already listed at {seen[tok]}: one credential is one identity "
            "(one tenant, or one role)",
        )
        return None
    seen[tok] = path
    return tok


def identity_name(c: Checker, name: object, path: str, seen: Seen) -> str | None:
    """One client-certificate name: a SPIFFE ID ("spiffe://trust-domain/path"), matched against
    URI SANs only, or a DNS name, matched against DNS SANs only."""
    if not isinstance(name, str):
        c.error(path, f"expected a string, got {describe(name)}")
        return None
    if len(name) > IDENTITY_MAX_LEN:
        c.error(path, f"longer than {IDENTITY_MAX_LEN} characters")
        return None
    uri = policy_cert_name(name).type is SanType.URI  # the SAN type it will be matched against
    ok = SPIFFE_RE.match(name) if uri else DNS_NAME_RE.match(name)
    if not ok:
        c.error(
            path,
            f"{describe(name)} is not a certificate name this server matches: a SPIFFE ID "
            '("spiffe://trust-domain/path") or a lowercase DNS name without wildcards, compared exactly '
            "with the verified client certificate's subject alternative name of the same type (URI, DNS)",
        )
        return None
    return name if _claim(c, name, path, seen) else None


def _strings(c: Checker, value: object, path: str, what: str) -> list[tuple[str, object]]:
    """(path of item, item) for a list at `path`; absent or null is empty."""
    if value is None:
        return []
    if not isinstance(value, list):
        c.error(path, f"expected a list of {what}, got {describe(value)}")
        return []
    return [(f"{path}[{i}]", v) for i, v in enumerate(value)]


def token_hashes(c: Checker, value: object, path: str, seen: Seen) -> tuple[str, ...]:
    items = (token_hash(c, v, p, seen) for p, v in _strings(c, value, path, "token hashes"))
    return tuple(t for t in items if t is not None)


def identity_names(c: Checker, value: object, path: str, seen: Seen) -> tuple[str, ...]:
    items = (identity_name(c, v, p, seen) for p, v in _strings(c, value, path, "certificate names"))
    return tuple(n for n in items if n is not None)


def _admins(c: Checker, value: object, path: str, seen: Seen) -> tuple[tuple[str, ...], tuple[str, ...]]:
    tokens: list[str] = []
    names: list[str] = []
    for p, v in _strings(c, value, path, "token hashes"):
        if isinstance(v, Mapping):
            m = c.section(v, p, ADMIN_ENTRY_KEYS)
            if len(m) != 1:
                c.error(p, f"expected exactly one of {keys_text(ADMIN_ENTRY_KEYS)}")
            elif "token" in m:
                tokens += [t for t in [token_hash(c, m["token"], join(p, "token"), seen)] if t]
            else:
                names += [n for n in [identity_name(c, m["identity"], join(p, "identity"), seen)] if n]
        else:
            tokens += [t for t in [token_hash(c, v, p, seen)] if t]
    return tuple(tokens), tuple(names)


_MAX_SLOTS = Num("maxSlots", "max_slots", True, minimum=1, maximum=MAX_WORKER_SLOTS)


def _worker_ids(c: Checker, value: object, path: str) -> tuple[str, ...]:
    ids: dict[str, str] = {}
    for p, v in _strings(c, value, path, "worker ids"):
        if not isinstance(v, str) or not v:
            c.error(p, f"expected a non-empty string, got {describe(v)}")
        elif len(v) > WORKER_ID_MAX_LEN:
            c.error(p, f"longer than {WORKER_ID_MAX_LEN} characters")
        elif v in ids:
            c.error(p, f"duplicate worker id {v!r} (also at {ids[v]})")
        else:
            ids[v] = p
    if value is None or (isinstance(value, list) and not value):
        c.error(path, "empty: list the worker ids this credential may register")
    return tuple(ids)


def _worker_entry(c: Checker, value: object, path: str, seen: Seen, pool: PoolSpec) -> WorkerAccess | None:
    if not isinstance(value, Mapping):
        # Never echo the value: a plain token pasted here is a secret.
        what = "a plain string" if isinstance(value, str) else describe(value)
        c.error(
            path,
            f"expected a worker credential entry {WORKER_ENTRY_SHAPE}, got {what}: a worker credential "
            "is bound to the worker ids it may act as (a bare token hash would let one worker "
            "heartbeat, drain or re-register any other)",
        )
        return None
    m = c.section(value, path, WORKER_ENTRY_KEYS)
    tokens = token_hashes(c, m.get("tokens"), join(path, "tokens"), seen)
    names = identity_names(c, m.get("identities"), join(path, "identities"), seen)
    if c.ok(join(path, "tokens"), join(path, "identities")) and not (tokens or names):
        c.error(path, "no credential: list tokens (sha256 hashes) or identities (certificate names)")
    ids: tuple[str, ...] = ()
    prefix: str | None = None
    if ("workerIds" in m) == ("workerIdPrefix" in m):
        c.error(path, "expected exactly one of workerIds (a list) or workerIdPrefix (for a set of pods)")
    elif "workerIds" in m:
        ids = _worker_ids(c, m["workerIds"], join(path, "workerIds"))
    else:
        pp = join(path, "workerIdPrefix")
        v = m["workerIdPrefix"]
        if not isinstance(v, str) or not v:
            # An empty prefix is every worker id: the shared token this shape replaces.
            c.error(pp, f"expected a non-empty string (an empty one matches every id), got {describe(v)}")
        elif len(v) >= WORKER_ID_MAX_LEN:
            c.error(pp, f"longer than {WORKER_ID_MAX_LEN - 1} characters")
        else:
            prefix = v
    max_slots = c.number(m, _MAX_SLOTS, path)
    if max_slots is None:  # absent (or bad, reported): one worker's share of the pool
        max_slots = min(pool.slots_per_worker, MAX_WORKER_SLOTS)
    return WorkerAccess(tokens, names, ids, prefix, int(max_slots))


def _overlap(a: WorkerAccess, b: WorkerAccess) -> str | None:
    """A worker id (or prefix) in the scope of both entries, described, or None."""
    if a.worker_id_prefix is not None and b.worker_id_prefix is not None:
        pa, pb = a.worker_id_prefix, b.worker_id_prefix
        return f"workerIdPrefix {pb!r} overlaps {pa!r}" if pa.startswith(pb) or pb.startswith(pa) else None
    for w in b.worker_ids:
        if a.allows(w):
            return f"worker id {w!r}"
    for w in a.worker_ids:
        if b.allows(w):
            return f"worker id {w!r}"
    return None


def _workers(c: Checker, value: object, path: str, seen: Seen, pool: PoolSpec) -> tuple[WorkerAccess, ...]:
    entries: list[tuple[str, WorkerAccess]] = []
    for p, v in _strings(c, value, path, "worker credential entries"):
        entry = _worker_entry(c, v, p, seen, pool)
        if entry is None:
            continue
        for q, other in entries:
            clash = _overlap(other, entry)
            if clash is not None:
                c.error(
                    p,
                    f"{clash} is also in the scope of {q}: one worker id belongs to one credential "
                    "entry (list several tokens in one entry to rotate them)",
                )
                break
        else:
            entries.append((p, entry))
    return tuple(e for _, e in entries)


def parse_access(c: Checker, value: object, path: str, seen: Seen, pool: PoolSpec) -> AccessSpec:
    # `seen` already holds the tenants' credentials: a role credential may not be a tenant's too,
    # or a tenant could call the Admin service (or a worker agent Acquire) with its own token.
    m = c.section(value, path, ACCESS_KEYS)
    admins, admin_names = _admins(c, m.get("admins"), join(path, "admins"), seen)
    workers = _workers(c, m.get("workers"), join(path, "workers"), seen, pool)
    return AccessSpec(admins=admins, admin_identities=admin_names, workers=workers)


_QPS = Num("qps", "qps", False, exclusive=True)
_BURST = Num("burst", "burst", True, minimum=1)


def rate_limit(c: Checker, value: object, path: str) -> RateLimit | None:
    """A {qps, burst} bucket; burst defaults to one second's worth (at least 1)."""
    if value is None:
        return None
    m = c.section(value, path, RATE_LIMIT_KEYS)
    if not m:
        if isinstance(value, Mapping):
            c.error(join(path, "qps"), "required: tokens per second")
        return None
    qps = c.number(m, _QPS, path)
    burst = c.number(m, _BURST, path)
    if "qps" not in m:
        c.error(join(path, "qps"), "required: tokens per second")
    if qps is None:
        return None
    return RateLimit(float(qps), int(burst) if burst is not None else max(1, int(-(-qps // 1))))


def parse_rate_limits(c: Checker, value: object, path: str) -> RateLimitsSpec:
    m = c.section(value, path, RATE_LIMITS_KEYS)
    return RateLimitsSpec(**{k: rate_limit(c, m.get(k), join(path, k)) for k in RATE_LIMITS_KEYS})


def max_held(t: TenantSpec, pool: PoolSpec) -> int:
    """The most leases a tenant may hold at once (BestEffort without a cap: the largest pool)."""
    be = t.best_effort_limit if t.best_effort_limit is not None else pool.max_workers * pool.slots_per_worker
    return t.guaranteed + t.burstable_limit + be


def check_renewal_headroom(
    c: Checker, limits: RateLimitsSpec, tenants: Sequence[TenantSpec], pool: PoolSpec, lease_ttl_s: float
) -> None:
    """Warn when the renewals bucket cannot carry a tenant's renewals at its quota: the SDK renews
    every lease each third of its TTL, so a tenant needs held x 3 / TTL renewals a second."""
    r = limits.renewals
    if r is None or not c.ok("spec.rateLimits", "spec.tenants", "spec.pool", "spec.timing"):
        return
    for t in tenants:
        need = max_held(t, pool) * 3.0 / lease_ttl_s
        if r.qps < need:
            c.warn(
                "spec.rateLimits.renewals.qps",
                f"{fmt_number(r.qps)} renewals a second is less than tenant {t.name!r} needs at its quota: "
                f"up to {max_held(t, pool)} leases renewed every third of leaseTTLSeconds "
                f"{fmt_number(lease_ttl_s)} = {fmt_number(round(need, 2))} a second; its renewals "
                "could be refused and its leases expire",
            )


def serving_warnings(policy: Policy) -> list[Problem]:
    """What serving this policy would refuse, said wherever a policy is taken in (`policy
    validate`, `policy apply`, `serve`'s --policy file and object), so one is never told a policy is
    fine that the server then locks up: no tenant token, no admin, no way for a worker to register."""
    out: list[Problem] = []
    if not any(t.tokens for t in policy.tenants):
        out.append(
            Problem(where("spec.tenants"), "no tenant lists a token: every Scheduler call will be refused")
        )
    if not policy.access.admins:
        out.append(
            Problem(
                where("spec.access.admins"),
                "empty: the Admin service refuses everyone (slotsched status, policy apply), and a "
                "running scheduler refuses to apply this policy",
            )
        )
    if not (policy.access.workers or policy.access.admins):
        out.append(Problem(where("spec.access.workers"), "empty: no worker agent can register"))
    return out
