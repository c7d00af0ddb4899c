"""The "Token budgets" section of the comparison's report.md: one table per group (a static pool,
and with the autoscaler), and the checks the issue's figures ask, each with its numbers.

Which Guaranteed figure is compared: time to permit of Guaranteed calls within their tenant's
reserved rate (what a reservation promises); all Guaranteed calls are in the table too.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.sim.budget.figures import BudgetFigures
from scheduler.sim.budget.run import AUTOSCALER, SLOTSCHED, BudgetResult
from scheduler.sim.budget.setup import BudgetSetup
from scheduler.sim.stats import percentile

COLUMNS = (
    "contender",
    "provider 429s (after convergence)",
    "utilization",
    "G within reserved p99 (s)",
    "G p50 / p99 (s)",
    "B p99 (s)",
    "BE p99 (s)",
    "attainment min",
    "stretch p50 / mean / p90",
    "worker-s",
    "sessions done",
)


def _s(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{nd}f}"


def _stretch(f: BudgetFigures) -> tuple[float | None, float | None]:
    v = f.stretches["all"]
    return (percentile(v, 50), sum(v) / len(v)) if v else (None, None)


def _p90(f: BudgetFigures) -> float | None:
    v = f.stretches["all"]
    return percentile(v, 90) if v else None


def row(f: BudgetFigures) -> str:
    g = f.waits["guaranteed"]
    p50, mean = _stretch(f)
    cells = (
        f"**{f.name}**" if f.name.startswith(SLOTSCHED) else f.name,
        f"{f.provider_429s:,} ({f.provider_429s_late:,})",
        _s(f.utilization, 3),
        _s(f.p99("within_reserved"), 2),
        f"{_s(percentile(g, 50) if g else None, 2)} / {_s(f.p99('guaranteed'), 1)}",
        _s(f.p99("burstable")),
        _s(f.p99("besteffort")),
        _s(f.attainment_min, 2),
        f"{_s(p50, 2)} / {_s(mean, 2)} / {_s(_p90(f), 2)}",
        f"{f.worker_seconds:,.0f}",
        f"{f.finished}/{f.sessions}",
    )
    return "| " + " | ".join(cells) + " |"


def checks(results: Sequence[BudgetResult], autoscaler: bool) -> list[str]:
    """The issue's figures for slotsched in one group, each with its numbers and a verdict."""
    group = [r for r in results if r.autoscaler == autoscaler]
    me = next((r.figures for r in group if r.contender.name == SLOTSCHED and r.capped), None)
    nocap = next((r.figures for r in group if not r.capped), None)
    if me is None:
        return []
    others = [r for r in group if r.contender.name != SLOTSCHED]
    blind = [r.figures for r in others if not r.contender.knows_classes]
    gateway = next((r.figures for r in others if r.contender.name == "gateway"), None)

    def ok(b: bool) -> str:
        return "yes" if b else "**no**"

    mine = me.p99("within_reserved")
    lines = [
        f"- provider 429s after convergence: {me.provider_429s_late} (all: {me.provider_429s}) — "
        f"0: {ok(me.provider_429s_late == 0)}",
        f"- utilization of the real limit over {me.contended_minutes} contended minutes: "
        f"{_s(me.utilization, 3)} — at least 0.9: {ok((me.utilization or 0) >= 0.9)}",
        f"- Guaranteed within its reserved rate, time to permit p99: {_s(mine, 2)} s — at most 1 s: "
        f"{ok(mine is not None and mine <= 1.0)}",
        f"- lowest token attainment: {_s(me.attainment_min, 2)} — every tenant at least 0.8: "
        f"{ok((me.attainment_min or 0) >= 0.8)}",
    ]
    if others:
        # None at all is as few as any can have (a contender wasting its budget may have none too).
        fewer = me.provider_429s == 0 or all(me.provider_429s < o.figures.provider_429s for o in others)
        lines.append(
            "- fewer provider 429s than every other contender, or none ("
            + ", ".join(f"{o.name} {o.figures.provider_429s:,}" for o in others)
            + f"): {ok(fewer)}"
        )
    if blind and mine is not None:
        best = min((b.p99("within_reserved") or 0.0, b.name) for b in blind)
        lines.append(
            f"- Guaranteed p99 at least 5x lower than the best class-blind contender ({best[1]}, "
            f"{_s(best[0], 2)} s): {ok(mine * 5 <= best[0] and best[0] > 0)}"
        )
    if gateway is not None and mine is not None:
        gw = gateway.p99("within_reserved") or 0.0
        lines.append(f"- lower than the gateway's ({_s(gw, 2)} s): {ok(mine < gw)}")
    if autoscaler and others:
        p50, mean = _stretch(me)
        rivals = ", ".join(
            f"{o.name} {o.figures.worker_seconds:,.0f} worker-s, stretch mean {_s(_stretch(o.figures)[1], 2)}"
            for o in others
        )
        least = all(me.worker_seconds <= o.figures.worker_seconds for o in others)
        lines.append(
            f"- with the budget cap: {me.worker_seconds:,.0f} worker-s, stretch mean {_s(mean, 2)} "
            f"({rivals}); no more worker-seconds than any: {ok(least)}"
        )
    if nocap is not None:
        (_, mean), (_, mean_off) = _stretch(me), _stretch(nocap)
        p90, p90_off = _p90(me), _p90(nocap)
        fewer = me.worker_seconds <= nocap.worker_seconds
        same = _no_worse(mean, mean_off) and _no_worse(p90, p90_off)
        lines.append(
            f"- the budget cap against none ({nocap.name}): worker-s {me.worker_seconds:,.0f} vs "
            f"{nocap.worker_seconds:,.0f}, stretch mean {_s(mean, 2)} vs {_s(mean_off, 2)}, p90 "
            f"{_s(p90, 2)} vs {_s(p90_off, 2)}, sessions done {me.finished} vs {nocap.finished} — no more "
            f"worker-seconds: {ok(fewer)}; the same stretch or better (within {STRETCH_TOLERANCE:.0%}): "
            f"{ok(same and me.finished >= nocap.finished)}"
        )
    return lines


# Stretch is a ratio of times, noisy in the second decimal from one pool size to the next: "the
# same" allows this much above the cap-less run's.
STRETCH_TOLERANCE = 0.02


def _no_worse(mine: float | None, theirs: float | None) -> bool:
    return mine is not None and (theirs is None or mine <= theirs * (1 + STRETCH_TOLERANCE))


def render_section(results: Sequence[BudgetResult], setup: BudgetSetup, images: Sequence[str]) -> str:
    r, i, o, t = setup.limits
    real = setup.real_fraction
    dims = ", ".join(
        f"{name} {v:,.0f}/min"
        for name, v in (("requests", r), ("input", i), ("output", o), ("tokens", t))
        if v > 0
    )
    out = [
        "## Token budgets",
        "",
        f"Budget `{setup.name}`: configured {dims}; the provider's real limit is {real:.3g} of it "
        f"({'the configured limit overruns it' if real < 1 else 'as configured'}). Every call of every "
        "session replays through each limiter to the provider; time to permit runs from a call ready "
        "(slot held) to the provider accepting it. A call's output estimate is its max tokens "
        f"({setup.max_tokens:,}). '(after convergence)': 429s later than 5 minutes after the first.",
        "",
    ]
    for autoscaler, title in ((False, "On the policy's pool"), (True, "With the autoscaler")):
        group = [x for x in results if x.autoscaler == autoscaler]
        if not group:
            continue
        out += [f"### {title}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        out += [row(x.figures) for x in group]
        out += ["", "What the issue asks of slotsched here:", "", *checks(results, autoscaler), ""]
    if images:
        out += [f"![{name}]({name})" for name in images] + [""]
    notes = [f"- **{c.name}**: {c.note}" for c in dict.fromkeys(x.contender for x in results)]
    out += [
        "Contenders:",
        "",
        *notes,
        f"- `{AUTOSCALER}`: the same limiter with the autoscaler "
        "(slotsched's also caps workers by what the budget can feed; "
        "`slotsched+autoscaler-nocap` is slotsched without that cap).",
        "",
    ]
    return "\n".join(out)
