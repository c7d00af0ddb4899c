#!/usr/bin/env python3
"""Build the shipped diurnal sample, scheduler/sim/samples/diurnal-3d.csv.xz, deterministically.

    python scripts/make_diurnal_sample.py          # (re)write it
    python scripts/make_diurnal_sample.py --check  # exit 1 if the shipped file differs

From the shipped samples only (the Claude Code sessions and the Azure arrivals: their licences
are in samples/README.md), so a clone rebuilds it without the full traces. The rules are
scheduler/sim/diurnal.py's `build_diurnal`; its policy, diurnal-3d-policy.yaml, is written by hand.
"""

from __future__ import annotations

import argparse
import lzma
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.sim.diurnal import build_diurnal  # noqa: E402
from scheduler.sim.traces.convert import (
    SAMPLE_ARRIVALS,
    SAMPLE_SESSIONS,
    read_arrivals,
    read_sessions,
    samples_dir,
)  # noqa: E402
from scheduler.sim.workload import write_workload  # noqa: E402

OUT = "diurnal-3d.csv.xz"  # 1.6 MB of CSV, 66 kB compressed (the samples' size budget)


def build(path: Path) -> None:
    s = samples_dir()
    plans = build_diurnal(read_sessions(s / SAMPLE_SESSIONS), read_arrivals(s / SAMPLE_ARRIVALS))
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = Path(tmp) / "diurnal-3d.csv.xz"
        write_workload(csv_path, plans)
        path.write_bytes(lzma.compress(csv_path.read_bytes(), preset=9))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true")
    a = p.parse_args(argv)
    target = samples_dir() / OUT
    if not a.check:
        build(target)
        print(f"wrote {target}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / OUT
        build(fresh)
        if fresh.read_bytes() != target.read_bytes():
            print(f"{target} is stale: python scripts/make_diurnal_sample.py", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
