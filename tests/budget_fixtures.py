"""A test policy with a token budget, and helpers to ask for permits over real gRPC."""

from __future__ import annotations

from typing import Any

import yaml

from scheduler.api.gen.slotsched.v1 import scheduler_pb2
from tests.grpc_fixtures import policy_yaml

BUDGET = "llm"


def budget_policy_yaml(
    *, tokens_per_minute: int = 60_000, requests_per_minute: int = 600, max_pending: int = 100,
    max_pending_per_tenant: int = 100, **kw: Any,
) -> str:  # fmt: skip
    """policy_yaml's tenants (acme: every class; globex: Burstable; batch: BestEffort only, and
    no share of the budget) with one budget `llm`: acme and globex share it."""
    doc = yaml.safe_load(policy_yaml(**kw))
    spec = doc["spec"]
    spec["budgets"] = [
        {
            "name": BUDGET,
            "tokensPerMinute": tokens_per_minute,
            "requestsPerMinute": requests_per_minute,
            "maxPending": max_pending,
            "maxPendingPerTenant": max_pending_per_tenant,
        }
    ]
    _share_the_budget(spec)
    return yaml.safe_dump(doc, sort_keys=False)


def _share_the_budget(spec: dict[str, Any]) -> None:
    """acme: Guaranteed 10%, Burstable 40% to 100% of `llm`; globex: Burstable alike."""
    burst = {"nominal": {"percent": 40}, "limit": {"percent": 100}}
    shares = {
        "acme": {"budget": BUDGET, "guaranteed": {"percent": 10}, "burstable": burst},
        "globex": {"budget": BUDGET, "burstable": burst},
    }
    for t in spec["tenants"]:
        if t["name"] in shares:
            t["budgets"] = [shares[t["name"]]]


def permit_request(session_id: str, inp: float = 100, out: float = 100, budget: str = BUDGET) -> Any:
    return scheduler_pb2.RequestPermitRequest(
        session_id=session_id,
        budget=budget,
        estimate=scheduler_pb2.TokenUsage(input_tokens=inp, output_tokens=out),
    )


def settle_request(session_id: str, permit_id: str, inp: float = 50, out: float = 50, **kw: Any) -> Any:
    usage = scheduler_pb2.TokenUsage(input_tokens=inp, output_tokens=out)
    return scheduler_pb2.SettlePermitRequest(session_id=session_id, permit_id=permit_id, usage=usage, **kw)


#: The pools naming the budget in `pools_budget_policy_yaml`, in the policy's order: its home is
#: the first, `cpu-b` (not the first pool nor a default one), wherever its sessions are.
HOME = "cpu-b"


def pools_budget_policy_yaml(*, tokens_per_minute: int = 60_000, **kw: Any) -> str:
    """`pools_policy_yaml`'s three pools (cpu-a, cpu-b, gpu) with the budget `llm` of
    `budget_policy_yaml` (acme: Guaranteed 10%, Burstable 40% to 100%; globex: Burstable),
    named by `cpu-b` and `gpu`, so its home is `cpu-b` (HOME); `cpu-a` names none."""
    from tests.grpc_fixtures import pools_policy_yaml

    doc = yaml.safe_load(pools_policy_yaml(**kw))
    spec = doc["spec"]
    spec["budgets"] = [
        {"name": BUDGET, "tokensPerMinute": tokens_per_minute, "requestsPerMinute": 600, "maxPending": 100}
    ]
    _share_the_budget(spec)
    for p in spec["pools"]:
        if p["name"] in (HOME, "gpu"):
            p["budgets"] = [BUDGET]
    return yaml.safe_dump(doc, sort_keys=False)
