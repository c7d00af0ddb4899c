"""The SDK with several pools (issue 24): `client.session(pool=, selector=, fallback=)` over real
gRPC against the three-pool platform of `pools_policy_yaml` (one static worker a pool: cpu-a 2
slots, cpu-b 1, gpu 1). The session lands only where it named or matched, shows its pool and why
it waits, and the pool refusals arrive as typed errors naming the pool."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from scheduler.client import (
    AsyncClient,
    Client,
    InvalidArgument,
    NoEligiblePool,
    NoQuota,
    Phase,
    QoS,
    SnapshotRef,
)
from tests.grpc_fixtures import TOKENS, pools_policy_yaml, running_server

ACME, GLOBEX = TOKENS["acme"], TOKENS["globex"]


@pytest.mark.parametrize("multiplex", [True, False], ids=["channel", "per-session"])
def test_sessions_land_where_they_named_and_wait_there(multiplex: bool) -> None:
    with running_server(pools_policy_yaml()) as server:

        async def go() -> None:
            async with AsyncClient(server.target, token=ACME, multiplex=multiplex) as client:
                async with client.session("g1", QoS.BURSTABLE, pool="gpu") as lease:
                    assert lease.pool == "gpu"
                    # The selector's matches are tried in the policy's order: cpu-a first.
                    async with client.session("c1", selector={"kind": "cpu"}) as c1:
                        assert c1.pool == "cpu-a"
                    # gpu is full (1 slot): the fallback grants in cpu-b, never elsewhere.
                    async with client.session("g2", pool="gpu", fallback=["cpu-b"]) as g2:
                        assert g2.pool == "cpu-b"
                        # Both full: it waits in its first pool, and says why (acme holds its
                        # nominal in gpu: beyond it, it waits on its quota).
                        s = client.session("g3", pool="gpu", fallback=["cpu-b"])
                        s.start()
                        await s.wait_until(lambda x: x.phase is Phase.QUEUED, timeout=10)
                        assert s.pool == "gpu" and s.lease is None
                        assert s.queue is not None and s.queue.pool == "gpu"
                        assert s.queue.reason == "tenant_quota"
                        info = await client.get_session("g3")
                        assert (info.phase, info.pool, info.wait_reason) == (
                            Phase.QUEUED,
                            "gpu",
                            "tenant_quota",
                        )
                        # globex, within its nominal in cpu-b, waits only for a slot there.
                        async with AsyncClient(server.target, token=GLOBEX, multiplex=multiplex) as globex:
                            x = globex.session("x", pool="cpu-b")
                            x.start()
                            await x.wait_until(lambda v: v.phase is Phase.QUEUED, timeout=10)
                            assert x.queue is not None and (x.queue.pool, x.queue.reason) == (
                                "cpu-b",
                                "pool_exhausted",
                            )
                            await x.release()
                # g1's slot is free again: g3 is granted in gpu, where it waited.
                got = await s.wait_granted(timeout=10)
                assert got.pool == "gpu" and s.pool == "gpu"
                info = await client.get_session("g3")
                assert info.lease is not None and info.lease.pool == "gpu" and info.wait_reason == ""
                await s.release()

        asyncio.run(go())


def test_the_blocking_client_names_a_pool_too() -> None:
    with running_server(pools_policy_yaml()) as server, Client(server.target, token=ACME) as client:
        with client.session("b1", pool="cpu-b") as lease:
            assert lease.pool == "cpu-b"
        with client.session("b2", selector={"gpu": "a100"}) as lease:
            assert lease.pool == "gpu"
        s = client.session("b3", QoS.BESTEFFORT, selector={"kind": "cpu"}, fallback=["gpu"])
        with s as lease:
            assert s.pool == lease.pool == "cpu-a"


def test_refusals_name_the_pool_and_arrive_typed() -> None:
    with running_server(pools_policy_yaml()) as server:

        async def go() -> None:
            async with AsyncClient(server.target, token=ACME) as acme:
                with pytest.raises(InvalidArgument, match="nowhere"):
                    async with acme.session("u1", pool="nowhere"):
                        pass
                with pytest.raises(InvalidArgument, match="pool"):  # several pools, none named
                    async with acme.session("u2"):
                        pass
                with pytest.raises(NoEligiblePool, match="tpu") as no_pool:
                    async with acme.session("u3", selector={"kind": "tpu"}):
                        pass
                assert no_pool.value.code is not None and no_pool.value.code.name == "FAILED_PRECONDITION"
            async with AsyncClient(server.target, token=GLOBEX) as globex:
                with pytest.raises(NoQuota, match="gpu") as denied:
                    async with globex.session("x1", QoS.BURSTABLE, pool="gpu"):
                        pass
                assert "burstable" in str(denied.value).lower()
                async with globex.session("x2", QoS.BURSTABLE, pool="cpu-a") as lease:
                    assert lease.pool == "cpu-a"  # the same tenant has quota in the CPU pools

        asyncio.run(go())


def test_a_pool_and_a_selector_or_a_lone_fallback_string_are_refused_before_any_call() -> None:
    client = AsyncClient("127.0.0.1:1", token=ACME)  # never dialled
    with pytest.raises(InvalidArgument, match="not both"):
        client.session("s", pool="gpu", selector={"kind": "gpu"})
    with pytest.raises(InvalidArgument, match="fallback"):
        client.session("s", pool="gpu", fallback="cpu-a")


def test_a_snapshot_ref_carries_its_pool_and_labels_both_ways() -> None:
    made = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    labels = {"cpuModel": "icelake"}
    ref = SnapshotRef("s3://b/k", 10, "ab" * 32, made, pool="cpu-a", labels=labels)
    labels["cpuModel"] = "changed"  # the ref keeps what it was made with
    back = SnapshotRef.from_proto(ref.to_proto())
    assert back == ref and back.pool == "cpu-a" and dict(back.labels) == {"cpuModel": "icelake"}
    assert hash(back) == hash(ref)
    assert SnapshotRef.from_proto(SnapshotRef("s3://b/old").to_proto()).labels == {}
    with pytest.raises(ValueError, match="labels"):
        SnapshotRef("s3://b/k", labels={"cpuModel": 1})  # type: ignore[dict-item]
