"""Scheduler.Channel from a second implementation: a Node client (@grpc/grpc-js and
@grpc/proto-loader, pinned in tests/node/package.json) built from the proto alone drives a real
server: two sessions acquired in one message, both Granted, a per-session error, both released,
both Ended, status OK.

npm installs the packages into tests/node/node_modules on first run (`npm ci` from the lock
file). Without node or npm the test is skipped on a laptop, but fails in CI (CI set)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.grpc_fixtures import TOKENS, policy_yaml, running_server

NODE_DIR = Path(__file__).resolve().parent / "node"
PROTO_DIR = Path(__file__).resolve().parents[1] / "proto"
NODE, NPM = shutil.which("node"), shutil.which("npm")


def _node_modules() -> None:
    if (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        return
    assert NPM is not None
    lock = (NODE_DIR / "package-lock.json").exists()
    args = [NPM, "ci" if lock else "install", "--no-audit", "--no-fund", "--loglevel=error"]
    done = subprocess.run(args, cwd=NODE_DIR, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"npm failed: {done.stdout[-2000:]}{done.stderr[-2000:]}"


def test_a_node_client_drives_the_channel() -> None:
    if NODE is None or NPM is None:
        if os.environ.get("CI"):
            pytest.fail("node and npm are needed for the Channel's second-implementation test")
        pytest.skip("node/npm not installed")
    _node_modules()
    with running_server(policy_yaml(slots_per_worker=2, floor=0)) as server:
        args = [NODE, "channel_client.js", server.target, TOKENS["acme"], str(PROTO_DIR)]
        done = subprocess.run(args, cwd=NODE_DIR, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"node client failed: {done.stdout}{done.stderr}"
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(seen["grants"]) == {"a", "b"} and all(g["grant"] for g in seen["grants"].values())
    assert seen["ended"] == {"a": "END_REASON_RELEASED", "b": "END_REASON_RELEASED"}
    assert sorted(seen["released"]) == ["4", "5"]
    assert seen["error"]["ref"] == "3" and seen["error"]["code"] == 5  # NOT_FOUND, as Renew says
    assert seen["status"] == 0
