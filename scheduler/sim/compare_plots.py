"""The comparison's figures, drawn with matplotlib's Agg backend (files only, no display needed).

- `time_to_slot_cdf.png`: for each class (columns) and group of contenders (rows: the static pool,
  the elastic pools), the CDF of time-to-slot, one line per contender (slotsched's thicker). The
  x axis is symlog (linear below 1 s) so a zero wait and an hour's wait fit on one axis.
- `slots_by_tenant.png`: for each contender, slots held per tenant over time (the largest
  tenants by slot-seconds, the rest summed), with the pool's capacity on top: who got the pool.
- `pool_vs_demand.png`: for each contender, pool size against demand (held + waiting) and held
  slots over time: where demand outran the pool, and how an autoscaler followed it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from scheduler.sim.stats import CLASS_KEYS, SimStats  # noqa: E402

TOP_TENANTS = 6


def _grid(n: int, width: float = 5.0, height: float = 3.0) -> tuple[Figure, list[Axes]]:
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, sharex=True)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def cdf_plot(
    runs: Sequence[tuple[str, SimStats]], path: Path, groups: Mapping[str, str] | None = None
) -> Path:
    group_of = groups or {}
    rows = list(dict.fromkeys(group_of.get(name, "") for name, _ in runs))
    fig, axes = plt.subplots(len(rows), 3, figsize=(16, 4.2 * len(rows)), squeeze=False)
    for r, group in enumerate(rows):
        members = [(n, s) for n, s in runs if group_of.get(n, "") == group]
        for ax, cls in zip(axes[r], CLASS_KEYS, strict=True):
            for i, (name, stats) in enumerate(members):
                w = sorted(stats.waits[cls])
                if not w:
                    continue
                ys = [(k + 1) / len(w) for k in range(len(w))]
                lw = 2.4 if name.startswith("slotsched") else 1.2
                ax.step(w, ys, where="post", label=name, color=plt.get_cmap("tab10")(i % 10), lw=lw)
            ax.set_xscale("symlog", linthresh=1.0)
            ax.set_title(f"{cls}: time to slot" + (f" ({group} pool)" if group else ""))
            ax.set_xlabel("seconds (symlog)")
            ax.set_ylabel("fraction of grants")
            ax.grid(True, alpha=0.3)
        axes[r][0].legend(fontsize="small", loc="lower right")
    return _save(fig, path)


def tenants_plot(runs: Sequence[tuple[str, SimStats]], path: Path) -> Path:
    fig, axes = _grid(len(runs))
    for ax, (name, stats) in zip(axes, runs, strict=True):
        samples = stats.samples
        if not samples:
            ax.set_title(f"{name}: no samples")
            continue
        totals = {t: sum(by.values()) for t, by in stats.slot_seconds.items()}
        top = sorted(totals, key=lambda t: (-totals[t], t))[:TOP_TENANTS]
        ts = [s.t / 3600 for s in samples]
        series = [[s.held_by_tenant.get(t, 0) for s in samples] for t in top]
        rest = [
            sum(s.held_by_tenant.values()) - sum(s.held_by_tenant.get(t, 0) for t in top) for s in samples
        ]
        ax.stackplot(ts, *series, rest, labels=[*top, "others"], alpha=0.85)
        ax.plot(ts, [s.capacity for s in samples], color="black", lw=1, label="capacity")
        ax.set_title(f"{name}: slots held per tenant")
        ax.set_xlabel("hours")
        ax.set_ylabel("slots")
    axes[0].legend(fontsize="x-small", loc="upper right", ncol=2)
    return _save(fig, path)


def pool_plot(runs: Sequence[tuple[str, SimStats]], path: Path) -> Path:
    fig, axes = _grid(len(runs))
    for ax, (name, stats) in zip(axes, runs, strict=True):
        samples = stats.samples
        ts = [s.t / 3600 for s in samples]
        ax.plot(ts, [s.busy + s.pending for s in samples], label="demand (held + waiting)", color="tab:red")
        ax.plot(ts, [s.busy for s in samples], label="held", color="tab:blue", lw=0.8)
        ax.step(ts, [s.capacity for s in samples], where="post", label="pool size (slots)", color="black")
        ax.set_title(f"{name}: pool vs demand")
        ax.set_xlabel("hours")
        ax.set_ylabel("slots")
    axes[0].legend(fontsize="x-small", loc="upper right")
    return _save(fig, path)


def draw_all(
    runs: Sequence[tuple[str, SimStats]], out: Path, groups: Mapping[str, str] | None = None
) -> list[Path]:
    """The three figures; `groups` (name -> group) splits the CDFs into a row per group."""
    return [
        cdf_plot(runs, out / "time_to_slot_cdf.png", groups),
        tenants_plot(runs, out / "slots_by_tenant.png"),
        pool_plot(runs, out / "pool_vs_demand.png"),
    ]
