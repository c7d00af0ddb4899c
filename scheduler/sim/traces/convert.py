"""Public traces → simulator workloads: real agent sessions, a real arrival process, seeded tenants.

Why: the simulator's answers are only as good as its workload. Synthetic Poisson sessions of fixed
length hide what makes agent runtimes hard: sessions are active in short bursts separated by long,
heavy-tailed idle gaps. This module turns one row per LLM call of real coding-agent sessions into
closed-loop periods (`hold_s`, `think_s`) and gives them start times from a real arrival process.

The rules, each deterministic for a given `seed`:

- **Sessions.** One trace (`trace_id`) is one session. Sub-agents are flattened into it: a
  sub-agent is a tool call of the main agent and runs inside the same actor, so its LLM calls keep
  the session's slot busy exactly as the main agent's do.
- **Bursts and gaps.** A call occupies `[t_s, t_s + api_time_s]` on the session clock. Calls of all
  agents are merged into active bursts; a gap between bursts of at most `gap_threshold_s` (tool
  runs, short thinking) stays inside the burst. A longer gap is idle: the session checkpoints and
  releases its slot, and asks again when its next burst starts (a closed-loop period).
- **Idle timeout.** A runtime cannot know in advance that a gap will be long, so it holds the slot
  for `gap_threshold_s` of idleness before releasing: a period's `hold_s` is its burst plus the
  threshold (the last period ends with its burst: the session is over) and the next `think_s` is
  the gap less the threshold. Nothing of the session's timeline is added or lost.
- **Missing call durations.** `api_time_s` is empty for some calls; it is recovered from the next
  call of the same agent (`t_next - think_time_next - t_s`) when that is known, else taken as 0.
- **Which sessions.** `limit` sessions are drawn without replacement with the seed; beyond the 710
  of the trace, sessions are reused with a `~k` suffix on the id.
- **Start times.** Session starts are a seeded thinning of the arrivals trace's request timestamps
  (so they keep its bursts and lulls), mapped linearly onto `[0, duration_s]`. `duration_s`
  defaults to the trace's own span; `rate_per_s` sets it to `sessions / rate`. Without an arrivals
  trace, starts are a seeded Poisson process over the same window.
- **Tenants.** `tenants` tenants named `t01`, `t02`, … by rank; tenant `k` gets a Zipf share
  `k**-zipf_s / sum` of the sessions (a few large tenants and a long tail). Counts are exact
  (largest remainder) and the assignment is a seeded shuffle, so proportions do not drift with
  the seed. Tail tenants whose share rounds to zero get no session.
- **Classes.** The `mix` (Guaranteed, Burstable, BestEffort fractions) is applied the same way:
  exact counts, seeded shuffle, independent of the tenant draw.
- **Calls** (`calls=True`, `trace import --calls`): each period carries its LLM calls (offset
  from the session's start, input and output tokens, API time), for the token-budget simulator.
  A call's offset is its `t_s` less the session's first call's, so the unconstrained timeline of
  the calls and of the periods agree.
- **Snapshot size.** About 4 bytes per context token of the period's last call (the transcript an
  agent checkpoints); it only labels the snapshot in the simulator.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from scheduler.core.types import QoS
from scheduler.sim.workload import LlmCall, Period, SessionPlan

CLASS_ORDER: tuple[QoS, QoS, QoS] = (QoS.GUARANTEED, QoS.BURSTABLE, QoS.BEST_EFFORT)
BYTES_PER_TOKEN = 4
# Derived samples of the two public traces, shipped in samples_dir() (its README.md gives their
# licences and citations; scripts/make_samples.py derives them from the full traces).
SAMPLE_SESSIONS = "claude_code_agent_sessions_sample.csv"
SAMPLE_ARRIVALS = "azure_llm_conv_2023_sample.csv"


def samples_dir() -> Path:
    """The sample traces, workloads and policies shipped as package data, so that a clone and an
    installed package alike can import, simulate and compare without the full traces."""
    return Path(__file__).resolve().parents[1] / "samples"


class TraceError(ValueError):
    pass


@dataclass(frozen=True)
class ImportConfig:
    gap_threshold_s: float = 30.0
    tenants: int = 20
    mix: tuple[float, float, float] = (0.1, 0.5, 0.4)  # Guaranteed, Burstable, BestEffort
    limit: int | None = None  # sessions to draw (None: every session of the trace, once)
    seed: int = 0
    duration_s: float | None = None  # window of session starts (None: the arrivals trace's span)
    rate_per_s: float | None = None  # session starts per second (sets the window instead)
    zipf_s: float = 1.1
    calls: bool = False  # keep each period's LLM calls (the workload's `calls` column)

    def __post_init__(self) -> None:
        if self.gap_threshold_s < 0:
            raise TraceError(f"gap threshold must be >= 0, not {self.gap_threshold_s}")
        if self.tenants < 1:
            raise TraceError(f"need at least one tenant, not {self.tenants}")
        if len(self.mix) != 3 or any(x < 0 for x in self.mix) or sum(self.mix) <= 0:
            raise TraceError(f"mix must be three non-negative fractions g,b,be, not {self.mix}")
        if self.limit is not None and self.limit < 1:
            raise TraceError(f"limit must be at least 1, not {self.limit}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise TraceError(f"duration must be > 0, not {self.duration_s}")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise TraceError(f"rate must be > 0, not {self.rate_per_s}")


@dataclass(frozen=True)
class Call:
    start: float
    end: float
    context_tokens: int
    output_tokens: int = 0


@dataclass
class TraceSession:
    trace_id: str
    calls: list[Call] = field(default_factory=list)


# ---------------------------------------------------------------- reading


def _float(text: str | None) -> float | None:
    text = (text or "").strip()
    return float(text) if text else None


def _open(path: str | Path, what: str) -> TextIO:
    """The trace file opened for csv, or a TraceError naming it (never a bare errno)."""
    try:
        return open(path, newline="")
    except FileNotFoundError:
        raise TraceError(f"{what} not found: {path}") from None
    except OSError as e:
        raise TraceError(f"cannot read {what} {path}: {e.strerror or e}") from None


def read_sessions(path: str | Path) -> dict[str, TraceSession]:
    """Calls of every session, all agents flattened, api_time_s recovered where it is empty."""
    by_agent: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    with _open(path, "sessions trace") as f:
        reader = csv.DictReader(f)
        need = {"trace_id", "agent", "t_s", "api_time_s", "think_time_s"}
        missing = need - set(reader.fieldnames or [])
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
        for row in reader:
            by_agent[(row["trace_id"], row["agent"])].append(row)
    sessions: dict[str, TraceSession] = {}
    for (trace_id, _agent), rows in by_agent.items():
        rows.sort(key=lambda r: float(r["t_s"]))
        s = sessions.setdefault(trace_id, TraceSession(trace_id))
        for i, row in enumerate(rows):
            start = float(row["t_s"])
            api = _float(row["api_time_s"])
            if api is None and i + 1 < len(rows):
                nxt_think = _float(rows[i + 1]["think_time_s"])
                if nxt_think is not None:
                    api = max(0.0, float(rows[i + 1]["t_s"]) - nxt_think - start)
            tokens = int(_float(row.get("in_tokens")) or 0)
            out_tokens = int(_float(row.get("out_tokens")) or 0)
            s.calls.append(Call(start, start + (api or 0.0), tokens, out_tokens))
    for s in sessions.values():
        s.calls.sort(key=lambda c: (c.start, c.end))
    return dict(sorted(sessions.items()))


def _seconds(stamp: str) -> float:
    """`2023-11-16 18:15:46.6805900` (7 fractional digits, which fromisoformat refuses) → epoch s."""
    date, _, clock = stamp.strip().partition(" ")
    h, m, s = clock.split(":")
    day = dt.date.fromisoformat(date).toordinal()
    return day * 86400.0 + int(h) * 3600.0 + int(m) * 60.0 + float(s)


def read_arrivals(path: str | Path) -> list[float]:
    """Request times of the arrivals trace, in seconds from its first request, sorted."""
    with _open(path, "arrivals trace") as f:
        reader = csv.DictReader(f)
        if "TIMESTAMP" not in (reader.fieldnames or []):
            raise TraceError(f"{path}: needs a TIMESTAMP column")
        times = sorted(_seconds(row["TIMESTAMP"]) for row in reader)
    if not times:
        raise TraceError(f"{path}: no arrivals")
    return [t - times[0] for t in times]


# ---------------------------------------------------------------- sessions → periods


def bursts(calls: Sequence[Call], gap_threshold_s: float) -> list[tuple[float, float, int]]:
    """Active bursts `(start, end, context tokens of the last call)`: calls whose idle gaps are
    at most the threshold are merged (overlapping sub-agent calls merge too)."""
    out: list[list[float]] = []
    tokens: list[int] = []
    for c in sorted(calls, key=lambda c: (c.start, c.end)):
        if out and c.start - out[-1][1] <= gap_threshold_s:
            if c.end >= out[-1][1]:
                tokens[-1] = c.context_tokens
            out[-1][1] = max(out[-1][1], c.end)
        else:
            out.append([c.start, c.end])
            tokens.append(c.context_tokens)
    return [(s, e, n) for (s, e), n in zip(out, tokens, strict=True)]


def periods(
    session: TraceSession, gap_threshold_s: float, arrival_s: float, with_calls: bool = False
) -> list[Period]:
    """Closed-loop periods of one session starting at `arrival_s` (see the module docstring)."""
    bs = bursts(session.calls, gap_threshold_s)
    calls = sorted(session.calls, key=lambda c: (c.start, c.end))
    origin = bs[0][0] if bs else 0.0
    out: list[Period] = []
    k = 0
    for i, (start, end, tokens) in enumerate(bs):
        last = i == len(bs) - 1
        hold = end - start + (0.0 if last else gap_threshold_s)
        think = None if i == 0 else start - bs[i - 1][1] - gap_threshold_s
        snap = tokens * BYTES_PER_TOKEN
        mine: list[LlmCall] = []
        while with_calls and k < len(calls) and (last or calls[k].start <= end):
            c = calls[k]
            mine.append(
                LlmCall(
                    round(c.start - origin, 3), c.context_tokens, c.output_tokens, round(c.end - c.start, 3)
                )
            )
            k += 1
        out.append(
            Period(
                round(hold, 3), None if think is None else round(think, 3), arrival_s, snap, calls=tuple(mine)
            )
        )
    return out


# ---------------------------------------------------------------- seeded assignment


def exact_counts(n: int, weights: Sequence[float]) -> list[int]:
    """n split by weights with largest remainders: the counts sum to n, each within 1 of n·w."""
    total = sum(weights)
    raw = [n * w / total for w in weights]
    counts = [math.floor(x) for x in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def zipf_weights(n: int, s: float) -> list[float]:
    return [k**-s for k in range(1, n + 1)]


def tenant_names(n: int) -> list[str]:
    width = max(2, len(str(n)))
    return [f"t{k:0{width}d}" for k in range(1, n + 1)]


def _shuffled_labels(labels: Sequence[str], counts: Sequence[int], rng: random.Random) -> list[str]:
    out = [label for label, c in zip(labels, counts, strict=True) for _ in range(c)]
    rng.shuffle(out)
    return out


def session_starts(
    n: int, arrivals: Sequence[float] | None, cfg: ImportConfig, rng: random.Random
) -> list[float]:
    """n sorted start times: a thinning of `arrivals` scaled onto the window, or Poisson."""
    span = (arrivals[-1] - arrivals[0]) if arrivals else 3600.0
    window = cfg.duration_s or (n / cfg.rate_per_s if cfg.rate_per_s else span or 3600.0)
    if not arrivals:
        # n uniform points on the window: a Poisson process conditioned on n arrivals.
        return sorted(rng.uniform(0.0, window) for _ in range(n))
    picks = rng.sample(list(arrivals), n) if n <= len(arrivals) else rng.choices(list(arrivals), k=n)
    scale = window / span if span > 0 else 0.0
    return sorted((t - arrivals[0]) * scale for t in picks)


def pick_sessions(ids: Sequence[str], n: int, rng: random.Random) -> list[tuple[str, str]]:
    """`(trace_id, session_id)` pairs: a seeded draw without replacement, then reuse with `~k`."""
    out: list[tuple[str, str]] = []
    rounds = 0
    while len(out) < n:
        take = min(len(ids), n - len(out))
        suffix = "" if rounds == 0 else f"~{rounds + 1}"
        out += [(t, t + suffix) for t in rng.sample(list(ids), take)]
        rounds += 1
    return out


# ---------------------------------------------------------------- the converter


def import_traces(
    sessions: dict[str, TraceSession], arrivals: Sequence[float] | None, cfg: ImportConfig
) -> list[SessionPlan]:
    """The workload: one closed-loop SessionPlan per drawn session, sorted by arrival."""
    if not sessions:
        raise TraceError("no sessions to import")
    rng = random.Random(cfg.seed)
    n = cfg.limit or len(sessions)
    chosen = pick_sessions(list(sessions), n, rng)
    starts = session_starts(n, arrivals, cfg, rng)
    names = tenant_names(cfg.tenants)
    tenants = _shuffled_labels(names, exact_counts(n, zipf_weights(cfg.tenants, cfg.zipf_s)), rng)
    classes = _shuffled_labels([q.value for q in CLASS_ORDER], exact_counts(n, cfg.mix), rng)
    plans = []
    for (trace_id, sid), start, tenant, qos in zip(chosen, starts, tenants, classes, strict=True):
        ps = periods(sessions[trace_id], cfg.gap_threshold_s, round(start, 3), cfg.calls)
        if ps:
            plans.append(SessionPlan(sid, tenant, QoS(qos), ps))
    return sorted(plans, key=lambda p: (p.arrival_s, p.session_id))


def import_files(
    sessions_path: str | Path, arrivals_path: str | Path | None, cfg: ImportConfig
) -> list[SessionPlan]:
    arrivals = read_arrivals(arrivals_path) if arrivals_path else None
    return import_traces(read_sessions(sessions_path), arrivals, cfg)
