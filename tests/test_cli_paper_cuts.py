"""Operator paper cuts of the CLI, each run as a user runs it (a subprocess, a real server).

Ctrl-C on `demo`, port clashes on `serve` and `worker`, workers in `status`, defaults in --help.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _slotsched(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", *args],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_demo_ctrl_c_stops_cleanly_and_prints_the_partial_outcome() -> None:
    proc = _slotsched("demo", "--duration", "60")
    try:
        assert proc.stderr is not None
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith("slotsched demo  t="):  # the first live table: it runs
                break
        assert seen and seen[-1].startswith("slotsched demo  t="), "".join(seen)
        time.sleep(2.0)  # let it grant and preempt a little
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + err
    assert "Traceback" not in err, err[-3000:]
    assert "KeyboardInterrupt" not in err
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "PARTIAL outcome (interrupted) after" in out, out
    assert "of 60s" in out
    assert "time to slot" in out and "preemptions" in out and "sessions done" in out
