"""`slotsched policy apply FILE` against a real server (issue 20, item 3): local validation first,
`--dry-run` shows the server's warnings and the diff against its policy and applies nothing; an
apply prints the new generation, the diff and that in-memory state goes back to the policy file
on a restart. The server logs every policy put in force (who, generation, what changed), from
Admin.ApplyPolicy and from the Kubernetes watch alike."""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path
from typing import Any

import pytest

from scheduler import cli
from scheduler.cli.policy_apply import apply_main
from scheduler.policy.crd import GROUP, PLURAL, VERSION
from scheduler.policy.diff import diff_policies, summary
from scheduler.policy.identities import hash_token
from scheduler.policy.yaml_io import parse_policy
from scheduler.serve import start_server
from tests.fake_kube import FakeObjectApi, serving
from tests.grpc_fixtures import ADMIN_TOKEN, DEFAULT_TENANTS, TOKENS, running_server
from tests.grpc_fixtures import policy_yaml as make_policy
from tests.redis_topology import free_port
from tests.test_policy_watch import NAME, NS, policy_object

# The test policy with acme's Guaranteed quota raised, batch gone, newco added, one more worker.
CHANGED = [
    {**DEFAULT_TENANTS[0], "guaranteed": 2},
    DEFAULT_TENANTS[1],
    {"name": "newco", "token": "newco-token", "burstable": {"nominal": 0, "limit": 1}},
]


def _run(path: Path, target: str, *extra: str, token: str = ADMIN_TOKEN) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = apply_main(str(path), target, token, dry_run="--dry-run" in extra, out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def _guaranteed(server: Any) -> dict[str, int]:
    found: dict[str, int] = server.call(lambda s: {t.name: t.guaranteed for t in s.loop.core.policy.tenants})
    return found


def test_dry_run_shows_warnings_and_the_diff_against_the_server_and_applies_nothing(tmp_path: Path) -> None:
    new = tmp_path / "new.yaml"
    # Without the worker entry: a warning only the server gives (its workers stop heartbeating).
    new.write_text(make_policy(CHANGED, workers=3, worker_tokens=[]))
    with running_server(make_policy()) as server:
        rc, out, err = _run(new, server.target, "--dry-run")
        assert (rc, err) == (0, ""), (out, err)
        assert "warning: spec.access.workers: 1 worker token hash(es) removed" in out, out
        assert (
            f"dry run: {new} is valid for {server.target} (policy test, generation 1); nothing applied" in out
        )
        assert "  + tenant newco\n" in out and "  - tenant batch\n" in out
        assert (
            "  ~ tenants[acme].guaranteed: 1 -> 2\n" in out
            and "  ~ pool.workers: 2 -> 3 (takes effect at restart: " in out
        )
        assert "tenants[globex]" not in out  # unchanged
        assert "sha256:" not in out  # credentials by their count only
        assert _guaranteed(server) == {"acme": 1, "globex": 0, "batch": 0}  # nothing applied


def test_apply_prints_the_generation_the_diff_and_that_a_restart_goes_back_to_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slotsched.policy")
    new = tmp_path / "new.yaml"
    new.write_text(make_policy(CHANGED))
    with running_server(make_policy()) as server:
        started = next(r.getMessage() for r in caplog.records if "state in memory" in r.getMessage())
        assert "lasts until a restart, which goes back to the policy file " in started, started
        origin = started.rsplit(" ", 1)[1]
        rc, out, err = _run(new, server.target)
        assert (rc, err) == (0, ""), (out, err)
        assert f"applied: policy test in force on {server.target}, generation 2\n" in out, out
        assert "changed (against policy test, generation 1):\n" in out
        assert "  + tenant newco\n" in out and "  ~ tenants[acme].guaranteed: 1 -> 2\n" in out
        assert (
            f"note: this server keeps its state in memory: a restart goes back to its --policy file {origin}"
            in out
        ), out
        assert _guaranteed(server) == {"acme": 2, "globex": 0, "newco": 0}

        applied = [r.getMessage() for r in caplog.records if " applied by " in r.getMessage()]
        who = f"admin token {hash_token(ADMIN_TOKEN)[:19]}..."
        assert applied == [
            f"policy test applied by {who}: generation 2; tenants added: newco; tenants removed: batch; "
            "tenants[acme].guaranteed: 1 -> 2"
        ]
        assert ADMIN_TOKEN not in caplog.text

        rc, out, _ = _run(new, server.target)  # the same again: the next generation, no change
        assert (
            rc == 0
            and "generation 3" in out
            and "changed (against policy test, generation 2): nothing" in out
        )


def test_an_invalid_file_is_refused_locally_naming_the_key_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    tenants = [{**DEFAULT_TENANTS[0], "burstable": {"nominal": 3, "limit": 2}}]
    bad.write_text(make_policy(tenants))
    # Nothing listens there: refused before any connection is tried.
    rc, out, err = _run(bad, f"127.0.0.1:{free_port()}")
    assert rc == 1 and out == ""
    assert "error: spec.tenants[0].burstable.nominal: nominal 3 is greater than limit 2" in err, err
    assert f"{bad}: invalid policy, 1 error: nothing sent" in err
    assert "UNAVAILABLE" not in err


def test_the_server_s_refusals_are_named(tmp_path: Path) -> None:
    no_admins = tmp_path / "no-admins.yaml"
    no_admins.write_text(make_policy(admin_tokens=[]))
    with running_server(make_policy()) as server:
        rc, _, err = _run(no_admins, server.target)
        assert rc == 1 and "FAILED_PRECONDITION: spec.access.admins is empty" in err, err
        rc, _, err = _run(no_admins, server.target, token=TOKENS["acme"])
        assert rc == 1 and "PERMISSION_DENIED" in err and "policy apply needs an admin token" in err, err
        assert _guaranteed(server) == {"acme": 1, "globex": 0, "batch": 0}


def test_the_command_line_and_its_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = tmp_path / "new.yaml"
    new.write_text(make_policy(CHANGED))
    with running_server(make_policy()) as server:
        argv = ["policy", "apply", str(new), "--target", server.target, "--token", ADMIN_TOKEN]
        assert cli.main([*argv, "--dry-run"]) == 0
        assert "nothing applied" in capsys.readouterr().out
        assert _guaranteed(server)["acme"] == 1
        assert cli.main(argv) == 0
        assert "generation 2" in capsys.readouterr().out
        assert _guaranteed(server)["acme"] == 2
    with pytest.raises(SystemExit):
        cli.main(["policy", "apply", "--help"])
    text = capsys.readouterr().out
    for flag in ("--target", "--token", "--tls-ca", "--tls-cert", "--tls-key", "--dry-run"):
        assert flag in text


def test_the_kubernetes_watch_logs_what_it_applied(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="slotsched.policy")
    fake = FakeObjectApi(GROUP, VERSION, NS, PLURAL)
    fake.create(policy_object(guaranteed=1))

    def reported(generation: int) -> bool:
        c = fake.condition("Applied")
        return c is not None and c.get("observedGeneration") == generation

    def applied() -> list[str]:
        return [r.getMessage() for r in caplog.records if " applied by " in r.getMessage()]

    async def scenario(api: Any) -> None:
        running = await start_server(
            None, "127.0.0.1:0", None, policy_source=f"kubernetes://{NS}/{NAME}", kube_api=api
        )
        try:
            for generation in (1, 2):
                if generation == 2:
                    fake.set_spec(policy_object(guaranteed=2)["spec"])
                await asyncio.to_thread(fake.wait_for, lambda g=generation: reported(g))
        finally:
            await running.stop(0)

    with serving(fake) as api:
        asyncio.run(scenario(api))
    ref = f"kubernetes://{NS}/{NAME}"
    # The object as read at start is the policy the server started with (generation 1).
    assert applied() == [
        f"policy {NAME} applied by the object {ref}: generation 2; tenants[acme].guaranteed: 1 -> 2"
    ], caplog.text
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"policy from {ref}")]
    assert len(started) == 1 and "lasts until the object changes or the server restarts" in started[0]


def test_the_diff_ignores_order_and_counts_credentials() -> None:
    old = parse_policy(make_policy())[0]
    shuffled = parse_policy(make_policy(list(reversed(DEFAULT_TENANTS))))[0]
    assert diff_policies(old, shuffled).empty and summary(diff_policies(old, shuffled)) == "no change"
    more = parse_policy(make_policy(admin_tokens=[ADMIN_TOKEN, "second-admin"]))[0]
    assert summary(diff_policies(old, more)) == "access.admins: 1 entry -> 2 entries"
