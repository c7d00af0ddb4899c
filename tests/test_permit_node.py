"""Token budget permits from a second implementation: a Node client (@grpc/grpc-js, from the
proto alone: tests/node/permit_client.js) asks for a permit on the Channel, is answered on its
ref, settles it, and the charge and refund come back. Skipped without node/npm (fails in CI),
as tests/test_channel_node.py."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.budget_fixtures import BUDGET, budget_policy_yaml
from tests.grpc_fixtures import TOKENS, running_server
from tests.test_channel_node import NODE, NODE_DIR, NPM, PROTO_DIR, _node_modules


def test_a_node_client_asks_for_a_permit_and_settles_it() -> None:
    if NODE is None or NPM is None:
        if os.environ.get("CI"):
            pytest.fail("node and npm are needed for the permits' second-implementation test")
        pytest.skip("node/npm not installed")
    _node_modules()
    with running_server(budget_policy_yaml(slots_per_worker=2, floor=0)) as server:
        args = [NODE, "permit_client.js", server.target, TOKENS["acme"], str(PROTO_DIR), BUDGET]
        done = subprocess.run(args, cwd=NODE_DIR, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"node client failed: {done.stdout}{done.stderr}"
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["permit"][-1] == "granted" and seen["permit"][0] in ("queued", "granted"), seen
    assert seen["permit_id"] and seen["status"] == 0
    assert seen["settled"]["ref"] == "3"
    assert seen["settled"]["charged"]["input_tokens"] == 700
    assert seen["settled"]["refunded"]["input_tokens"] == 100
