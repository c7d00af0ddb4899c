"""The house rules of docs/architecture.md, enforced: layer contracts (import-linter, configured in
pyproject.toml; every room of the map's table is one), statuses decided in one module, and files
of one job (the packages and bench/).

The contracts are checked on this tree, and shown to bite: a copy of the tree with one violating
import must fail them, naming the contract's rule.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("scheduler", "slots", "snapshots")
# `lint-imports` through this interpreter (the console script may not be on PATH in a venv).
LINT = [
    sys.executable,
    "-c",
    "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
]


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [*LINT, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_layer_contracts_hold() -> None:
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BROKEN" not in out.stdout


def _copy_tree(dst: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__", "samples"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


@pytest.mark.parametrize(
    ("module", "line", "rule"),
    [
        ("scheduler/core/types.py", "import grpc", "scheduler.core is not allowed to import grpc"),
        ("scheduler/core/engine.py", "import time", "scheduler.core is not allowed to import time"),
        (
            "scheduler/server/loop.py",
            "import scheduler.state.redis_store",
            "scheduler.server is not allowed to import scheduler.state",
        ),
        (
            "scheduler/state/codec.py",
            "import scheduler.server.errors",
            "scheduler.state is not allowed to import scheduler.server",
        ),
        ("snapshots/store.py", "import scheduler.core.types", "snapshots is not allowed to import scheduler"),
        (
            "scheduler/client/types.py",
            "import scheduler.server.convert",
            "scheduler.client is not allowed to import scheduler.server",
        ),
        ("scheduler/sim/stats.py", "import redis", "scheduler.sim is not allowed to import redis"),
        # A room's row: slots/worker takes SnapshotRef from snapshots.ref, never from the core.
        (
            "slots/worker/host.py",
            "import scheduler.core.types",
            "slots.worker is not allowed to import scheduler.core",
        ),
        (
            "scheduler/client/types.py",
            "import scheduler.api.guard",
            "scheduler.client is not allowed to import scheduler.api.guard",
        ),
        (
            "scheduler/demo/run.py",
            "import scheduler.state.codec",
            "scheduler.demo is not allowed to import scheduler.state",
        ),
        (
            "scheduler/core/engine.py",
            "import scheduler.policy.yaml_io",
            "scheduler.core is not allowed to import scheduler.policy",
        ),
        (
            "slots/autoscaler/loop.py",
            "import slots.actuators.factory",
            "slots.autoscaler is not allowed to import slots.actuators",
        ),
        ("scheduler/server/app.py", "import scheduler.cli", "is not allowed to import scheduler.cli"),
        # The SDK's client above its routes: the aio <-> routes circle stays broken.
        (
            "scheduler/client/routes.py",
            "import scheduler.client.aio",
            "scheduler.client.routes is not allowed to import scheduler.client.aio",
        ),
        # The simulator reads the table of refusal reasons (plain data), nothing else of the wire.
        ("scheduler/sim/stats.py", "import scheduler.api.wire", "scheduler.sim is not allowed to import"),
        # A backend outside its import point: a base install would fail there, saying nothing.
        ("scheduler/serve.py", "import redis", "scheduler is not allowed to import redis"),
        ("snapshots/config.py", "import boto3", "snapshots is not allowed to import boto3"),
        # The composition root: a serving mode that imports another, or anything it wires that
        # imports the root back (a circle, even behind TYPE_CHECKING).
        (
            "scheduler/app/memory.py",
            "import scheduler.app.pools",
            "scheduler.app.memory is not allowed to import",
        ),
        (
            "scheduler/app/pools.py",
            "import scheduler.serve",
            "scheduler.app.pools is not allowed to import scheduler.serve",
        ),
        (
            "scheduler/server/session_ops.py",
            "from scheduler.app import root",
            "scheduler.server is not allowed to import scheduler.app",
        ),
    ],
)
def test_a_violating_import_breaks_its_contract(tmp_path: Path, module: str, line: str, rule: str) -> None:
    tree = _copy_tree(tmp_path)
    target = tree / module
    target.write_text(target.read_text() + f"\n{line}  # a deliberate violation\n")
    out = _lint(tree)
    assert out.returncode != 0
    assert rule in out.stdout, out.stdout


# Where a gRPC status may be chosen on the server side: errors.py decides, the servicers raise
# what it builds. The client SDK reads statuses (it maps them to typed errors), so it is not here.
_SERVER_SIDE = ("scheduler/server", "scheduler/state", "scheduler/serve.py", "scheduler/app")
_STATUS_HOME = {"scheduler/server/errors.py"}


def _python_files(rel: str) -> list[Path]:
    p = ROOT / rel
    return [p] if p.is_file() else sorted(p.rglob("*.py"))


def test_statuses_are_decided_in_errors_only() -> None:
    offenders = []
    for rel in _SERVER_SIDE:
        for f in _python_files(rel):
            name = f.relative_to(ROOT).as_posix()
            if name in _STATUS_HOME:
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Attribute) and node.attr == "StatusCode":
                    offenders.append(f"{name}:{node.lineno}")
    assert not offenders, f"gRPC status codes chosen outside scheduler/server/errors.py: {offenders}"


# docs/architecture.md's rooms table: every row's "may import" is the contract named after it.
_ROW = re.compile(r"^\| `((?:scheduler|slots|snapshots)[^`]*)` \|")


def test_every_room_of_the_map_is_a_contract() -> None:
    rows = [
        m.group(1) for ln in (ROOT / "docs/architecture.md").read_text().splitlines() if (m := _ROW.match(ln))
    ]
    assert len(rows) >= 15, rows
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = [c["name"] for c in conf["tool"]["importlinter"]["contracts"]]
    missing = [r for r in rows if not any(n.startswith(f"room {r} may import:") for n in names)]
    assert not missing, f"rooms of docs/architecture.md without their contract in pyproject.toml: {missing}"
    rooms = {n.split()[1] for n in names if n.startswith("room ")}
    assert rooms == set(rows), f"contracts of rooms the map does not have: {sorted(rooms - set(rows))}"


# The files the rule of 600 lines names, each with its reason: the concept decides the file.
LONG_FILES = {
    # One class: the state, the bookkeeping of every change to it, and the decisions that make
    # the changes. Split by inheritance it read as two concepts (a "ledger" deciding nothing)
    # and cost a reader a jump per step; composed, every step would reach the state through
    # another object, on the hottest path (bench/core.py).
    "scheduler/core/engine.py": "the policy core's one class, Core",
}


def test_no_source_file_over_600_lines() -> None:
    long = []
    for pkg in (*PACKAGES, "bench"):  # the benchmarks are code too
        for f in (ROOT / pkg).rglob("*.py"):
            if "api/gen" in f.as_posix():
                continue  # generated by protoc
            n = len(f.read_text().splitlines())
            if n > 600 and f.relative_to(ROOT).as_posix() not in LONG_FILES:
                long.append(f"{f.relative_to(ROOT)}: {n}")
    assert not long, f"files over 600 lines (split them by job): {long}"


def test_every_long_file_named_is_long() -> None:
    """A named file back under the limit leaves the list: the exception is not a standing licence."""
    short = [f for f in LONG_FILES if len((ROOT / f).read_text().splitlines()) <= 600]
    assert not short, f"files named in LONG_FILES that are 600 lines or fewer: {short}"
