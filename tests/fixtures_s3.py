"""A real S3 API server for tests: moto's standalone server in its own process, over HTTP.

Why a subprocess and not moto's in-process mocks: the code under test must go through botocore's real
HTTP stack (endpoints, timeouts, retries, connection errors), and fault tests must be able to kill or
freeze the server the way a real outage would. Use it from any test module with

    pytest_plugins = ["tests.fixtures_s3"]

Fixtures:
  s3_server        (session)  endpoint URL (str) of a shared server; never kill it.
  fresh_s3_server  (function) a `MotoServer` of the test's own: .endpoint_url, .kill(), .start()
                              (restarts on the same port, with empty state), .pause()/.resume()
                              (SIGSTOP/SIGCONT: requests hang, state survives).
  s3_bucket        (function) name of a new, empty bucket on `s3_server`.
Both server fixtures point the standard boto3 credential chain at dummy credentials via environment
variables (and disable the instance-metadata lookup), so clients built without keys just work.
Note: moto keeps everything in memory, so a killed-and-restarted server comes back empty.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
_AWS_UNSET = (
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before in this process: processes started one after
    another bind their ports later, and the kernel may offer a port twice meanwhile."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


class MotoServer:
    """`python -m moto.server` on 127.0.0.1:<port>, started, killed and restarted on demand."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)  # noqa: SIM115

    def start(self, timeout: float = 30.0) -> MotoServer:
        if self.running:
            return self
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}:\n{self.log()}")
            if self._answers():
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(
            f"moto server did not answer on {self.endpoint_url} within {timeout}s:\n{self.log()}"
        )

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=0.5):
                return True
        except urllib.error.HTTPError:
            return True  # any HTTP answer means it is serving
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, like a crashed or partitioned store; connections are refused afterwards."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.resume()
                self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self.kill()

    def pause(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel but nothing answers (timeouts)."""
        if self.running:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.running:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGCONT)

    def log(self) -> str:
        self._log.flush()
        with open(self._log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-4000:]

    def close(self) -> None:
        self.stop()
        self._log.close()
        os.unlink(self._log.name)

    def client(self) -> Any:
        """A plain boto3 S3 client for this server, with dummy credentials."""
        return s3_client(self.endpoint_url)


@functools.cache
def s3_client(endpoint_url: str) -> Any:
    """A plain boto3 S3 client for `endpoint_url` with dummy credentials (cached: clients are costly)."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def make_bucket(endpoint_url: str, name: str | None = None) -> str:
    bucket = name or f"test-{uuid.uuid4().hex[:20]}"
    s3_client(endpoint_url).create_bucket(Bucket=bucket)
    return bucket


def _set_aws_env(mp: pytest.MonkeyPatch) -> None:
    for key, value in AWS_TEST_ENV.items():
        mp.setenv(key, value)
    for key in _AWS_UNSET:
        mp.delenv(key, raising=False)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        _set_aws_env(mp)
        server = MotoServer().start()
        try:
            yield server.endpoint_url
        finally:
            server.close()


@pytest.fixture
def fresh_s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoServer]:
    _set_aws_env(monkeypatch)
    server = MotoServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def s3_bucket(s3_server: str) -> str:
    return make_bucket(s3_server)
