"""Load, validate and write SchedulingPolicy files.

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

The model lives in ``policy.py`` so the core does not depend on YAML; this module is the only place
that knows the YAML shape, and it writes it back (``policy_to_dict``) so a policy round-trips
through the Admin API. Only ``load_policy`` and ``validate_main`` do I/O.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import hmac
import math
import os
import re
import sys
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TextIO

import yaml

from scheduler.policy import (
    ADMIN,
    WORKER,
    AccessSpec,
    AutoscalerSpec,
    Policy,
    PoolSpec,
    QueueSpec,
    Role,
    TenantSpec,
    TimingSpec,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_POLICY_YAML",
    "KIND",
    "PolicyError",
    "Problem",
    "default_policy",
    "hash_token",
    "load_policy",
    "parse_policy",
    "policy_from_dict",
    "policy_to_dict",
    "policy_to_yaml",
    "role_for_token",
    "tenant_for_token",
    "validate_main",
]

API_VERSION: Final = "slotsched.dev/v1alpha1"
KIND: Final = "SchedulingPolicy"

# Tenant names end up in metric labels, log fields and Redis keys: keep them boring.
TENANT_NAME_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9_]*[a-z0-9])?$")
TENANT_NAME_MAX_LEN: Final = 63
# metadata.name follows Kubernetes object names (DNS-1123 subdomain).
POLICY_NAME_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
POLICY_NAME_MAX_LEN: Final = 253
TOKEN_HASH_RE: Final = re.compile(r"^sha256:[0-9a-f]{64}$")
# "25%", "12.5%"; the exponent form is what repr() writes for tiny floats ("1e-05%").
_PERCENT_RE: Final = re.compile(r"^(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)%$")

_DOCUMENT: Final = "(document)"


# ---------------------------------------------------------------------------------------------
# Problems and errors


@dataclass(frozen=True)
class Problem:
    """One error or warning, located by its key path (``spec.tenants[1].burstable.nominal``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class PolicyError(Exception):
    """A policy that cannot be used. Carries every error found, and the warnings seen so far."""

    def __init__(self, problems: Sequence[Problem], warnings: Sequence[Problem] = ()) -> None:
        self.problems: list[Problem] = list(problems)
        self.warnings: list[Problem] = list(warnings)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)


# ---------------------------------------------------------------------------------------------
# Field tables: one source of truth for parsing (camelCase -> field) and writing back.


@dataclass(frozen=True)
class _Num:
    key: str  # camelCase key in the YAML
    attr: str  # dataclass field
    integer: bool
    minimum: float = 0
    exclusive: bool = False  # the minimum itself is not allowed
    maximum: float | None = None


_POOL_FIELDS: Final = (
    _Num("slotsPerWorker", "slots_per_worker", True, minimum=1),
    _Num("workers", "workers", True),
    _Num("minWorkers", "min_workers", True),
    _Num("maxWorkers", "max_workers", True, minimum=1),
)
_TIMING_FIELDS: Final = (
    _Num("yieldGraceSeconds", "yield_grace_s", False),
    _Num("leaseTTLSeconds", "lease_ttl_s", False, exclusive=True),
    _Num("minRuntimeSeconds", "min_runtime_s", False),
)
_QUEUE_FIELDS: Final = (
    _Num("maxPending", "max_pending", True),
    _Num("maxPendingPerTenant", "max_pending_per_tenant", True),
    _Num("bestEffortFraction", "best_effort_fraction", False, maximum=1.0),
)
_AUTOSCALER_FIELDS: Final = (
    _Num("tolerance", "tolerance", False),
    _Num("scaleDownStabilizationSeconds", "scale_down_stabilization_s", False),
    _Num("scaleUpCooldownSeconds", "scale_up_cooldown_s", False),
    _Num("scaleDownCooldownSeconds", "scale_down_cooldown_s", False),
    _Num("drainTimeoutSeconds", "drain_timeout_s", False),
    _Num("startDelaySeconds", "start_delay_s", False),
)
_WEIGHT_FIELDS: Final = (
    _Num("guaranteed", "weight_guaranteed", False),
    _Num("burstable", "weight_burstable", False),
    _Num("bestEffort", "weight_best_effort", False),
)
_SCALE_UP_FIELDS: Final = (
    _Num("pods", "scale_up_pods", True, minimum=1),
    _Num("percent", "scale_up_percent", False, exclusive=True),
    _Num("periodSeconds", "scale_up_period_s", False, exclusive=True),
)

_TOP_KEYS: Final = ("apiVersion", "kind", "metadata", "spec")
_METADATA_KEYS: Final = ("name", "labels", "annotations")
_SPEC_KEYS: Final = ("pool", "timing", "queue", "autoscaler", "tenants", "access")
_POOL_KEYS: Final = tuple(f.key for f in _POOL_FIELDS) + ("floor",)
_AUTOSCALER_KEYS: Final = ("weights", "scaleUp") + tuple(f.key for f in _AUTOSCALER_FIELDS)
_TENANT_KEYS: Final = ("name", "weight", "guaranteed", "burstable", "bestEffort", "tokens")
_BURSTABLE_KEYS: Final = ("nominal", "limit")
_BEST_EFFORT_KEYS: Final = ("limit",)
_ACCESS_KEYS: Final = ("admins", "workers")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _where(path: str) -> str:
    return path or _DOCUMENT


def _keys(allowed: Sequence[str]) -> str:
    return ", ".join(allowed)


def _describe(value: object) -> str:
    """A value's YAML type (and the value, when short) for a 'wrong type' message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({shown!r})"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


# ---------------------------------------------------------------------------------------------
# The checker: collects every problem instead of stopping at the first.


class _Checker:
    def __init__(self) -> None:
        self.errors: list[Problem] = []
        self.warnings: list[Problem] = []
        self._bad: list[str] = []

    def error(self, path: str, message: str) -> None:
        self.errors.append(Problem(_where(path), message))
        self._bad.append(path)

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(Problem(_where(path), message))

    def ok(self, *paths: str) -> bool:
        """No error was reported at, above or below any of `paths` (else cross-checks skip)."""
        for path in paths:
            for bad in self._bad:
                if not bad or path == bad or path.startswith((bad + ".", bad + "[")):
                    return False
                if bad.startswith((path + ".", path + "[")):
                    return False
        return True

    def section(self, value: object, path: str, allowed: Sequence[str]) -> dict[str, object]:
        """The mapping at `path` restricted to `allowed` keys; absent or null counts as empty."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error(path, f"expected a mapping with keys {_keys(allowed)}, got {_describe(value)}")
            return {}
        out: dict[str, object] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                self.error(path, f"keys must be strings, got {_describe(key)}")
            elif key not in allowed:
                hint = difflib.get_close_matches(key, allowed, n=1)
                did_you_mean = f" (did you mean {hint[0]}?)" if hint else ""
                self.error(_join(path, key), f"unknown key{did_you_mean}; allowed keys: {_keys(allowed)}")
            else:
                out[key] = item
        return out

    def number(self, m: Mapping[str, object], f: _Num, path: str) -> int | float | None:
        """The checked value of field `f` in `m`, or None when absent or invalid."""
        if f.key not in m:
            return None
        p = _join(path, f.key)
        v = m[f.key]
        if isinstance(v, bool) or not isinstance(v, int | float):
            kind = "an integer" if f.integer else "a number"
            self.error(p, f"expected {kind}, got {_describe(v)}")
            return None
        if f.integer and not isinstance(v, int):
            self.error(p, f"expected an integer, got {_describe(v)}")
            return None
        if not math.isfinite(v):
            self.error(p, f"expected a finite number, got {v!r}")
            return None
        if v < f.minimum or (f.exclusive and v == f.minimum):
            if f.minimum == 0 and not f.exclusive:
                self.error(p, f"must not be negative, got {_fmt(v)}")
            else:
                op = ">" if f.exclusive else ">="
                self.error(p, f"must be {op} {_fmt(f.minimum)}, got {_fmt(v)}")
            return None
        if f.maximum is not None and v > f.maximum:
            self.error(p, f"must be <= {_fmt(f.maximum)}, got {_fmt(v)}")
            return None
        return v if f.integer else float(v)

    def numbers(self, m: Mapping[str, object], fields: Sequence[_Num], path: str) -> dict[str, Any]:
        """dataclasses.replace() changes for every present and valid field of `fields`."""
        changes: dict[str, Any] = {}
        for f in fields:
            v = self.number(m, f, path)
            if v is not None:
                changes[f.attr] = v
        return changes

    def string(self, m: Mapping[str, object], key: str, path: str) -> str | None:
        if key not in m:
            return None
        v = m[key]
        if not isinstance(v, str):
            self.error(_join(path, key), f"expected a string, got {_describe(v)}")
            return None
        return v


# ---------------------------------------------------------------------------------------------
# dict -> Policy


def _capacity(pool: PoolSpec) -> int:
    return pool.workers * pool.slots_per_worker


def _floor_text(pool: PoolSpec) -> str:
    cap = _capacity(pool)
    floor = pool.floor_slots(cap)
    if pool.floor_percent is not None:
        return f"{floor} ({_fmt(pool.floor_percent)}% of {cap} slots)"
    return str(floor)


def _parse_pool(c: _Checker, value: object, path: str) -> PoolSpec:
    m = c.section(value, path, _POOL_KEYS)
    changes = c.numbers(m, _POOL_FIELDS, path)
    fp = _join(path, "floor")
    if "floor" in m:
        v = m["floor"]
        if isinstance(v, int) and not isinstance(v, bool):
            if v < 0:
                c.error(fp, f"must not be negative, got {v}")
            else:
                changes["floor"] = v
                changes["floor_percent"] = None
        elif isinstance(v, str):
            match = _PERCENT_RE.match(v.strip())
            if match is None:
                c.error(fp, f'bad percent {v!r}: expected a percent of capacity like "25%"')
            elif float(match.group(1)) > 100:
                c.error(fp, f"a percent of capacity must be at most 100%, got {v.strip()}")
            else:
                # `floor` keeps its default: it is ignored while floor_percent is set.
                changes["floor_percent"] = float(match.group(1))
        else:
            c.error(fp, f'expected a slot count or a percent like "25%", got {_describe(v)}')
    pool = dataclasses.replace(PoolSpec(), **changes)

    mn, mx, wk = (_join(path, k) for k in ("minWorkers", "maxWorkers", "workers"))
    spw = _join(path, "slotsPerWorker")
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


def _parse_autoscaler(c: _Checker, value: object, path: str) -> AutoscalerSpec:
    m = c.section(value, path, _AUTOSCALER_KEYS)
    changes = c.numbers(m, _AUTOSCALER_FIELDS, path)
    wp, sp = _join(path, "weights"), _join(path, "scaleUp")
    changes |= c.numbers(c.section(m.get("weights"), wp, [f.key for f in _WEIGHT_FIELDS]), _WEIGHT_FIELDS, wp)
    changes |= c.numbers(
        c.section(m.get("scaleUp"), sp, [f.key for f in _SCALE_UP_FIELDS]), _SCALE_UP_FIELDS, sp
    )
    return dataclasses.replace(AutoscalerSpec(), **changes)


_TENANT_WEIGHT: Final = _Num("weight", "weight", False, exclusive=True)
_TENANT_GUARANTEED: Final = _Num("guaranteed", "guaranteed", True)
_NOMINAL: Final = _Num("nominal", "burstable_nominal", True)
_LIMIT: Final = _Num("limit", "burstable_limit", True)
_BE_LIMIT: Final = _Num("limit", "best_effort_limit", True)


def _parse_tokens(c: _Checker, value: object, path: str, seen: dict[str, str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        c.error(path, f"expected a list of token hashes, got {_describe(value)}")
        return ()
    tokens: list[str] = []
    for i, tok in enumerate(value):
        p = f"{path}[{i}]"
        if not isinstance(tok, str):
            c.error(p, f"expected a string, got {_describe(tok)}")
        elif not TOKEN_HASH_RE.match(tok):
            # Never echo the value: a plain token pasted here by mistake is a secret.
            hint = " (use lowercase hex)" if TOKEN_HASH_RE.match(tok.lower()) else ""
            c.error(
                p,
                '"sha256:" followed by 64 lowercase hex digits expected: store the hash of the bearer '
                f"token, never the token itself{hint}",
            )
        elif tok in seen:
            c.error(
                p,
                f"the same token hash is already listed at {seen[tok]}: one credential is one identity "
                "(one tenant, or one role)",
            )
        else:
            seen[tok] = p
            tokens.append(tok)
    return tuple(tokens)


def _parse_tenant(c: _Checker, value: object, path: str, tokens_seen: dict[str, str]) -> TenantSpec | None:
    if not isinstance(value, Mapping):
        c.error(path, f"expected a mapping with keys {_keys(_TENANT_KEYS)}, got {_describe(value)}")
        return None
    m = c.section(value, path, _TENANT_KEYS)
    np = _join(path, "name")
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

    bp = _join(path, "burstable")
    bm = c.section(m.get("burstable"), bp, _BURSTABLE_KEYS)
    nominal = c.number(bm, _NOMINAL, bp)
    limit = c.number(bm, _LIMIT, bp)
    if nominal is not None:
        changes["burstable_nominal"] = nominal
        # An absent limit means "no bursting": the limit is the nominal.
        changes["burstable_limit"] = nominal
    if limit is not None:
        changes["burstable_limit"] = limit
    if nominal is not None and limit is not None and nominal > limit:
        c.error(_join(bp, "nominal"), f"nominal {nominal} is greater than limit {limit}")

    ep = _join(path, "bestEffort")
    em = c.section(m.get("bestEffort"), ep, _BEST_EFFORT_KEYS)
    # limit: null is allowed and means "no cap", like an absent limit.
    be = c.number(em, _BE_LIMIT, ep) if em.get("limit") is not None else None
    if be is not None:
        changes["best_effort_limit"] = be

    changes["tokens"] = _parse_tokens(c, m.get("tokens"), _join(path, "tokens"), tokens_seen)
    if name is None:
        return None
    return dataclasses.replace(TenantSpec(name=name), **changes)


def _parse_tenants(c: _Checker, value: object, path: str, tokens_seen: dict[str, str]) -> list[TenantSpec]:
    if value is None:
        return []
    if not isinstance(value, list):
        c.error(path, f"expected a list of tenants, got {_describe(value)}")
        return []
    tenants: list[TenantSpec] = []
    names: dict[str, str] = {}
    for i, item in enumerate(value):
        p = f"{path}[{i}]"
        t = _parse_tenant(c, item, p, tokens_seen)
        if t is None:
            continue
        if t.name in names:
            c.error(_join(p, "name"), f"duplicate tenant name {t.name!r} (also at {names[t.name]})")
        else:
            names[t.name] = _join(p, "name")
        tenants.append(t)
    return tenants


def _parse_access(c: _Checker, value: object, path: str, tokens_seen: dict[str, str]) -> AccessSpec:
    # `tokens_seen` already holds the tenants' hashes: a role token may not be a tenant's too,
    # or a tenant could call the Admin service (or a worker agent Acquire) with its own token.
    m = c.section(value, path, _ACCESS_KEYS)
    return AccessSpec(
        admins=_parse_tokens(c, m.get("admins"), _join(path, "admins"), tokens_seen),
        workers=_parse_tokens(c, m.get("workers"), _join(path, "workers"), tokens_seen),
    )


def _check_commitments(c: _Checker, pool: PoolSpec, tenants: Sequence[TenantSpec]) -> None:
    """Warnings about legal policies that break a promise of the design, with their numbers."""
    if not c.ok("spec.pool", "spec.tenants"):
        return
    cap = _capacity(pool)
    floor = pool.floor_slots(cap)
    guaranteed = sum(t.guaranteed for t in tenants)
    nominal = sum(t.burstable_nominal for t in tenants)
    if guaranteed > floor:
        c.warn(
            "spec.pool.floor",
            f"Guaranteed quotas add up to {guaranteed} slots but the floor is {_floor_text(pool)}: "
            "a Guaranteed request within quota may wait for another tenant's Guaranteed lease",
        )
    committed = guaranteed + nominal
    if committed > 0 and committed >= cap:
        c.warn(
            "spec.tenants",
            f"Guaranteed quotas ({guaranteed}) and Burstable nominals ({nominal}) add up to {committed} "
            f"slots, and the pool has {cap} slots ({pool.workers} workers x {pool.slots_per_worker}): "
            "no shared remainder is left, so BestEffort can starve",
        )


def policy_from_dict(d: object) -> tuple[Policy, list[Problem]]:
    """Build a Policy from a decoded policy document (a mapping in the YAML shape).

    Returns the policy and its warnings; raises PolicyError listing every error found.
    """
    c = _Checker()
    if not isinstance(d, Mapping):
        kind = "an empty document" if d is None else _describe(d)
        c.error("", f"expected a {KIND} mapping (apiVersion, kind, metadata, spec), got {kind}")
        raise PolicyError(c.errors)
    top = c.section(d, "", _TOP_KEYS)
    for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
        got = top.get(key)
        if key not in top:
            c.error(key, f'required: must be "{want}"')
        elif got != want:
            c.error(key, f'must be "{want}", got {_describe(got)}')

    meta = c.section(top.get("metadata"), "metadata", _METADATA_KEYS)
    name = c.string(meta, "name", "metadata")
    if name is not None and (not POLICY_NAME_RE.match(name) or len(name) > POLICY_NAME_MAX_LEN):
        c.error("metadata.name", f"{name!r} is not a valid name: lowercase letters, digits, '-' and '.'")
    for key in ("labels", "annotations"):  # accepted for Kubernetes tooling, not kept
        labels = meta.get(key)
        if labels is not None and not (
            isinstance(labels, Mapping) and all(isinstance(v, str) for v in labels.values())
        ):
            c.error(_join("metadata", key), "expected a mapping of strings to strings")

    spec = c.section(top.get("spec"), "spec", _SPEC_KEYS)
    pool = _parse_pool(c, spec.get("pool"), "spec.pool")
    timing_m = c.section(spec.get("timing"), "spec.timing", [f.key for f in _TIMING_FIELDS])
    timing = dataclasses.replace(TimingSpec(), **c.numbers(timing_m, _TIMING_FIELDS, "spec.timing"))
    queue_m = c.section(spec.get("queue"), "spec.queue", [f.key for f in _QUEUE_FIELDS])
    queue = dataclasses.replace(QueueSpec(), **c.numbers(queue_m, _QUEUE_FIELDS, "spec.queue"))
    autoscaler = _parse_autoscaler(c, spec.get("autoscaler"), "spec.autoscaler")
    tokens_seen: dict[str, str] = {}  # hash -> where it was first listed, across tenants and roles
    tenants = _parse_tenants(c, spec.get("tenants"), "spec.tenants", tokens_seen)
    access = _parse_access(c, spec.get("access"), "spec.access", tokens_seen)
    _check_commitments(c, pool, tenants)

    if c.errors:
        raise PolicyError(c.errors, c.warnings)
    policy = Policy(
        name=name if name is not None else Policy.name,
        pool=pool,
        timing=timing,
        queue=queue,
        autoscaler=autoscaler,
        tenants=tuple(tenants),
        access=access,
    )
    return policy, c.warnings


# ---------------------------------------------------------------------------------------------
# YAML text -> Policy


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: the base class reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep)


def parse_policy(text: str) -> tuple[Policy, list[Problem]]:
    """Parse a policy from YAML text. Returns (policy, warnings); raises PolicyError."""
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: builds plain data only
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}" if mark is not None else _DOCUMENT
        column = f" (column {mark.column + 1})" if mark is not None else ""
        context = f"{e.context}: " if e.context else ""
        raise PolicyError([Problem(where, f"invalid YAML: {context}{e.problem}{column}")]) from e
    except yaml.YAMLError as e:
        raise PolicyError([Problem(_DOCUMENT, f"invalid YAML: {e}")]) from e
    return policy_from_dict(doc)


def load_policy(path: str | os.PathLike[str]) -> tuple[Policy, list[Problem]]:
    """Read and parse a policy file. Returns (policy, warnings); raises PolicyError."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise PolicyError([Problem(os.fspath(path), f"cannot read policy file: {reason}")]) from e
    return parse_policy(text)


# ---------------------------------------------------------------------------------------------
# Policy -> dict / YAML (the inverse of policy_from_dict)


def _numbers_to_dict(spec: object, fields: Sequence[_Num]) -> dict[str, Any]:
    return {f.key: getattr(spec, f.attr) for f in fields}


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The policy in its YAML shape (camelCase keys); policy_from_dict(policy_to_dict(p)) == p."""
    pool = policy.pool
    pool_d = _numbers_to_dict(pool, _POOL_FIELDS)
    pool_d["floor"] = f"{_fmt(pool.floor_percent)}%" if pool.floor_percent is not None else pool.floor
    autoscaler_d = {
        "weights": _numbers_to_dict(policy.autoscaler, _WEIGHT_FIELDS),
        "scaleUp": _numbers_to_dict(policy.autoscaler, _SCALE_UP_FIELDS),
        **_numbers_to_dict(policy.autoscaler, _AUTOSCALER_FIELDS),
    }
    tenants = []
    for t in policy.tenants:
        be: dict[str, Any] = {} if t.best_effort_limit is None else {"limit": t.best_effort_limit}
        tenants.append(
            {
                "name": t.name,
                "weight": t.weight,
                "guaranteed": t.guaranteed,
                "burstable": {"nominal": t.burstable_nominal, "limit": t.burstable_limit},
                "bestEffort": be,
                "tokens": list(t.tokens),
            }
        )
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": policy.name},
        "spec": {
            "pool": pool_d,
            "timing": _numbers_to_dict(policy.timing, _TIMING_FIELDS),
            "queue": _numbers_to_dict(policy.queue, _QUEUE_FIELDS),
            "autoscaler": autoscaler_d,
            "tenants": tenants,
            "access": {"admins": list(policy.access.admins), "workers": list(policy.access.workers)},
        },
    }


def policy_to_yaml(policy: Policy) -> str:
    """The policy as a YAML document that parse_policy reads back to an equal Policy."""
    return yaml.safe_dump(policy_to_dict(policy), sort_keys=False, default_flow_style=False)


# ---------------------------------------------------------------------------------------------
# Tokens


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


# ---------------------------------------------------------------------------------------------
# The built-in policy


DEFAULT_POLICY_YAML: Final = """\
# The built-in policy of `slotsched serve` when no policy file is given.
apiVersion: slotsched.dev/v1alpha1
kind: SchedulingPolicy
metadata:
  name: default
spec:
  pool:
    slotsPerWorker: 2
    workers: 4          # 8 slots
    minWorkers: 1
    maxWorkers: 8
    floor: 2            # reserved for Guaranteed work, lent out while idle
  tenants:
    - name: sre         # incident responders: may hold the whole floor
      weight: 1
      guaranteed: 2
      burstable: {nominal: 1, limit: 4}
    - name: product     # interactive product work
      weight: 2
      guaranteed: 0
      burstable: {nominal: 2, limit: 6}
    - name: batch       # batch jobs: BestEffort only, no cap
      weight: 1
      guaranteed: 0
      burstable: {nominal: 0, limit: 0}
"""


@functools.cache
def default_policy() -> Policy:
    """The built-in policy (DEFAULT_POLICY_YAML), parsed once."""
    policy, _ = parse_policy(DEFAULT_POLICY_YAML)
    return policy


# ---------------------------------------------------------------------------------------------
# `slotsched policy validate FILE`


def validate_main(path: str, out: TextIO | None = None) -> int:
    """Validate a policy file, print its errors and warnings; 1 on any error, else 0."""
    stream = sys.stdout if out is None else out
    try:
        policy, warnings = load_policy(path)
    except PolicyError as e:
        for p in e.problems:
            print(f"error: {p}", file=stream)
        for w in e.warnings:
            print(f"warning: {w}", file=stream)
        n = len(e.problems)
        print(f"{path}: invalid policy, {n} error{'s' if n != 1 else ''}", file=stream)
        return 1
    for w in warnings:
        print(f"warning: {w}", file=stream)
    cap = _capacity(policy.pool)
    n = len(policy.tenants)
    roles = "".join(
        f", {k} {role} token{'s' if k != 1 else ''}"
        for role, k in ((ADMIN, len(policy.access.admins)), (WORKER, len(policy.access.workers)))
        if k
    )
    print(
        f"policy {policy.name} is valid: {n} tenant{'s' if n != 1 else ''}, capacity {cap} slots, "
        f"floor {policy.pool.floor_slots(cap)}{roles}",
        file=stream,
    )
    return 0
