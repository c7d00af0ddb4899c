"""The per-tenant fairness contract of docs/design.md ("Who gets the next free slot"), measured on
the shipped samples: slotsched against strict priority, one line of figures per sample, then a
table per sample (per tenant and class: p99 time-to-slot and fair-share attainment).

The figures, per sample (`--until` as in scheduler/sim/samples/README.md):
  attainment_min  lowest fair-share attainment over tenants (scheduler/sim/attainment.py)
  light_med, light_max   over tenants whose demand (slot-seconds of holds) is below the median:
                  median and max of BestEffort p99 / the same tenant's BestEffort p99 under strict
                  priority (a strict p99 below 1 s counts as 1 s: a ratio of seconds to nothing
                  says nothing)
  heavy_max       max over every tenant of its Burstable or BestEffort p99 / its own under strict
                  priority (same floor)
  jain            Jain's index under contention (strict priority's beside it)
  g_misses        Guaranteed waits within quota above grace + checkpoint
  first_grant     the latest first grant (s) and the slot-seconds spread (be-12x4's bound)

    python bench/fairness_contract.py                        # the three fairness samples
    python bench/fairness_contract.py --samples many-tenants --window 0 --half-life 600
    python bench/fairness_contract.py --jain-only            # every other shipped sample: Jain

Last line: key=value pairs (per sample: <sample>_attainment_min=…, <sample>_jain=…).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.policy.model import Policy  # noqa: E402
from scheduler.policy.yaml_io import load_policy  # noqa: E402
from scheduler.sim.compare.contenders import STATIC  # noqa: E402
from scheduler.sim.compare.metrics import RunFigures  # noqa: E402
from scheduler.sim.compare.run import compare, sample_every  # noqa: E402
from scheduler.sim.simulator import SimConfig  # noqa: E402
from scheduler.sim.traces.convert import samples_dir  # noqa: E402
from scheduler.sim.workload import load_workload  # noqa: E402

# name: (policy file, workload file, --until)
FAIRNESS = {
    "many-tenants": ("many-tenants-policy.yaml", "many-tenants.csv", 14400.0),
    "claude-16x64": ("claude-16x64-policy.yaml", "claude-16x64.csv", 14400.0),
    "be-12x4": ("be-12x4-policy.yaml", "be-12x4.csv", 3000.0),
}
OTHERS = {
    "agent-sessions": ("agent-sessions-policy.yaml", "agent-sessions.csv", 14400.0),
    "two-incidents": ("policy.yaml", "two-incidents.csv", 14400.0),
    "busy-300": ("policy.yaml", "busy-300.csv", 14400.0),
    "pools-cpu-gpu": ("pools-cpu-gpu-policy.yaml", "pools-cpu-gpu.csv", 3600.0),
}
CLASSES = ("guaranteed", "burstable", "besteffort")
FLOOR_S = 1.0


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return a / max(b, FLOOR_S)


def _p99(f: RunFigures, tenant: str, cls: str) -> float | None:
    t = f.tenants.get(tenant)
    return None if t is None else t["waits_by_class"][cls]["p99"]


def contract(s: RunFigures, sp: RunFigures, demand: dict[str, float]) -> dict[str, Any]:
    """The contract figures of one sample: slotsched `s` against strict priority `sp`."""
    med = statistics.median(demand.values())
    light = sorted(t for t, d in demand.items() if d < med)
    light_r = [
        r for t in light if (r := _ratio(_p99(s, t, "besteffort"), _p99(sp, t, "besteffort"))) is not None
    ]
    heavy_r = [
        r
        for t in demand
        for c in ("burstable", "besteffort")
        if (r := _ratio(_p99(s, t, c), _p99(sp, t, c))) is not None
    ]
    return {
        "attainment_min": s.attainment_min,
        "attainment_min_strict": sp.attainment_min,
        "light_med": statistics.median(light_r) if light_r else None,
        "light_max": max(light_r, default=None),
        "heavy_max": max(heavy_r, default=None),
        "jain": s.jain_contended,
        "jain_strict": sp.jain_contended,
        "g_misses": s.sla_misses,
        "g_max": s.waits["guaranteed"][2],
        "first_grant": s.first_grant_max,
        "spread": s.share_spread,
        "preemptions": s.preemptions,
    }


def _f(v: Any) -> str:
    if v is None:
        return "—"
    return (
        f"{v:.3f}"
        if isinstance(v, float) and abs(v) < 10
        else (f"{v:,.0f}" if isinstance(v, float) else str(v))
    )


def per_tenant(s: RunFigures, sp: RunFigures, demand: dict[str, float]) -> dict[str, Any]:
    """Per tenant: demand, and p99 and attainment by class (attainment also `all`), for slotsched
    and strict priority; what `table` prints and `--json` keeps."""
    out = {}
    for t in demand:
        out[t] = {"demand": demand[t]}
        for key, f in (("s", s), ("sp", sp)):
            att = f.tenants.get(t, {}).get("attainment", {})
            out[t][key] = {
                "p99": {c: _p99(f, t, c) for c in CLASSES},
                "att": {c: att.get(c) for c in (*CLASSES, "all")},
            }
    return out


def table(rows: dict[str, Any], before: dict[str, Any] | None) -> list[str]:
    """Per tenant (heaviest first) and class: p99 (s) and attainment, slotsched / strict priority,
    or slotsched / the tree before (`--before`) / strict priority."""
    cols = "now / before / strict" if before else "slotsched / strict"
    lines = [
        f"| tenant | demand slot-s | class | p99 s ({cols}) | attainment ({cols}) |",
        "|---|---|---|---|---|",
    ]
    for t in sorted(rows, key=lambda n: -rows[n]["demand"]):
        r, b = rows[t], (before or {}).get(t)
        for c in (*CLASSES, "all"):
            att = [r["s"]["att"][c], *([b["s"]["att"][c]] if b else []), r["sp"]["att"][c]]
            p99 = [r["s"]["p99"].get(c), *([b["s"]["p99"].get(c)] if b else []), r["sp"]["p99"].get(c)]
            if all(v is None for v in att + p99):
                continue
            p = " / ".join(_f(v) for v in p99) if c != "all" else ""
            lines.append(f"| {t} | {r['demand']:,.0f} | {c} | {p} | {' / '.join(_f(v) for v in att)} |")
    return lines


def run_sample(
    name: str, files: tuple[str, str, float], fairness: dict[str, float], jain_only: bool
) -> tuple[dict[str, Any], list[str]]:
    pol_file, wl_file, until = files
    policy: Policy = load_policy(samples_dir() / pol_file)[0]
    if fairness:
        policy = dataclasses.replace(policy, fairness=dataclasses.replace(policy.fairness, **fairness))
    plans = load_workload(samples_dir() / wl_file)
    config = SimConfig(
        checkpoint_s=2.0, until_s=until, sample_every_s=sample_every(plans, until), retry_refused=True
    )
    cs = [c for c in STATIC if c.name in ("slotsched",) + (() if jain_only else ("strict-priority",))]
    results = compare(policy, plans, config, cs, stream=sys.stderr)
    s = results[0][2]
    if jain_only:
        return {
            "jain": s.jain_contended,
            "attainment_min": s.attainment_min,
            "preemptions": s.preemptions,
        }, []
    sp = results[1][2]
    demand: dict[str, float] = {}
    for p in plans:
        demand[p.tenant] = demand.get(p.tenant, 0.0) + p.total_hold_s
    return contract(s, sp, demand), per_tenant(s, sp, demand)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", default=",".join(FAIRNESS), help="comma-separated sample names")
    p.add_argument("--jain-only", action="store_true", help="the other shipped samples, Jain only")
    p.add_argument("--window", type=float, default=None, help="override spec.fairness.shareWindowSeconds")
    p.add_argument("--half-life", type=float, default=None, help="override usageHalfLifeSeconds")
    p.add_argument("--json", default=None, help="also write every figure, per tenant too, to this file")
    p.add_argument("--before", default=None, help="a --json file of another tree: its figures beside")
    args = p.parse_args(argv)
    fairness: dict[str, float] = {}
    if args.window is not None:
        fairness["share_window_s"] = args.window
    if args.half_life is not None:
        fairness["usage_half_life_s"] = args.half_life
    every = OTHERS if args.jain_only else FAIRNESS
    names = list(every) if args.jain_only else args.samples.split(",")
    before = json.loads(Path(args.before).read_text()) if args.before else {}
    out: dict[str, Any] = {}
    last = []
    for name in names:
        figs, rows = run_sample(name, every[name], fairness, args.jain_only)
        out[name] = {"figures": figs, "tenants": rows}
        print(f"## {name}: " + " ".join(f"{k}={_f(v)}" for k, v in figs.items()))
        if name in before:
            print("   before: " + " ".join(f"{k}={_f(v)}" for k, v in before[name]["figures"].items()))
        if rows:
            print("\n".join(table(rows, before.get(name, {}).get("tenants"))) + "\n")
        last += [
            f"{name}_{k}={_f(figs[k])}"
            for k in ("attainment_min", "jain")
            + (() if args.jain_only else ("light_med", "light_max", "heavy_max"))
        ]
        sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(" ".join(last))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
