"""The blocking `Client` cannot drift from `AsyncClient`: it takes exactly the same arguments
(it once lacked follow_leader, failover_timeout_s and multiplex though its docstring said "same
arguments"), hands every one on, and its `Session` shows every view of the async session's state."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from scheduler.client import AsyncClient, AsyncSession, Client, Session
from scheduler.client.forward import Forward


def test_client_takes_exactly_the_arguments_of_async_client() -> None:
    sync = inspect.signature(Client.__init__)
    aio = inspect.signature(AsyncClient.__init__)
    assert list(sync.parameters.values()) == list(aio.parameters.values())


def test_every_argument_reaches_the_async_client() -> None:
    given: dict[str, Any] = {
        "rpc_timeout_s": 3.0,
        "reattach_timeout_s": 7.0,
        "backoff_initial_s": 0.2,
        "backoff_max_s": 4.0,
        "renew_interval_s": 1.5,
        "connect_timeout_s": 2.5,
        "follow_leader": False,
        "failover_timeout_s": 9.0,
    }
    with Client("127.0.0.1:1,127.0.0.1:2", token="t", multiplex=False, **given) as client:  # never dialled
        aio = client.aio
        for name, value in given.items():
            assert getattr(aio, name) == value, name
        assert aio.targets == ["127.0.0.1:1", "127.0.0.1:2"]
        assert aio._mux is None  # multiplex=False
        assert aio._follower.follow is False and aio._follower.failover_timeout_s == 9.0
        assert aio.metadata == (("authorization", "Bearer t"),)


def _views(cls: type) -> set[str]:
    return {name for name, v in vars(cls).items() if isinstance(v, Forward)}


#: Views the blocking Session has in its own shape: a copy of the list, threading.Events
#: mirroring the asyncio ones.
_OWN = {"callback_errors", "lost_lease", "ended"}


def test_the_blocking_session_shows_every_view_of_the_async_one() -> None:
    missing = _views(AsyncSession) - _views(Session) - _OWN
    assert not missing, f"Session lacks {sorted(missing)}"
    assert isinstance(vars(Session)["callback_errors"], property)


@pytest.mark.parametrize("name", sorted(_views(AsyncSession) & _views(Session)))
def test_a_view_is_read_only(name: str) -> None:
    with pytest.raises(AttributeError):
        getattr(Session, name).__set__(object(), None)


def test_both_clients_take_one_options_object_or_its_names_as_keywords() -> None:
    from scheduler.client import ClientOptions

    options = ClientOptions(token="t", rpc_timeout_s=3.0, multiplex=False)
    with Client("127.0.0.1:1", options=options, follow_leader=False) as client:  # never dialled
        aio = client.aio
        assert aio.rpc_timeout_s == 3.0 and aio.follow_leader is False and aio._mux is None
        assert aio.metadata == (("authorization", "Bearer t"),)
    by_keywords = AsyncClient("127.0.0.1:1", "t", rpc_timeout_s=3.0, multiplex=False, follow_leader=False)
    assert by_keywords.options == AsyncClient("127.0.0.1:1", options=options, follow_leader=False).options
    with pytest.raises(TypeError, match="unknown client setting rpc_timeout: the settings are"):
        AsyncClient("127.0.0.1:1", rpc_timeout=3.0)
    with pytest.raises(ValueError, match="connect_timeout_s must be > 0"):
        Client("127.0.0.1:1", connect_timeout_s=0)


#: Methods of the async session the blocking one has in its own shape: closing is `__exit__`,
#: and its listeners are how it mirrors the async session's state (`Session._mirror`).
_OWN_METHODS = {"aclose", "add_listener"}


def test_the_blocking_session_has_every_method_of_the_async_one() -> None:
    """A new session command's method (e.g. to extend a lease) fails here until its blocking twin
    is written."""

    def methods(cls: type) -> set[str]:
        return {n for n, v in vars(cls).items() if not n.startswith("_") and inspect.isfunction(v)}

    missing = methods(AsyncSession) - methods(Session) - _OWN_METHODS
    assert not missing, f"Session lacks {sorted(missing)}"
