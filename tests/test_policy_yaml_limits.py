"""A policy text past the depth or node limits is refused naming the limit, whichever parser
PyYAML was built with, from a file (`policy validate`, `serve --policy`) as from the wire."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scheduler.cli.policy import validate_main
from scheduler.policy import yaml_limits
from scheduler.policy.errors import PolicyError
from scheduler.policy.yaml_io import load_policy, parse_policy
from scheduler.policy.yaml_limits import MAX_POLICY_DEPTH, MAX_POLICY_NODES, yaml_limit_problem

DEEP_SEQ = "spec: " + "[" * 5000 + "]" * 5000
DEEP_MAP = "spec: " + "{a: " * 2000 + "1" + "}" * 2000
JUST_PAST = "spec: " + "[" * (MAX_POLICY_DEPTH + 1) + "]" * (MAX_POLICY_DEPTH + 1)
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True)
)

LOADERS = [pytest.param(yaml.SafeLoader, id="pure-python")]
if hasattr(yaml, "CSafeLoader"):
    LOADERS.append(pytest.param(yaml.CSafeLoader, id="libyaml"))


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize(
    ("text", "limit"),
    [
        (DEEP_SEQ, f"deeper than {MAX_POLICY_DEPTH} levels"),
        (DEEP_MAP, f"deeper than {MAX_POLICY_DEPTH} levels"),
        (JUST_PAST, f"deeper than {MAX_POLICY_DEPTH} levels"),
        (BOMB, f"more than {MAX_POLICY_NODES} nodes"),
        ("spec: [" + "[]" * 10, None),  # malformed: the parser's error, not a limit
        ("spec: " + "[" * (MAX_POLICY_DEPTH - 1) + "]" * (MAX_POLICY_DEPTH - 1), None),  # the map is 1
    ],
    ids=["deep-seq", "deep-map", "just-past", "bomb", "malformed", "at-limit"],
)
def test_the_limit_is_named_with_either_parser(
    monkeypatch: pytest.MonkeyPatch, loader: object, text: str, limit: str | None
) -> None:
    monkeypatch.setattr(yaml_limits, "_FAST_LOADER", loader)
    problem = yaml_limit_problem(text)
    if limit is None:
        assert problem is None
    else:
        assert problem is not None and limit in problem, problem


def test_parse_policy_refuses_deep_yaml_with_a_policy_error_not_a_recursion_error() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(DEEP_SEQ)
    assert "policy depth limit" in str(e.value)


def test_validate_names_the_file_and_the_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "deep.yaml"
    f.write_text(DEEP_SEQ)
    with pytest.raises(PolicyError):
        load_policy(f)
    assert validate_main(str(f)) == 1
    out = capsys.readouterr().out
    assert f"deeper than {MAX_POLICY_DEPTH} levels" in out and str(f) in out
    assert "Traceback" not in out and "RecursionError" not in out


@pytest.mark.parametrize(
    "command",
    [
        ["policy", "validate", "{file}"],
        ["serve", "--policy", "{file}", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
    ],
    ids=["validate", "serve"],
)
def test_the_cli_refuses_deep_yaml_without_a_traceback(tmp_path: Path, command: list[str]) -> None:
    f = tmp_path / "deep.yaml"
    f.write_text(DEEP_SEQ)
    args = [a.format(file=f) for a in command]
    r = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *args], capture_output=True, text=True, timeout=60
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "policy depth limit" in out and str(f) in out, out
    assert "Traceback" not in out, out
