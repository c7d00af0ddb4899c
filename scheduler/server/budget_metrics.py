"""Prometheus metrics of the token budgets (docs/design.md, "Token budgets"), in the style of
metrics.py: the event loop bumps plain ints and bucket lists (`PermitDesk` calls
`observe_budget` per decision, `budget_views` after each event), a collector builds the
families at scrape time.

Labels are bounded: `budget` is a budget of the policy (a permit naming another counts under
`budget=""`), `tenant` a tenant of the policy or `_other` (metrics.py's rule), `class` one of
three, `reason` a row of `scheduler/api/reasons.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler.api import reasons
from scheduler.core.budget.types import (
    DIMENSION_NAMES,
    INPUT,
    OUTPUT,
    BudgetDecision,
    BudgetView,
    LimitChanged,
    PermitEnded,
    PermitGranted,
    PermitQueued,
    PermitRefused,
)
from scheduler.core.types import QoS
from scheduler.server.metrics import TIME_TO_SLOT_BUCKETS, _Histogram

NO_BUDGET = ""  # a refusal naming a budget the policy lacks
_DIMS = tuple(n.replace(" ", "_") for n in DIMENSION_NAMES)  # requests, input_tokens, ...


class _Series:
    """One (budget, tenant, class)'s keys in the counters, resolved once (the permit's hot path
    bumps them twice a permit: its grant, its end)."""

    __slots__ = ("granted", "input", "output", "key", "wait")

    def __init__(self, key: tuple[str, str, str]) -> None:
        self.key = key
        self.granted = (*key, "granted")
        self.input = (*key, "input")
        self.output = (*key, "output")
        self.wait: _Histogram | None = None  # made at its first grant (a series only then)


class BudgetMetrics:
    """Counters of permits and tokens per budget, tenant and class; gauges from the views."""

    def __init__(self, tenant_label: Callable[[str | None], str]) -> None:
        self._tenant = tenant_label
        self.budgets: frozenset[str] = frozenset()
        self.permits: dict[tuple[str, str, str, str], int] = {}  # budget, tenant, class, outcome
        self.refusals: dict[tuple[str, str, str], int] = {}  # budget, tenant, reason
        self.tokens: dict[tuple[str, str, str, str], float] = {}  # budget, tenant, class, kind
        self.throttles: dict[tuple[str, str, str], int] = {}
        self.wait: dict[tuple[str, str, str], _Histogram] = {}
        self.views: tuple[BudgetView, ...] = ()
        self._queued_class: dict[str, str] = {}  # a waiting permit's class, for its refusal
        # (budget as named, tenant label, class) -> its series: valid while `budgets` is.
        self._series: dict[tuple[str, str, QoS], _Series] = {}

    def _budget(self, name: str) -> str:
        return name if name in self.budgets else NO_BUDGET

    def _of(self, budget: str, tenant: str, qos: QoS) -> _Series:
        s = self._series.get((budget, tenant, qos))
        if s is None:
            s = self._series[(budget, tenant, qos)] = _Series((self._budget(budget), tenant, qos.value))
        return s

    def observe_budget(self, d: BudgetDecision, tenant: str) -> None:
        t = self._tenant(tenant)
        if isinstance(d, PermitGranted):
            s = self._of(d.budget, t, d.qos)
            permits = self.permits
            permits[s.granted] = permits.get(s.granted, 0) + 1
            h = s.wait
            if h is None:
                h = s.wait = self.wait.setdefault(s.key, _Histogram(TIME_TO_SLOT_BUCKETS))
            h.observe(d.waited_s)
        elif isinstance(d, PermitEnded):
            s = self._of(d.budget, t, d.qos)
            tokens, charged = self.tokens, d.charged
            tokens[s.input] = tokens.get(s.input, 0.0) + charged[INPUT]
            tokens[s.output] = tokens.get(s.output, 0.0) + charged[OUTPUT]
            if d.throttled:
                self._bump(self.throttles, s.key)
        elif isinstance(d, PermitQueued):
            self._bump(self.permits, (self._budget(d.budget), t, "", "queued"))
        elif isinstance(d, PermitRefused):
            reason = reasons.BUDGET[d.reason.value].name
            self._bump(self.refusals, (self._budget(d.budget), t, reason))
        elif isinstance(d, LimitChanged):
            pass  # the effective limit is a gauge, read from the views

    @staticmethod
    def _bump(counts: dict, key: tuple) -> None:  # type: ignore[type-arg]
        counts[key] = counts.get(key, 0) + 1

    def budget_views(self, views: tuple[BudgetView, ...]) -> None:
        self.views = views
        names = frozenset(v.name for v in views)
        if names != self.budgets:  # a budget's label changed: series resolved again
            self.budgets = names
            self._series.clear()


class BudgetCollector(Collector):
    def __init__(self, m: BudgetMetrics) -> None:
        self.m = m

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        m = self.m
        yield _counter(
            "slotsched_budget_permits",
            "Permits granted, and permits that had to wait (queued, class unset), per budget and tenant.",
            ["budget", "tenant", "class", "outcome"],
            m.permits.items(),
        )
        yield _counter(
            "slotsched_budget_permit_refusals",
            "Permits refused, by reason (a row of the refusal reasons).",
            ["budget", "tenant", "reason"],
            m.refusals.items(),
        )
        yield _counter(
            "slotsched_budget_tokens_settled",
            "Tokens charged to a budget when its permits closed (settled usage, or the estimate "
            "of a permit that expired), by kind (input, output).",
            ["budget", "tenant", "class", "kind"],
            m.tokens.items(),
        )
        yield _counter(
            "slotsched_budget_throttles",
            "Calls a settle reported the provider throttled (HTTP 429).",
            ["budget", "tenant", "class"],
            m.throttles.items(),
        )
        wait = HistogramMetricFamily(
            "slotsched_budget_permit_wait_seconds",
            "Wait from a permit's request to its grant.",
            labels=["budget", "tenant", "class"],
        )
        for (b, t, c), h in list(m.wait.items()):
            buckets, total = h.family_samples()
            wait.add_metric([b, t, c], buckets, total)
        yield wait
        yield from self._gauges()

    def _gauges(self) -> Iterator[Metric]:
        limit = GaugeMetricFamily(
            "slotsched_budget_effective_limit_per_minute",
            "A budget's effective limit per minute (the configured one times the provider "
            "feedback's factor), per dimension it limits.",
            labels=["budget", "dimension"],
        )
        util = GaugeMetricFamily(
            "slotsched_budget_utilization",
            "The share of a minute of the budget's shared rate that is spent (1 - what its "
            "shared bucket holds / a minute of the effective limit), per dimension it limits.",
            labels=["budget", "dimension"],
        )
        waiting = GaugeMetricFamily(
            "slotsched_budget_permits_waiting", "Permits waiting for the budget.", labels=["budget"]
        )
        factor = GaugeMetricFamily(
            "slotsched_budget_limit_factor",
            "Effective limit / configured limit (below 1 after the provider throttled).",
            labels=["budget"],
        )
        for v in self.m.views:
            waiting.add_metric([v.name], v.waiting)
            factor.add_metric([v.name], v.factor)
            for d, per_min in enumerate(v.limits_per_minute):
                if v.configured_per_minute[d] <= 0:
                    continue
                limit.add_metric([v.name, _DIMS[d]], per_min)
                used = 1.0 - v.shared_available[d] / per_min if per_min > 0 else 1.0
                util.add_metric([v.name, _DIMS[d]], min(1.0, max(0.0, used)))
        yield limit
        yield util
        yield waiting
        yield factor


def _counter(
    name: str, doc: str, labels: list[str], series: Iterable[tuple[tuple[str, ...], float]]
) -> Metric:
    """One counter family from its series (a copy: the loop may add a series meanwhile)."""
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, v in list(series):
        family.add_metric(list(key), v)
    return family
