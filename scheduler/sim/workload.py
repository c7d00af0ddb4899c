"""Workload files for the simulator: who asks for a slot, when, in which class, for how long.

CSV columns: `arrival_s,session_id,tenant,qos_class,hold_s` and optionally `snapshot_bytes`,
`think_s` and `crash_after_s`.

- Open loop: one row per session; it arrives at `arrival_s` and holds its slot for `hold_s`.
- Closed loop (agent sessions): several rows with the same `session_id`, in file order, each an
  active period. The first row arrives at `arrival_s`; each later row with a `think_s` value
  starts `think_s` after the previous period ended — a session delayed in the queue runs later,
  as a real agent does. A later row with an empty `think_s` arrives at its own `arrival_s`.
- `pool` (optional): the pool the session asks for (`Acquire.pool`); `gpu|cpu` names fallbacks
  after the first, in order. `fallback` (optional): more fallback pools, `|`-separated. Empty:
  the policy's only pool (or the one named `default`). Every row of a session names the same.
- `selector` (optional): the labels a pool must have, `key=value` pairs `;`-separated
  (`kind=gpu;tier=a`; `Acquire.selector`): every pool of the policy they match, in the policy's
  order, then `fallback`. A request no pool matches is refused `no_eligible_pool`, as the server
  does (the core's placement decides). Not with `pool` (give a pool or a selector, as the SDK).
- `calls` (optional): the LLM calls of the period, `;`-separated, each
  `offset/input_tokens/output_tokens/api_s` (`offset`: seconds from the session's start on its
  own unconstrained timeline; `api_s`: how long the provider took). The token-budget simulator
  (`scheduler/sim/budget/`) replays them; the slot simulator ignores them.
- `crash_after_s`: the holder dies that long after its grant. Until then it renews and answers
  yields like any holder; then it stops renewing and never releases (the lease expires one TTL
  after its last renewal).
"""

from __future__ import annotations

import csv
import lzma
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from scheduler.core.types import QoS

REQUIRED = ("arrival_s", "session_id", "tenant", "qos_class", "hold_s")
OPTIONAL = ("snapshot_bytes", "think_s", "crash_after_s", "pool", "fallback", "selector", "calls")
POOL_COLUMNS = ("pool", "fallback", "selector")


class WorkloadError(ValueError):
    pass


@dataclass(frozen=True)
class LlmCall:
    """One LLM call of a session: when it starts on the session's own timeline (seconds from its
    start, as if nothing ever waited), its tokens as the provider reported them, its API time."""

    offset_s: float
    input_tokens: int
    output_tokens: int
    api_s: float

    def encode(self) -> str:
        return f"{_short(self.offset_s)}/{self.input_tokens}/{self.output_tokens}/{_short(self.api_s)}"


def _short(x: float) -> str:
    """Milliseconds at most, no trailing zeros (`19`, `7.34`): the calls column is most of a file."""
    return f"{x:.3f}".rstrip("0").rstrip(".")


def parse_calls(text: str, line: int) -> tuple[LlmCall, ...]:
    """The `calls` column: `offset/input/output/api;…` (empty: none)."""
    out: list[LlmCall] = []
    for part in (text or "").split(";"):
        part = part.strip()
        if not part:
            continue
        fields = part.split("/")
        if len(fields) != 4:
            raise WorkloadError(f"line {line}: column calls: {part!r} is not offset/input/output/api")
        try:
            off, api = float(fields[0]), float(fields[3])
            tin, tout = int(fields[1]), int(fields[2])
        except ValueError:
            raise WorkloadError(
                f"line {line}: column calls: {part!r} has a field that is not a number"
            ) from None
        if min(off, api, tin, tout) < 0 or not (math.isfinite(off) and math.isfinite(api)):
            raise WorkloadError(f"line {line}: column calls: {part!r} has a negative or infinite field")
        out.append(LlmCall(off, tin, tout, api))
    return tuple(out)


@dataclass(frozen=True)
class Period:
    hold_s: float
    think_s: float | None  # gap after the previous period; None for the first or open-loop rows
    arrival_s: float
    snapshot_bytes: int = 0
    crash_after_s: float | None = None
    calls: tuple[LlmCall, ...] = ()  # the LLM calls made in this period (column calls)


@dataclass
class SessionPlan:
    session_id: str
    tenant: str
    qos: QoS
    periods: list[Period] = field(default_factory=list)
    pool: str = ""  # the pool asked for ("": the policy's only pool, or `default`)
    fallback: tuple[str, ...] = ()  # then these, in order (Acquire.fallback)
    selector: tuple[tuple[str, str], ...] = ()  # labels, sorted by key (Acquire.selector)

    @property
    def pools(self) -> tuple[str, ...]:
        """Every pool the session may land in, in the order asked ("" first: the default one)."""
        return (self.pool, *self.fallback)

    @property
    def arrival_s(self) -> float:
        return self.periods[0].arrival_s

    @property
    def calls(self) -> list[LlmCall]:
        """Every LLM call of the session, by offset."""
        return sorted((c for p in self.periods for c in p.calls), key=lambda c: c.offset_s)

    @property
    def total_hold_s(self) -> float:
        return sum(p.hold_s for p in self.periods)


def _num(row: dict[str, str], key: str, line: int, required: bool = True) -> float | None:
    text = (row.get(key) or "").strip()
    if not text:
        if required:
            raise WorkloadError(f"line {line}: column {key} is empty")
        return None
    try:
        value = float(text)
    except ValueError:
        raise WorkloadError(f"line {line}: column {key} must be a number, not {text!r}") from None
    if value < 0:
        raise WorkloadError(f"line {line}: column {key} must be >= 0, not {value}")
    return value


def _pools(row: dict[str, str], line: int, selector: bool = False) -> tuple[str, tuple[str, ...]]:
    """`pool` (`a|b`: a, then b) and `fallback` (`c|d`) -> (pool, fallbacks in order, no repeats).
    With a `selector`, fallbacks follow the pools it matches."""
    names = [n.strip() for n in (row.get("pool") or "").split("|")]
    more = [n.strip() for n in (row.get("fallback") or "").split("|")]
    if any(not n for n in names[1:]) or (row.get("fallback") or "").strip() and any(not n for n in more):
        raise WorkloadError(f"line {line}: an empty pool name in pool/fallback")
    if not names[0] and not selector and len(names) + len([n for n in more if n]) > 1:
        raise WorkloadError(f"line {line}: fallback pools need a first pool in column pool")
    fallback: list[str] = []
    for n in names[1:] + [n for n in more if n]:
        if n != names[0] and n not in fallback:
            fallback.append(n)
    return names[0], tuple(fallback)


def _selector(row: dict[str, str], line: int) -> tuple[tuple[str, str], ...]:
    """`selector`: `k=v;k2=v2` -> ((k, v), (k2, v2)) sorted by key, as the SDK sends it."""
    text = (row.get("selector") or "").strip()
    if not text:
        return ()
    pairs: dict[str, str] = {}
    for part in text.split(";"):
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or not key or not value:
            raise WorkloadError(f"line {line}: column selector: {part.strip()!r} is not key=value")
        if key in pairs:
            raise WorkloadError(f"line {line}: column selector names {key!r} twice")
        pairs[key] = value
    if (row.get("pool") or "").strip():
        raise WorkloadError(f"line {line}: give a pool or a selector, not both")
    return tuple(sorted(pairs.items()))


def parse_rows(rows: Iterable[dict[str, str]], header: Iterable[str]) -> list[SessionPlan]:
    cols = list(header)
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise WorkloadError(f"workload lacks column(s) {', '.join(missing)}; needs {', '.join(REQUIRED)}")
    unknown = [c for c in cols if c not in REQUIRED + OPTIONAL]
    if unknown:
        raise WorkloadError(
            f"unknown column(s) {', '.join(unknown)}; allowed: {', '.join(REQUIRED + OPTIONAL)}"
        )
    plans: dict[str, SessionPlan] = {}
    for line, row in enumerate(rows, start=2):
        sid = (row.get("session_id") or "").strip()
        tenant = (row.get("tenant") or "").strip()
        if not sid or not tenant:
            raise WorkloadError(f"line {line}: session_id and tenant must not be empty")
        try:
            qos = QoS.parse(row.get("qos_class") or "")
        except ValueError as e:
            raise WorkloadError(f"line {line}: {e}") from None
        arrival = _num(row, "arrival_s", line, required=False)
        hold = _num(row, "hold_s", line)
        snap = _num(row, "snapshot_bytes", line, required=False)
        think = _num(row, "think_s", line, required=False)
        crash = _num(row, "crash_after_s", line, required=False)
        selector = _selector(row, line)
        pool, fallback = _pools(row, line, bool(selector))
        plan = plans.get(sid)
        if plan is None:
            if arrival is None:
                raise WorkloadError(f"line {line}: the first row of session {sid} needs arrival_s")
            plan = plans[sid] = SessionPlan(sid, tenant, qos, pool=pool, fallback=fallback, selector=selector)
            think = None
        elif plan.tenant != tenant or plan.qos != qos:
            raise WorkloadError(f"line {line}: session {sid} changes tenant or class between rows")
        elif (plan.pool, plan.fallback, plan.selector) != (pool, fallback, selector):
            raise WorkloadError(f"line {line}: session {sid} changes pool, fallback or selector between rows")
        elif think is None and arrival is None:
            raise WorkloadError(f"line {line}: a later row of session {sid} needs think_s or arrival_s")
        assert hold is not None
        plan.periods.append(
            Period(
                hold,
                think,
                arrival if arrival is not None else 0.0,
                int(snap or 0),
                crash,
                parse_calls(row.get("calls") or "", line),
            )
        )
    return sorted(plans.values(), key=lambda p: (p.arrival_s, p.session_id))


def load_workload(path: str | Path) -> list[SessionPlan]:
    """A workload CSV; one ending `.xz` is read through lzma (a large shipped sample, compressed)."""
    try:
        if str(path).endswith(".xz"):
            f: TextIO = lzma.open(path, "rt", newline="", encoding="utf-8")  # noqa: SIM115 (as below)
        else:
            f = open(path, newline="")  # noqa: SIM115 (closed below; the error names the file)
    except FileNotFoundError:
        raise WorkloadError(f"workload file not found: {path}") from None
    except OSError as e:
        raise WorkloadError(f"cannot read workload file {path}: {e.strerror or e}") from None
    with f:
        reader = csv.DictReader(f)
        return parse_rows(reader, reader.fieldnames or [])


def unknown_tenants(plans: Iterable[SessionPlan], known: Iterable[str]) -> dict[str, int]:
    """Sessions per tenant the policy lacks, by name: every one of their requests would be refused."""
    names = set(known)
    out: dict[str, int] = {}
    for p in plans:
        if p.tenant not in names:
            out[p.tenant] = out.get(p.tenant, 0) + 1
    return dict(sorted(out.items()))


def describe_tenants(counts: dict[str, int]) -> str:
    """`a (3 sessions), b (1 session)`."""
    return ", ".join(f"{t} ({n} session{'s' if n != 1 else ''})" for t, n in counts.items())


def write_workload(path: str | Path, plans: Iterable[SessionPlan]) -> None:
    """Write plans back in the same format (closed-loop periods as think_s rows); the pool columns
    only when some plan names a pool or a fallback, `selector` only when some plan has one, `calls`
    only when some period carries LLM calls."""
    plans = list(plans)
    selected = any(p.selector for p in plans)
    pooled = selected or any(p.pool or p.fallback for p in plans)
    called = any(per.calls for p in plans for per in p.periods)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(REQUIRED + OPTIONAL[: 3 + 2 * pooled + selected] + ("calls",) * called)
        for p in plans:
            extra = [p.pool, "|".join(p.fallback)] if pooled else []
            if selected:
                extra.append(";".join(f"{k}={v}" for k, v in p.selector))
            for i, per in enumerate(p.periods):
                w.writerow(
                    [
                        f"{per.arrival_s:.3f}" if i == 0 or per.think_s is None else "",
                        p.session_id,
                        p.tenant,
                        p.qos.value,
                        f"{per.hold_s:.3f}",
                        per.snapshot_bytes or "",
                        "" if per.think_s is None else f"{per.think_s:.3f}",
                        "" if per.crash_after_s is None else f"{per.crash_after_s:.3f}",
                        *extra,
                        *([";".join(c.encode() for c in per.calls)] if called else []),
                    ]
                )
