"""Kueue-like metrics scraped from a real server: per-tenant grants, time to slot, refusals and
preemptions (victim and preemptor), bounded by the policy's tenants (a tenant ApplyPolicy removes
leaves the series; one the policy lacks is `_other`), quota gauges, build_info and process
metrics."""

from __future__ import annotations

import asyncio
import platform

import grpc

from scheduler.api.gen.slotsched.v1 import admin_pb2
from tests.grpc_fixtures import (
    ADMIN_TOKEN,
    BE,
    DEFAULT_TENANTS,
    TOKENS,
    B,
    Client,
    G,
    next_event,
    policy_yaml,
    running_server,
    status_of,
)
from tests.test_server_ops import scrape

TENANT_SERIES = (
    "slotsched_grants_total",
    "slotsched_time_to_slot_seconds_count",
    "slotsched_refusals_total",
)


def tenants_in(m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, label: str) -> set[str]:
    return {dict(labels)[label] for n, labels in m if n == name}


def test_tenant_labelled_series_quotas_and_build_info() -> None:
    with running_server(policy_yaml()) as server:

        async def go() -> None:
            async with (
                Client(server.target, token=TOKENS["acme"]) as acme,
                Client(server.target, token=TOKENS["batch"]) as batch,
                Client(server.target, token=TOKENS["globex"]) as globex,
                Client(server.target, token=ADMIN_TOKEN) as admin,
            ):
                b1 = batch.acquire("b1", BE)
                assert (await next_event(b1)).WhichOneof("event") == "granted"
                a1 = acme.acquire("a1", B)
                assert (await next_event(a1)).WhichOneof("event") == "granted"
                refused = globex.acquire("g", BE)  # globex: BestEffort limit 0
                assert (await status_of(refused))[0] == grpc.StatusCode.PERMISSION_DENIED
                g1 = acme.acquire("g1", G)  # the floor, lent to batch: batch yields to acme
                assert (await next_event(g1)).WhichOneof("event") == "queued"
                assert (await next_event(b1)).WhichOneof("event") == "yield_requested"

                m = scrape(server.metrics_url)
                assert (
                    m[
                        (
                            "slotsched_grants_total",
                            (("class", "besteffort"), ("pool", "default"), ("tenant", "batch")),
                        )
                    ]
                    == 1
                )
                assert (
                    m[
                        (
                            "slotsched_grants_total",
                            (("class", "burstable"), ("pool", "default"), ("tenant", "acme")),
                        )
                    ]
                    == 1
                )
                assert (
                    m[
                        (
                            "slotsched_time_to_slot_seconds_count",
                            (("class", "besteffort"), ("pool", "default"), ("tenant", "batch")),
                        )
                    ]
                    == 1
                )
                assert (
                    m[
                        (
                            "slotsched_refusals_total",
                            (("pool", "default"), ("reason", "no_quota"), ("tenant", "globex")),
                        )
                    ]
                    == 1
                )
                assert (
                    m[
                        (
                            "slotsched_refusals_total",
                            (("pool", "default"), ("reason", "no_quota"), ("tenant", "acme")),
                        )
                    ]
                    == 0
                )
                pre = (
                    ("cause", "guaranteed"),
                    ("pool", "default"),
                    ("preemptor_tenant", "acme"),
                    ("victim_tenant", "batch"),
                )
                assert m[("slotsched_preemptions_total", pre)] == 1
                # Bounded: the policy's tenants (its spelling) and `_other`, nothing else.
                for name in TENANT_SERIES:
                    assert tenants_in(m, name, "tenant") == {"acme", "globex", "batch", "_other"}, name
                # Quotas, as the policy says.
                assert (
                    m[("slotsched_tenant_guaranteed_quota_slots", (("pool", "default"), ("tenant", "acme")))]
                    == 1
                )
                assert (
                    m[("slotsched_tenant_nominal_quota_slots", (("pool", "default"), ("tenant", "globex")))]
                    == 1
                )
                assert (
                    m[
                        (
                            "slotsched_tenant_limit_slots",
                            (("class", "burstable"), ("pool", "default"), ("tenant", "acme")),
                        )
                    ]
                    == 2
                )
                assert (
                    m[
                        (
                            "slotsched_tenant_limit_slots",
                            (("class", "besteffort"), ("pool", "default"), ("tenant", "globex")),
                        )
                    ]
                    == 0
                )
                assert (
                    "slotsched_tenant_limit_slots",
                    (("class", "besteffort"), ("pool", "default"), ("tenant", "acme")),
                ) not in m
                assert m[("slotsched_tenant_weight", (("pool", "default"), ("tenant", "batch")))] == 1
                # build_info and the process.
                (info,) = [labels for n, labels in m if n == "slotsched_build_info"]
                info_d = dict(info)
                assert info_d["python"] == platform.python_version() and info_d["grpc"] == grpc.__version__
                assert info_d["version"]
                assert m[("process_cpu_seconds_total", ())] > 0
                assert any(n == "python_info" for n, _ in m)

                # ApplyPolicy without globex: its series go, the others keep their counts.
                tenants = [t for t in DEFAULT_TENANTS if t["name"] != "globex"]
                await admin.admin.ApplyPolicy(
                    admin_pb2.ApplyPolicyRequest(yaml=policy_yaml(tenants)), metadata=admin.md
                )
                m = scrape(server.metrics_url)
                for name in (*TENANT_SERIES, "slotsched_tenant_guaranteed_quota_slots"):
                    assert "globex" not in tenants_in(m, name, "tenant"), name
                assert "globex" not in tenants_in(m, "slotsched_preemptions_total", "preemptor_tenant")
                assert (
                    m[
                        (
                            "slotsched_grants_total",
                            (("class", "burstable"), ("pool", "default"), ("tenant", "acme")),
                        )
                    ]
                    == 1
                )
                assert m[("slotsched_preemptions_total", pre)] == 1
                for call in (a1, b1, g1):
                    call.cancel()

        asyncio.run(go())


def test_a_tenant_the_policy_lacks_is_counted_as_other() -> None:
    # The server's auth refuses such a caller before the core; the core's own refusal (e.g. on a
    # journal replayed after an ApplyPolicy) must not mint a series for it either.
    from scheduler.core.types import Acquire, QoS, Refused, RefuseReason, SessionId, TenantName
    from scheduler.policy.yaml_io import parse_policy
    from scheduler.server.metrics import Metrics

    policy, _ = parse_policy(policy_yaml())

    class Core:
        def __init__(self) -> None:
            self.policy = policy

        def session(self, session: object) -> None:
            return None

    m = Metrics()
    event = Acquire(SessionId("s"), TenantName("nobody"), QoS.BURSTABLE)
    m.observe([Refused(SessionId("s"), RefuseReason.UNKNOWN_TENANT, "unknown")], 1e-6, event, Core())
    assert m.refusals[("default", "_other", RefuseReason.UNKNOWN_TENANT)] == 1
    assert {t for _, t, _ in m.refusals} == {"acme", "globex", "batch", "_other"}
