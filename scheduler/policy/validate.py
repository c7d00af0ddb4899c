"""Validate a decoded SchedulingPolicy document and build the Policy (``policy_from_dict``).

Why this module exists: a policy is the contract between a platform team and its tenants — who
is protected, how far each may burst, which bearer token speaks for whom (a tenant, or the admin
or worker role). A mistake in it crashes nothing; it quietly starves someone. So the loader is
strict and talkative:

* it reports every error at once, each with the key path that holds it
  (``spec.tenants[1].burstable.nominal: ...``), so one run fixes a whole file;
* it rejects unknown and duplicate keys, because a misspelt key would otherwise fall back to a
  default unnoticed;
* it warns, with the numbers, about policies that are legal but break a promise of the design:
  an over-committed floor (a Guaranteed request within quota may wait on another tenant) and a
  pool with no shared remainder (BestEffort can starve).

The model lives in ``model.py`` so the core does not depend on YAML; the YAML text is read and
written in ``yaml_io.py``, the key shape and bounds are the tables of ``schema.py``. No I/O here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

from scheduler.policy.access import (
    check_renewal_headroom,
    identity_names,
    max_held,
    parse_access,
    parse_rate_limits,
    rate_limit,
    token_hashes,
)
from scheduler.policy.autoscaler_keys import parse_autoscaler
from scheduler.policy.budgets import with_budgets
from scheduler.policy.checker import (
    Checker,
    actuator_target,
    check_pool_name,
    compatibility_keys,
    describe,
    join,
    keys_text,
    pool_labels,
)
from scheduler.policy.errors import PolicyError, Problem
from scheduler.policy.model import (
    AccessSpec,
    AutoscalerSpec,
    FairnessSpec,
    LimitsSpec,
    Policy,
    PoolSpec,
    QueueSpec,
    TenantPoolQuota,
    TenantSpec,
    TimingSpec,
)
from scheduler.policy.schema import (
    API_VERSION,
    BEST_EFFORT_KEYS,
    BURSTABLE_KEYS,
    FAIRNESS_FIELDS,
    KIND,
    LIMITS_FIELDS,
    MAX_WORKER_SLOTS,
    METADATA_KEYS,
    PERCENT_RE,
    POLICY_NAME_MAX_LEN,
    POLICY_NAME_RE,
    POOL_FIELDS,
    POOL_KEYS,
    POOLS_ENTRY_KEYS,
    QUEUE_FIELDS,
    SPEC_KEYS,
    TENANT_KEYS,
    TENANT_NAME_MAX_LEN,
    TENANT_NAME_RE,
    TENANT_POOL_FIELDS,
    TENANT_POOL_KEYS,
    TIMING_FIELDS,
    TOP_KEYS,
    Num,
    fmt_number,
)


def _capacity(pool: PoolSpec) -> int:
    return pool.workers * pool.slots_per_worker


def _floor_text(pool: PoolSpec) -> str:
    cap = _capacity(pool)
    floor = pool.floor_slots(cap)
    if pool.floor_percent is not None:
        return f"{floor} ({fmt_number(pool.floor_percent)}% of {cap} slots)"
    return str(floor)


def _parse_pool(c: Checker, value: object, path: str) -> PoolSpec:
    return _pool_sizes(c, c.section(value, path, POOL_KEYS), path, PoolSpec())


def _pool_sizes(c: Checker, m: Mapping[str, object], path: str, base: PoolSpec) -> PoolSpec:
    """A pool's size, bounds and floor (the keys of spec.pool) over `base`, cross-checked."""
    changes = c.numbers(m, POOL_FIELDS, path)
    fp = join(path, "floor")
    if "floor" in m:
        v = m["floor"]
        if isinstance(v, int) and not isinstance(v, bool):
            if v < 0:
                c.error(fp, f"must not be negative, got {v}")
            else:
                changes["floor"] = v
                changes["floor_percent"] = None
        elif isinstance(v, str):
            match = PERCENT_RE.match(v.strip())
            if match is None:
                c.error(fp, f'bad percent {v!r}: expected a percent of capacity like "25%"')
            elif float(match.group(1)) > 100:
                c.error(fp, f"a percent of capacity must be at most 100%, got {v.strip()}")
            else:
                # `floor` keeps its default: it is ignored while floor_percent is set.
                changes["floor_percent"] = float(match.group(1))
        else:
            c.error(fp, f'expected a slot count or a percent like "25%", got {describe(v)}')
    pool = dataclasses.replace(base, **changes)

    mn, mx, wk = (join(path, k) for k in ("minWorkers", "maxWorkers", "workers"))
    spw = join(path, "slotsPerWorker")
    if c.ok(mn, mx) and pool.min_workers > pool.max_workers:
        c.error(mn, f"minWorkers {pool.min_workers} is greater than maxWorkers {pool.max_workers}")
    elif c.ok(mn, mx, wk) and not pool.min_workers <= pool.workers <= pool.max_workers:
        c.error(
            wk,
            f"workers {pool.workers} is outside [minWorkers {pool.min_workers}, "
            f"maxWorkers {pool.max_workers}]",
        )
    if c.ok(fp, wk, spw) and pool.floor_percent is None and pool.floor > _capacity(pool):
        c.error(
            fp,
            f"floor of {pool.floor} slots is larger than the pool: {pool.workers} workers x "
            f"{pool.slots_per_worker} slots = {_capacity(pool)} slots",
        )
    return pool


def _parse_autoscaler(
    c: Checker, value: object, path: str, base: AutoscalerSpec | None = None
) -> AutoscalerSpec:
    return parse_autoscaler(c, value, path, base)


# --- spec.pools ---------------------------------------------------------------------------------


def _parse_pools(c: Checker, value: object, path: str, autoscaler: AutoscalerSpec) -> list[PoolSpec]:
    """spec.pools: each a pool of its own; names unique, in the order selectors try them."""
    if not isinstance(value, list):
        c.error(path, f"expected a list of pools, got {describe(value)}")
        return []
    if not value:
        c.error(path, "empty: list at least one pool (a policy of one pool may write spec.pool instead)")
    pools: list[PoolSpec] = []
    names: dict[str, str] = {}
    for p, m in c.entries(value, path, POOLS_ENTRY_KEYS, "pools"):
        name = c.once(check_pool_name(c, m, p), join(p, "name"), names, "pool name")
        lp = join(p, "labels")
        labels = pool_labels(c, m.get("labels"), lp)
        compatibility = compatibility_keys(c, m.get("compatibility"), join(p, "compatibility"), labels, lp)
        sizes = _pool_sizes(c, m, p, PoolSpec())
        # The pool's autoscaler keys override spec.autoscaler's; absent: spec.autoscaler as it is.
        auto = m.get("autoscaler")
        own = None if auto is None else _parse_autoscaler(c, auto, join(p, "autoscaler"), autoscaler)
        target = actuator_target(c, m, p)
        if name is not None:
            pools.append(
                dataclasses.replace(
                    sizes,
                    name=name,
                    labels=labels,
                    compatibility=compatibility,
                    autoscaler=own,
                    target=target,
                )
            )
    return pools


def _pool_list(pool_names: Sequence[str]) -> str:
    return ", ".join(pool_names)


# --- tenants ---------------------------------------------------------------------------------------


_TENANT_WEIGHT: Final = Num("weight", "weight", False, exclusive=True)
_TENANT_GUARANTEED: Final = Num("guaranteed", "guaranteed", True)
_NOMINAL: Final = Num("nominal", "burstable_nominal", True)
_LIMIT: Final = Num("limit", "burstable_limit", True)
_BE_LIMIT: Final = Num("limit", "best_effort_limit", True)


_POOL_BE_LIMIT: Final = Num("bestEffortLimit", "best_effort_limit", True)


def _tenant_pools(
    c: Checker, value: object, path: str, pool_names: Sequence[str], wide: tuple[int, int], wide_path: str
) -> tuple[TenantPoolQuota, ...]:
    """spec.tenants[i].pools: the tenant's quotas in named pools, over its tenant-wide ones."""
    quotas: list[TenantPoolQuota] = []
    seen: dict[str, str] = {}
    listed = _pool_list(pool_names)
    for p, m in c.entries(value, path, TENANT_POOL_KEYS, "quotas per pool"):
        pool = c.reference(m, "pool", p, pool_names, "the pool these quotas apply in", listed)
        pool = c.once(pool, join(p, "pool"), seen, "entry for pool")
        changes = c.numbers(m, TENANT_POOL_FIELDS, p)
        # bestEffortLimit: null is "no cap in this pool", overriding a tenant-wide cap.
        be_v = c.number(m, _POOL_BE_LIMIT, p) if m.get("bestEffortLimit") is not None else None
        be = None if be_v is None else int(be_v)
        if pool is None:
            continue
        be_set = "bestEffortLimit" in m
        q = TenantPoolQuota(pool, **changes, best_effort_limit=be, best_effort_limit_set=be_set)
        nominal = wide[0] if q.burstable_nominal is None else q.burstable_nominal
        limit = wide[1] if q.burstable_limit is None else q.burstable_limit
        if nominal > limit and c.ok(p, wide_path):
            key = "burstableNominal" if q.burstable_nominal is not None else "burstableLimit"
            whose = "" if q.burstable_limit is not None else " (the tenant-wide one: set burstableLimit too)"
            c.error(
                join(p, key),
                f"in pool {pool!r}: Burstable nominal {nominal} is greater than limit {limit}{whose}",
            )
        quotas.append(q)
    return tuple(quotas)


def _parse_tenant(
    c: Checker, value: object, path: str, tokens_seen: dict[str, str], pool_names: Sequence[str]
) -> TenantSpec | None:
    if not isinstance(value, Mapping):
        c.error(path, f"expected a mapping with keys {keys_text(TENANT_KEYS)}, got {describe(value)}")
        return None
    m = c.section(value, path, TENANT_KEYS)
    np = join(path, "name")
    name = c.string(m, "name", path)
    if "name" not in m:
        c.error(np, "required")
    elif name is not None:
        if not TENANT_NAME_RE.match(name):
            c.error(
                np,
                f"{name!r} is not a valid tenant name: lowercase letters, digits, '-' and '_', "
                "starting and ending with a letter or digit",
            )
        elif len(name) > TENANT_NAME_MAX_LEN:
            c.error(np, f"longer than {TENANT_NAME_MAX_LEN} characters")
    changes: dict[str, Any] = {}
    changes |= c.numbers(m, (_TENANT_WEIGHT, _TENANT_GUARANTEED), path)

    bp = join(path, "burstable")
    bm = c.section(m.get("burstable"), bp, BURSTABLE_KEYS)
    nominal = c.number(bm, _NOMINAL, bp)
    limit = c.number(bm, _LIMIT, bp)
    if nominal is not None:
        changes["burstable_nominal"] = nominal
        # An absent limit means "no bursting": the limit is the nominal.
        changes["burstable_limit"] = nominal
    if limit is not None:
        changes["burstable_limit"] = limit
    if nominal is not None and limit is not None and nominal > limit:
        c.error(join(bp, "nominal"), f"nominal {nominal} is greater than limit {limit}")

    ep = join(path, "bestEffort")
    em = c.section(m.get("bestEffort"), ep, BEST_EFFORT_KEYS)
    # limit: null is allowed and means "no cap", like an absent limit.
    be = c.number(em, _BE_LIMIT, ep) if em.get("limit") is not None else None
    if be is not None:
        changes["best_effort_limit"] = be

    changes["tokens"] = token_hashes(c, m.get("tokens"), join(path, "tokens"), tokens_seen)
    changes["identities"] = identity_names(c, m.get("identities"), join(path, "identities"), tokens_seen)
    changes["rate_limit"] = rate_limit(c, m.get("rateLimit"), join(path, "rateLimit"))
    wide = (changes.get("burstable_nominal", 0), changes.get("burstable_limit", 0))
    changes["pools"] = _tenant_pools(c, m.get("pools"), join(path, "pools"), pool_names, wide, bp)
    if name is None:
        return None
    return dataclasses.replace(TenantSpec(name=name), **changes)


def _parse_tenants(
    c: Checker, value: object, path: str, tokens_seen: dict[str, str], pool_names: Sequence[str]
) -> list[TenantSpec]:
    if value is None:
        return []
    if not isinstance(value, list):
        c.error(path, f"expected a list of tenants, got {describe(value)}")
        return []
    tenants: list[TenantSpec] = []
    names: dict[str, str] = {}
    for i, item in enumerate(value):
        p = f"{path}[{i}]"
        t = _parse_tenant(c, item, p, tokens_seen, pool_names)
        if t is None:
            continue
        if t.name in names:
            c.error(join(p, "name"), f"duplicate tenant name {t.name!r} (also at {names[t.name]})")
        else:
            names[t.name] = join(p, "name")
        tenants.append(t)
    return tenants


def _check_commitments(
    c: Checker, pool: PoolSpec, tenants: Sequence[TenantSpec], pool_path: str = "spec.pool", where: str = ""
) -> None:
    """Warnings about legal policies that break a promise of the design, with their numbers (for
    one pool: `tenants` as that pool sees them, `where` naming it when there are several)."""
    if not c.ok(pool_path, "spec.tenants"):
        return
    cap = _capacity(pool)
    floor = pool.floor_slots(cap)
    guaranteed = sum(t.guaranteed for t in tenants)
    nominal = sum(t.burstable_nominal for t in tenants)
    if guaranteed > floor:
        c.warn(
            join(pool_path, "floor"),
            f"{where}Guaranteed quotas add up to {guaranteed} slots but the floor is {_floor_text(pool)}: "
            "a Guaranteed request within quota may wait for another tenant's Guaranteed lease",
        )
    committed = guaranteed + nominal
    if committed > 0 and committed >= cap:
        c.warn(
            "spec.tenants",
            f"{where}Guaranteed quotas ({guaranteed}) and Burstable nominals ({nominal}) add up to "
            f"{committed} slots, and the pool has {cap} slots ({pool.workers} workers x "
            f"{pool.slots_per_worker}): no shared remainder is left, so BestEffort can starve",
        )


def _check_pools(c: Checker, policy: Policy) -> None:
    """The commitment checks per pool, on the tenants as each pool sees them; the renewals bucket
    against what a tenant may hold in all of them together."""
    if not policy.pools:
        view = policy.for_pool(policy.pool.name)
        _check_commitments(c, view.pool, view.tenants)
        check_renewal_headroom(c, policy.rate_limits, view.tenants, view.pool, policy.timing.lease_ttl_s)
        return
    for i, spec in enumerate(policy.pools):
        tenants = policy.for_pool(spec.name).tenants
        _check_commitments(c, spec, tenants, f"spec.pools[{i}]", f"pool {spec.name!r}: ")
    r, ttl = policy.rate_limits.renewals, policy.timing.lease_ttl_s
    if r is None or not c.ok("spec.rateLimits", "spec.tenants", "spec.pools", "spec.timing"):
        return
    for t in policy.tenants:
        held = sum(max_held(t.in_pool(p.name), p) for p in policy.pools)
        need = held * 3.0 / ttl
        if r.qps < need:
            c.warn(
                "spec.rateLimits.renewals.qps",
                f"{fmt_number(r.qps)} renewals a second is less than tenant {t.name!r} needs at its quotas: "
                f"up to {held} leases in its {len(policy.pools)} pools renewed every third of "
                f"leaseTTLSeconds {fmt_number(ttl)} = {fmt_number(round(need, 2))} a second; its "
                "renewals could be refused and its leases expire",
            )


def _worker_pools(
    c: Checker, value: object, path: str, pools: Sequence[PoolSpec], access: AccessSpec
) -> AccessSpec:
    """spec.access.workers[i].pools: the pools an entry's workers may join, each one of the
    policy's; required when there are several. An entry naming pools and no maxSlots may
    register the largest slotsPerWorker among them."""
    entries = value.get("workers") if isinstance(value, Mapping) else None
    if not isinstance(entries, list):
        return access
    names = [p.name for p in pools]
    found: list[tuple[str, ...]] = []
    for i, entry in enumerate(entries):
        pp = join(f"{path}.workers[{i}]", "pools")
        listed = entry.get("pools") if isinstance(entry, Mapping) else None
        if listed is None:
            if isinstance(entry, Mapping) and len(names) > 1:
                c.error(
                    pp,
                    "required when spec.pools has more than one pool: name the pools this entry's "
                    f"workers may join (of {_pool_list(names)})",
                )
            found.append(())
            continue
        if not isinstance(listed, list) or not listed:
            c.error(
                pp,
                f"expected a non-empty list of pool names (of {_pool_list(names)}), got {describe(listed)}",
            )
            found.append(())
            continue
        found.append(c.names(listed, pp, names, "pool", _pool_list(names)))
    if c.errors or len(found) != len(access.workers):
        return access  # not built: the errors are reported
    spw = {p.name: p.slots_per_worker for p in pools}
    workers = []
    for w, entry, named in zip(access.workers, entries, found, strict=True):
        if named:
            slots = w.max_slots if "maxSlots" in entry else min(max(spw[n] for n in named), MAX_WORKER_SLOTS)
            w = dataclasses.replace(w, pools=named, max_slots=slots)
        workers.append(w)
    return dataclasses.replace(access, workers=tuple(workers))


def policy_from_dict(d: object) -> tuple[Policy, list[Problem]]:
    """Build a Policy from a decoded policy document (a mapping in the YAML shape).

    Returns the policy and its warnings; raises PolicyError listing every error found.
    """
    c = Checker()
    if not isinstance(d, Mapping):
        kind = "an empty document" if d is None else describe(d)
        c.error("", f"expected a {KIND} mapping (apiVersion, kind, metadata, spec), got {kind}")
        raise PolicyError(c.errors)
    top = c.section(d, "", TOP_KEYS)
    for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
        got = top.get(key)
        if key not in top:
            c.error(key, f'required: must be "{want}"')
        elif got != want:
            c.error(key, f'must be "{want}", got {describe(got)}')

    meta = c.section(top.get("metadata"), "metadata", METADATA_KEYS)
    name = c.string(meta, "name", "metadata")
    if name is not None and (not POLICY_NAME_RE.match(name) or len(name) > POLICY_NAME_MAX_LEN):
        c.error("metadata.name", f"{name!r} is not a valid name: lowercase letters, digits, '-' and '.'")
    for key in ("labels", "annotations"):  # accepted for Kubernetes tooling, not kept
        labels = meta.get(key)
        if labels is not None and not (
            isinstance(labels, Mapping) and all(isinstance(v, str) for v in labels.values())
        ):
            c.error(join("metadata", key), "expected a mapping of strings to strings")

    spec = c.section(top.get("spec"), "spec", SPEC_KEYS)
    if spec.get("pool") is not None and spec.get("pools") is not None:
        c.error(
            "spec.pools",
            "spec.pool and spec.pools together: a policy of one pool writes spec.pool, a policy of "
            "several lists every pool under spec.pools (move spec.pool into the list)",
        )
    pool = _parse_pool(c, spec.get("pool"), "spec.pool")
    timing_m = c.section(spec.get("timing"), "spec.timing", [f.key for f in TIMING_FIELDS])
    timing = dataclasses.replace(TimingSpec(), **c.numbers(timing_m, TIMING_FIELDS, "spec.timing"))
    queue_m = c.section(spec.get("queue"), "spec.queue", [f.key for f in QUEUE_FIELDS])
    queue = dataclasses.replace(QueueSpec(), **c.numbers(queue_m, QUEUE_FIELDS, "spec.queue"))
    autoscaler = _parse_autoscaler(c, spec.get("autoscaler"), "spec.autoscaler")
    pools: list[PoolSpec] = []
    if spec.get("pools") is not None:
        pools = _parse_pools(c, spec["pools"], "spec.pools", autoscaler)
        pool = pools[0] if pools else pool
    pool_names = [p.name for p in pools] or [pool.name]
    tokens_seen: dict[str, str] = {}  # hash -> where it was first listed, across tenants and roles
    tenants = _parse_tenants(c, spec.get("tenants"), "spec.tenants", tokens_seen, pool_names)
    access = parse_access(c, spec.get("access"), "spec.access", tokens_seen, pool)
    access = _worker_pools(c, spec.get("access"), "spec.access", pools or [pool], access)
    rate_limits = parse_rate_limits(c, spec.get("rateLimits"), "spec.rateLimits")
    limits_m = c.section(spec.get("limits"), "spec.limits", [f.key for f in LIMITS_FIELDS])
    limits = dataclasses.replace(LimitsSpec(), **c.numbers(limits_m, LIMITS_FIELDS, "spec.limits"))
    fairness_m = c.section(spec.get("fairness"), "spec.fairness", [f.key for f in FAIRNESS_FIELDS])
    fairness = dataclasses.replace(FairnessSpec(), **c.numbers(fairness_m, FAIRNESS_FIELDS, "spec.fairness"))
    policy = Policy(
        name=name if name is not None else Policy.name,
        pool=pool,
        timing=timing,
        queue=queue,
        autoscaler=autoscaler,
        tenants=tuple(tenants),
        access=access,
        rate_limits=rate_limits,
        limits=limits,
        fairness=fairness,
        pools=tuple(pools),
    )
    policy = with_budgets(c, spec, policy)
    _check_pools(c, policy)
    if c.errors:
        raise PolicyError(c.errors, c.warnings)
    return policy, c.warnings
