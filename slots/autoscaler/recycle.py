"""Which worker to recycle: one past spec.autoscaler.recycle's memory or age, pure.

Why: long-running agent workers accumulate memory (conversation context, tool histories, caches);
one left alone runs into its OOM kill and every actor on it loses what it did since its last
checkpoint. Replaced gracefully instead (loop.py: a replacement is started first, then the old
worker is drained, so its actors yield with checkpoints and resume elsewhere), nothing is lost.
One worker at a time per pool: a recycle never takes more than one worker's capacity away.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.policy.model import AutoscalerSpec
from slots.autoscaler.decision import ScaleWorker, ScaleWorkerState

MEMORY, AGE = "memory", "age"


def recycle_cause(w: ScaleWorker, now: float, spec: AutoscalerSpec) -> str | None:
    """ "memory" or "age" when `w` is past a threshold, else None (thresholds at 0 are off)."""
    if spec.recycle_memory_bytes > 0 and w.rss_bytes >= spec.recycle_memory_bytes:
        return MEMORY
    if (
        spec.recycle_max_age_s > 0
        and w.started_at is not None
        and now - w.started_at >= spec.recycle_max_age_s
    ):
        return AGE
    return None


def pick_recycle(workers: Iterable[ScaleWorker], now: float, spec: AutoscalerSpec) -> tuple[str, str] | None:
    """The ready worker to recycle next, with its cause: memory first (the most over first: it
    is nearest its OOM kill), then the oldest; None when none is due."""
    due = [
        (cause, w)
        for w in workers
        if w.state is ScaleWorkerState.READY and (cause := recycle_cause(w, now, spec)) is not None
    ]
    if not due:
        return None
    cause, w = min(
        due,
        key=lambda cw: (cw[0] != MEMORY, -cw[1].rss_bytes, cw[1].started_at or now, cw[1].worker_id),
    )
    return w.worker_id, cause
