"""`slotsched worker` refused by the scheduler: a hint that matches the cause, one paragraph, exit 1.

Why a real server and the real command: the worker tells the causes apart by the server's ErrorInfo
reason (WORKER_OUT_OF_SCOPE, WORKER_SLOTS_OVER_BOUND) and, where there is none of its own, by its
words; only the server's actual refusals show that each still gets its own hint, and only the
command shows what an
operator reads (issue 20 #7: a right token beyond its entry's scope or maxSlots was told to get a
worker token, then shown a raw AioRpcError).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from scheduler.api import wire
from scheduler.api.gen.slotsched.v1 import workers_pb2
from slots.worker.agent import refusal_hint

pytest.register_assert_rewrite("tests.grpc_fixtures")
from tests.grpc_fixtures import (  # noqa: E402
    TOKENS,
    WORKER_MAX_SLOTS,
    WORKER_TOKEN,
    Client,
    ServerThread,
    policy_yaml,
    running_server,
)

ROOT = Path(__file__).resolve().parents[1]
TOKEN_HINT = "Give the worker a worker token"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_server(policy_yaml(), static_pool=False) as s:
        yield s


@pytest.mark.parametrize(
    ("args", "cause", "hint"),
    [
        (
            ["--worker-id", "w1", "--slots", str(WORKER_MAX_SLOTS + 1)],
            "maxSlots is 8",
            "at most that many --slots",
        ),
        (["--worker-id", "x1"], "outside this credential's scope", "--worker-id the entry allows"),
        (["--worker-id", "w1", "--token", TOKENS["acme"]], "needs the worker role", TOKEN_HINT),
        (["--worker-id", "w1", "--token", "no-such-token"], "names no tenant or role", TOKEN_HINT),
    ],
    ids=["max-slots", "scope", "tenant-token", "unknown-token"],
)
def test_each_refusal_gets_its_own_hint_in_one_paragraph(
    server: ServerThread, tmp_path: Path, args: list[str], cause: str, hint: str
) -> None:
    cmd = [
        sys.executable, "-m", "scheduler.cli", "worker", "--scheduler", server.target,
        "--snapshots", str(tmp_path), "--token", WORKER_TOKEN, *args,
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, env=os.environ.copy(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    for leak in ("Traceback", "AioRpcError", "debug_error_string"):
        assert leak not in r.stderr, r.stderr
    (message,) = [line for line in r.stderr.splitlines() if "refused to register" in line]
    assert message.startswith("slotsched worker ") and "PERMISSION_DENIED" in message, message
    assert cause in message and hint in message, message
    if hint != TOKEN_HINT:  # the token was right: no advice to change it
        assert TOKEN_HINT not in r.stderr, r.stderr


def test_the_reason_picks_the_hint_whatever_the_message_says() -> None:
    scope = refusal_hint(grpc.StatusCode.PERMISSION_DENIED, "reworded", wire.Reason.WORKER_OUT_OF_SCOPE)
    slots = refusal_hint(grpc.StatusCode.PERMISSION_DENIED, "reworded", wire.Reason.WORKER_SLOTS_OVER_BOUND)
    assert "--worker-id" in scope and "maxSlots" in slots and TOKEN_HINT not in scope + slots
    assert refusal_hint(grpc.StatusCode.PERMISSION_DENIED, "x", "SOME_FUTURE_REASON") == ""


def test_hints_by_code_when_the_message_names_no_known_cause() -> None:
    assert TOKEN_HINT in refusal_hint(grpc.StatusCode.UNAUTHENTICATED, "missing credential")
    assert refusal_hint(grpc.StatusCode.PERMISSION_DENIED, "one certificate must be one identity") == ""
    assert refusal_hint(grpc.StatusCode.INVALID_ARGUMENT, "slots: must be 1 to 256") == ""


def test_register_refuses_slot_epochs_outside_its_slots_or_bounds(server: ServerThread) -> None:
    async def go() -> None:
        async with Client(server.target, token=WORKER_TOKEN) as c:
            for epochs in ({2: 5}, {0: 2**53}):
                req = workers_pb2.RegisterRequest(worker_id="w9", address="h:1", slots=2, slot_epochs=epochs)
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await c.workers.Register(req, metadata=c.md)
                assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "slot_epochs" in (e.value.details() or ""), e.value.details()

    asyncio.run(go())


def test_the_runtime_docstring_shows_workers_the_runtime_token() -> None:
    """Issue 20 #20: runtimes present their own token to workers (README), not the workers' one."""
    from scheduler.client import worker_runtime as runtime

    doc = runtime.__doc__ or ""
    assert "WorkerClients(token=RUNTIME_TOKEN)" in doc and "WORKER_TOKEN" not in doc
    assert "--accept-token-hash" in doc
