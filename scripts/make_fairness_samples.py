"""Derive the issue-23 samples in scheduler/sim/samples/ — deterministically, byte for byte.

Why: fairness between tenants is judged where it is hard, when tenants outnumber slots and the
lower classes compete for what the Guaranteed floor and Burstable nominals leave. Three
workloads, each with its policy (scheduler/sim/samples/README.md says what each asks):

- `many-tenants.csv`, `many-tenants-policy.yaml`: real sessions of the shipped Claude Code
  sample on the shipped Azure arrivals, spread over 13 Zipf-sized tenants, classes 15/45/40%
  G/B/BE, on a 10-slot pool (fewer slots than tenants: more tenants have work at the peak than
  there are slots). The same derivation as `slotsched trace import` with the arguments in
  SAMPLES below, and a policy sized by `scheduler/sim/traces/policy.py`.
- `claude-16x64.csv`, `claude-16x64-policy.yaml`: the shipped Claude Code sessions, 16 tenants,
  64 slots, mix 15/45/40%, 500 session starts over 2 h. A session keeps its slot through 120 s of
  idleness (`--gap-threshold 120`, where the other imports keep 30 s): so that 64 slots are
  contended by a workload small enough to ship (fewer, longer periods; 256 KB).
- `be-12x4.csv`, `be-12x4-policy.yaml`: 12 equal-weight BestEffort tenants on 4 slots, each with
  6 sessions of 1,800 s of work arriving in the first 12 s: demand far above supply through a
  3,000 s run.

Each policy states `spec.fairness.usageHalfLifeSeconds: 600` (the default, written out: the
samples are about it). The trace-derived workloads are byte for byte what `slotsched trace
import` writes with the same arguments (README gives the command lines); their policies are what
`--policy-out` writes plus that key.

    python scripts/make_fairness_samples.py                   # into scheduler/sim/samples/
    python scripts/make_fairness_samples.py --out /tmp/s      # elsewhere (what the test does)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core.types import QoS  # noqa: E402
from scheduler.policy.model import Policy, PoolSpec, QueueSpec, TenantSpec, TimingSpec  # noqa: E402
from scheduler.policy.yaml_io import policy_to_dict  # noqa: E402
from scheduler.sim.traces.convert import (  # noqa: E402
    SAMPLE_ARRIVALS,
    SAMPLE_SESSIONS,
    ImportConfig,
    import_files,
    samples_dir,
)
from scheduler.sim.traces.policy import policy_for  # noqa: E402
from scheduler.sim.workload import Period, SessionPlan, write_workload  # noqa: E402

HALF_LIFE_S = 600.0
MIX = (0.15, 0.45, 0.40)

# name -> `slotsched trace import` arguments (README "issue 23" rows print them as command lines).
SAMPLES: dict[str, dict[str, Any]] = {
    "many-tenants": {
        "tenants": 13,
        "limit": 130,
        "duration": 3600.0,
        "seed": 23,
        "workers": 5,
        "max_workers": 10,
    },
    "claude-16x64": {
        "tenants": 16,
        "limit": 500,
        "duration": 7200.0,
        "seed": 23,
        "workers": 32,
        "max_workers": 64,
        "gap_threshold": 120.0,
    },
}

BE_TENANTS, BE_SLOTS, BE_SESSIONS, BE_HOLD_S = 12, 4, 6, 1800.0


def import_command(name: str) -> str:
    """The `slotsched trace import` line that writes `name`.csv (and the policy, less fairness)."""
    a = SAMPLES[name]
    gap = f" --gap-threshold {a['gap_threshold']:g}" if "gap_threshold" in a else ""
    return (
        f"slotsched trace import --sessions $S/{SAMPLE_SESSIONS} --arrivals $S/{SAMPLE_ARRIVALS} "
        f"--tenants {a['tenants']} --mix {','.join(f'{x:g}' for x in MIX)} --limit {a['limit']} "
        f"--duration {a['duration']:g}{gap} --seed {a['seed']} --workers {a['workers']} "
        f"--max-workers {a['max_workers']} --out {name}.csv --policy-out {name}-policy.yaml"
    )


def policy_text(policy: Policy, comment: str) -> str:
    doc = policy_to_dict(policy)
    doc["spec"]["fairness"] = {"usageHalfLifeSeconds": HALF_LIFE_S}
    head = "".join(f"# {line}\n".replace("# \n", "#\n") for line in comment.splitlines())
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def imported(name: str, sessions: Path, arrivals: Path) -> tuple[list[SessionPlan], str]:
    a = SAMPLES[name]
    cfg = ImportConfig(
        gap_threshold_s=a.get("gap_threshold", 30.0),
        tenants=a["tenants"],
        mix=MIX,
        limit=a["limit"],
        seed=a["seed"],
        duration_s=a["duration"],
    )
    plans = import_files(sessions, arrivals, cfg)
    policy = policy_for(plans, a["workers"], 2, a["max_workers"])
    comment = (
        f"The policy of {name}.csv (scripts/make_fairness_samples.py): what\n"
        f"`{import_command(name)}`\n"
        "writes with --policy-out, plus spec.fairness (the default half-life, written out)."
    )
    return plans, policy_text(policy, comment)


def be_12x4() -> tuple[list[SessionPlan], str]:
    """12 equal-weight BestEffort tenants, 6 sessions each of 1,800 s, arriving 1 s apart by
    tenant (t01 at 0 s … t12 at 11 s, a tenant's sessions 0.01 s apart), on 4 slots."""
    names = [f"t{i + 1:02d}" for i in range(BE_TENANTS)]
    plans = [
        SessionPlan(
            f"{t}-{k + 1}", t, QoS.BEST_EFFORT, [Period(BE_HOLD_S, None, round(i + 0.01 * k, 2), 1 << 20)]
        )
        for i, t in enumerate(names)
        for k in range(BE_SESSIONS)
    ]
    policy = Policy(
        name="be-12x4",
        pool=PoolSpec(slots_per_worker=1, workers=BE_SLOTS, min_workers=1, max_workers=BE_SLOTS, floor=0),
        timing=TimingSpec(yield_grace_s=10, lease_ttl_s=30, min_runtime_s=60),
        queue=QueueSpec(max_pending=100_000, max_pending_per_tenant=100_000),
        tenants=tuple(TenantSpec(t, weight=1.0) for t in names),
    )
    comment = (
        "The policy of be-12x4.csv (scripts/make_fairness_samples.py): 4 slots, floor 0, 12 tenants\n"
        "of weight 1 with BestEffort allowed (no Guaranteed, no Burstable), min runtime 60 s, recent\n"
        "usage in the share with a 600 s half-life. Run it with --until 3000."
    )
    return plans, policy_text(policy, comment)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=samples_dir(), help="default: scheduler/sim/samples/")
    a = p.parse_args(argv)
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    shipped = samples_dir()
    built = {name: imported(name, shipped / SAMPLE_SESSIONS, shipped / SAMPLE_ARRIVALS) for name in SAMPLES}
    built["be-12x4"] = be_12x4()
    for name, (plans, policy) in built.items():
        write_workload(out / f"{name}.csv", plans)
        (out / f"{name}-policy.yaml").write_text(policy)
        tenants = len({x.tenant for x in plans})
        print(f"wrote {out / name}.csv ({len(plans)} sessions, {tenants} tenants) and {name}-policy.yaml")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
