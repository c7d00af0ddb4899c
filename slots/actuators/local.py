"""The embedded default actuator: worker processes on this machine, one per worker.

Why a command template and not an import: the actuator only starts and stops processes; what a
worker is (the reference `slotsched worker`, or anything else that registers with the scheduler)
is configuration. Each argument may use `{worker_id}`, `{slots}`, `{scheduler}` and `{pool}` (the
pool its workers join, of several; empty otherwise); they are
replaced textually, so other braces (JSON, shell) pass through untouched.

Stopping never blocks the loop: `remove` sends SIGTERM (the worker deregisters and exits) and
returns; a worker still alive `stop_grace_s` later gets SIGKILL. A worker that exits when nobody
asked it to is reported once by `poll_errors` with its exit code, and is no longer listed, so the
autoscaler loop asks for a replacement on its next tick. A worker the loop drained (`record` of a
scale-down names it) was asked to leave: the reference worker exits by itself, with code 0, once a
drain has emptied it, often before the loop gets to `remove` it, and that exit is no failure.

Containers: `container_command(image)` is a template for `docker run` (or `podman run`): the
container is named after the worker (`--name {worker_id}`, removed when it exits: `--rm`), shares
the host's network so `{scheduler}` (127.0.0.1:port) reaches the scheduler, and gets
`$SLOTSCHED_TOKEN` passed through. SIGTERM to `docker run` reaches the worker (the client proxies
signals), and `stop_command` (`container_stop_command`: `docker stop --time G {worker_id}`) is run
on `remove` as well, so a container outlives neither a client that was killed nor the grace.

Credentials: against a scheduler in secure mode each worker registers with a worker token (the
Workers service refuses tenant tokens). The workers inherit `env` (default: the scheduler's own
environment), and the reference worker reads its token from `$SLOTSCHED_TOKEN`: set it there to
a token whose hash the policy lists under `spec.access.workers`, or put `--token` in the command.
"""

from __future__ import annotations

import builtins
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from slots.actuators.base import ActuatorError, ScaleNote, WorkerInfo, WorkerPhase

log = logging.getLogger("slotsched.actuators.local")

# The reference worker (`slotsched worker`), run with this interpreter so no install is needed.
DEFAULT_WORKER_COMMAND: tuple[str, ...] = (
    sys.executable,
    "-m",
    "scheduler.cli",
    "worker",
    "--scheduler",
    "{scheduler}",
    "--worker-id",
    "{worker_id}",
    "--slots",
    "{slots}",
)


def container_command(
    image: str, runtime: str = "docker", run_args: Sequence[str] = (), worker_args: Sequence[str] = ()
) -> tuple[str, ...]:
    """A worker command template that runs `image` as a container named after the worker; the
    image's entrypoint is `slotsched` (the project's Dockerfile), so its arguments start `worker`."""
    if not image:
        raise ValueError("the worker image must not be empty")
    return (
        runtime, "run", "--rm", "--name", "{worker_id}", "--network", "host",
        "--env", "SLOTSCHED_TOKEN", *run_args, image,
        "worker", "--scheduler", "{scheduler}", "--worker-id", "{worker_id}",
        "--slots", "{slots}", *worker_args,
    )  # fmt: skip


def container_stop_command(runtime: str = "docker", grace_s: float = 10.0) -> tuple[str, ...]:
    """Stop the worker's container: SIGTERM (the worker drains itself), SIGKILL after `grace_s`."""
    return (runtime, "stop", "--time", str(int(grace_s)), "{worker_id}")


@dataclass
class _Proc:
    popen: subprocess.Popen[bytes]
    log_file: IO[bytes] | None
    stop_deadline: float | None = None  # set once SIGTERM was sent
    drained: bool = False  # the loop drained it: it may leave by itself


class LocalActuator:
    def __init__(
        self,
        *,
        scheduler: str,
        slots: int,
        command: Sequence[str] = DEFAULT_WORKER_COMMAND,
        id_prefix: str = "worker",
        env: Mapping[str, str] | None = None,
        log_dir: str | Path | None = None,
        stop_grace_s: float = 10.0,
        pool: str = "",
        stop_command: Sequence[str] | None = None,
    ) -> None:
        if not command:
            raise ValueError("the worker command must not be empty")
        self.scheduler = scheduler
        self.slots = slots
        self.command = tuple(command)
        self.stop_command = tuple(stop_command) if stop_command else None
        self.id_prefix = id_prefix
        self.pool = pool
        self.env = dict(os.environ if env is None else env)
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.stop_grace_s = stop_grace_s
        self._procs: dict[str, _Proc] = {}
        self._errors: builtins.list[str] = []
        self._stoppers: builtins.list[subprocess.Popen[bytes]] = []  # stop commands still running
        self._seq = 0
        self._lock = threading.Lock()  # the loop calls from a worker thread; close() from anywhere

    def argv(self, worker_id: str, template: Sequence[str] | None = None) -> builtins.list[str]:
        values = {
            "{worker_id}": worker_id,
            "{slots}": str(self.slots),
            "{scheduler}": self.scheduler,
            "{pool}": self.pool,
        }
        out = []
        for arg in self.command if template is None else template:
            for key, value in values.items():
                arg = arg.replace(key, value)
            out.append(arg)
        return out

    # ------------------------------------------------------------------ Actuator

    def scale_to(self, n: int) -> None:
        with self._lock:
            self._reap()
            while sum(1 for p in self._procs.values() if p.stop_deadline is None) < n:
                self._start()

    def remove(self, worker_ids: builtins.list[str]) -> None:
        with self._lock:
            now = time.monotonic()
            for wid in worker_ids:
                p = self._procs.get(wid)
                if p is None or p.stop_deadline is not None:
                    continue  # not ours, or already stopping
                p.stop_deadline = now + self.stop_grace_s
                if p.popen.poll() is None:
                    p.popen.terminate()
                if self.stop_command is not None:
                    self._stop(wid)
            self._reap()

    def _stop(self, wid: str) -> None:
        """Run the stop command (a container's `docker stop`) without waiting for it."""
        argv = self.argv(wid, self.stop_command)
        try:
            stopper = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError as e:
            self._errors.append(f"cannot stop worker {wid} with {argv[0]!r}: {e}")
            return
        self._stoppers.append(stopper)

    def list(self) -> builtins.list[WorkerInfo]:
        with self._lock:
            self._reap()
            return [
                WorkerInfo(
                    wid,
                    WorkerPhase.STOPPING if p.stop_deadline is not None else WorkerPhase.RUNNING,
                    f"pid {p.popen.pid}",
                )
                for wid, p in self._procs.items()
            ]

    def poll_errors(self) -> builtins.list[str]:
        with self._lock:
            self._reap()
            out, self._errors = self._errors, []
            return out

    def record(self, note: ScaleNote) -> None:
        """A scale decision (DecisionRecorder): logged; the workers a scale-down drains may exit."""
        log.info("autoscaler decision: %s", note.message())
        if note.direction != "down":
            return
        with self._lock:
            for wid in note.workers:
                p = self._procs.get(wid)
                if p is not None:
                    p.drained = True

    # ------------------------------------------------------------------ lifecycle

    def close(self, timeout_s: float | None = None) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after the grace) and wait for them."""
        with self._lock:
            procs = list(self._procs.values())
            for p in procs:
                if p.popen.poll() is None:
                    p.popen.terminate()
            deadline = time.monotonic() + (self.stop_grace_s if timeout_s is None else timeout_s)
            for p in procs:
                try:
                    p.popen.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.popen.kill()
                    p.popen.wait()
                if p.log_file is not None:
                    p.log_file.close()
            self._procs.clear()

    def _start(self) -> None:
        self._seq += 1
        wid = f"{self.id_prefix}-{self._seq}"
        while wid in self._procs:
            self._seq += 1
            wid = f"{self.id_prefix}-{self._seq}"
        log_file = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_file = open(self.log_dir / f"{wid}.log", "ab")  # noqa: SIM115 - closed on reap
        argv = self.argv(wid)
        try:
            popen = subprocess.Popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file
            )
        except OSError as e:
            if log_file is not None:
                log_file.close()
            raise ActuatorError(f"cannot start worker {wid} with {argv[0]!r}: {e}", retry=False) from e
        self._procs[wid] = _Proc(popen, log_file)
        log.info("started worker %s (pid %d)", wid, popen.pid)

    def _reap(self) -> None:
        """Forget exited workers (reporting unexpected exits); SIGKILL those past their grace."""
        self._stoppers = [s for s in self._stoppers if s.poll() is None]
        now = time.monotonic()
        for wid, p in list(self._procs.items()):
            code = p.popen.poll()
            if code is None:
                if p.stop_deadline is not None and now >= p.stop_deadline:
                    log.warning("worker %s did not stop within %.0f s: SIGKILL", wid, self.stop_grace_s)
                    p.popen.kill()
                continue
            if p.stop_deadline is None and p.drained and code == 0:
                log.info("drained worker %s (pid %d) exited by itself", wid, p.popen.pid)
            elif p.stop_deadline is None:
                self._errors.append(f"worker {wid} (pid {p.popen.pid}) exited with code {code}")
            if p.log_file is not None:
                p.log_file.close()
            del self._procs[wid]
