"""The one-way arrows of issue 11 item 1/4, checked on the source: server/ and state/ meet only in
scheduler/serve.py (through scheduler/ports.py), and the loop speaks domain types only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "scheduler"


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _offending(package: str, banned: tuple[str, ...]) -> list[str]:
    return [
        f"{p.relative_to(ROOT.parent)} imports {m}"
        for p in sorted((ROOT / package).glob("*.py"))
        for m in sorted(_imports(p))
        if any(m == b or m.startswith(b + ".") for b in banned)
    ]


@pytest.mark.parametrize(
    ("package", "banned"),
    [
        ("server", ("scheduler.state", "scheduler.serve", "redis")),
        ("state", ("scheduler.server", "scheduler.serve", "grpc")),
    ],
)
def test_server_and_state_do_not_import_each_other(package: str, banned: tuple[str, ...]) -> None:
    assert _offending(package, banned) == []


@pytest.mark.parametrize("module", ["server/loop.py", "server/stream.py", "ports.py", "dispatch.py"])
def test_domain_modules_import_no_wire(module: str) -> None:
    wire = [m for m in _imports(ROOT / module) if m.startswith(("grpc", "google.protobuf", "scheduler.api"))]
    assert wire == []
