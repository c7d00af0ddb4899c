"""What a worker reports of its own process: resident memory and uptime.

Why: long-running agent workers accumulate memory; the companion autoscaler replaces one past
`spec.autoscaler.recycle` gracefully, before its OOM kill (slots/autoscaler/recycle.py). The
agent sends both with every heartbeat, and the worker exports them as metrics.
"""

from __future__ import annotations

import os
import resource
import sys
import time

_STARTED = time.monotonic()  # when this module was first imported: the worker's start, near enough
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident memory now (Linux: /proc/self/statm); elsewhere the peak, the nearest there is."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


def uptime_s() -> float:
    return time.monotonic() - _STARTED
