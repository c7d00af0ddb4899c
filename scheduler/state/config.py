"""`--state`: which state store a URL names, and building it (as snapshots/config.py for the
snapshot stores). Parse, redact, build, and nothing else knows which kinds exist.

    memory                               no store: the state lives and dies with the process
    redis[s][+sentinel|+cluster]://…     scheduler/state/redis_connect.py: one Redis, Sentinel or Cluster

A kind is one row of `KINDS`: its URL schemes, the URL forms errors show, the pip extra its
client library comes with, and a loader importing its module only when a URL of its scheme is
given (so a base install without that library still serves `memory`, and says which extra to
install otherwise). What a kind's module gives (`Backend`): a check of its URL, the replica's
`StateStore` (scheduler/state/store.py: the guarantees tests/test_state_store_contract.py runs on
every kind) and the replicas' `Members` (scheduler/state/members.py, for `--leadership pool`).
A new store is its module, its row here and its row in that suite's `STORES`.

Errors name `--state` and what is wrong; they never show a password (`redact`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from snapshots.extras import needs_extra

if TYPE_CHECKING:
    from scheduler.state.members import Members
    from scheduler.state.store import StateStore

__all__ = [
    "FORMS",
    "KINDS",
    "Backend",
    "Kind",
    "StateConfigError",
    "StateUrl",
    "parse_state",
    "redact",
    "state_url",
]

MEMORY = "memory"


class StateConfigError(ValueError):
    """A `--state` value this build cannot use."""


@dataclass(frozen=True)
class Backend:
    """What a kind's module gives the wiring: every call takes the whole `--state` URL."""

    #: Raises StateConfigError naming `--state` and what is wrong with the URL.
    check: Callable[[str], object]
    #: `(url, prefix, replica_id, timeout_s)`: one replica's view of the pool under `prefix`.
    store: Callable[[str, str, str, float], StateStore]
    #: `(url, prefix, timeout_s)`: the replicas' membership and owners table under `prefix`.
    members: Callable[[str, str, float], Members]


def _redis() -> Backend:
    from scheduler.state.redis_connect import parse_target
    from scheduler.state.redis_members import RedisMembers
    from scheduler.state.redis_store import RedisStore
    from scheduler.state.resp_shared import SharedLines

    lines = SharedLines()  # the stores of every pool of this process renew their leases together
    return Backend(
        check=parse_target,
        store=lambda url, prefix, replica, timeout_s: RedisStore(url, prefix, replica, timeout_s, lines),
        members=RedisMembers,
    )


@dataclass(frozen=True)
class Kind:
    name: str
    schemes: tuple[str, ...]
    forms: str  # the URL forms an error lists
    extra: str  # the pip extra of its client library
    load: Callable[[], Backend]


#: Every state store kind, by its schemes. `memory` is none of them: no store at all.
KINDS: tuple[Kind, ...] = (
    Kind(
        "redis",
        ("redis", "rediss", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster"),
        "redis://HOST:PORT/DB, redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER[/DB] "
        "or redis+cluster://HOST:PORT[,HOST:PORT…]",
        "redis",
        _redis,
    ),
)
_BY_SCHEME = {scheme: kind for kind in KINDS for scheme in kind.schemes}
FORMS = ", ".join((MEMORY, *(k.forms for k in KINDS)))


def redact(text: str) -> str:
    """`text` with the password of its userinfo replaced by ***: config errors are logged."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    netloc_end = min(
        (i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest)
    )
    netloc, tail = rest[:netloc_end], rest[netloc_end:]
    userinfo, at, hosts = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return text
    user = userinfo.partition(":")[0]
    return f"{scheme}://{user}:***@{hosts}{tail}"


@dataclass(frozen=True)
class StateUrl:
    """A checked `--state` URL of a store kind, and what builds that kind's parts."""

    url: str
    kind: Kind
    backend: Backend

    @property
    def redacted(self) -> str:
        return redact(self.url)

    def store(self, prefix: str, replica_id: str, timeout_s: float) -> StateStore:
        return self.backend.store(self.url, prefix, replica_id, timeout_s)

    def members(self, prefix: str, timeout_s: float) -> Members:
        return self.backend.members(self.url, prefix, timeout_s)


def state_url(value: str) -> StateUrl | None:
    """None for `memory`; else the checked URL with its kind's builders (its module imported
    now: MissingExtra naming the extra when the install lacks its library). Raises
    StateConfigError naming `--state` and what is wrong."""
    text = value.strip()
    if text in ("", MEMORY):
        return None
    scheme, sep, _ = text.partition("://")
    kind = _BY_SCHEME.get(scheme.lower()) if sep else None
    if kind is None:
        raise StateConfigError(f"--state {redact(text)!r}: expected {FORMS}")
    with needs_extra(kind.extra, f"--state {scheme}://…"):  # the scheme only: the URL may hold a password
        backend = kind.load()
    backend.check(text)
    return StateUrl(text, kind, backend)


def parse_state(value: str) -> str | None:
    """None for `memory`; else the checked URL. Raises StateConfigError naming `--state`."""
    url = state_url(value)
    return None if url is None else url.url
