"""Pool selection from a second implementation: a Node client (@grpc/grpc-js, protobufjs from the
pinned packages of tests/node) built from the proto alone acquires in named pools of a real
three-pool server, sees where it was granted and why it waits, and decodes the refusals' rich
details. Skipped on a laptop without node; in CI (CI set) a missing node fails."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.grpc_fixtures import TOKENS, pools_policy_yaml, running_server
from tests.test_channel_node import NODE, NODE_DIR, NPM, PROTO_DIR, _node_modules


def test_a_node_client_acquires_in_named_pools() -> None:
    if NODE is None or NPM is None:
        if os.environ.get("CI"):
            pytest.fail("node and npm are needed for the pools' second-implementation test")
        pytest.skip("node/npm not installed")
    _node_modules()
    with running_server(pools_policy_yaml()) as server:
        args = [NODE, "pool_acquire.js", server.target, TOKENS["acme"], TOKENS["globex"], str(PROTO_DIR)]
        done = subprocess.run(args, cwd=NODE_DIR, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"node client failed: {done.stdout}{done.stderr}"
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["named"]["pool"] == "gpu" and seen["named"]["worker"].startswith("local-gpu-")
    assert seen["selected"] == {"pool": "cpu-a"}  # the selector's first match in the policy's order
    assert seen["queued"] == {"pool": "gpu", "reason": "tenant_quota"}  # beyond acme's nominal 1 there
    assert seen["after_release"] == {"pool": "gpu"}  # granted where it waited
    assert seen["ended"] == ["END_REASON_RELEASED", "END_REASON_RELEASED"]
    unknown = seen["unknown"]
    assert unknown["code"] == 3 and unknown["fields"] == ["pool"] and "nowhere" in unknown["message"]
    no_match = seen["no_match"]
    assert no_match["code"] == 9 and no_match["reason"] == "NO_ELIGIBLE_POOL" and "tpu" in no_match["message"]
    no_quota = seen["no_quota"]
    assert no_quota["code"] == 7 and no_quota["reason"] == "NO_QUOTA"
    assert "gpu" in no_quota["message"] and "burstable" in no_quota["message"].lower()
