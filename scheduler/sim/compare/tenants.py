"""The per-tenant part of report.md (issue 23): what a platform team asks of each contender.

Why per tenant: the class figures of the main table can look fine while one tenant waits for its
first slot for an hour, and when tenants outnumber slots that is exactly what goes wrong. Three
compact tables, a row per tenant with demand and a column per contender:

- first grant (seconds from the tenant's first request to its first slot), time-to-slot
  p50/p99/max over all its waits, slot-seconds; under them, per contender, the latest first grant
  and the spread of slot-seconds / weight (max over min);
- its p99 time-to-slot per class (Guaranteed / Burstable / BestEffort);
- its fair-share attainment (`scheduler/sim/attainment.py`), and the lowest over tenants.

Every figure is `simulate --json`'s `tenants.<t>` (p50 and max per class are there too). The rows
carry no leading `|` (GitHub-flavoured markdown makes the outer pipes optional) so that a reader
that takes the lines starting with `|` for the main table (the CLI's summary, the bench script)
still finds it alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scheduler.sim.compare.metrics import RunFigures
from scheduler.sim.stats import CLASS_KEYS

NONE = "—"  # nothing measured: never granted, or no grant of the class


def _s(v: float | None) -> str:
    if v is None:
        return NONE
    return "∞" if math.isinf(v) else f"{v:.1f}"


def _row(cells: Sequence[str]) -> str:
    return " | ".join(cells)


def tenant_cell(t: dict[str, Any] | None) -> str:
    """`first grant · p50/p99/max · slot-s` of one tenant under one contender."""
    if t is None or t["first_grant_s"] is None:
        return f"{NONE} never granted"
    w = t["time_to_slot"]
    return (
        f"{_s(t['first_grant_s'])} · {_s(w['p50'])}/{_s(w['p99'])}/{_s(w['max'])} · {t['slot_seconds']:.0f}"
    )


def class_cell(t: dict[str, Any] | None) -> str:
    if t is None:
        return NONE
    return " / ".join(_s(t["waits_by_class"][c]["p99"]) for c in CLASS_KEYS)


def _a(v: float | None) -> str:
    return NONE if v is None else f"{v:.2f}"


def attainment_cell(t: dict[str, Any] | None) -> str:
    """`all (G / B / BE)` of one tenant's fair-share attainment under one contender."""
    a = None if t is None else t.get("attainment")
    if not a:
        return NONE
    return f"{_a(a['all'])} ({' / '.join(_a(a[c]) for c in CLASS_KEYS)})"


def _spread(f: RunFigures) -> str:
    if math.isinf(f.share_spread):
        never = sum(1 for t in f.tenants.values() if t["slot_seconds"] == 0)
        return f"∞ ({never} got none)"
    return f"{f.share_spread:.2f}"


def _latest(f: RunFigures) -> str:
    v = f.first_grant_max
    if v is not None and math.isinf(v):
        never = sum(1 for t in f.tenants.values() if t["first_grant_s"] is None)
        return f"∞ ({never} never granted)"
    return _s(v)


def tenant_tables(figs: Sequence[RunFigures]) -> list[str]:
    """The section's lines; none when no contender has per-tenant figures."""
    names = sorted({n for f in figs for n in f.tenants})
    if not names:
        return []
    head = [(f"**{f.name}**" if f.name.startswith("slotsched") else f.name) for f in figs]
    sep = _row(["---"] * (len(figs) + 1))
    lines = [
        "## Per tenant",
        "",
        "First grant (s from the tenant's first request to its first slot) · time-to-slot p50/p99/max "
        "(s, every wait: the first and each after a yield, a kill or a refusal) · slot-seconds, for "
        "each tenant with sessions in the workload; `simulate --json` has them as `tenants.<t>`.",
        "",
        _row(["tenant", *head]),
        sep,
        *(_row([n, *(tenant_cell(f.tenants.get(n)) for f in figs)]) for n in names),
        _row(["*latest first grant (s)*", *(_latest(f) for f in figs)]),
        _row(["*slot-s / weight, max / min*", *(_spread(f) for f in figs)]),
        "",
        "p99 time-to-slot per class (s), Guaranteed / Burstable / BestEffort (— : no grant of the "
        "class; p50 and max are in the JSON's `waits_by_class`):",
        "",
        _row(["tenant", *head]),
        sep,
        *(_row([n, *(class_cell(f.tenants.get(n)) for f in figs)]) for n in names),
        "",
        "Fair-share attainment: slots held while the tenant had work over its weighted max-min "
        "entitlement at the same samples (scheduler/sim/attainment.py; 1 is its share), all classes "
        "(Guaranteed / Burstable / BestEffort); `attainment` in the JSON:",
        "",
        _row(["tenant", *head]),
        sep,
        *(_row([n, *(attainment_cell(f.tenants.get(n)) for f in figs)]) for n in names),
        _row(["*lowest (attainment_min)*", *(_a(f.attainment_min) for f in figs)]),
        "",
    ]
    return lines
