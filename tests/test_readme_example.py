"""The README's agent-runtime example runs as written against a real server (docs stay true)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.grpc_fixtures import running_server

ROOT = Path(__file__).resolve().parents[1]


def _example() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (example,) = [b for b in blocks if "AsyncClient(" in b]
    return example


def test_readme_sdk_example_runs() -> None:
    with running_server() as server:  # no policy: dev mode, built-in policy, static pool
        code = _example().replace('"127.0.0.1:50051"', repr(server.target))
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
        )
    assert out.returncode == 0, out.stderr
    assert re.search(r"^holding \S+/\d+ on \S+ resuming from None$", out.stdout, flags=re.M), out.stdout
