"""Human-readable rendering of a simulation result (the JSON form is in stats.py)."""

from __future__ import annotations

from typing import Any

NONE = "—"  # a figure with nothing to measure (a class with no grant)


def _secs(v: float | None) -> str:
    return f"{v:>8.2f}" if v is not None else f"{NONE:>8}"


def _p99(wait: dict[str, Any] | None) -> str:
    v = None if wait is None else wait.get("p99")
    return f"{v:.1f}" if v is not None else NONE


def render_text(result: dict[str, Any]) -> str:
    lines = ["time to slot (s)        count      p50      p95      p99      max"]
    for name, c in result["classes"].items():
        tts = c["time_to_slot"]
        suffix = "   (no grants)" if c["count"] == 0 else ""
        lines.append(
            f"  {name:<20} {c['count']:>7} "
            + " ".join(_secs(tts[k]) for k in ("p50", "p95", "p99", "max"))
            + suffix
        )
    lines.append("slot-seconds by tenant")
    for name, t in result["tenants"].items():
        by = ", ".join(f"{k} {v:.0f}" for k, v in t["by_class"].items() if v) or "nothing granted"
        lines.append(f"  {name:<20} {t['slot_seconds']:>12.0f}   ({by})")
    pools = result.get("pools") or {}
    if len(pools) > 1:  # one pool's figures are the totals above
        head = "by pool              sessions  utilization  preemptions   wait p99 (s): G / B / BE"
        lines.append(head + "   slots end/peak")
        for name, p in pools.items():
            p99 = " / ".join(_p99(p["waits"].get(c)) for c in ("guaranteed", "burstable", "besteffort"))
            cap = p["capacity"]
            lines.append(
                f"  {name:<20} {p['sessions']:>6} {p['utilization']:>12.1%} {p['preemptions']:>12}"
                f"   {p99:>26}   {cap['end']:>5}/{cap['peak']}"
            )
    lines.append(
        "preemptions {preemptions}  revocations {revocations}  "
        "expiries {expiries}  refusals {refusals}".format(**result)
    )
    lines.append(
        f"work lost {result['work_lost_slot_seconds']:.1f} slot-s  utilization {result['utilization']:.1%}  "
        f"completed {result['completed']}  unfinished {result['unfinished']}"
    )
    return "\n".join(lines)
