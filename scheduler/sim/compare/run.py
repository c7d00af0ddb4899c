"""`slotsched simulate --compare`: slotsched and every baseline on one workload and one pool.

Why: a scheduler's claims only mean something next to what people run today. Every contender
(see `contenders.py`) runs on the same plans, the same policy's pool and the same simulated
holders; refused holders retry (1.5-3 s seeded jitter), so a rejecting runtime's client-side
queue is measured too. Output: DIR/report.md (one table, verdicts), three PNGs, a progress bar
on stderr, and with --json `{"policies": {name: {…simulate --json keys…, worker_seconds,
scale_actions, sla_misses, guaranteed_by_quota, jain_under_contention}}}` on stdout (the
simulate keys include each tenant's first grant and waits, `tenants.<t>`). report.md has a
per-tenant section too (`tenants.py`); without --json stdout shows the main table and its
first per-tenant table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from scheduler.policy.model import Policy, PoolSpec
from scheduler.sim.compare.contenders import STATIC, Contender, roster
from scheduler.sim.compare.metrics import RunFigures, figures, json_entry, sla_target
from scheduler.sim.compare.report import render
from scheduler.sim.simulator import SimConfig, Simulator
from scheduler.sim.stats import SimStats
from scheduler.sim.workload import SessionPlan, describe_tenants
from snapshots.extras import MissingExtra

SAMPLES = 400  # time-series points per run, for the plots


class Progress:
    """A one-line bar on stderr: redrawn in place on a terminal, one line per run otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self.name = ""
        self.started = time.monotonic()

    def update(self, frac: float) -> None:
        if not self.tty:
            return
        whole = (self.done + min(1.0, frac)) / self.total
        bar = "#" * int(30 * whole)
        self.stream.write(f"\rcompare [{bar:<30}] {whole:5.1%}  {self.done + 1}/{self.total} {self.name:<22}")
        self.stream.flush()

    def start(self, name: str) -> None:
        self.name = name
        self.update(0.0)

    def finish(self) -> None:
        self.done += 1
        if not self.tty:
            secs = time.monotonic() - self.started
            self.stream.write(f"compare: {self.done}/{self.total} {self.name} done ({secs:.0f} s elapsed)\n")
        elif self.done == self.total:
            self.stream.write("\r" + " " * 80 + "\r")
        self.stream.flush()


def sample_every(plans: Sequence[SessionPlan], until: float | None) -> float:
    """About SAMPLES points over the run (its end estimated from the unconstrained timeline)."""
    end = until or max(
        (p.arrival_s + sum(x.hold_s + (x.think_s or 0) for x in p.periods) for p in plans), default=1
    )
    return max(1.0, end / SAMPLES)


def run_one(
    c: Contender,
    policy: Policy,
    plans: Sequence[SessionPlan],
    config: SimConfig,
    progress: Callable[[float], None],
) -> Simulator:
    sim = Simulator(policy, list(plans), config, hook=c.hook() if c.hook else None, decider=c.decider)
    sim.run(progress)
    return sim


def compare(
    policy: Policy,
    plans: Sequence[SessionPlan],
    config: SimConfig,
    contenders: Sequence[Contender] | None = None,
    stream: TextIO | None = None,
    refused: int = 0,
) -> list[tuple[Contender, SimStats, RunFigures]]:
    """Run every contender; returns each with its stats and figures, in roster order. `refused`:
    sessions left out of `plans` (their tenant is unknown) that every contender counts as refused."""
    if contenders is None and len(policy.pool_names()) > 1:
        # The elastic pool hooks size one pool: with several, only the static group runs.
        print(
            "note: several pools: the elastic contenders (autoscalers) are left out",
            file=stream or sys.stderr,
        )
        contenders = STATIC
    cs = list(contenders or roster())
    bar = Progress(len(cs), stream)
    out = []
    for c in cs:
        bar.start(c.name)
        sim = run_one(c, policy, plans, config, bar.update)
        sim.stats.refusals += refused
        if refused:
            sim.stats.refusals_by_reason["unknown_tenant"] += refused
        bar.finish()
        fig = figures(
            c.name, sim.stats, policy, plans, config.checkpoint_s, sim.waiting_by_tenant, sim.points
        )
        out.append((c, sim.stats, fig))
    return out


def _short(path: object) -> str:
    """A path relative to the working directory when it is under it (a command to paste)."""
    p = Path(str(path))
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def pools_line(policy: Policy) -> str:
    """`Pool: 2 workers x 4 slots, floor 2`, or every pool of several, each with its own figures
    (and the slots they add up to: the plots draw that sum)."""
    specs = policy.pool_specs()

    def one(p: PoolSpec) -> str:
        slots = p.workers * p.slots_per_worker
        unit = "slot" if p.slots_per_worker == 1 else "slots"
        workers = "worker" if p.workers == 1 else "workers"
        return f"{p.workers} {workers} x {p.slots_per_worker} {unit}, floor {p.floor_slots(slots)}"

    if len(specs) == 1:
        return f"Pool: {one(specs[0])}"
    total = sum(p.workers * p.slots_per_worker for p in specs)
    each = "; ".join(f"`{p.name}` {one(p)}" for p in specs)
    return f"Pools ({len(specs)}, {total} slots in all): {each}"


def header_lines(policy: Policy, plans: Sequence[SessionPlan], config: SimConfig, args: Any) -> list[str]:
    timing = policy.timing
    periods = sum(len(p.periods) for p in plans)
    classes: dict[str, int] = {}
    for p in plans:
        classes[p.qos.value] = classes.get(p.qos.value, 0) + 1
    cmd = "slotsched simulate --compare"
    for flag, attr in (("--policy", "policy"), ("--workload", "workload"), ("--out", "out")):
        v = getattr(args, attr, None)
        if v:
            cmd += f" {flag} {_short(v)}"
    if config.until_s is not None:
        cmd += f" --until {config.until_s:g}"
    holds = sum(p.total_hold_s for p in plans)
    tenants = len({p.tenant for p in plans})
    target = sla_target(policy, config.checkpoint_s)
    stop = f"; stopped at {config.until_s:g} s (what is left counts as unfinished)" if config.until_s else ""
    return [
        f"Workload: {len(plans)} sessions, {periods} active periods, {holds:.0f} slot-s of holds, "
        f"{tenants} tenants; classes " + ", ".join(f"{k} {v}" for k, v in sorted(classes.items())) + ".",
        f"{pools_line(policy)}; yield grace {timing.yield_grace_s:g} s, "
        f"checkpoint {config.checkpoint_s:g} s, "
        f"lease TTL {timing.lease_ttl_s:g} s, min runtime {timing.min_runtime_s:g} s{stop}.",
        f"Guaranteed SLA target: yieldGraceSeconds + checkpoint = {target:g} s, for requests within "
        "their tenant's Guaranteed quota (beyond it, a request waits for the tenant's own leases).",
        "",
        f"Reproduce: `{cmd}`",
    ]


def draw_plots(
    results: Sequence[tuple[Contender, SimStats, RunFigures]], out: Path
) -> tuple[list[Path], str]:
    """The PNGs, or none and a line saying why: matplotlib is the `sim` extra, but a report and the
    JSON are worth having from an install that lacks it (or whose matplotlib is broken)."""
    try:
        from scheduler.sim.compare.plots import draw_all
    except MissingExtra as e:  # names the extra to install
        return [], f"plots not drawn: {e}"
    images = draw_all([(c.name, s) for c, s, _ in results], out, {c.name: c.group for c, _, _ in results})
    return images, ""


def write_outputs(
    results: Sequence[tuple[Contender, SimStats, RunFigures]],
    policy: Policy,
    plans: Sequence[SessionPlan],
    config: SimConfig,
    out: Path,
    args: Any,
    refused_unknown: Mapping[str, int] | None = None,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    images, missing = draw_plots(results, out)
    if missing:
        print(missing, file=sys.stderr)
    header = header_lines(policy, plans, config, args)
    if refused_unknown:
        header.insert(
            1,
            f"Refused, not simulated (tenants the policy lacks; counted in refusals): "
            f"{describe_tenants(dict(refused_unknown))}.",
        )
    text = render(
        [c for c, _, _ in results],
        [f for _, _, f in results],
        sla_target(policy, config.checkpoint_s),
        config.checkpoint_s,
        header,
        [p.name for p in images],
        missing,
    )
    report = out / "report.md"
    report.write_text(text)
    return report


def run_compare(
    policy: Policy,
    plans: list[SessionPlan],
    args: argparse.Namespace,
    refused_unknown: Mapping[str, int] | None = None,
) -> int:
    checkpoint = getattr(args, "checkpoint_seconds", 2.0)
    until = getattr(args, "until", None)
    config = SimConfig(
        checkpoint_s=checkpoint,
        until_s=until,
        sample_every_s=sample_every(plans, until),
        retry_refused=True,
        seed=getattr(args, "seed", 0) or 0,
    )
    refused = sum((refused_unknown or {}).values())
    results = compare(policy, plans, config, refused=refused)
    report = write_outputs(results, policy, plans, config, Path(args.out), args, refused_unknown)
    doc: dict[str, Any] = {"policies": {c.name: json_entry(s, f) for c, s, f in results}}
    # Token budgets (scheduler/sim/budget): a section, two plots and `budget` entries of their own.
    from scheduler.sim.budget.outputs import budget_compare

    budget_compare(policy, plans, args, until, report, doc)
    if args.json:
        print(json.dumps(doc))
    else:
        text = report.read_text()
        table = [ln for ln in text.splitlines() if ln.startswith("|")]
        print("\n".join(table))
        per_tenant = (
            text.split("## Per tenant\n", 1)[1].split("\n\n", 2)[1] if "## Per tenant\n" in text else ""
        )
        if per_tenant:  # its first table: first grant, waits, slot-seconds of each tenant
            print("\nper tenant: first grant (s) · time-to-slot p50/p99/max (s) · slot-s\n" + per_tenant)
        print(f"\nreport: {report}")
    return 0
