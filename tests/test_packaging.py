"""A base install runs the SDK and `slotsched serve` on its defaults; each backend is an extra.

pyproject's base dependencies leave out matplotlib, boto3, kubernetes and redis (issue 21 part 4).
The commands run in a subprocess whose imports of the backends (and of what only they need) fail,
as on a base install: serve starts on its defaults and an SDK session is granted, and each command
that needs a backend fails with a message naming the extra to install. `slotsched simulate
--compare` is the exception by design: without `sim` it still writes the report and the JSON, and
its message names the extra.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from scheduler.state.config import KINDS
from tests.grpc_fixtures import served_target

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
BACKENDS = ("matplotlib", "boto3", "kubernetes", "redis")
# What a base install lacks: the backends and what only they bring (botocore, orjson).
NOT_IN_BASE = (*BACKENDS, "botocore", "orjson")
SAMPLES = ROOT / "scheduler" / "sim" / "samples"

# Makes the modules of NOT_IN_BASE unimportable, as they are on a base install, then runs the code.
_BLOCK = textwrap.dedent(
    f"""
    import importlib.abc, sys

    class _NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {NOT_IN_BASE!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, _NotInstalled())
    """
)
_CLI = _BLOCK + "from scheduler.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _env() -> dict[str, str]:
    # No SLOTSCHED_STATE, SLOTSCHED_AUTOSCALER, ... from outside: the defaults are under test.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("SLOTSCHED_") or k == "SLOTSCHED_SNAPSHOTS"
    }
    return {**env, "PYTHONPATH": str(ROOT)}


def _run(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_base_dependencies_leave_out_every_backend() -> None:
    base = {Requirement(r).name.lower() for r in PYPROJECT["project"]["dependencies"]}
    assert not base & set(BACKENDS), base
    extras = PYPROJECT["project"]["optional-dependencies"]
    names = {k: {Requirement(r).name.lower() for r in v} for k, v in extras.items()}
    assert {"redis"} <= names["redis"] and names["s3"] == {"boto3"} and names["kubernetes"] == {"kubernetes"}
    assert names["sim"] == {"matplotlib"}
    assert "slotsched[all]" in extras["test"]  # the README's test command installs every backend


def test_every_extra_a_message_names_exists() -> None:
    named = set()
    for pkg in ("scheduler", "slots", "snapshots"):
        for f in (ROOT / pkg).rglob("*.py"):
            named |= set(re.findall(r"needs_extra\(\s*\"(\w+)\"", f.read_text()))
    named |= {kind.extra for kind in KINDS}  # the state stores' rows: needs_extra(kind.extra, …)
    assert {"redis", "s3", "kubernetes", "sim"} <= named
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert named <= set(extras)
    (everything,) = extras["all"]
    assert set(Requirement(everything).extras) == named  # `all` is every backend, and only those


def test_the_sdk_and_serve_import_no_backend_even_when_installed() -> None:
    out = _run(
        "import sys\n"
        "import scheduler.client, scheduler.client.worker_runtime, scheduler.serve, scheduler.cli\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {NOT_IN_BASE!r}))\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.fixture
def base_serve() -> Iterator[str]:
    """`slotsched serve` on its defaults, the backends unimportable: its gRPC target."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield served_target(proc, 30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_base_install_serves_and_grants_an_sdk_session(base_serve: str) -> None:
    client = _BLOCK + textwrap.dedent(
        """
        import asyncio
        from scheduler.client import AsyncClient, QoS
        from scheduler.client.worker_runtime import actor_session  # the runtime needs no backend

        async def main():
            async with AsyncClient(sys.argv[1], tenant="product") as c:
                async with c.session("packaging-1", QoS.BURSTABLE) as s:
                    print("granted", s.slot)

        asyncio.run(main())
        """
    )
    out = _run(client, base_serve)
    assert out.returncode == 0, out.stderr
    assert re.match(r"granted \S+/\d+$", out.stdout.strip()), out.stdout


_EXTRA = (
    "needs the {0} extra: pip install 'slotsched[{0}]' (from a clone of the repository: "
    "pip install -e '.[{0}]')"
)
_QUICK = ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]


@pytest.mark.parametrize(
    ("args", "env", "extra", "what"),
    [
        (
            ["serve", *_QUICK, "--state", "redis://user:secret@127.0.0.1:1/0"],
            {},
            "redis",
            "--state redis://…",
        ),
        (
            ["serve", *_QUICK, "--autoscaler", "kubernetes"],
            {"SLOTSCHED_AUTOSCALER_TARGET": "Deployment/workers"},
            "kubernetes",
            "the kubernetes actuator",
        ),
        (["serve", *_QUICK, "--policy-source", "kubernetes://ns/p"], {}, "kubernetes", "--policy-source"),
        (
            ["worker", "--scheduler", "127.0.0.1:1", "--worker-id", "w", "--slots", "1"]
            + ["--snapshots", "s3://bucket/snaps?endpoint_url=http://127.0.0.1:1"],
            {},
            "s3",
            "an s3:// snapshot store",
        ),
    ],
    ids=["state-redis", "kubernetes-actuator", "policy-source", "s3-snapshots"],
)
def test_a_missing_backend_is_an_error_naming_its_extra(
    args: list[str], env: dict[str, str], extra: str, what: str
) -> None:
    out = _run(_CLI, *args, env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert what in lines[-1] and _EXTRA.format(extra) in lines[-1], out.stderr
    assert "Traceback" not in out.stderr and "secret" not in out.stderr


def test_compare_without_the_sim_extra_writes_the_report_and_names_the_extra(tmp_path: Path) -> None:
    out = _run(
        _CLI,
        "simulate",
        "--compare",
        "--policy",
        str(SAMPLES / "policy.yaml"),
        "--workload",
        str(SAMPLES / "two-incidents.csv"),
        "--out",
        str(tmp_path),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    assert "plots not drawn: simulate --compare's plots " + _EXTRA.format("sim") in out.stderr
    assert (tmp_path / "report.md").is_file() and not list(tmp_path.glob("*.png"))
