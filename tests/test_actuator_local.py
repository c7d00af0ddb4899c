"""The local actuator starts and stops real processes (a stand-in worker that only sleeps)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from slots.actuators.base import ActuatorError, ScaleNote, WorkerPhase
from slots.actuators.local import LocalActuator

STAND_IN = """
import pathlib, signal, sys, time
args = sys.argv[1:]
out = pathlib.Path(args[0])
if "--ignore-term" in args:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
out.joinpath(args[args.index("--worker-id") + 1] + ".args").write_text(" ".join(args[1:]))
if "--exit" in args:
    sys.exit(int(args[args.index("--exit") + 1]))
time.sleep(120)
"""


def _actuator(tmp_path: Path, *extra: str, grace: float = 5.0) -> LocalActuator:
    script = tmp_path / "stand_in_worker.py"
    script.write_text(STAND_IN)
    cmd = [sys.executable, str(script), str(tmp_path), "--scheduler", "{scheduler}"]
    cmd += ["--worker-id", "{worker_id}", "--slots", "{slots}", '--meta={"k": 1}', *extra]
    return LocalActuator(scheduler="127.0.0.1:50051", slots=3, command=cmd, stop_grace_s=grace)


def _wait(pred: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(pred) and pred():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_processes_start_with_the_template_and_stop_on_remove(tmp_path: Path) -> None:
    act = _actuator(tmp_path)
    try:
        act.scale_to(2)
        ws = act.list()
        assert [(w.worker_id, w.phase) for w in ws] == [
            ("worker-1", WorkerPhase.RUNNING),
            ("worker-2", WorkerPhase.RUNNING),
        ]
        _wait(lambda: all((tmp_path / f"worker-{i}.args").exists() for i in (1, 2)))
        args = (tmp_path / "worker-1.args").read_text()
        assert args == '--scheduler 127.0.0.1:50051 --worker-id worker-1 --slots 3 --meta={"k": 1}'
        act.scale_to(1)  # never lowers: removal is remove()'s job
        assert len(act.list()) == 2
        pid1 = int(ws[0].detail.split()[1])
        act.remove(["worker-1", "not-mine"])
        _wait(lambda: [w.worker_id for w in act.list()] == ["worker-2"])
        assert not _alive(pid1)
        assert act.poll_errors() == []  # asked to stop: not an error
        act.scale_to(2)
        assert [w.worker_id for w in act.list()] == ["worker-2", "worker-3"]
    finally:
        act.close(timeout_s=5)
    assert act.list() == []


def test_a_worker_that_exits_on_its_own_is_reported_once_and_not_listed(tmp_path: Path) -> None:
    act = _actuator(tmp_path, "--exit", "3")
    try:
        act.scale_to(1)
        _wait(lambda: act.list() == [])
        errors = act.poll_errors()
        assert len(errors) == 1 and "worker-1" in errors[0] and "exited with code 3" in errors[0]
        assert act.poll_errors() == []
    finally:
        act.close(timeout_s=5)


def test_a_drained_worker_may_exit_by_itself_but_only_cleanly(tmp_path: Path) -> None:
    def down(*workers: str) -> ScaleNote:
        return ScaleNote("down", 1, 2, 1.0, "scale_down", False, 0.0, workers)

    clean = _actuator(tmp_path, "--exit", "0")
    failed = _actuator(tmp_path, "--exit", "3")
    try:
        clean.scale_to(2)
        clean.record(down("worker-1"))  # the loop drained worker-1, not worker-2
        _wait(lambda: clean.list() == [])
        errors = clean.poll_errors()
        assert len(errors) == 1 and "worker-2" in errors[0] and "exited with code 0" in errors[0]
        failed.scale_to(1)
        failed.record(down("worker-1"))
        _wait(lambda: failed.list() == [])
        assert ["exited with code 3" in e for e in failed.poll_errors()] == [True]  # drained, but failed
    finally:
        clean.close(timeout_s=5)
        failed.close(timeout_s=5)


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    act = _actuator(tmp_path, "--ignore-term", grace=0.3)
    try:
        act.scale_to(1)
        _wait(lambda: (tmp_path / "worker-1.args").exists())  # the handler is installed by now
        act.remove(["worker-1"])
        assert [w.phase for w in act.list()] == [WorkerPhase.STOPPING]
        _wait(lambda: act.list() == [], timeout=5)
    finally:
        act.close(timeout_s=5)


def test_a_command_that_cannot_start_raises_a_typed_error(tmp_path: Path) -> None:
    act = LocalActuator(scheduler="x:1", slots=1, command=[str(tmp_path / "missing-binary")])
    with pytest.raises(ActuatorError, match="cannot start worker worker-1"):
        act.scale_to(1)
    assert act.list() == []


def test_the_environment_chooses_the_actuator() -> None:
    from slots.actuators.dry_run import DryRunActuator
    from slots.actuators.factory import actuator_from_env

    assert actuator_from_env({}, scheduler="h:1", slots=2) is None
    assert isinstance(
        actuator_from_env({"SLOTSCHED_AUTOSCALER": "dry-run"}, scheduler="h:1", slots=2), DryRunActuator
    )
    local = actuator_from_env(
        {
            "SLOTSCHED_AUTOSCALER": "local",
            "SLOTSCHED_WORKER_COMMAND": "my-worker --id {worker_id} --to '{scheduler}'",
        },
        scheduler="h:1",
        slots=2,
    )
    assert isinstance(local, LocalActuator) and local.argv("w-1") == [
        "my-worker",
        "--id",
        "w-1",
        "--to",
        "h:1",
    ]
    with pytest.raises(ValueError, match="needs SLOTSCHED_AUTOSCALER_TARGET"):
        actuator_from_env({"SLOTSCHED_AUTOSCALER": "kubernetes"}, scheduler="h:1", slots=2)
    with pytest.raises(ValueError, match="expected one of"):
        actuator_from_env({"SLOTSCHED_AUTOSCALER": "nomad"}, scheduler="h:1", slots=2)
