"""Operator paper cuts of the CLI, each run as a user runs it (a subprocess, a real server).

Ctrl-C on `demo`, port clashes on `serve` and `worker`, workers in `status`, defaults in --help.
"""

from __future__ import annotations

import argparse
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

from scheduler import cli, listen
from tests.grpc_fixtures import running_server

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


def _leaf_parsers(parser: argparse.ArgumentParser, path: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every runnable subcommand's parser, by its command line ("policy validate")."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {path: parser}
    out: dict[str, argparse.ArgumentParser] = {}
    for name, child in subs[0].choices.items():
        out.update(_leaf_parsers(child, f"{path} {name}".strip()))
    return out


def _shown(value: object) -> set[str]:
    """The ways a help text may spell a default: 2.0 as "2.0" or "2", (0.1, 0.5) as "0.1,0.5"."""
    forms = {str(value)}
    if isinstance(value, float | int) and not isinstance(value, bool):
        forms.add(f"{value:g}")
    if isinstance(value, tuple | list):
        forms.add(",".join(f"{v:g}" if isinstance(v, float | int) else str(v) for v in value))
    return forms


def test_every_option_with_a_default_shows_it_in_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: no default split by wrapping
    leaves = _leaf_parsers(cli.build_parser())
    assert {"serve", "status", "worker", "demo", "simulate", "policy validate", "trace import"} <= set(leaves)
    missing = []
    for command, parser in leaves.items():
        lines = parser.format_help().splitlines()
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
                continue
            flag = action.option_strings[-1]
            starts = [i for i, ln in enumerate(lines) if ln.startswith("  -") and ln.split()[0] == flag]
            assert len(starts) == 1, (command, flag)
            # The option's entry: its line and the help lines indented under it.
            end = starts[0] + 1
            while (
                end < len(lines) and lines[end].startswith("   ") and not lines[end].lstrip().startswith("-")
            ):
                end += 1
            entry = " ".join(" ".join(lines[starts[0] : end]).split())
            spelled = ("default {}", "default: {}", "{} (default")
            if not any(form.format(v) in entry for v in _shown(action.default) for form in spelled):
                missing.append(f"{command} {flag} (default {action.default!r}): {entry}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize(
    "command",
    [
        ["status", "--json", "--target", "{target}"],
        ["policy", "crd"],
        ["policy", "validate", "deploy/policy-example.yaml"],
        ["trace", "samples", "--path"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_output_to_a_reader_that_went_away_ends_quietly(command: list[str]) -> None:
    """`slotsched status --json | head`: the reader closes its end; no BrokenPipeError traceback
    (nor "Exception ignored ... BrokenPipeError" at exit), exit 1 as for SIGPIPE in the docs."""
    with running_server(None) as server:  # dev mode: status needs no token
        args = [a.format(target=server.target) for a in command]
        proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", *args],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # before the command writes a byte: its first write meets a closed pipe
        err = proc.stderr.read().decode()
        proc.wait(30)
    assert "BrokenPipe" not in err and "Traceback" not in err, err
    assert (proc.returncode, err) == (1, "")


SAMPLE = str(ROOT / "scheduler/sim/samples/busy-300.csv")


@pytest.mark.parametrize(
    ("argv", "flag", "why"),
    [
        (["demo", "--duration", "-5"], "--duration", "must be > 0, not -5"),
        (["demo", "--duration", "nan"], "--duration", "must be a finite number"),
        (["simulate", "--workload", SAMPLE, "--until", "-5"], "--until", "must be > 0, not -5"),
        (
            ["simulate", "--workload", SAMPLE, "--checkpoint-seconds", "-3"],
            "--checkpoint-seconds",
            "must be >= 0, not -3",
        ),
        (["simulate", "--workload", SAMPLE, "--out", "x"], "--out", "only with --compare"),
        (["simulate", "--compare", "--workload", SAMPLE, "--out", "{file}"], "--out", "{file} is a file"),
        (
            ["simulate", "--compare", "--workload", SAMPLE, "--out", "{file}/r"],
            "--out",
            "{file}/r is under {file}, a file",
        ),
    ],
)
def test_nonsense_values_are_usage_errors_naming_the_flag(
    argv: list[str],
    flag: str,
    why: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    existing = tmp_path / "report.md"
    existing.write_text("mine\n")

    def no_work(*_: object, **__: object) -> None:
        raise AssertionError("ran before checking its options")

    from scheduler.demo import run as demo_run
    from scheduler.sim.compare import run as compare_run

    monkeypatch.setattr(compare_run, "compare", no_work)
    monkeypatch.setattr(demo_run, "demo_main", no_work)
    with pytest.raises(SystemExit) as e:
        cli.main([a.format(file=existing) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"slotsched {argv[0]}: error: argument {flag}: {why.format(file=existing)}" in err, err
    assert existing.read_text() == "mine\n"
