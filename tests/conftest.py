"""Shared test configuration: the helper modules tests import get pytest's assert rewriting, and
workers started without a snapshot store write under this run's own temporary directory.

`tests.grpc_fixtures` and `tests.fixtures_s3` hold asserts (and fixtures) used by many test
modules; registering them here, before any test module imports them, gives their failing asserts
pytest's detailed messages and keeps pytest from warning that they could not be rewritten.

A worker given no `--snapshots` (e.g. a CLI test that only checks a port clash) writes to
`$SLOTSCHED_SNAPSHOTS`, else to `slotsched-snapshots` in the system's temporary directory, shared
by every run and user. The variable is set here, before any test module imports the worker (the
default is read at import) and so that subprocesses inherit it; a session fixture fails the run
if the shared directory appears or gains entries anyway.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

pytest.register_assert_rewrite("tests.grpc_fixtures", "tests.fixtures_s3", "tests.channel_fixtures")

_RUN_SNAPSHOTS = tempfile.mkdtemp(prefix="slotsched-test-snapshots-")
os.environ["SLOTSCHED_SNAPSHOTS"] = os.path.join(_RUN_SNAPSHOTS, "default")
# What slots/worker/defaults.py falls back to without the variable (not imported: see above).
SHARED_SNAPSHOTS = os.path.join(tempfile.gettempdir(), "slotsched-snapshots")


def _entries(path: str) -> set[str] | None:
    try:
        return set(os.listdir(path))
    except FileNotFoundError:
        return None


@pytest.fixture(scope="session", autouse=True)
def _no_test_writes_the_shared_snapshot_directory() -> Iterator[None]:
    before = _entries(SHARED_SNAPSHOTS)
    yield
    shutil.rmtree(_RUN_SNAPSHOTS, ignore_errors=True)
    after = _entries(SHARED_SNAPSHOTS)
    if after is not None and (before is None or not after <= before):
        new = "the directory" if before is None else ", ".join(sorted(after - before))
        pytest.fail(
            f"a test wrote to the worker's shared default snapshot directory {SHARED_SNAPSHOTS} ({new}): "
            "give the worker snapshots=/--snapshots under its tmp_path",
            pytrace=False,
        )
