"""A dry run changes nothing anywhere: `serve --autoscaler dry-run` beside static workers drains,
deregisters and starts no worker; it logs and counts what it would do."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from scheduler.core.engine import Core
from scheduler.core.types import Decision, WorkerAdded, WorkerId
from slots.actuators.dry_run import DryRunActuator
from slots.autoscaler.demand import CoreDemand, CoreMembership
from slots.autoscaler.loop import Autoscaler
from tests.test_autoscaler_loop import policy

#: Two static workers of 2 slots, no load and a minimum of 0: every tick would scale down.
POLICY_YAML = """\
apiVersion: slotsched.dev/v1alpha1
kind: SchedulingPolicy
metadata: {name: dry}
spec:
  pool: {slotsPerWorker: 2, workers: 2, minWorkers: 0, maxWorkers: 4, floor: 0}
  autoscaler: {scaleDownStabilizationSeconds: 0, scaleDownCooldownSeconds: 0, scaleUpCooldownSeconds: 0}
  tenants:
    - {name: t, burstable: {nominal: 4, limit: 4}}
"""


def test_a_dry_run_serve_leaves_static_workers_and_capacity_as_they_are(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from scheduler.serve import start_server

    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_YAML)

    async def go() -> None:
        env = {"SLOTSCHED_AUTOSCALER": "dry-run"}
        running = await start_server(str(path), metrics_listen=None, static_pool=True, autoscaler_env=env)
        try:
            before = running.loop.core.describe()
            assert before.capacity == 4 and len(before.workers) == 2
            assert running.autoscalers is not None
            start = running.loop.now()
            for i in range(6):  # several decisions, each one a scale-down
                running.autoscalers.tick(start + 1000.0 * (i + 1))
            after = running.loop.core.describe()
            assert after.capacity == before.capacity
            assert [(w.worker_id, w.state, w.slots) for w in after.workers] == [
                (w.worker_id, w.state, w.slots) for w in before.workers
            ]
            loop = running.autoscalers.loops[next(iter(running.autoscalers.loops))]
            assert loop.last is not None and loop.last.decision is not None
            assert loop.last.decision.desired < 2 and loop.last.would_drain  # it would scale down
            assert loop.last.drained == () and loop.last.removed == ()
            dry = running.autoscalers.actuators[loop.pool or next(iter(running.autoscalers.actuators))]
            assert isinstance(dry, DryRunActuator)
            assert ("drain", loop.last.would_drain) in dry.calls
            registry = running.loop.metrics.registry  # type: ignore[union-attr]
            drains = registry.get_sample_value(
                "slotsched_autoscaler_dry_run_actions_total", {"action": "drain"}
            )
            assert drains is not None and drains >= 6
        finally:
            await running.stop(0)

    with caplog.at_level(logging.INFO, logger="slotsched.actuators.dry_run"):
        asyncio.run(go())
    assert any("would drain workers local-" in r.getMessage() for r in caplog.records)


def test_a_dry_run_loop_never_touches_the_membership() -> None:
    """Table of the loop's calls on the membership in a dry run: none, whatever the decision."""
    core = Core(policy())
    calls: list[object] = []

    class Watching(CoreMembership):
        def drain(self, worker_id: WorkerId, yield_within_s: float | None) -> list[Decision]:
            calls.append(("drain", worker_id))
            return super().drain(worker_id, yield_within_s)

        def deregister(self, worker_id: WorkerId) -> list[Decision]:
            calls.append(("deregister", worker_id))
            return super().deregister(worker_id)

    for i in range(3):
        core.handle(WorkerAdded(WorkerId(f"w{i}"), 2, f"w{i}:1"), 0.0)
    membership = Watching(lambda ev: core.handle(ev, 0.0))
    auto = Autoscaler(
        CoreDemand(core.describe, lambda: core.policy), membership, DryRunActuator(), lambda: core.policy
    )
    reports = [auto.tick(100.0 * i) for i in range(5)]
    assert calls == []
    assert any(r.would_drain for r in reports)
    assert len(core.describe().workers) == 3 and all(
        w.state.value == "ready" for w in core.describe().workers
    )
