"""The composition root's table of serving modes (scheduler/app/root.py `MODES`) and the state
store chosen by its URL (scheduler/state/config.py): which mode `--leadership` and `--state`
wire, the refusals that name the flag, and that nothing but `state/config.py` names a store kind."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from scheduler.app.memory import Memory
from scheduler.app.one_leader import OneLeader
from scheduler.app.options import StateOptions
from scheduler.app.pools import PoolLeadership
from scheduler.app.root import mode_of
from scheduler.serve import start_server
from scheduler.state.config import KINDS, StateConfigError, state_url

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("leadership", "durable", "mode"),
    [
        ("replica", False, Memory),
        ("replica", True, OneLeader),
        ("pool", True, PoolLeadership),
    ],
)
def test_each_mode_is_one_row(leadership: str, durable: bool, mode: object) -> None:
    assert mode_of(StateOptions(leadership=leadership), durable) is mode


@pytest.mark.parametrize(
    ("leadership", "durable", "says"),
    [
        ("pool", False, "--leadership pool needs --state"),
        ("pools", True, "--leadership 'pools': replica or pool"),
        ("", False, "--leadership '': replica or pool"),
    ],
)
def test_a_mode_without_its_row_is_refused_naming_the_flag(leadership: str, durable: bool, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        mode_of(StateOptions(leadership=leadership), durable)


def test_start_server_refuses_pool_leadership_in_memory() -> None:
    async def go() -> None:
        with pytest.raises(ValueError, match="--leadership pool needs --state"):
            await start_server(state=StateOptions(leadership="pool"))

    asyncio.run(go())


@pytest.mark.parametrize("scheme", sorted({s for k in KINDS for s in k.schemes}))
def test_every_scheme_of_a_kind_is_chosen_by_its_url(scheme: str) -> None:
    url = state_url(f"{scheme}://127.0.0.1:6379" + ("/master" if "sentinel" in scheme else ""))
    assert url is not None and scheme in url.kind.schemes


@pytest.mark.parametrize("value", ["memory", "", "  memory "])
def test_memory_is_no_store(value: str) -> None:
    assert state_url(value) is None


def test_an_unknown_scheme_lists_every_kind_and_hides_the_password() -> None:
    with pytest.raises(StateConfigError) as err:
        state_url("etcd://root:hunter2@etcd:2379")
    text = str(err.value)
    assert text.startswith("--state ") and "hunter2" not in text and "etcd://root:***@etcd:2379" in text
    for kind in KINDS:
        assert kind.forms in text


# A store's kind is named (its module imported, its class built) in scheduler/state/config.py
# and its own modules only: the composition root builds stores from the URL, never by name.
_STORE_MODULES = {
    f"scheduler.state.{m}" for m in ("redis_store", "redis_members", "redis_connect", "resp", "resp_shared")
}
_MAY_NAME = {"scheduler/state/config.py"} | {
    f"scheduler/state/{m.rsplit('.', 1)[1]}.py" for m in _STORE_MODULES
}


def test_only_the_state_config_names_a_store_kind() -> None:
    named = []
    for path in sorted((ROOT / "scheduler").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in _MAY_NAME:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in _STORE_MODULES:
                named.append(f"{rel}: from {node.module} import …")
            elif isinstance(node, ast.Import):
                named += [f"{rel}: import {a.name}" for a in node.names if a.name in _STORE_MODULES]
    assert not named, f"a store kind named outside scheduler/state/config.py: {named}"
