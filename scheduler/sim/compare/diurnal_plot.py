"""The diurnal comparison's figure: pool size against demand over two days, one panel per mode.

Why its own module: the comparison report's plots (plots.py) are of one run; this one lays the
reactive, scheduled and forecast pools over the same demand, so a reader sees which meets the
morning wave and what each keeps up at night. matplotlib is imported here only (the `sim` extra).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from scheduler.sim.diurnal import DAY_S, RAMP_HOUR, DiurnalStats
from snapshots.extras import needs_extra

with needs_extra("sim", "the diurnal autoscaling plot"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


def plot_diurnal(
    runs: Mapping[str, DiurnalStats], slots_per_worker: int, days: Sequence[int], out: str | Path
) -> Path:
    """Ready workers (capacity / slots per worker) of each run against demand (busy + queued
    slots, in workers), sampled every 5 minutes, over `days`; the ramp hours shaded."""
    first, last = min(days) * DAY_S, (max(days) + 1) * DAY_S
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.6 * len(runs)), sharex=True, sharey=True)
    for ax, (name, stats) in zip(axes, runs.items(), strict=True):
        pts = [(t, c, d) for t, c, d in stats.series if first <= t <= last]
        hours = [(t - first) / 3600 for t, _, _ in pts]
        ax.fill_between(hours, [d / slots_per_worker for _, _, d in pts], color="#f4a582", label="demand")
        ax.step(
            hours,
            [c / slots_per_worker for _, c, _ in pts],
            where="post",
            color="#2166ac",
            label="ready workers",
        )
        for d in range(len(days)):
            ax.axvspan(24 * d + RAMP_HOUR, 24 * d + RAMP_HOUR + 1, color="#999999", alpha=0.2, lw=0)
        ax.set_title(
            f"{name}: {stats.worker_seconds / 3600:,.0f} worker-hours (whole 3-day run)",
            fontsize=10,
            loc="left",
        )
        ax.set_ylabel("workers")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel(f"hours from midnight of day {min(days)} (grey: the 9:00 ramp hour)")
    axes[-1].set_xticks(range(0, 24 * len(days) + 1, 3))
    fig.suptitle("Pool size against demand over two days (diurnal-3d sample)")
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
