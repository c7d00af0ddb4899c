"""Redis keys, fenced scripts and the parsing of `--state`.

Keys under the prefix P (default `slotsched`):

| key | type | holds |
| --- | --- | --- |
| `P:leader` | string, PX ttl | the leader's term token `<replica id>:<random>` (see Fencing) |
| `P:journal` | stream | one entry per applied event, field `e` = a codec record (scheduler/state/codec.py) |
| `P:snapshot` | hash | `fingerprint` (format), `stream_id` (last entry covered), `at`, `data` (JSON) |
| `P:alive` | string | the leader's clock at its last lease renewal: a successor's outage starts there |
| `P:trimmed` | string | present once the journal was compacted (it no longer starts at the beginning) |
| `P:leader_addr` | string | `<term token> <host:port>`: the address the leader of that term published |

Election timing (scheduler/state/replica.py): the lease is `SET NX PX ttl` (default 1 s), renewed
every ttl/4 by a compare-and-`PEXPIRE`, so its expiry is Redis's clock; the leader stops serving
at ttl − 10 % after it sent its last successful renewal (its monotonic clock): it never serves
past the moment a successor could win, assuming clock *rates* differ by less than 10 %.

Fencing: every write (journal append, snapshot + trim) is one Lua script that first checks that
`P:leader` still holds this replica's token for the current term, so a replica that lost the
lease (paused, partitioned) can never write after a successor took over; it gets `NOTLEADER` and
steps down. A token is new for every term (`SET NX PX`, or a swap from the replica's own previous
token), even when the same replica leads again, so work left over from its previous term (a
batch still in flight, a snapshot being cut) is refused too; a Lua compare-and-extend keeps it.

Durability of Redis itself is Redis's job: run it with `appendonly yes` (`appendfsync always`
loses nothing a caller was told; `everysec` may lose up to a second on a Redis crash).
"""

from __future__ import annotations

import secrets
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError

_APPEND = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('NOTLEADER') end
local id = ''
for i = 2, #ARGV do id = redis.call('XADD', KEYS[2], '*', 'e', ARGV[i]) end
return id
"""
_SNAPSHOT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('NOTLEADER') end
redis.call('HSET', KEYS[2], 'fingerprint', ARGV[2], 'stream_id', ARGV[3], 'at', ARGV[4], 'data', ARGV[5])
redis.call('XTRIM', KEYS[3], 'MINID', ARGV[6])
redis.call('SET', KEYS[4], '1')
return 1
"""
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[3])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_SWAP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""
_PUBLISH_ADDR = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
return 1
"""
_RESIGN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class StateConfigError(ValueError):
    """A `--state` value this build cannot use."""


class NotLeader(Exception):
    """A fenced write refused: another replica holds the leader lease."""


def _redacted(u: urllib.parse.SplitResult) -> str:
    """The URL without its password: a config error is logged, a credential must not be."""
    if u.password is None:
        return u.geturl()
    user = u.username or ""
    host = u.netloc.rpartition("@")[2]
    return u._replace(netloc=f"{user}:***@{host}").geturl()


def parse_state(value: str) -> str | None:
    """None for `memory`; the Redis URL for `redis://HOST:PORT/DB`. Raises StateConfigError."""
    text = value.strip()
    if text in ("", "memory"):
        return None
    u = urllib.parse.urlsplit(text)
    why = ""
    try:
        port = u.port
    except ValueError:
        port, why = None, "the port is not a number"
    if u.scheme not in ("redis", "rediss"):
        why = "expected memory or redis://HOST:PORT/DB"
    elif not u.hostname:
        why = why or "no host"
    elif u.path not in ("", "/") and not u.path.lstrip("/").isdigit():
        why = "the database must be a number (redis://HOST:PORT/0)"
    elif u.query or u.fragment:
        why = "no query or fragment allowed"
    if why or port == 0:
        raise StateConfigError(f"--state {_redacted(u)!r}: {why or 'bad port'}")
    return text


def _next_id(stream_id: str) -> str:
    """The smallest stream id after `stream_id` (XTRIM MINID keeps ids >= it)."""
    ms, _, seq = stream_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


@dataclass(frozen=True)
class StoredSnapshot:
    data: bytes
    fingerprint: str
    stream_id: str
    at: float


class RedisStore:
    """One replica's view of the shared state keys. Every call may raise redis errors."""

    def __init__(self, url: str, prefix: str, replica_id: str, timeout_s: float = 1.0) -> None:
        self.replica_id = replica_id
        self.token = f"{replica_id}:-"  # this replica's term token; a new one per won term
        # Any: redis-py's stubs type replies as bytes | str, and this client always returns bytes.
        self.redis: Any = Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # the replica decides what a failure means (step down)
        )
        self.k_leader = f"{prefix}:leader"
        self.k_journal = f"{prefix}:journal"
        self.k_snapshot = f"{prefix}:snapshot"
        self.k_trimmed = f"{prefix}:trimmed"
        self.k_alive = f"{prefix}:alive"
        self._append = self.redis.register_script(_APPEND)
        self._snapshot = self.redis.register_script(_SNAPSHOT)
        self._extend = self.redis.register_script(_EXTEND)
        self._swap = self.redis.register_script(_SWAP)
        self._resign = self.redis.register_script(_RESIGN)

    async def close(self) -> None:
        await self.redis.aclose()

    # ------------------------------------------------------------------ leadership

    async def try_lead(self, ttl_s: float) -> bool:
        """Win a new term: the key is free, or still holds our own previous term's token."""
        ms = max(1, int(ttl_s * 1000))
        token = f"{self.replica_id}:{secrets.token_hex(6)}"
        won = bool(await self.redis.set(self.k_leader, token, nx=True, px=ms)) or bool(
            await self._swap(keys=[self.k_leader], args=[self.token, token, ms])
        )
        if won:
            self.token = token
        return won

    async def extend_lead(self, ttl_s: float, now: float) -> bool:
        """Keep the lease; record `now` (our clock) as the last time this leader was known alive."""
        ms = max(1, int(ttl_s * 1000))
        return bool(await self._extend(keys=[self.k_leader, self.k_alive], args=[self.token, ms, repr(now)]))

    async def alive(self) -> float | None:
        """When the last leader last renewed its lease (its clock), if one ever did."""
        v = await self.redis.get(self.k_alive)
        return None if v is None else float(v)

    async def resign(self) -> None:
        await self._resign(keys=[self.k_leader], args=[self.token])

    async def leader(self) -> str | None:
        v = await self.redis.get(self.k_leader)
        return None if v is None else v.decode()

    # ------------------------------------------------------------------ journal

    async def append(self, records: list[bytes], token: str) -> str:
        """Append records in one script fenced by the term `token`; the id of the last. Raises
        NotLeader."""
        try:
            last = await self._append(keys=[self.k_leader, self.k_journal], args=[token, *records])
        except ResponseError as e:
            if "NOTLEADER" in str(e):
                raise NotLeader(str(e)) from e
            raise
        return _text(last)

    async def journal_after(
        self, stream_id: str, chunk: int = 2000
    ) -> AsyncIterator[list[tuple[str, bytes]]]:
        """Journal entries after `stream_id` ("0-0": all), in chunks."""
        start = f"({stream_id}"
        while True:
            rows = await self.redis.xrange(self.k_journal, min=start, max="+", count=chunk)
            if not rows:
                return
            out: list[tuple[str, bytes]] = [(_text(rid), bytes(fields[b"e"])) for rid, fields in rows]
            yield out
            start = f"({out[-1][0]}"

    async def trimmed(self) -> bool:
        return bool(await self.redis.exists(self.k_trimmed))

    # ------------------------------------------------------------------ snapshots

    async def save_snapshot(
        self, data: bytes, fingerprint: str, stream_id: str, at: float, token: str
    ) -> None:
        """Store the snapshot covering the journal up to `stream_id`, then trim what it covers;
        fenced by the term `token`."""
        keys = [self.k_leader, self.k_snapshot, self.k_journal, self.k_trimmed]
        args: list[str | bytes] = [
            token,
            fingerprint,
            stream_id,
            repr(at),
            data,
            _next_id(stream_id),
        ]
        try:
            await self._snapshot(keys=keys, args=args)
        except ResponseError as e:
            if "NOTLEADER" in str(e):
                raise NotLeader(str(e)) from e
            raise

    async def load_snapshot(self) -> StoredSnapshot | None:
        doc: dict[bytes, Any] = await self.redis.hgetall(self.k_snapshot)
        if not doc:
            return None
        return StoredSnapshot(
            bytes(doc[b"data"]), _text(doc[b"fingerprint"]), _text(doc[b"stream_id"]), float(doc[b"at"])
        )

    # ------------------------------------------------------------------ hot standby, leader address
    # (added after the methods above: the standby's tail and the address clients are sent to)

    @property
    def k_leader_addr(self) -> str:
        """`P:leader_addr`: "<term token> <host:port>" of the leader that won that term. Derived
        from `k_leader` so it shares its hash tag (one slot with the lease in a Redis Cluster)."""
        return f"{self.k_leader}_addr"

    async def publish_address(self, address: str, token: str) -> bool:
        """Record `address` as the leader's for the term `token` (fenced: False if not ours)."""
        script = self.redis.register_script(_PUBLISH_ADDR)
        return bool(await script(keys=[self.k_leader, self.k_leader_addr], args=[token, address]))

    async def leader_address(self) -> str | None:
        """The address the current leader published, or None (no leader, or the one that holds
        the lease has not published yet: never a previous term's address)."""
        token, rec = await self.redis.mget(self.k_leader, self.k_leader_addr)
        if token is None or rec is None:
            return None
        term, _, address = _text(rec).partition(" ")
        return address if term == _text(token) and address else None

    async def tail(
        self, after: str, block_ms: int, count: int = 2000
    ) -> tuple[list[tuple[str, bytes]], str | None]:
        """Journal entries after `after`, waiting up to `block_ms` for the first; and the stream
        id the stored snapshot covers, read after them (in one pipeline: Redis runs the HGET once
        the XREAD returned). A snapshot id past `after` whose entries did not come means the
        leader trimmed what the standby had not read: it must reload the snapshot."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xread({self.k_journal: after}, count=count, block=max(1, block_ms))
        pipe.hget(self.k_snapshot, "stream_id")
        got, snap = await pipe.execute()
        rows: list[tuple[str, bytes]] = []
        for _, entries in got or ():
            rows.extend((_text(rid), bytes(fields[b"e"])) for rid, fields in entries)
        return rows, None if snap is None else _text(snap)

    async def snapshot_id(self) -> str | None:
        """The stream id the stored snapshot covers (None: no snapshot)."""
        v = await self.redis.hget(self.k_snapshot, "stream_id")
        return None if v is None else _text(v)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
