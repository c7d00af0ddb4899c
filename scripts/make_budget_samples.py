"""Derive the token-budget sample in scheduler/sim/samples/: `claude-budget.csv.xz` (sessions with
their LLM calls) and `claude-budget-policy.yaml` (its pool, tenants and budget), deterministically.

The workload is `slotsched trace import --calls` of the full Claude Code sessions trace (710
sessions; not shipped: pass its path) with the shipped Azure arrivals: 150 sessions started over
30 minutes, 8 Zipf-sized tenants, classes 15/45/40% G/B/BE. The policy is the one `--policy-out`
sizes for the slots (40 workers x 2, at most 80), plus one budget, `claude`, sized to bind at the
peak:

- input tokens per minute: `INPUT_PER_MIN` (the unconstrained demand peaks near 16 M a minute,
  and stays above 10 M for about 25 minutes), output tokens and requests far from binding;
- a tenant with Guaranteed sessions reserves its peak Guaranteed input tokens in a minute of the
  unconstrained timeline, the reservations scaled down together to at most `RESERVED_CAP` of the
  budget (a floor a platform would sign, not the sum of every peak);
- the effective limit's floor under the provider's 429s (`feedback.minimum`) is the reservations'
  sum, so that the feedback never scales a reservation down;
- Burstable nominals split `NOMINAL_FRACTION` of what is not reserved by each tenant's Burstable
  input tokens; Burstable limit: the whole budget; BestEffort: no cap (what is left).

The provider's real limit is not a key: `simulate --compare --provider-limit 0.8333` runs it at
1/1.2 of the configured limit (configured 20% above the real one).

    python scripts/make_budget_samples.py --sessions ../shared/data/claude_code_agent_sessions.csv
"""

from __future__ import annotations

import argparse
import lzma
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core.types import QoS  # noqa: E402
from scheduler.policy.model import (  # noqa: E402
    BudgetFeedback,
    BudgetRate,
    BudgetSpec,
    FairnessSpec,
    Policy,
    TenantBudgetQuota,
)
from scheduler.policy.yaml_io import policy_to_yaml  # noqa: E402
from scheduler.sim.traces.convert import ImportConfig, exact_counts, import_files, samples_dir  # noqa: E402
from scheduler.sim.traces.policy import policy_for  # noqa: E402
from scheduler.sim.workload import SessionPlan, write_workload  # noqa: E402

WORKLOAD = "claude-budget.csv.xz"  # 316 kB of CSV, 100 kB compressed
BUDGET = "claude"
INPUT_PER_MIN = 6_000_000
OUTPUT_PER_MIN = 2_000_000
REQUESTS_PER_MIN = 2_000
RESERVED_CAP = 0.4
NOMINAL_FRACTION = 0.4
CONFIG = ImportConfig(tenants=8, mix=(0.15, 0.45, 0.4), limit=150, seed=43, duration_s=1800.0, calls=True)
WORKERS, MAX_WORKERS, SLOTS_PER_WORKER = 40, 80, 2
HEADER = """\
# The policy of claude-budget.csv.xz (scripts/make_budget_samples.py): the slots as `slotsched
# trace import --calls --tenants 8 --mix 0.15,0.45,0.4 --limit 150 --duration 1800 --seed 43
# --workers 40 --max-workers 80` sizes them, and one token budget, `claude`, that binds at the
# peak (input tokens; the demand peaks near 16 M a minute): Guaranteed reserves each tenant's peak
# Guaranteed minute (scaled to 40% of the budget in all), Burstable nominals split 40% of the rest,
# BestEffort takes what is left; the provider's 429s never lower the effective limit below the
# reservations (feedback.minimum 0.4).
"""


def budget_policy(plans: list[SessionPlan], base: Policy) -> Policy:
    g_peak: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    b_tokens: dict[str, float] = defaultdict(float)
    for p in plans:
        for c in p.calls:
            if p.qos is QoS.GUARANTEED:
                g_peak[p.tenant][int((p.arrival_s + c.offset_s) // 60)] += c.input_tokens
            elif p.qos is QoS.BURSTABLE:
                b_tokens[p.tenant] += c.input_tokens
    peaks = {t: max(m.values()) for t, m in g_peak.items()}
    scale = min(1.0, RESERVED_CAP * INPUT_PER_MIN / max(1.0, sum(peaks.values())))
    reserved = {t: int(v * scale) for t, v in peaks.items()}
    names = [t.name for t in base.tenants]
    rest = INPUT_PER_MIN - sum(reserved.values())
    nominal_total = int(rest * NOMINAL_FRACTION)
    weights = [b_tokens.get(t, 0.0) for t in names]
    nominals = dict(zip(names, exact_counts(nominal_total, weights), strict=True))

    def rate(tokens: int) -> BudgetRate:
        # Output and requests in proportion (the same percent of those limits).
        pct = tokens / INPUT_PER_MIN
        return BudgetRate(
            input_tokens=tokens,
            output_tokens=max(1, int(OUTPUT_PER_MIN * pct)),
            requests=max(1, int(REQUESTS_PER_MIN * pct)),
        )

    tenants = []
    for t in base.tenants:
        q = TenantBudgetQuota(
            budget=BUDGET,
            reserved=rate(reserved[t.name]) if reserved.get(t.name) else None,
            burstable_nominal=rate(nominals[t.name]) if nominals[t.name] else None,
            burstable_limit=BudgetRate(percent=100.0),
            best_effort_limit=BudgetRate(percent=100.0),
        )
        tenants.append(t.__class__(**{**t.__dict__, "budgets": (q,)}))
    spec = BudgetSpec(
        BUDGET,
        input_tokens_per_minute=INPUT_PER_MIN,
        output_tokens_per_minute=OUTPUT_PER_MIN,
        requests_per_minute=REQUESTS_PER_MIN,
        # The effective limit never drops below the reservations: below them the core scales every
        # reserved rate down, and a Guaranteed call within its reservation waits.
        feedback=BudgetFeedback(minimum=RESERVED_CAP),
    )
    pool = base.pool.__class__(**{**base.pool.__dict__, "budgets": (BUDGET,)})
    return base.__class__(
        **{
            **base.__dict__,
            "tenants": tuple(tenants),
            "budgets": (spec,),
            "pool": pool,
            "fairness": FairnessSpec(),
        }
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", required=True, help="the full claude_code_agent_sessions.csv")
    ap.add_argument("--out", default=str(samples_dir()), help="folder to write (default: the samples)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plans = import_files(args.sessions, samples_dir() / "azure_llm_conv_2023_sample.csv", CONFIG)
    with tempfile.TemporaryDirectory() as tmp:  # shipped compressed (the samples' size budget)
        csv_path = Path(tmp) / "claude-budget.csv"
        write_workload(csv_path, plans)
        (out / WORKLOAD).write_bytes(lzma.compress(csv_path.read_bytes(), preset=9))
    base = policy_for(plans, WORKERS, SLOTS_PER_WORKER, MAX_WORKERS)
    policy = budget_policy(plans, base)
    (out / "claude-budget-policy.yaml").write_text(HEADER + policy_to_yaml(policy))
    print(f"wrote {out}/{WORKLOAD} ({len(plans)} sessions) and claude-budget-policy.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
