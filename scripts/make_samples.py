"""Derive the samples shipped in scheduler/sim/samples/ — deterministically, byte for byte.

Why samples at all: a clone (or an installed package) must be able to run `slotsched trace
import`, `slotsched simulate` and `slotsched simulate --compare`, and the tests of the trace
converter must run, without the full public traces (3.9 MB, kept outside the repository).

What it writes (scheduler/sim/samples/README.md describes each file, its licence and citation):

- `claude_code_agent_sessions_sample.csv`: every row of the first 60 sessions (by trace_id) of
  the agent-sessions trace, verbatim, same columns. Needs the full trace (`--sessions`).
- `azure_llm_conv_2023_sample.csv`: every 10th request of the Azure conversation trace, from the
  first, verbatim (1,937 of 19,366: the whole 58 minutes, with its bursts and lulls thinned
  evenly). Needs the full trace (`--arrivals`).
- `agent-sessions.csv`, `agent-sessions-policy.yaml`: `slotsched trace import` of the two samples
  (arguments in IMPORT_ARGS), the workload and the policy sized to it.
- `two-incidents.csv`, `busy-300.csv`: seeded synthetic workloads for the tenants of `policy.yaml`
  (a hand-written copy of deploy/policy-example.yaml without tokens).

Without the full traces the two trace samples are left as they are and everything derived from
them is rebuilt from the shipped copies, so `--workloads-only` (what the test does) needs no data
outside the repository.

    python scripts/make_samples.py                                  # full traces from ../shared/data
    python scripts/make_samples.py --sessions S.csv --arrivals A.csv
    python scripts/make_samples.py --workloads-only --out /tmp/samples
"""

from __future__ import annotations

import argparse
import csv
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core.types import QoS  # noqa: E402
from scheduler.sim.traces.convert import (  # noqa: E402
    SAMPLE_ARRIVALS,
    SAMPLE_SESSIONS,
    ImportConfig,
    import_files,
    samples_dir,
)
from scheduler.sim.traces.policy import policy_for  # noqa: E402
from scheduler.sim.workload import Period, SessionPlan, write_workload  # noqa: E402

# Where this team keeps the full traces; anyone else passes --sessions/--arrivals.
FULL_DATA = ROOT.parent / "shared" / "data"
SESSIONS_KEPT = 60
ARRIVAL_STRIDE = 10
# `slotsched trace import` arguments of agent-sessions.csv (README "Sample workloads" shows them).
IMPORT_ARGS = {"tenants": 6, "seed": 1, "workers": 6, "max_workers": 12}

G, B, BE = QoS.GUARANTEED, QoS.BURSTABLE, QoS.BEST_EFFORT


# ---------------------------------------------------------------- the trace samples


def _lines(path: Path) -> Iterator[str]:
    with open(path, newline="") as f:
        for line in f:
            yield line.rstrip("\r\n") + "\n"


def sample_sessions(src: Path, dst: Path, keep: int = SESSIONS_KEPT) -> int:
    """Every row of the `keep` smallest trace ids, in file order; returns the sessions kept."""
    rows = _lines(src)
    header = next(rows)
    body = [(next(csv.reader([line]))[0], line) for line in rows]
    kept = set(sorted({trace_id for trace_id, _ in body})[:keep])
    with open(dst, "w", newline="") as out:
        out.write(header)
        out.writelines(line for trace_id, line in body if trace_id in kept)
    return len(kept)


def sample_arrivals(src: Path, dst: Path, stride: int = ARRIVAL_STRIDE) -> int:
    """Every `stride`-th request from the first; returns the requests kept."""
    rows = _lines(src)
    header = next(rows)
    kept = [line for i, line in enumerate(rows) if i % stride == 0]
    with open(dst, "w", newline="") as out:
        out.write(header)
        out.writelines(kept)
    return len(kept)


# ---------------------------------------------------------------- synthetic workloads


def _periods(
    rng: random.Random, at: float, hold_median: float, n: int, think: tuple[float, float]
) -> list[Period]:
    """`n` closed-loop periods of lognormal holds (median `hold_median`) and uniform thinks."""
    out = []
    for i in range(n):
        hold = round(hold_median * rng.lognormvariate(0.0, 0.6), 1)
        gap = None if i == 0 else round(rng.uniform(*think), 1)
        out.append(Period(hold, gap, at, snapshot_bytes=rng.choice((1, 4, 16)) << 20))
    return out


def two_incidents(seed: int = 2) -> list[SessionPlan]:
    """A full pool of long research, support and batch work; two incidents strike it.

    At 0-120 s 30 sessions fill the 24 slots (support-copilot Burstable at its nominal, research
    bursting past its nominal, evals-batch BestEffort). At 300 s three incident-response
    Guaranteed sessions (and two Burstable) arrive; at 900 s five more Guaranteed, while one of
    the first still holds, and two support-copilot Guaranteed. Within quota a Guaranteed session
    waits one checkpoint for a victim; the two beyond incident-response's quota of 4 wait for the
    tenant's own leases to end. The question the workload asks: how long do the incident
    responders wait on a full pool, and who pays."""
    rng = random.Random(seed)
    plans: list[SessionPlan] = []

    def add(
        prefix: str, tenant: str, qos: QoS, n: int, start: float, spread: float, hold: float, k: int
    ) -> None:
        for i in range(n):
            at = round(start + rng.uniform(0.0, spread), 1)
            plans.append(
                SessionPlan(f"{prefix}-{i + 1:02d}", tenant, qos, _periods(rng, at, hold, k, (5, 60)))
            )

    add("support", "support-copilot", B, 8, 0, 60, 500, 3)
    add("research", "research", B, 10, 0, 60, 900, 2)
    add("evals", "evals-batch", BE, 12, 0, 120, 1200, 1)
    add("incident1-g", "incident-response", G, 3, 300, 20, 240, 2)
    add("incident1-b", "incident-response", B, 2, 300, 20, 300, 1)
    add("incident2-g", "incident-response", G, 5, 900, 30, 300, 2)
    add("incident2-support-g", "support-copilot", G, 2, 900, 30, 200, 1)
    return sorted(plans, key=lambda p: (p.arrival_s, p.session_id))


# tenant -> (share of the sessions, class mix g/b/be within the tenant's quotas of policy.yaml)
_BUSY_TENANTS: dict[str, tuple[float, tuple[float, float, float]]] = {
    "support-copilot": (0.40, (0.1, 0.6, 0.3)),
    "research": (0.25, (0.0, 0.7, 0.3)),
    "evals-batch": (0.25, (0.0, 0.0, 1.0)),
    "incident-response": (0.10, (0.5, 0.5, 0.0)),
}


def busy_300(seed: int = 3, sessions: int = 300, window_s: float = 1800.0) -> list[SessionPlan]:
    """300 agent sessions over 30 minutes, about 1.7 times what the 24-slot pool can serve.

    Poisson starts over the window; tenants and classes drawn by the shares above; each session
    1-4 closed-loop periods (median hold 150 s, think 10-120 s)."""
    rng = random.Random(seed)
    names = list(_BUSY_TENANTS)
    at = 0.0
    plans = []
    for i in range(sessions):
        at += rng.expovariate(sessions / window_s)
        tenant = rng.choices(names, weights=[_BUSY_TENANTS[t][0] for t in names])[0]
        qos = rng.choices((G, B, BE), weights=_BUSY_TENANTS[tenant][1])[0]
        n = rng.choice((1, 1, 2, 3, 4))
        plans.append(
            SessionPlan(f"s{i + 1:03d}", tenant, qos, _periods(rng, round(at, 1), 150, n, (10, 120)))
        )
    return plans


# ---------------------------------------------------------------- main


def write_imported(sessions: Path, arrivals: Path, out: Path) -> int:
    """What `slotsched trace import … --out agent-sessions.csv --policy-out …` writes."""
    from scheduler.policy.yaml_io import policy_to_yaml

    a = IMPORT_ARGS
    plans = import_files(sessions, arrivals, ImportConfig(tenants=a["tenants"], seed=a["seed"]))
    write_workload(out / "agent-sessions.csv", plans)
    policy = policy_for(plans, a["workers"], 2, a["max_workers"])
    (out / "agent-sessions-policy.yaml").write_text(policy_to_yaml(policy))
    return len(plans)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=Path, default=FULL_DATA / "claude_code_agent_sessions.csv")
    p.add_argument("--arrivals", type=Path, default=FULL_DATA / "azure_llm_conv_2023.csv")
    p.add_argument("--out", type=Path, default=samples_dir(), help="default: scheduler/sim/samples/")
    p.add_argument(
        "--workloads-only", action="store_true", help="keep the shipped trace samples; rebuild the rest"
    )
    a = p.parse_args(argv)
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    shipped = samples_dir()
    sessions, arrivals = out / SAMPLE_SESSIONS, out / SAMPLE_ARRIVALS
    if a.workloads_only or not (a.sessions.is_file() and a.arrivals.is_file()):
        if not a.workloads_only:
            print(f"full traces not found ({a.sessions}, {a.arrivals}): trace samples kept as shipped")
        for name in (SAMPLE_SESSIONS, SAMPLE_ARRIVALS):
            if out.resolve() != shipped.resolve():
                shutil.copyfile(shipped / name, out / name)
    else:
        n = sample_sessions(a.sessions, sessions)
        m = sample_arrivals(a.arrivals, arrivals)
        print(f"wrote {sessions}: {n} sessions; {arrivals}: {m} requests")
    n = write_imported(sessions, arrivals, out)
    write_workload(out / "two-incidents.csv", two_incidents())
    write_workload(out / "busy-300.csv", busy_300())
    if out.resolve() != shipped.resolve():
        shutil.copyfile(shipped / "policy.yaml", out / "policy.yaml")
    print(f"wrote {out}: agent-sessions.csv ({n} sessions), two-incidents.csv, busy-300.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
