"""What `simulate --compare` adds for a budget run: the report's "Token budgets" section, its two
plots, and each contender's `budget` entry in `--json`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler.policy.model import Policy
from scheduler.sim.budget.figures import budget_json, cap_json
from scheduler.sim.budget.report import render_section
from scheduler.sim.budget.run import SLOTSCHED, BudgetResult, has_budget_run, run_budgets
from scheduler.sim.budget.setup import setup_of
from scheduler.sim.workload import SessionPlan
from snapshots.extras import MissingExtra


def budget_compare(
    policy: Policy,
    plans: Sequence[SessionPlan],
    args: argparse.Namespace,
    until_s: float | None,
    report: Path,
    doc: dict[str, Any],
) -> list[BudgetResult]:
    """Run the budget contenders when the workload carries calls and the policy a budget; append
    their section to `report`, their `budget` entries to `doc["policies"]` (a slot contender of
    the same name gets it in its entry), and slotsched's autoscaler with and without its budget
    cap side by side to `doc["budget_cap"]`. Nothing when there is no budget run."""
    if not has_budget_run(policy, plans):
        return []
    fraction = getattr(args, "provider_limit", None) or 1.0
    budget = getattr(args, "budget", None)
    headers = not getattr(args, "no_provider_headers", False)
    setup = setup_of(policy, budget, fraction, headers=headers)

    def progress(name: str) -> None:
        if sys.stderr.isatty():
            print(f"\rbudget: {name:<28}", end="", file=sys.stderr, flush=True)

    seed = getattr(args, "seed", 0) or 0
    results = run_budgets(policy, plans, until_s, fraction, budget, seed, progress, headers)
    if sys.stderr.isatty():
        print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
    images: list[str] = []
    try:
        from scheduler.sim.budget.plots import draw
    except MissingExtra as e:
        print(f"budget plots not drawn: {e}", file=sys.stderr)
    else:
        images = [p.name for p in draw(results, report.parent)]
    report.write_text(report.read_text().rstrip("\n") + "\n\n" + render_section(results, setup, images))
    policies = doc.setdefault("policies", {})
    for r in results:
        policies.setdefault(r.name, {})["budget"] = budget_json(r.figures)
    mine = [r for r in results if r.autoscaler and r.contender.name == SLOTSCHED]
    capped = next((r.figures for r in mine if r.capped), None)
    nocap = next((r.figures for r in mine if not r.capped), None)
    if capped is not None and nocap is not None:
        doc["budget_cap"] = cap_json(capped, nocap)
    return results
