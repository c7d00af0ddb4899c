"""The SchedulingPolicy YAML shape: api version, kind, names, and the field tables that are the one
source of truth for parsing (camelCase key -> dataclass field, with bounds) and for writing back."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

API_VERSION: Final = "slotsched.dev/v1alpha1"
KIND: Final = "SchedulingPolicy"

# Tenant names end up in metric labels, log fields and Redis keys: keep them boring.
TENANT_NAME_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9_]*[a-z0-9])?$")
TENANT_NAME_MAX_LEN: Final = 63
# metadata.name follows Kubernetes object names (DNS-1123 subdomain).
POLICY_NAME_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
POLICY_NAME_MAX_LEN: Final = 253
TOKEN_HASH_RE: Final = re.compile(r"^sha256:[0-9a-f]{64}$")
# Client-certificate names (SANs) a policy may bind: a SPIFFE ID or a DNS name, compared exactly
# with what the TLS layer verified (so no wildcards, and lowercase: DNS names compare lowercase).
SPIFFE_RE: Final = re.compile(r"^spiffe://[a-z0-9._-]+(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)*$")
_DNS_LABEL: Final = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
DNS_NAME_RE: Final = re.compile(rf"^(?=.{{1,253}}$){_DNS_LABEL}(\.{_DNS_LABEL})*$")
IDENTITY_MAX_LEN: Final = 2048
# Worker ids end up in lease ids and Redis keys: at most a DNS subdomain (a pod name).
WORKER_ID_MAX_LEN: Final = 253
# The global cap on the slots one worker may register, whatever the credential (an admin too):
# a registered worker's slots are capacity every tenant's grants are placed on.
MAX_WORKER_SLOTS: Final = 256
# Pool names end up in metric labels, journal keys and the ScaledObject's metadata: a DNS label.
POOL_NAME_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
POOL_NAME_MAX_LEN: Final = 63
# Pool labels follow Kubernetes label syntax: a key is an optional DNS-subdomain prefix and '/',
# then a name of at most 63 characters; a value is empty or such a name.
LABEL_NAME_RE: Final = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_NAME_MAX_LEN: Final = 63
LABEL_PREFIX_MAX_LEN: Final = 253
# What a pool's actuator scales (Deployment/NAME, StatefulSet/NAME, PLURAL.GROUP/VERSION/KIND/NAME):
# read by the actuator, so here only a bounded string without spaces.
TARGET_RE: Final = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.:/]*$")
TARGET_MAX_LEN: Final = 512
# "25%", "12.5%"; the exponent form is what repr() writes for tiny floats ("1e-05%").
PERCENT_RE: Final = re.compile(r"^(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)%$")


@dataclass(frozen=True)
class Num:
    key: str  # camelCase key in the YAML
    attr: str  # dataclass field
    integer: bool
    minimum: float = 0
    exclusive: bool = False  # the minimum itself is not allowed
    maximum: float | None = None


POOL_FIELDS: Final = (
    Num("slotsPerWorker", "slots_per_worker", True, minimum=1),
    Num("workers", "workers", True),
    Num("minWorkers", "min_workers", True),
    Num("maxWorkers", "max_workers", True, minimum=1),
)
TIMING_FIELDS: Final = (
    Num("yieldGraceSeconds", "yield_grace_s", False),
    Num("leaseTTLSeconds", "lease_ttl_s", False, exclusive=True),
    Num("minRuntimeSeconds", "min_runtime_s", False),
)
QUEUE_FIELDS: Final = (
    Num("maxPending", "max_pending", True),
    Num("maxPendingPerTenant", "max_pending_per_tenant", True),
    Num("bestEffortFraction", "best_effort_fraction", False, maximum=1.0),
)
LIMITS_FIELDS: Final = (
    Num("seats", "seats", True, minimum=1),
    Num("queuedPerFlow", "queued_per_flow", True, minimum=1),
    Num("channelsPerTenant", "channels_per_tenant", True, minimum=1),
    Num("channelsPerConnection", "channels_per_connection", True, minimum=1),
    Num("streamsPerTenant", "streams_per_tenant", True, minimum=1),
    Num("streamsPerConnection", "streams_per_connection", True, minimum=1),
    Num("turnMillis", "turn_ms", False),
)
FAIRNESS_FIELDS: Final = (
    Num("usageHalfLifeSeconds", "usage_half_life_s", False),
    Num("usageSamplingSeconds", "usage_sampling_s", False, exclusive=True),
    Num("bestEffortMinShare", "best_effort_min_share", False, maximum=1.0),
    Num("shareWindowSeconds", "share_window_s", False),
)
AUTOSCALER_FIELDS: Final = (
    Num("tolerance", "tolerance", False),
    Num("scaleDownStabilizationSeconds", "scale_down_stabilization_s", False),
    Num("scaleUpCooldownSeconds", "scale_up_cooldown_s", False),
    Num("scaleDownCooldownSeconds", "scale_down_cooldown_s", False),
    Num("drainTimeoutSeconds", "drain_timeout_s", False),
    Num("startDelaySeconds", "start_delay_s", False),
)
WEIGHT_FIELDS: Final = (
    Num("guaranteed", "weight_guaranteed", False),
    Num("burstable", "weight_burstable", False),
    Num("bestEffort", "weight_best_effort", False),
)
SCALE_UP_FIELDS: Final = (
    Num("pods", "scale_up_pods", True, minimum=1),
    Num("percent", "scale_up_percent", False, exclusive=True),
    Num("periodSeconds", "scale_up_period_s", False, exclusive=True),
    Num("oldestWaitSeconds", "scale_up_oldest_wait_s", False),
)
# spec.autoscaler.scaleDown: the HPA's scale-down policies, the more conservative applied.
SCALE_DOWN_FIELDS: Final = (
    Num("pods", "scale_down_pods", True),
    Num("percent", "scale_down_percent", False, exclusive=True, maximum=100.0),
    Num("periodSeconds", "scale_down_period_s", False, exclusive=True),
)
RECYCLE_FIELDS: Final = (
    Num("memoryBytes", "recycle_memory_bytes", True),
    Num("maxAgeSeconds", "recycle_max_age_s", False),
)
FORECAST_FIELDS: Final = (
    Num("lookbackDays", "lookback_days", True, maximum=28),
    Num("leadSeconds", "lead_s", False),
    Num("bucketSeconds", "bucket_s", False, exclusive=True, maximum=86400.0),
)
SCHEDULE_KEYS: Final = ("timeZone", "windows")
SCHEDULE_WINDOW_KEYS: Final = ("days", "start", "end", "minWorkers")
# Days of a schedule window, Monday first (datetime.weekday()).
WEEKDAYS: Final = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
CLOCK_RE: Final = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")

TOP_KEYS: Final = ("apiVersion", "kind", "metadata", "spec")
METADATA_KEYS: Final = ("name", "labels", "annotations")
SPEC_KEYS: Final = (
    "pool",
    "pools",
    "timing",
    "queue",
    "autoscaler",
    "tenants",
    "access",
    "rateLimits",
    "limits",
    "fairness",
    "budgets",
)
POOL_KEYS: Final = tuple(f.key for f in POOL_FIELDS) + ("floor", "budgets")
#: Keys of a pool (spec.pool, spec.pools[]) read only when the scheduler starts, with why: a new
#: value applied live is kept, but changes nothing until a restart. The one table: `policy apply`'s
#: diff and the server's log line of an applied policy mark them (diff.py); docs/design.md lists
#: them ("Policy, identity and roles"), tests/test_policy_restart_keys.py holds the two equal.
RESTART_ONLY: Final = {
    "workers": "the in-process workers are registered when the scheduler starts",
    "slotsPerWorker": "workers keep the slots they registered with; the in-process and local autoscaler "
    "workers take the new value at restart",
    "target": "a pool's autoscaler actuator is built when the scheduler starts (or the pool is added)",
}
# An entry of spec.pools: spec.pool's keys and what a pool among several has.
POOLS_ENTRY_KEYS: Final = ("name", "labels", "compatibility") + POOL_KEYS + ("autoscaler", "target")
AUTOSCALER_KEYS: Final = ("weights", "scaleUp", "scaleDown", "recycle", "schedule", "forecast") + tuple(
    f.key for f in AUTOSCALER_FIELDS
)
TENANT_KEYS: Final = (
    "name", "weight", "guaranteed", "burstable", "bestEffort", "tokens", "identities", "rateLimit",
    "pools", "budgets",
)  # fmt: skip
# spec.tenants[i].pools[j]: the tenant's quotas in one pool (absent keys: the tenant-wide value).
TENANT_POOL_FIELDS: Final = (
    Num("guaranteed", "guaranteed", True),
    Num("burstableNominal", "burstable_nominal", True),
    Num("burstableLimit", "burstable_limit", True),
)
TENANT_POOL_KEYS: Final = ("pool",) + tuple(f.key for f in TENANT_POOL_FIELDS) + ("bestEffortLimit",)
BURSTABLE_KEYS: Final = ("nominal", "limit")
BEST_EFFORT_KEYS: Final = ("limit",)
ACCESS_KEYS: Final = ("admins", "workers")
ADMIN_ENTRY_KEYS: Final = ("token", "identity")
WORKER_ENTRY_KEYS: Final = ("tokens", "identities", "workerIds", "workerIdPrefix", "maxSlots", "pools")
RATE_LIMIT_KEYS: Final = ("qps", "burst")
RATE_LIMITS_KEYS: Final = ("tenant", "renewals", "admin", "worker")
# Token budgets (spec.budgets[i]): a per-minute limit in each dimension the provider limits (at
# least one), bounded so that no arithmetic on it overflows a float's exact integers.
BUDGET_MAX_PER_MINUTE: Final = 10**12
BUDGET_LIMIT_FIELDS: Final = tuple(
    Num(key, attr, True, exclusive=True, maximum=BUDGET_MAX_PER_MINUTE)
    for key, attr in (
        ("tokensPerMinute", "tokens_per_minute"),
        ("inputTokensPerMinute", "input_tokens_per_minute"),
        ("outputTokensPerMinute", "output_tokens_per_minute"),
        ("requestsPerMinute", "requests_per_minute"),
    )
)
BUDGET_FIELDS: Final = (
    Num("permitTTLSeconds", "permit_ttl_s", False, exclusive=True, maximum=86400.0),
    Num("maxPending", "max_pending", True),
    Num("maxPendingPerTenant", "max_pending_per_tenant", True),
)
BUDGET_FEEDBACK_FIELDS: Final = (
    Num("decrease", "decrease", False, exclusive=True, maximum=1.0),
    Num("recoveryPerMinute", "recovery_per_minute", False, exclusive=True, maximum=1.0),
    Num("minimum", "minimum", False, exclusive=True, maximum=1.0),
)
BUDGET_KEYS: Final = (
    ("name",)
    + tuple(f.key for f in BUDGET_LIMIT_FIELDS)
    + tuple(f.key for f in BUDGET_FIELDS)
    + ("feedback",)
)
# A rate within a budget (a tenant's guaranteed, burstable nominal or limit, bestEffort limit).
BUDGET_RATE_FIELDS: Final = (
    Num("percent", "percent", False, maximum=100.0),
    Num("tokensPerMinute", "tokens", True, maximum=BUDGET_MAX_PER_MINUTE),
    Num("inputTokensPerMinute", "input_tokens", True, maximum=BUDGET_MAX_PER_MINUTE),
    Num("outputTokensPerMinute", "output_tokens", True, maximum=BUDGET_MAX_PER_MINUTE),
    Num("requestsPerMinute", "requests", True, maximum=BUDGET_MAX_PER_MINUTE),
)
# spec.tenants[i].budgets[j]: the tenant's share of one budget.
TENANT_BUDGET_KEYS: Final = ("budget", "weight", "guaranteed", "burstable", "bestEffort")
# The shape a worker entry takes, for the error a plain string gets.
WORKER_ENTRY_SHAPE: Final = (
    '{tokens: ["sha256:<hex>"], workerIds: [...] or workerIdPrefix: "...", maxSlots: N}'
)


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a Kubernetes label key, or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > LABEL_PREFIX_MAX_LEN or not DNS_NAME_RE.match(prefix)):
        return "its prefix (before '/') must be a lowercase DNS subdomain"
    if not LABEL_NAME_RE.match(name) or len(name) > LABEL_NAME_MAX_LEN:
        return (
            f"a label name is at most {LABEL_NAME_MAX_LEN} letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a Kubernetes label value (empty is one), or None."""
    if value and (not LABEL_NAME_RE.match(value) or len(value) > LABEL_NAME_MAX_LEN):
        return (
            f"a label value is empty or at most {LABEL_NAME_MAX_LEN} letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    return None


def fmt_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)
