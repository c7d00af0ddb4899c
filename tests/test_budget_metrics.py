"""The budget series: what each permit decision counts, under bounded labels."""

from __future__ import annotations

from prometheus_client import generate_latest

from scheduler.core.budget.types import (
    BudgetName,
    PermitEnded,
    PermitEndReason,
    PermitGranted,
    PermitId,
    PermitRefused,
    PermitRefuseReason,
    Usage,
)
from scheduler.core.types import QoS, TenantName
from scheduler.server.metrics import Metrics


def test_permit_decisions_are_counted_per_budget_tenant_and_class() -> None:
    m = Metrics()
    m._set_tenants(["acme"])  # noqa: SLF001 - the policy's tenants, as an event would set them
    b = m.budget
    b.budgets = frozenset({"llm"})
    pid, llm = PermitId("p"), BudgetName("llm")
    b.observe_budget(
        PermitGranted(pid, "o", TenantName("acme"), llm, QoS.BURSTABLE, Usage(1, 1), 9.0, 0.25, True), "acme"
    )
    b.observe_budget(PermitRefused(pid, BudgetName("nope"), PermitRefuseReason.UNKNOWN_BUDGET, "m"), "acme")
    b.observe_budget(PermitRefused(pid, llm, PermitRefuseReason.QUEUE_FULL, "m"), "stranger")
    ended = PermitEnded(pid, "o", TenantName("acme"), llm, QoS.BURSTABLE, PermitEndReason.SETTLED,
                        (1, 30, 20, 50), (0, 0, 0, 0), throttled=True)  # fmt: skip
    b.observe_budget(ended, "acme")
    text = generate_latest(m.registry).decode()
    assert (
        'slotsched_budget_permits_total{budget="llm",class="burstable",outcome="granted",tenant="acme"} 1.0'
        in text
    )
    assert (
        'slotsched_budget_permit_refusals_total{budget="",reason="unknown_budget",tenant="acme"} 1.0' in text
    )
    assert (
        'slotsched_budget_permit_refusals_total{budget="llm",reason="budget_queue_full",tenant="_other"} 1.0'
        in text
    )
    tokens = (
        'slotsched_budget_tokens_settled_total{budget="llm",class="burstable",kind="input",tenant="acme"}'
    )
    assert f"{tokens} 30.0" in text
    assert 'slotsched_budget_throttles_total{budget="llm",class="burstable",tenant="acme"} 1.0' in text
