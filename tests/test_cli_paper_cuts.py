"""Operator paper cuts of the CLI, each run as a user runs it (a subprocess, a real server).

Ctrl-C on `demo`, port clashes on `serve` and `worker`, workers in `status`, defaults in --help.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from scheduler import listen

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


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another process (here: a plain listening socket) already holds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (["serve", "--listen", "127.0.0.1:0"], "--metrics-listen"),
        (["serve", "--metrics-listen", "127.0.0.1:0"], "--listen"),
        (["worker", "--worker-id", "w1"], "--listen"),
        (["worker", "--worker-id", "w1"], "--metrics-listen"),
    ],
)
def test_a_port_clash_names_the_address_and_the_flag(command: list[str], flag: str, taken_port: int) -> None:
    address = f"127.0.0.1:{taken_port}"
    r = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *command, flag, address],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"error: cannot listen on {address} for {flag}: address already in use" in r.stderr, r.stderr
    for leak in ("add_port", "E1201", "Traceback", "Errno"):
        assert leak not in r.stderr, r.stderr
    # The dev-mode warning belongs to a server that runs, not to one that failed to start.
    assert "INSECURE" not in r.stderr + r.stdout


def test_a_bind_the_probe_missed_keeps_the_c_core_log_off_stderr(
    taken_port: int, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The port is taken between the Python probe and the C-core's bind (a race): the same error."""
    monkeypatch.setattr(listen, "check_bindable", lambda address, flag: None)

    async def go() -> None:
        server = grpc.aio.server()
        try:
            with pytest.raises(listen.ListenError) as e:
                listen.add_grpc_port(server, f"127.0.0.1:{taken_port}", "--listen")
            assert (
                str(e.value)
                == f"cannot listen on 127.0.0.1:{taken_port} for --listen: address already in use"
            )
        finally:
            await server.stop(None)

    asyncio.run(go())
    err = capfd.readouterr().err
    assert "add_port" not in err and "E1201" not in err, err
