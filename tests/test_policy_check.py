"""One validator: `policy validate`, `policy apply` (before it sends) and `serve` hold a policy file
to the same limits, size first, and say the same warnings, those of serving it included: an
oversize file is refused by each with the same sentence (and fast: before any parsing), and
`admins: []` gets the same warning from each."""

from __future__ import annotations

import asyncio
import io
import logging
import re
from pathlib import Path

import pytest
import yaml

from scheduler.api import wire
from scheduler.cli.policy import validate_main
from scheduler.cli.policy_apply import apply_main
from scheduler.policy.errors import PolicyError
from scheduler.policy.yaml_limits import MAX_POLICY_BYTES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = (ROOT / "deploy" / "policy-example.yaml").read_text()
ADMINS = re.compile(r"^    admins:\n(      - .*\n)+", re.M)

SIZE = f"longer than {MAX_POLICY_BYTES} bytes"
NO_ADMINS = "spec.access.admins: empty: the Admin service refuses everyone"


def _oversize() -> str:
    """The example, valid, then 555 KB of comment: parsing it all would take seconds."""
    return EXAMPLE + "# padding padding padding padding padding padding padding padding\n" * 8_500


def _no_admins() -> str:
    text, n = ADMINS.subn("    admins: []\n", EXAMPLE)
    assert n == 1
    return text


def _validate(path: Path) -> str:
    out = io.StringIO()
    validate_main(str(path), out)
    return out.getvalue()


def _apply(path: Path) -> str:
    """`policy apply` to a port nobody listens on: what it says before (and without) sending."""
    out, err = io.StringIO(), io.StringIO()
    apply_main(str(path), "127.0.0.1:1", None, out=out, err=err)
    return out.getvalue() + err.getvalue()


def _serve(path: Path, caplog: pytest.LogCaptureFixture) -> str:
    from scheduler.serve import start_server

    async def go() -> str:
        try:
            running = await start_server(str(path), metrics_listen=None, static_pool=False, autoscaler_env={})
        except PolicyError as e:
            return str(e)
        await running.stop(0)
        return ""

    with caplog.at_level(logging.WARNING, logger="slotsched.server"):
        refused = asyncio.run(go())
    return refused + "\n".join(r.getMessage() for r in caplog.records)


def test_the_size_limit_is_the_wires() -> None:
    assert MAX_POLICY_BYTES == wire.MAX_POLICY_BYTES


@pytest.mark.parametrize("path_name", ["validate", "apply", "serve"])
def test_an_oversize_policy_is_refused_alike_and_at_once(
    path_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(_oversize())
    assert path.stat().st_size > 500_000

    def parsed(*_: object, **__: object) -> None:
        raise AssertionError("an oversize policy was parsed")

    for name in ("load", "parse", "compose"):  # refused before parsing, so at once
        monkeypatch.setattr(yaml, name, parsed)
    said = (
        {"validate": _validate, "apply": _apply}[path_name](path)
        if path_name != "serve"
        else _serve(path, caplog)
    )
    assert f"(document): {SIZE} (got {path.stat().st_size}): the policy size limit" in said
    assert "is valid" not in said and "applied" not in said


@pytest.mark.parametrize("path_name", ["validate", "apply", "serve"])
def test_no_admins_is_warned_alike(path_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "no-admins.yaml"
    path.write_text(_no_admins())
    said = (
        {"validate": _validate, "apply": _apply}[path_name](path)
        if path_name != "serve"
        else _serve(path, caplog)
    )
    assert NO_ADMINS in said


def test_validate_says_nothing_of_admins_when_there_is_one(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(EXAMPLE)
    said = _validate(path)
    assert "is valid" in said and "warning" not in said
