"""`slotsched demo --json`: runs as a real command and reports what it promises.

Why a subprocess: the demo is a user-facing command; the test runs it exactly as documented
(`python -m scheduler.cli demo --duration 15 --json`) and checks the JSON contract — the classes
block has the same shape as `slotsched simulate --json`, the pool was too small so something was
preempted, and every resume verified (no failures).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


def _shape(value: object) -> object:
    """The keys of nested dicts, with leaves replaced by their type."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return type(value).__name__


def test_demo_json_outcome(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "demo", "--duration", "15", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    for key in ("classes", "preemptions", "resumes_verified", "resume_failures", "work_lost_slot_seconds"):
        assert key in out, key
    assert out["preemptions"] >= 1, out
    assert out["resume_failures"] == 0, out
    assert out["resumes_verified"] >= 1, out
    assert isinstance(out["work_lost_slot_seconds"], float)
    assert out["checkpoints"]["count"] >= 1 and out["checkpoints"]["failed"] == 0
    assert "class" in r.stderr and "preemptions" in r.stderr  # the live table went to stderr

    # The classes block has the shape of `slotsched simulate --json`'s.
    csv = tmp_path / "w.csv"
    csv.write_text(
        "arrival_s,session_id,tenant,qos_class,hold_s\n"
        "0,a,batch,besteffort,10\n1,b,product,burstable,5\n2,c,sre,guaranteed,5\n"
    )
    assert cli_main(["simulate", "--workload", str(csv), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert _shape(out["classes"]) == _shape(sim["classes"])
