"""The comparison's figures, drawn with matplotlib's Agg backend (files only, no display needed).

- `time_to_slot_cdf.png`: for each class (columns) and group of contenders (rows: the static pool,
  the elastic pools), the CDF of time-to-slot, one line per contender (slotsched's thicker). The
  x axis is symlog (linear below 1 s) so a zero wait and an hour's wait fit on one axis. Each
  curve starts at 0 at its shortest wait, so a single grant is a visible step; few grants are
  also marked with dots. Contenders whose waits are identical share one curve: the later ones
  are drawn dashed over it, the panel names them ("same curve: …") and so does the contenders'
  legend (`same_as`: "= fifo" for identical waits, "≈ fifo" for waits within 0.1 s or 1% each,
  which draw as one curve too). A class with no grant
  says so instead of leaving an empty frame. Guaranteed curves are the requests within quota,
  the waits the SLA target is about (as in the report's table); the panel says how many beyond
  quota are left out.
- `slots_by_tenant.png`: for each contender, slots held per tenant over time, averaged over a
  window of a fortieth of the run (`smooth`: sessions of many tenants come and go faster than a
  panel's pixels, and the share over time is what fairness is about), with the pool's ready slots
  on top: who got the pool. Every tenant up to 16 has a colour of its own (`PALETTE`, 16 that
  tell apart), the same in every panel; beyond 16, the largest by slot-seconds over all
  contenders, and "others" only when there are other tenants.
- `pool_vs_demand.png`: for each contender, held slots, the sessions waiting on top of them (a
  shaded band: demand above what is held) and the pool size over time: where demand outran the
  pool, and how an autoscaler followed it. Waiting while slots sit idle is a band of its own
  (`pool_bands`): those sessions' tenants are at their quota or limit, so a free slot is not
  theirs. The held line is drawn over the pool line (equal when the pool is full), and a queue
  that dwarfs the pool is cut at the top with its peak named (`pool_ylim`), so held stays
  readable.

A panel whose series equal an earlier panel's says so in its title ("same as fifo":
`identical_to`). The panels of a row share their y axis (`row_tops`), so contenders side by side
compare by height. With several pools, the tenants and pool plots draw the pools' sum, and every
figure's title says so and names the pools (`pools_note`).

Time axes are in seconds, minutes or hours, whichever suits the run's length (`time_unit`), and
shared by the panels of a figure. A contender stopped with work left (†) may run far longer
than the others before the guard ends it; the shared axis ends with the finished runs
(`shared_span`) and its panel says where it was cut. The helpers that choose what is drawn
(`time_unit`, `cdf_lines`, `same_as`, `cdf_xlim`, `tenant_order`, `tenant_legend`, `smooth`,
`identical_to`, `row_tops`, `pools_note`, `pool_bands`, `pool_ylim`, `shared_span`) are pure, so
tests check them rather than pixels.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from scheduler.sim.stats import CLASS_KEYS, Sample, SimStats
from snapshots.extras import needs_extra

with needs_extra("sim", "simulate --compare's plots"):  # matplotlib: not in a base install
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib import pyplot as pyplot  # re-exported: budget/plots.py draws with it (one import point)
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

# 16 colours that tell apart side by side (Trubetskoy's distinct colours, the pale ones left out):
# a sample's 12-16 tenants each get their own.
PALETTE = (
    "#4363d8", "#f58231", "#3cb44b", "#e6194b", "#911eb4", "#9a6324", "#f032e6", "#42d4f4",
    "#bfef45", "#000075", "#469990", "#ffe119", "#800000", "#808000", "#fabed4", "#dcbeff",
)  # fmt: skip
TOP_TENANTS = len(PALETTE)
NEAR_S, NEAR_REL = 0.1, 0.01  # waits this close (s, or share of the wait) draw as one curve
MARK_BELOW = 25  # grants in a curve below which each one is marked with a dot
OTHERS = "others"
POOL = "pool size (ready slots)"
_TAB10 = plt.get_cmap("tab10")  # contenders


# ---------------------------------------------------------------- what is drawn (pure)


def time_unit(span_s: float) -> tuple[float, str]:
    """(seconds per unit, unit name) for a time axis spanning `span_s`: a 5-minute run in minutes,
    a 4-hour one in hours, never a run in fractions of an hour."""
    if span_s <= 180.0:
        return 1.0, "seconds"
    if span_s <= 3 * 3600.0:
        return 60.0, "minutes"
    return 3600.0, "hours"


@dataclass(frozen=True)
class CdfLine:
    names: tuple[str, ...]  # contenders with exactly these waits; the first draws the curve
    xs: list[float]
    ys: list[float]

    @property
    def grants(self) -> int:
        return len(self.xs) - 1


def class_waits(stats: SimStats, cls: str) -> list[float]:
    """A class's waits as plotted: Guaranteed ones within quota (the report's Guaranteed figures)."""
    return stats.guaranteed_waits(beyond_quota=False) if cls == "guaranteed" else stats.waits[cls]


def cdf_lines(members: Sequence[tuple[str, SimStats]], cls: str) -> list[CdfLine]:
    """The empirical CDF of each contender's waits in `cls` (`class_waits`), starting at (shortest
    wait, 0) so that one grant draws a step; contenders with identical waits share a line. None
    without grants."""
    by_waits: dict[tuple[float, ...], list[str]] = {}
    for name, stats in members:
        w = tuple(sorted(round(x, 6) for x in class_waits(stats, cls)))
        if w:
            by_waits.setdefault(w, []).append(name)
    out = []
    for w, names in by_waits.items():
        n = len(w)
        out.append(CdfLine(tuple(names), [w[0], *w], [0.0, *((k + 1) / n for k in range(n))]))
    return out


def _near(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(
        abs(x - y) <= max(NEAR_S, NEAR_REL * max(abs(x), abs(y))) for x, y in zip(a, b, strict=True)
    )


def same_as(members: Sequence[tuple[str, SimStats]], classes: Sequence[str] = CLASS_KEYS) -> dict[str, str]:
    """For the legend: each contender whose curves in every one of `classes` are another's says
    whose. Contenders with the same waits form a group whose first member draws the curve: the
    others are "= first". A group's first member whose waits are each within NEAR_S seconds or
    NEAR_REL of an earlier group's is "≈ that one" (one curve on the plot too). Contenders with a
    curve of their own, or none drawn, are left out."""
    waits = {n: [sorted(round(x, 6) for x in class_waits(s, c)) for c in classes] for n, s in members}
    firsts: list[str] = []
    out: dict[str, str] = {}
    for name, _ in members:
        mine = waits[name]
        if not any(mine):
            continue  # nothing drawn: no curve to be the same as
        same = next((f for f in firsts if waits[f] == mine), None)
        if same is not None:
            out[name] = f"= {same}"
            continue
        near = next(
            (f for f in firsts if all(_near(a, b) for a, b in zip(mine, waits[f], strict=True))), None
        )
        if near is not None:
            out[name] = f"≈ {near}"
        firsts.append(name)
    return out


def identical_to(series: Sequence[tuple[str, Hashable]]) -> dict[str, str]:
    """Each name whose series equals an earlier one's, with the first name that has it: a panel
    that draws the very same picture as another says so instead of being read as a new result."""
    first: dict[Hashable, str] = {}
    out: dict[str, str] = {}
    for name, key in series:
        if key in first:
            out[name] = first[key]
        else:
            first[key] = name
    return out


def row_tops(tops: Sequence[float], cols: int) -> list[float]:
    """Each panel's y top made its row's highest: contenders side by side compare by height."""
    out = []
    for i in range(len(tops)):
        row = tops[i - i % cols : i - i % cols + cols]
        out.append(max(row))
    return out


def smooth(values: Sequence[float], window: int) -> list[float]:
    """The mean over `window` samples centred on each one (fewer at the ends)."""
    if window <= 1:
        return [float(v) for v in values]
    half = window // 2
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    n = len(values)
    return [
        (prefix[min(n, i + half + 1)] - prefix[max(0, i - half)]) / (min(n, i + half + 1) - max(0, i - half))
        for i in range(n)
    ]


def pools_note(runs: Sequence[tuple[str, SimStats]]) -> str:
    """ "" with one pool; with several, what a figure summing them says: which pools, their slots."""
    specs = runs[0][1].policy.pool_specs() if runs else ()
    if len(specs) < 2:
        return ""
    each = " + ".join(f"{p.name} ({p.workers * p.slots_per_worker})" for p in specs)
    return f"summed over {len(specs)} pools: {each} slots at start"


def drawn_classes(runs: Sequence[tuple[str, SimStats]]) -> tuple[list[str], list[str]]:
    """(the classes the CDF draws, those it leaves out): a class no run granted is an empty column
    in every row, so it is named once instead; with no grant at all, every class is drawn."""
    have = [c for c in CLASS_KEYS if any(s.waits[c] for _, s in runs)]
    if not have:
        return list(CLASS_KEYS), []
    return have, [c for c in CLASS_KEYS if c not in have]


def same_note(same: Mapping[str, str]) -> list[str]:
    """The lines of a panel's "one curve" note: `fifo = strict-priority = …` for identical waits,
    `reject-retry ≈ fifo` for waits within NEAR_S s or NEAR_REL each."""
    exact: dict[str, list[str]] = {}
    near: list[str] = []
    for name, how in same.items():
        sign, other = how.split(" ", 1)
        if sign == "=":
            exact.setdefault(other, [other]).append(name)
        else:
            near.append(f"{name} ≈ {other}")
            exact.setdefault(name, [name])  # its group, if any, listed under it
    lines = [
        textwrap.fill(" = ".join(names), 32, subsequent_indent="  ")
        for names in exact.values()
        if len(names) > 1
    ]
    if near:
        lines += [*near, f"(≈: each wait within {NEAR_S:g} s or {NEAR_REL:.0%})"]
    return lines


def cdf_xlim(waits: Sequence[float]) -> tuple[float, float]:
    """x limits that show a curve at 0 off the frame and leave room past the longest wait; all
    zeros (everyone served at once) get 0-10 s rather than matplotlib's ±0.055."""
    hi = max(waits, default=0.0)
    return -0.2, max(10.0, hi * 1.5)


def tenant_order(runs: Sequence[tuple[str, SimStats]]) -> list[str]:
    """Tenants by slot-seconds over every run, largest first: one colour per tenant in all panels."""
    totals: dict[str, float] = {}
    for _, stats in runs:
        for t, by in stats.slot_seconds.items():
            totals[t] = totals.get(t, 0.0) + sum(by.values())
        for s in stats.samples:
            for t in s.held_by_tenant:
                totals.setdefault(t, 0.0)
    return sorted(totals, key=lambda t: (-totals[t], t))


def tenant_legend(runs: Sequence[tuple[str, SimStats]]) -> list[str]:
    """The tenants plot's legend: its top tenants, "others" only if some run had other tenants
    holding slots, then the pool line."""
    order = tenant_order(runs)
    top = order[:TOP_TENANTS]
    rest = set(order[TOP_TENANTS:])
    others = any(s.held_by_tenant.get(t, 0) for _, stats in runs for s in stats.samples for t in rest)
    return [*top, *([OTHERS] if others else []), POOL]


# ---------------------------------------------------------------- drawing


def _grid(n: int, width: float = 5.0, height: float = 3.0) -> tuple[Figure, list[Axes]]:
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, sharex=True)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    for i, ax in enumerate(flat[:n]):
        if i + cols >= n:  # nothing visible below it: it carries the time axis
            ax.xaxis.set_tick_params(labelbottom=True)
    return fig, flat[:n]


def _label_time(axes: Sequence[Axes], unit: str) -> None:
    cols = min(3, len(axes))
    for i, ax in enumerate(axes):
        if i + cols >= len(axes):
            ax.set_xlabel(unit)


def _span(runs: Sequence[tuple[str, SimStats]]) -> float:
    return max(
        (max(stats.end_s, stats.samples[-1].t if stats.samples else 0.0) for _, stats in runs), default=0
    )


def shared_span(runs: Sequence[tuple[str, SimStats]]) -> tuple[float, list[str]]:
    """(span of the shared time axis, the runs it cuts short). A run stopped with work left (†)
    ends when the guard gives up on it, possibly hours after the others: the axis ends with the
    longest finished run, so that the others do not shrink into a corner."""
    finished = [(n, s) for n, s in runs if s.stopped_at_s is None]
    span = _span(finished or runs)
    return span, [n for n, s in runs if _span([(n, s)]) > span + 1e-9]


def _clip_note(stats: SimStats, span: float, div: float, unit: str) -> str:
    """Where a † run's panel was cut, and when the run really stopped (a title line: inside the
    frame it would cover the data)."""
    return f"\n(stopped at {_span([('', stats)]) / div:.1f} {unit}; drawn to {span / div:.1f})"


def _save(fig: Figure, path: Path, legend_rows: int = 0) -> Path:
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.1 + 0.25 * legend_rows) / height if legend_rows else 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _step(samples: Sequence[object]) -> Literal["post"] | None:
    """Steps show a short run's few changes as they were; many samples read better as a curve
    (stepped areas of hundreds of points render as seams)."""
    return "post" if len(samples) < 100 else None


def _note(ax: Axes, text: str, where: str = "center") -> None:
    x, y, ha, va = {
        "center": (0.5, 0.5, "center", "center"),
        "corner": (0.98, 0.04, "right", "bottom"),
        "top": (0.98, 0.96, "right", "top"),
    }[where]
    box = {"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 2}
    ax.text(x, y, text, transform=ax.transAxes, ha=ha, va=va, fontsize="small", color="dimgray", bbox=box)


def cdf_plot(
    runs: Sequence[tuple[str, SimStats]], path: Path, groups: Mapping[str, str] | None = None
) -> Path:
    group_of = groups or {}
    rows = list(dict.fromkeys(group_of.get(name, "") for name, _ in runs))
    classes, absent = drawn_classes(runs)
    cols = len(classes)
    fig, axes = plt.subplots(len(rows), cols, figsize=(3.6 + 4.5 * cols, 4.2 * len(rows)), squeeze=False)
    for r, group in enumerate(rows):
        members = [(n, s) for n, s in runs if group_of.get(n, "") == group]
        color = {name: _TAB10(i % 10) for i, (name, _) in enumerate(members)}
        for ax, cls in zip(axes[r], classes, strict=True):
            lines = cdf_lines(members, cls)
            waits = [x for line in lines for x in line.xs]
            for line in lines:
                for k, name in enumerate(line.names):
                    mark = "o" if line.grants < MARK_BELOW else None
                    ax.step(
                        line.xs,
                        line.ys,
                        where="post",
                        color=color[name],
                        lw=2.4 if name.startswith("slotsched") else 1.3,
                        ls="-" if k == 0 else (0, (3, 3)),  # an identical curve: dashed over the first
                        marker=mark if k == 0 else None,
                        markersize=3.5,
                    )
            ax.set_xscale("symlog", linthresh=1.0)
            ax.set_xlim(*cdf_xlim(waits))
            ax.set_ylim(-0.03, 1.03)
            title = f"{cls}: time to slot" + (f" ({group} pool)" if group else "")
            beyond = sorted(len(s.beyond_quota) for _, s in members) if cls == "guaranteed" else []
            if beyond and beyond[-1]:
                n = f"{beyond[0]}" if beyond[0] == beyond[-1] else f"{beyond[0]}-{beyond[-1]}"
                title += f"\nrequests within quota; the {n} beyond it per contender: in the report"
            ax.set_title(title, fontsize="medium")
            ax.set_xlabel("seconds waited (log scale above 1 s)")
            ax.set_ylabel("fraction of grants")
            ax.grid(True, alpha=0.3)
            if not lines:
                _note(ax, f"no {cls} grants")
            elif max(waits) == 0:
                _note(ax, "every grant at once (0 s)")
            same = same_note(same_as(members, [cls]))
            if same:
                # As a legend without a handle: matplotlib puts it where it covers the fewest lines;
                # kept as an artist, so the contenders' legend beside it does not replace it.
                note = ax.legend(
                    [Line2D([], [], alpha=0)],
                    ["\n".join(["one curve (dashed over it):", *same])],
                    loc="best",
                    handlelength=0,
                    handletextpad=0,
                    fontsize="small",
                    labelcolor="dimgray",
                    framealpha=0.8,
                    edgecolor="none",
                )
                ax.add_artist(note)
        handles = [
            Line2D([], [], color=color[n], lw=2.4 if n.startswith("slotsched") else 1.3) for n, _ in members
        ]
        alike = same_as(members, classes)  # a contender drawn only under another's curve
        labels = [f"{n} ({alike[n]})" if n in alike else n for n, _ in members]
        axes[r][-1].legend(handles, labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    notes = []
    if absent:
        notes.append(f"no {' or '.join(absent)} grants in any run: not drawn")
    note = pools_note(runs)
    if note:
        notes.append("waits in every pool (" + note.split(": ", 1)[1] + ")")
    if notes:
        fig.suptitle("; ".join(notes), fontsize="medium")
    return _save(fig, path, legend_rows=1 if notes else 0)


def _title(ax: Axes, name: str, stats: SimStats, what: str, clip: str = "") -> None:
    ax.set_title(f"{name}{' †' if stats.stopped_at_s is not None else ''}: {what}{clip}")


def _same_title(name: str, same: Mapping[str, str]) -> str:
    return f"\n(same as {same[name]})" if name in same else ""


def _dur(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def tenants_plot(runs: Sequence[tuple[str, SimStats]], path: Path) -> Path:
    fig, axes = _grid(len(runs))
    span, clipped = shared_span(runs)
    div, unit = time_unit(span)
    legend = tenant_legend(runs)
    top = [t for t in legend if t not in (OTHERS, POOL)]
    colors = {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(top)}
    colors[OTHERS] = "#d4d4d4"  # light gray
    layers = [*top, *([OTHERS] if OTHERS in legend else [])]
    same = identical_to(
        [
            (n, tuple((s.capacity, tuple(sorted(s.held_by_tenant.items()))) for s in st.samples))
            for n, st in runs
        ]
    )
    tops: list[float] = []
    # One window for every panel: a fortieth of the shared time axis, in samples.
    step_s = next((st.samples[1].t - st.samples[0].t for _, st in runs if len(st.samples) > 1), 0.0)
    window = max(1, round(span / 40 / step_s)) if step_s > 0 else 1
    for ax, (name, stats) in zip(axes, runs, strict=True):
        samples = stats.samples
        clip = _clip_note(stats, span, div, unit) if name in clipped else ""
        _title(ax, name, stats, "slots per tenant" + _same_title(name, same), clip)
        ax.set_ylabel("slots")
        if not samples:
            _note(ax, "no samples")
            tops.append(1.0)
            continue
        ts = [s.t / div for s in samples]
        series = [[s.held_by_tenant.get(t, 0) for s in samples] for t in top]
        if OTHERS in layers:
            series.append(
                [
                    sum(s.held_by_tenant.values()) - sum(s.held_by_tenant.get(t, 0) for t in top)
                    for s in samples
                ]
            )
        ax.stackplot(
            ts,
            *[smooth(x, window) for x in series],
            colors=[colors[t] for t in layers],
            step=_step(samples) if window == 1 else None,
        )
        ax.step(ts, [s.capacity for s in samples], where="post", color="black", lw=1)
        tops.append(max(1, max(max(s.capacity, sum(s.held_by_tenant.values())) for s in samples)) * 1.08)
        if not any(any(s.held_by_tenant.values()) for s in samples):
            _note(ax, "no slots held")
    for ax, top_y in zip(axes, row_tops(tops, min(3, len(axes))), strict=True):
        ax.set_xlim(0, max(span, 1.0) / div)
        ax.set_ylim(0, top_y)
    _label_time(axes, unit)
    handles: list[Patch | Line2D] = [Patch(color=colors[t]) for t in layers]
    handles.append(Line2D([], [], color="black", lw=1))
    what = "slots held per tenant" + (f", each a mean over {_dur(window * step_s)}" if window > 1 else "")
    note = "; ".join(x for x in (what, pools_note(runs)) if x)
    fig.legend(
        handles,
        legend,
        loc="upper center",
        ncol=min(len(legend), 9),
        fontsize="small",
        title=note or None,
        title_fontsize="small",
    )
    return _save(fig, path, legend_rows=math.ceil(len(legend) / 9) + bool(note))


POOL_LEGEND = (
    "held",
    "waiting, pool full",
    "waiting beside idle slots (their tenant is at its quota or limit)",
    "pool size (ready slots)",
)
CLIP_AT = 2.5  # y axis at most this many times the pool (or held) when the queue dwarfs both


def pool_bands(samples: Sequence[Sample]) -> tuple[list[int], list[int], list[int]]:
    """(held, held + waiting that idle slots could have taken, demand) per sample. Sessions wait
    beside idle slots when a free slot is not theirs to take (their tenant holds its Guaranteed
    quota, Burstable or BestEffort limit): a band of its own, so it does not read as a full pool.
    With several pools, a pool's idle slots count only for its own waiters (`Sample.by_pool`): a
    session waiting in a full pool is not beside the idle slots of another."""
    held = [s.busy for s in samples]
    beside = [
        s.busy
        + sum(
            min(p, max(0, c - b)) for c, b, p in (s.by_pool or {"": (s.capacity, s.busy, s.pending)}).values()
        )
        for s in samples
    ]
    return held, beside, [s.busy + s.pending for s in samples]


def pool_ylim(samples: Sequence[Sample]) -> tuple[float, int | None]:
    """(top of the y axis, the demand peak it leaves out, if any). A queue ten times the pool would
    flatten held and the pool into the bottom of the panel: the axis stops at CLIP_AT times them
    and the panel names the peak instead."""
    base = max(1, max((max(s.capacity, s.busy) for s in samples), default=1))
    peak = max((s.busy + s.pending for s in samples), default=0)
    if peak > CLIP_AT * base:
        return CLIP_AT * base, peak
    return max(base, peak) * 1.08, None


def pool_plot(runs: Sequence[tuple[str, SimStats]], path: Path) -> Path:
    fig, axes = _grid(len(runs))
    span, clipped = shared_span(runs)
    div, unit = time_unit(span)
    same = identical_to([(n, tuple((s.capacity, s.busy, s.pending) for s in st.samples)) for n, st in runs])
    limits: list[tuple[float, int | None]] = []
    for ax, (name, stats) in zip(axes, runs, strict=True):
        samples = stats.samples
        clip = _clip_note(stats, span, div, unit) if name in clipped else ""
        _title(ax, name, stats, "pool vs demand" + _same_title(name, same), clip)
        ax.set_ylabel("slots")
        limits.append(pool_ylim(samples))
        if not samples:
            _note(ax, "no samples")
            continue
        ts = [s.t / div for s in samples]
        held, beside, demand = pool_bands(samples)
        step = _step(samples)
        # Waiting as bands above the held line: where nobody waits they vanish, instead of a
        # demand line drawn over the held one (which blended into an unexplained purple).
        ax.fill_between(ts, held, beside, step=step, color="tab:orange", alpha=0.45, lw=0, hatch="///")
        ax.fill_between(ts, beside, demand, step=step, color="tab:red", alpha=0.3, lw=0)
        # The pool under the held line, wider: where they are equal (a full pool) both show.
        ax.step(ts, [s.capacity for s in samples], where="post", color="black", lw=2.6)
        ax.step(ts, held, where="post", color="tab:blue", lw=1.1)
    cols = min(3, len(axes))
    for ax, top_y, (_, peak), (_, stats) in zip(
        axes, row_tops([t for t, _ in limits], cols), limits, runs, strict=True
    ):
        ax.set_xlim(0, max(span, 1.0) / div)
        ax.set_ylim(0, top_y)
        # The row's highest panel sets the top: a peak off it is named, wherever it is.
        high = max((s.busy + s.pending for s in stats.samples), default=0)
        if peak is not None or high > top_y:
            _note(ax, f"demand peaks at {high} slots, off the top", where="top")
    _label_time(axes, unit)
    handles = [
        Line2D([], [], color="tab:blue", lw=1.1),
        Patch(color="tab:red", alpha=0.3),
        Patch(facecolor="tab:orange", alpha=0.45, hatch="///"),
        Line2D([], [], color="black", lw=2.6),
    ]
    note = pools_note(runs)
    fig.legend(
        handles,
        POOL_LEGEND,
        loc="upper center",
        ncol=4,
        fontsize="small",
        title=note or None,
        title_fontsize="small",
    )
    return _save(fig, path, legend_rows=1 + bool(note))


def draw_all(
    runs: Sequence[tuple[str, SimStats]], out: Path, groups: Mapping[str, str] | None = None
) -> list[Path]:
    """The three figures; `groups` (name -> group) splits the CDFs into a row per group."""
    return [
        cdf_plot(runs, out / "time_to_slot_cdf.png", groups),
        tenants_plot(runs, out / "slots_by_tenant.png"),
        pool_plot(runs, out / "pool_vs_demand.png"),
    ]
