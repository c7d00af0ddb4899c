"""A state store that does not answer is not a standby (issue 20, item 4).

`slotsched serve --state redis://…` against a port nobody listens on: the start-up line, the log
(rate-limited while it retries), health (`slotsched.state`), the NOT_LEADER refusal and
`slotsched status` all say the store is unreachable, at which address (password masked) and why;
a standby whose store answers says where the leader is instead. Once a redis-server comes up on
that port, the replica says so and leads.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler.api.gen.slotsched.v1 import admin_pb2, admin_pb2_grpc
from scheduler.cli.status_table import status_main
from scheduler.core.types import WorkerId
from scheduler.policy.defaults import default_policy
from scheduler.server.app import STATE_HEALTH, assemble
from scheduler.server.auth import Authenticator
from scheduler.server.loop import SchedulerLoop
from scheduler.server.registry import WorkerRegistry
from scheduler.state.reach import StoreReach
from tests.redis_topology import free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
REDIS_BIN = shutil.which("redis-server") or "/usr/bin/redis-server"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LEADER = "10.0.0.7:50051"

needs_redis = pytest.mark.skipif(
    not os.path.exists(REDIS_BIN) and not os.environ.get("CI"), reason="redis-server not installed"
)


def _health(target: str, service: str) -> int | None:
    try:
        with grpc.insecure_channel(target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status)
    except grpc.RpcError:
        return None


class _Serve:
    """`slotsched serve --state URL` in a subprocess, its output in a file."""

    def __init__(self, state: str) -> None:
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="slotsched-unreach-", suffix=".log", delete=False)  # noqa: SIM115
        args = [sys.executable, "-m", "scheduler.cli", "serve", "--state", state]
        args += ["--listen", f"127.0.0.1:{self.port}", "--metrics-listen", "", "--replica-id", "r1"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SLOTSCHED_AUTOSCALER": "off"}
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def wait_output(self, text: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, f"no {text!r} in: {self.output()}"
            time.sleep(0.05)
        return self.output()

    def wait_health(self, service: str, want: int, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while _health(self.target, service) != want:
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, f"{service!r} not {want}: {self.output()}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.unlink(self.log.name)


@pytest.fixture
def redis_port() -> Iterator[int]:
    yield free_port()


def _redis(port: int, password: str) -> subprocess.Popen[bytes]:
    """A redis-server (no persistence) on `port`, requiring `password`."""
    args = [REDIS_BIN, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [*args, "--requirepass", password], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    client = redis.Redis(port=port, password=password, socket_timeout=2)
    wait_for(f"redis on {port}", client.ping, 10)
    return proc


@needs_redis
def test_an_unreachable_store_is_said_everywhere_then_the_replica_leads_once_it_answers(
    redis_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://:hunter2@127.0.0.1:{redis_port}/0"
    shown = f"redis://:***@127.0.0.1:{redis_port}/0"
    srv = _Serve(url)
    node = None
    try:
        out = srv.wait_output("slotsched state:")
        state_line = next(ln for ln in out.splitlines() if ln.startswith("slotsched state:"))
        assert f"state store unreachable at {shown}: " in state_line, state_line
        assert "standby" not in state_line
        assert f"WARNING slotsched.state: state store unreachable at {shown}: " in out
        srv.wait_health(STATE_HEALTH, NOT_SERVING)
        assert _health(srv.target, "") == NOT_SERVING

        # status (through the NOT_LEADER refusal of DescribePool) names the store, not a standby.
        assert status_main(srv.target, False, None, None) == 1
        err = capsys.readouterr().err
        assert f"slotsched status: {srv.target}: state store unreachable at {shown}: " in err, err
        assert "Connect" in err or "connect" in err, err  # the last error, in its own words
        assert "standby" not in err and "not the leader" not in err, err
        with grpc.insecure_channel(srv.target) as ch, pytest.raises(grpc.RpcError) as e:
            stub = admin_pb2_grpc.AdminStub(ch)  # type: ignore[no-untyped-call]
            stub.DescribePool(admin_pb2.DescribePoolRequest(), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert dict(e.value.trailing_metadata() or ())["retry-after-ms"] == "1000"

        # The store comes up on that port: the replica says so, and leads.
        node = _redis(redis_port, "hunter2")
        srv.wait_health(STATE_HEALTH, SERVING)
        srv.wait_health("", SERVING)
        out = srv.wait_output("answers again")
        assert f"state store at {shown} answers again, after " in out
        assert "hunter2" not in out
    finally:
        srv.stop()
        if node is not None:
            node.kill()
            node.wait(5)


def test_while_the_store_is_down_one_line_every_few_seconds_with_attempts_and_last_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    told: list[str | None] = []

    async def tell(down: str | None) -> None:
        told.append(down)

    async def go() -> None:
        reach = StoreReach("redis://:***@h:1/0", tell, report_every_s=5.0, clock=lambda: now[0])
        for i in range(30):  # a retry every 0.5 s for 15 s
            await reach.failed(ConnectionError(f"Error 111 try {i}."))
            now[0] += 0.5
        assert reach.down() == "state store unreachable at redis://:***@h:1/0: Error 111 try 29"
        await reach.answered()
        await reach.answered()  # answering on is not news
        assert reach.down() is None

    caplog.set_level("INFO", logger="slotsched.state")
    asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("state store unreachable at redis://:***@h:1/0: Error 111 try 0; retrying")
    still = [ln for ln in lines if "still unreachable" in ln]
    assert still == [
        "state store still unreachable at redis://:***@h:1/0: 11 failed attempts in 5 s, the last: "
        "Error 111 try 10",
        "state store still unreachable at redis://:***@h:1/0: 21 failed attempts in 10 s, the last: "
        "Error 111 try 20",
    ]
    assert lines[-1] == "state store at redis://:***@h:1/0 answers again, after 30 failed attempts in 15.0 s"
    assert len(lines) == 4
    # Health heard the two changes only, not every try.
    assert told == ["state store unreachable at redis://:***@h:1/0: Error 111 try 0", None]


def _gated_server(store_down: list[str | None]) -> Any:
    """Every service as a replica assembles them, not serving, the leader known as LEADER."""
    policy = default_policy()
    loop = SchedulerLoop(policy)
    registry = WorkerRegistry(loop, 5.0)
    registry.register(WorkerId("local-0"), "local", 1, {}, static=True)
    auth = Authenticator(False, lambda: loop.core.policy)
    return assemble(
        loop,
        registry,
        auth,
        lambda: 0.0,
        serving=lambda: False,
        leader=lambda: LEADER,
        store_down=lambda: store_down[0],
    )


def test_status_tells_a_standby_from_a_replica_that_cannot_reach_its_store(
    capsys: pytest.CaptureFixture[str],
) -> None:
    down: list[str | None] = [None]

    async def go() -> None:
        app = _gated_server(down)
        port = app.server.add_insecure_port("127.0.0.1:0")
        await app.server.start()
        target = f"127.0.0.1:{port}"
        try:
            assert await asyncio.to_thread(status_main, target, False, None, None) == 1
            standby = capsys.readouterr().err
            down[0] = "state store unreachable at redis://r:6379/0: Error 111 connecting to r:6379"
            assert await asyncio.to_thread(status_main, target, False, None, None) == 1
            unreachable = capsys.readouterr().err
        finally:
            await app.server.stop(None)
        assert (
            standby
            == f"slotsched status: {target}: standby; leader is {LEADER} (run it with --target {LEADER})\n"
        )
        assert unreachable.startswith(
            f"slotsched status: {target}: state store unreachable at redis://r:6379/0: Error 111 connecting "
            "to r:6379; this replica cannot lead until it answers"
        ), unreachable
        assert "standby" not in unreachable

    asyncio.run(go())
