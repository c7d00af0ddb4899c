"""A script using the blocking `Client` exits cleanly: nothing is left pending on the client's
private loop when `close()` stops it (a user saw `Task was destroyed but it is pending!` at the
exit of such a script: one of grpc's own tasks, a call's status handler, outlives the channel's
close by a turn of the loop, and the loop was stopped under it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.grpc_fixtures import TOKENS, policy_yaml, running_server

ROOT = Path(__file__).resolve().parent.parent

# A session held and released, then (as grpc's status handler is, for a turn) a task of the
# loop's still pending when the client closes: the script's exit must not report it destroyed.
SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from scheduler.client import Client

    with Client(sys.argv[1], token=sys.argv[2], multiplex=sys.argv[3] == "1") as client:
        with client.session("exit-1") as s:
            assert s.lease_id is not None

        async def leave_a_task() -> None:
            asyncio.get_running_loop().create_task(asyncio.Event().wait(), name="left-behind")

        client.run(leave_a_task())
    left = [t for t in asyncio.all_tasks(client._loop) if not t.done()]
    print("pending at exit:", len(left))
    """
)


def test_a_sync_client_script_leaves_no_task_pending_at_exit() -> None:
    with running_server(policy_yaml()) as server:
        for multiplex in ("1", "0"):
            run = subprocess.run(
                [sys.executable, "-c", SCRIPT, server.target, TOKENS["acme"], multiplex],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=ROOT,
            )
            assert run.returncode == 0, run.stderr
            assert "pending at exit: 0" in run.stdout, (multiplex, run.stdout, run.stderr)
            assert "Task was destroyed but it is pending" not in run.stderr, (multiplex, run.stderr)
