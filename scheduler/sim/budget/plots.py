"""The budget comparison's figures (matplotlib through `compare/plots.py`, its one import point):

- `budget-tokens.png`: per contender, the tokens per minute the provider accepted, stacked by class,
  against the real limit (a dashed line) and the limit the limiter believed (slotsched: its
  effective limit as the 429s moved it);
- `budget-429s.png`: per contender, the provider's 429s per minute.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler.sim.budget.run import BudgetResult
from scheduler.sim.compare.plots import pyplot as plt

CLASS_COLOURS = (("guaranteed", "#e6194b"), ("burstable", "#4363d8"), ("besteffort", "#bfbfbf"))


def _grid(n: int, cols: int = 5) -> tuple[Any, list[Any]]:
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), sharex=True, squeeze=False)
    flat = [a for r in axes for a in r]
    for a in flat[n:]:
        a.axis("off")
    return fig, flat[:n]


def tokens_plot(results: Sequence[BudgetResult], path: Path) -> Path:
    fig, axes = _grid(len(results))
    top = max(max((sum(m) for m in r.figures.minutes), default=0.0) for r in results) / 1e6
    top = max(top, max(r.figures.real_limit for r in results) / 1e6) * 1.1
    for ax, r in zip(axes, results, strict=True):
        f = r.figures
        xs = list(range(len(f.minutes)))
        ys = [[m[i] / 1e6 for m in f.minutes] for i in range(3)]
        labels = [k for k, _ in CLASS_COLOURS]
        ax.stackplot(xs, *ys, colors=[c for _, c in CLASS_COLOURS], labels=labels, step="post", linewidth=0)
        ax.axhline(
            f.real_limit / 1e6, color="black", linestyle="--", linewidth=1, label="provider's real limit"
        )
        if f.limit_line:
            ax.step([t / 60 for t, _ in f.limit_line], [v / 1e6 for _, v in f.limit_line], where="post",
                    color="#f58231", linewidth=1, label="limit the limiter uses")  # fmt: skip
        ax.set_title(f"{f.name}\n429s {f.provider_429s:,}, util {f.utilization or 0:.2f}", fontsize=9)
        ax.set_ylim(0, top)
        ax.tick_params(labelsize=8)
    for ax in axes[::5]:
        ax.set_ylabel("M input tokens / min", fontsize=8)
    for ax in axes[-5:]:
        ax.set_xlabel("minutes", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=9, frameon=False)
    fig.suptitle("Tokens the provider accepted per minute, by class, against its real limit", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def throttles_plot(results: Sequence[BudgetResult], path: Path) -> Path:
    fig, axes = _grid(len(results))
    top = max(max(r.figures.throttles_per_minute, default=0) for r in results) * 1.1 or 1.0
    for ax, r in zip(axes, results, strict=True):
        f = r.figures
        ax.bar(range(len(f.throttles_per_minute)), f.throttles_per_minute, width=1.0, color="#e6194b")
        ax.set_title(f"{f.name}: {f.provider_429s:,} in all", fontsize=9)
        ax.set_ylim(0, top)
        ax.tick_params(labelsize=8)
    for ax in axes[::5]:
        ax.set_ylabel("provider 429s / min", fontsize=8)
    for ax in axes[-5:]:
        ax.set_xlabel("minutes", fontsize=8)
    fig.suptitle("Calls the provider answered 429, per minute (same scale throughout)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def draw(results: Sequence[BudgetResult], out: Path) -> list[Path]:
    return [tokens_plot(results, out / "budget-tokens.png"), throttles_plot(results, out / "budget-429s.png")]
