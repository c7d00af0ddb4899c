"""Workers as containers from the local actuator: the `docker run` / `podman run` template and
the stop command, run against a stand-in runtime that records what it was asked and behaves like
`docker run` in the foreground (it runs until SIGTERM) and `docker stop`."""

from __future__ import annotations

import json
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slots.actuators.factory import actuator_from_env
from slots.actuators.local import LocalActuator, container_command, container_stop_command

RUNTIME = """#!{python}
import json, os, pathlib, signal, sys, time
log = pathlib.Path({log!r})
args = sys.argv[1:]
with log.open("a") as f:
    f.write(json.dumps({{"argv": args, "token": os.environ.get("SLOTSCHED_TOKEN")}}) + "\\n")
if args[0] == "run":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    time.sleep(120)
"""


def fake_runtime(tmp_path: Path) -> tuple[str, Path]:
    log = tmp_path / "runtime.log"
    script = tmp_path / "fake-docker"
    script.write_text(RUNTIME.format(python=sys.executable, log=str(log)))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), log


def calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def wait_for(pred: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_template_runs_the_project_image_named_after_the_worker() -> None:
    argv = LocalActuator(
        scheduler="127.0.0.1:50051", slots=2, command=container_command("img:1", "podman")
    ).argv("worker-3")
    assert argv == [
        "podman", "run", "--rm", "--name", "worker-3", "--network", "host", "--env", "SLOTSCHED_TOKEN",
        "img:1", "worker", "--scheduler", "127.0.0.1:50051", "--worker-id", "worker-3", "--slots", "2",
    ]  # fmt: skip
    assert container_stop_command("docker", 30) == ("docker", "stop", "--time", "30", "{worker_id}")
    with pytest.raises(ValueError, match="image"):
        container_command("")


def test_a_container_worker_is_started_and_on_removal_stopped_by_the_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, log = fake_runtime(tmp_path)
    monkeypatch.setenv("SLOTSCHED_TOKEN", "worker-token")  # the workers inherit the scheduler's
    env = {
        "SLOTSCHED_AUTOSCALER": "local",
        "SLOTSCHED_WORKER_IMAGE": "ghcr.io/slotsched/slotsched:0.1.0",
        "SLOTSCHED_CONTAINER_RUNTIME": runtime,
    }
    act = actuator_from_env(env, scheduler="127.0.0.1:50051", slots=2)
    assert isinstance(act, LocalActuator)
    try:
        act.scale_to(1)
        wait_for(lambda: len(calls(log)) == 1)
        (run,) = calls(log)
        assert run["argv"][:4] == ["run", "--rm", "--name", "worker-1"]  # type: ignore[index]
        assert run["argv"][-7:] == [  # type: ignore[index]
            "worker", "--scheduler", "127.0.0.1:50051", "--worker-id", "worker-1", "--slots", "2",
        ]  # fmt: skip
        assert "ghcr.io/slotsched/slotsched:0.1.0" in run["argv"]  # type: ignore[operator]
        assert run["token"] == "worker-token"  # passed through to --env SLOTSCHED_TOKEN
        act.remove(["worker-1"])
        wait_for(lambda: any(c["argv"][0] == "stop" for c in calls(log)))  # type: ignore[index]
        stop = next(c for c in calls(log) if c["argv"][0] == "stop")  # type: ignore[index]
        assert stop["argv"] == ["stop", "--time", "10", "worker-1"]
        wait_for(lambda: act.list() == [])  # the `run` client exited on SIGTERM
        assert act.poll_errors() == []
    finally:
        act.close(timeout_s=5)


def test_a_worker_command_wins_over_the_image(tmp_path: Path) -> None:
    env = {
        "SLOTSCHED_AUTOSCALER": "local",
        "SLOTSCHED_WORKER_IMAGE": "img",
        "SLOTSCHED_WORKER_COMMAND": "w {worker_id}",
    }
    act = actuator_from_env(env, scheduler="s:1", slots=1)
    assert isinstance(act, LocalActuator)
    assert act.argv("worker-1") == ["w", "worker-1"] and act.stop_command is None
