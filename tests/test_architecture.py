"""The house rules of docs/architecture.md, enforced: layer contracts (import-linter, configured in
pyproject.toml), statuses decided in one module, and files of one job.

The contracts are checked on this tree, and shown to bite: a copy of the tree with one violating
import must fail them, naming the contract's rule.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
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
_SERVER_SIDE = ("scheduler/server", "scheduler/state", "scheduler/serve.py")
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
