"""report.md of the diurnal comparison: reactive, scheduled and forecast on one multi-day
workload — the ramp hour's waits by class and the worker-seconds — beside the plot of pool size
against demand (diurnal_plot.py). Apart from report.py, whose comparison is slotsched against
other autoscalers on one workload: this one is three ways of sizing slotsched's own pool."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler.sim.diurnal import RAMP_HOUR, DiurnalStats, ramp_p99

CLASSES = (
    ("guaranteed", "Guaranteed (within quota)"),
    ("burstable", "Burstable"),
    ("besteffort", "BestEffort"),
)


def render_diurnal(
    runs: Mapping[str, DiurnalStats], days: Sequence[int], plot: str | None = None, title: str = "diurnal-3d"
) -> str:
    """The report's markdown: one row per mode, ratios against `reactive`."""
    base = runs["reactive"]
    head = (
        "| mode | " + " | ".join(f"{label} p99" for _, label in CLASSES) + " | worker-hours | vs reactive |"
    )
    lines = [
        f"# Scaling ahead of the morning wave: {title}",
        "",
        f"Requests made {RAMP_HOUR}:00–{RAMP_HOUR + 1}:00 on days {', '.join(map(str, days))}: "
        "their p99 wait; worker-hours of the whole run.",
        "",
        head,
        "| --- " * (len(CLASSES) + 3) + "|",
    ]
    for name, st in runs.items():
        waits = " | ".join(f"{ramp_p99(st, c, days):.1f} s" for c, _ in CLASSES)
        ratio = st.worker_seconds / base.worker_seconds if base.worker_seconds else 0.0
        lines.append(f"| {name} | {waits} | {st.worker_seconds / 3600:,.0f} | {ratio:.3f}x |")
    if plot:
        lines += ["", f"![pool size against demand]({plot})"]
    return "\n".join(lines) + "\n"
