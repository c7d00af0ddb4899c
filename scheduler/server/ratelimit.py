"""Rate limits per flow, as Kubernetes API Priority and Fairness limits per flow: the adapter that
keeps one pure `TokenBucket` per flow, reads the clock, and refuses a call past its bucket with
RESOURCE_EXHAUSTED and `retry-after-ms`.

The flows (the buckets' sizes come from the policy in force, `spec.rateLimits`):

* a tenant's calls: Acquire and GetSession (`spec.tenants[i].rateLimit`, else
  `spec.rateLimits.tenant`);
* a tenant's renewals: Renew, Release and Yield (and a Channel's withdraw), in a bucket of their own
  (`spec.rateLimits.renewals`). Why separate: a tenant flooding Acquire must not make its own
  renewals fail (its running leases would expire) and a slot given back must never wait behind
  Acquires. Sized for the tenant's leases at quota (the validator warns when it is not).
* the admin role: every admin credential together (`spec.rateLimits.admin`), on the Admin and the
  Workers service, so an operator's loop cannot take the event loop from tenants' renewals;
* each worker entry (`spec.access.workers[i]`): its pods together (`spec.rateLimits.worker`).

An absent bucket is unlimited. A bucket whose size the policy changes starts full again.
Which session command goes to which flow is the command table's (scheduler/api/commands.py:
`Command.flow`), read here for the per-session rpcs and the Channel's commands alike (withdraw is
charged as the Release it stands for); the channel itself is not charged (the sessions on it are).
Every command is charged, refused ones included: one the wire guard refused, one of a message
the fair admission gate refused (fairness.py), one past its bucket (a message's later commands
of an empty bucket get the same refusal at the cost of a lookup: session_channel.py).
Refusals are counted in `slotsched_rate_limited_total{tenant,rpc}`: `tenant` is the tenant's
name or `role:admin` / `role:worker` (no tenant name has a ':'), `rpc` the method name, so the
label values are bounded by the policy's tenants and the services' methods.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from scheduler.api.commands import BY_RPC, Command, Flow
from scheduler.core.ratelimit import TokenBucket
from scheduler.policy.identities import Identity
from scheduler.policy.model import ADMIN, Policy, RateLimit
from scheduler.server import errors
from scheduler.server.metrics import Metrics


class RateLimiter:
    def __init__(self, policy: Callable[[], Policy], clock: Callable[[], float] = time.monotonic) -> None:
        self._policy = policy
        self._clock = clock
        self._buckets: dict[str, tuple[RateLimit, TokenBucket]] = {}
        self.metrics: Metrics | None = None  # where refusals are counted (bound by the wiring)

    def tenant(self, tenant: str, rpc: str) -> None:
        """Charge a tenant's call of the Scheduler rpc `rpc` to its flow."""
        self.charge(tenant, BY_RPC[rpc])

    def charge(self, tenant: str, command: Command) -> None:
        """Charge a tenant's session command to its flow (`command.flow`), labelled by its rpc."""
        refusal = self.refusal(tenant, command)
        if refusal is not None:
            raise refusal

    def refusal(self, tenant: str, command: Command) -> errors.RpcFailure | None:
        """`charge`, returning the refusal instead of raising it: a Channel answers it as one
        outcome among a message's, and a raise per command would leave a traceback cycle (frames
        holding the command) for the collector each time."""
        flow, limit, key = self._limit_of(tenant, command.flow)
        return self._take(flow, limit, key, tenant, command.rpc)

    def refill_s(self, tenant: str, flow: Flow, count: int) -> float:
        """Seconds `tenant`'s bucket of `flow` takes to earn `count` tokens (0: no limit)."""
        limit = self._limit_of(tenant, flow)[1]
        return count / limit.qps if limit is not None else 0.0

    def _limit_of(self, tenant: str, flow: Flow) -> tuple[str, RateLimit | None, str]:
        """The bucket a tenant's commands of `flow` are charged to: its key, limit and policy key."""
        policy = self._policy()
        if flow is Flow.RENEWALS:
            return f"renewals:{tenant}", policy.rate_limits.renewals, "spec.rateLimits.renewals"
        for i, t in enumerate(policy.tenants):
            if t.name == tenant and t.rate_limit is not None:
                return f"tenant:{tenant}", t.rate_limit, f"spec.tenants[{i}].rateLimit"
        return f"tenant:{tenant}", policy.rate_limits.tenant, "spec.rateLimits.tenant"

    def count_refused(self, tenant: str, command: Command) -> None:
        """Count a command refused by its bucket without charging it again (its message's
        earlier command found the bucket empty: scheduler/server/session_channel.py)."""
        if self.metrics is not None:
            self.metrics.count_rate_limited(tenant, command.rpc)

    def role(self, identity: Identity, rpc: str) -> None:
        """Charge an admin's or a worker's call: all admins share one bucket, each worker entry
        has its own."""
        limits = self._policy().rate_limits
        if identity.role == ADMIN:
            refusal = self._take("admin", limits.admin, "spec.rateLimits.admin", "role:admin", rpc)
        else:
            flow = f"worker:{identity.key}"
            refusal = self._take(flow, limits.worker, "spec.rateLimits.worker", "role:worker", rpc)
        if refusal is not None:
            raise refusal

    def _take(
        self, flow: str, limit: RateLimit | None, key: str, label: str, rpc: str
    ) -> errors.RpcFailure | None:
        if limit is None:
            return None
        now = self._clock()
        wait = self._bucket(flow, limit, now).take(now)
        if wait > 0:
            if self.metrics is not None:
                self.metrics.count_rate_limited(label, rpc)
            return errors.rate_limited(label, rpc, key, limit.qps, limit.burst, wait)
        return None

    def _bucket(self, flow: str, limit: RateLimit, now: float) -> TokenBucket:
        held = self._buckets.get(flow)
        if held is None or held[0] != limit:  # new, or resized by ApplyPolicy: starts full
            held = (limit, TokenBucket.full(limit.qps, limit.burst, now))
            self._buckets[flow] = held
        return held[1]
