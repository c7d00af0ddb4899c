"""Keys read only at start are marked in what `policy apply` and the server's log say: a change of
`workers` does not pass for one that resized the pool. One table (schema.RESTART_ONLY), which
docs/design.md lists."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.policy.diff import RESTART_NOTE, diff_lines, diff_policies, summary
from scheduler.policy.model import Policy, PoolSpec, TenantSpec
from scheduler.policy.schema import RESTART_ONLY

ROOT = Path(__file__).resolve().parents[1]


def _two_pools(**cpu: object) -> Policy:
    spec = {"slots_per_worker": 2, "workers": 2, "min_workers": 1, "max_workers": 6, "floor": 0, **cpu}
    return Policy(
        pools=(
            PoolSpec(name="cpu", **spec),  # type: ignore[arg-type]
            PoolSpec(
                name="gpu",
                labels=(("gpu", "true"),),
                slots_per_worker=1,
                workers=1,
                min_workers=1,
                max_workers=4,
                floor=0,
            ),
        ),
        tenants=(TenantSpec("t", burstable_nominal=4, burstable_limit=4),),
    )


@pytest.mark.parametrize(
    ("old", "new", "path", "restart"),
    [
        (Policy(pool=PoolSpec(workers=2)), Policy(pool=PoolSpec(workers=3)), "pool.workers", True),
        (
            Policy(pool=PoolSpec(slots_per_worker=4)),
            Policy(pool=PoolSpec(slots_per_worker=8)),
            "pool.slotsPerWorker",
            True,
        ),
        (
            Policy(pool=PoolSpec(max_workers=4)),
            Policy(pool=PoolSpec(max_workers=8)),
            "pool.maxWorkers",
            False,
        ),
        (_two_pools(), _two_pools(workers=3), "pools[cpu].workers", True),
        (_two_pools(), _two_pools(target="Deployment/cpu"), "pools[cpu].target", True),
        (_two_pools(), _two_pools(min_workers=2), "pools[cpu].minWorkers", False),
    ],
)
def test_a_change_read_only_at_start_says_so(old: Policy, new: Policy, path: str, restart: bool) -> None:
    d = diff_policies(old, new)
    [change] = [c for c in d.changes if c.path == path]
    lines = [line for line in diff_lines(d) if line.startswith(f"~ {path}:")]
    assert len(lines) == 1
    assert (RESTART_NOTE in lines[0]) is restart
    assert (RESTART_NOTE in summary(d)) is restart  # the server's log line of the apply
    assert (change.restart is not None) is restart


def test_a_tenant_quota_named_like_a_restart_key_is_live() -> None:
    old = Policy(tenants=(TenantSpec("workers", burstable_nominal=2, burstable_limit=2),))
    new = replace(old, tenants=(TenantSpec("workers", burstable_nominal=3, burstable_limit=3),))
    assert all(RESTART_NOTE not in line for line in diff_lines(diff_policies(old, new)))


def test_the_design_lists_every_restart_only_key() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    m = re.search(r"read only when the scheduler starts[^.]*?:([^.]*)\.", design)
    assert m is not None
    assert set(re.findall(r"`(\w+)`", m.group(1))) == set(RESTART_ONLY)
