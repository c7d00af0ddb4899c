"""What the command line tells a user who is stuck: a missing extra names both install forms (the
registry's and a clone's), and `serve --help` says what each `--autoscaler` kind does and how it
is used."""

from __future__ import annotations

import re

import pytest

from scheduler import cli
from snapshots.extras import MissingExtra, needs_extra


def test_a_missing_extra_names_the_registry_and_the_clone_install() -> None:
    with pytest.raises(MissingExtra) as e, needs_extra("redis", "--state redis://…"):
        raise ModuleNotFoundError("No module named 'redis'", name="redis")
    text = str(e.value)
    assert "--state redis://… needs the redis extra" in text
    assert "pip install 'slotsched[redis]'" in text  # installed from the registry
    assert "pip install -e '.[redis]'" in text  # a clone of the repository


def test_serve_help_says_what_each_autoscaler_kind_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert re.search(r"local: starts and stops worker processes on this machine", text), text
    assert "slotsched serve --autoscaler local --no-static-pool" in text
    assert "$SLOTSCHED_WORKER_COMMAND" in text and "$SLOTSCHED_TOKEN" in text
    assert "dry-run: changes nothing" in text and "kubernetes: scales each pool's target" in text
