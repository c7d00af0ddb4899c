"""`.ci/run` runs the README's test command, word for word, inside a virtualenv it makes fresh."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", readme, flags=re.S)
    commands = [b.strip() for b in blocks if "pytest" in b]
    assert commands, "the README shows no test command"
    return commands[0]


def test_ci_runs_the_readme_test_command_in_a_fresh_virtualenv() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    lines = [ln.strip() for ln in script.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    command = _readme_test_command()
    assert command in lines, (command, lines)
    venv = next(i for i, ln in enumerate(lines) if ln.startswith("python3 -m venv "))
    activate = next(i for i, ln in enumerate(lines) if "/bin/activate" in ln)
    assert venv < activate < lines.index(command), lines
    assert any("mktemp -d" in ln for ln in lines[:venv]), "the virtualenv must be new on every run"
