"""Redis keys, fenced scripts and the parsing of `--state` (URL forms and the client each names:
redis_connect.py).

Keys under the prefix P (`--state-prefix`, default `slotsched`; with `redis+cluster://` P is the
hash tag `{slotsched}`, so every key of the pool hashes to one slot and the scripts that touch
several keys run on one node). Name every key through `RedisStore.key(name)`:

| key | type | holds |
| --- | --- | --- |
| `P:leader` | string, PX ttl | the leader's term token `<replica id>:<random>` (see Fencing) |
| `P:journal` | stream | one entry per applied event, field `e` = a codec record (scheduler/state/codec.py) |
| `P:snapshot` | hash | `fingerprint`, `stream_id` (last covered), `at`, `data`, `trimmed_to`, `trimmed_for` |
| `P:alive` | string | the leader's clock at its last lease renewal: a successor's outage starts there |
| `P:trimmed` | string | present once the journal was compacted (it no longer starts at the beginning) |
| `P:leader_addr` | string | `<term token> <host:port>`: the address the leader of that term published |

`trimmed_to` is the last journal entry dropped: the previous snapshot's `stream_id` (a snapshot
trims what the one before it covered, `_SNAPSHOT`), 0-0 while none was; `trimmed_for` the
`stream_id` it was written with (an older build's snapshot, which trimmed what it covered, leaves
both behind: they count only beside the snapshot they were written with).

Election timing (scheduler/state/lease.py): the lease is `SET NX PX ttl` (default 1 s), renewed
every ttl/4 by a compare-and-`PEXPIRE`, so its expiry is Redis's clock; the leader stops serving
at ttl − 10 % after it sent its last successful renewal (its monotonic clock): it never serves
past the moment a successor could win, assuming clock *rates* differ by less than 10 %.

Fencing: every write (journal append, snapshot + trim) is one Lua script that first checks that
`P:leader` still holds this replica's token for the current term, so a replica that lost the
lease (paused, partitioned) can never write after a successor took over; it gets `NOTLEADER`
(the seam's `StaleTerm`, scheduler/state/store.py) and steps down. A token is new for every
term (`SET NX PX`, or a swap from the replica's own previous token), even when the same replica
leads again, so work left over from its previous term (a batch still in flight, a snapshot being
cut) is refused too; a Lua compare-and-extend keeps it.

Durability of Redis itself is Redis's job: run it with `appendonly yes` (`appendfsync always`
loses nothing a caller was told; `everysec` may lose up to a second on a Redis crash). Replication
is asynchronous, so a failover may lose what only the old primary had: with `replicas=N` in the
URL (default 1 with Sentinel and Cluster) an append is acknowledged only after `WAIT` says N replicas hold it,
on the same connection, else it fails (ReplicasBehind, a StoreUnavailable: the replica steps down).
The leader key itself is not WAITed for: a term lost in a failover only makes the leader's next
renewal fail; it steps down and campaigns again on the promoted primary.

The journal path: every Acquire/Release reply waits for its batch's append, so with plain
`redis://` (one known primary) the append runs on its own persistent connection of
scheduler/state/resp.py (a lean RESP client: EVALSHA of the fenced script, EVAL when the server
lost it, `WAIT` pipelined behind it): p50 0.14–0.15 ms on loopback, 0.21–0.23 through redis-py.
Its failures are redis-py's exception types, turned into the seam's like every other call's;
it reconnects on next use. A standby's tail (XREAD BLOCK and the snapshot's id) has a second such
connection: redis-py parses a reply a line at a time, each an await, which was most of a
follower's CPU (bench/scaleout.py). `rediss://` (TLS), Sentinel (the primary moves: redis-py asks
the sentinels at every reconnection) and Cluster (slot routing) keep redis-py for both, as does
every other call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

from redis.exceptions import ConnectionError, RedisClusterException, RedisError, ResponseError

from scheduler.state.config import StateConfigError
from scheduler.state.redis_connect import Mode, connect, parse_target
from scheduler.state.resp import RespConnection
from scheduler.state.resp_shared import SharedLine, SharedLines
from scheduler.state.store import (
    START,
    AppendDone,
    Entry,
    Position,
    StaleTerm,
    StoredSnapshot,
    StoreUnavailable,
    Tail,
)

__all__ = ["RedisStore", "ReplicasBehind", "StateConfigError", "id_key", "key_prefix", "seam"]

_APPEND = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('NOTLEADER') end
local id = ''
for i = 2, #ARGV do id = redis.call('XADD', KEYS[2], '*', 'e', ARGV[i]) end
return id
"""
_APPEND_SHA = hashlib.sha1(_APPEND.encode()).hexdigest()  # what EVALSHA names (Redis hashes the same text)
# Stores the snapshot, then trims the journal up to the PREVIOUS snapshot's last entry (kept
# in `trimmed_to`): one snapshot's worth of journal stays behind the newest, so a standby reading
# a little behind the leader (paced under load, standby.py) reads on through a snapshot instead
# of reloading it. The first snapshot trims nothing (`trimmed_to` 0-0).
_SNAPSHOT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('NOTLEADER') end
local prev = redis.call('HGET', KEYS[2], 'stream_id')
redis.call('HSET', KEYS[2], 'fingerprint', ARGV[2], 'stream_id', ARGV[3], 'at', ARGV[4], 'data', ARGV[5])
local dropped = '0-0'
local ms, seq = string.match(prev or '', '^(%d+)-(%d+)$')
if ms and (ms ~= '0' or seq ~= '0') then
  redis.call('XTRIM', KEYS[3], 'MINID', ms .. '-' .. (tonumber(seq) + 1))
  redis.call('SET', KEYS[4], '1')
  dropped = prev
end
redis.call('HSET', KEYS[2], 'trimmed_to', dropped, 'trimmed_for', ARGV[3])
return 1
"""
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[3])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_EXTEND_SHA = hashlib.sha1(_EXTEND.encode()).hexdigest()
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


#: bench/durable.py's switch: `redis-py` sends the journal append through redis-py, not resp.py.
APPEND_ENV = "SLOTSCHED_JOURNAL_APPEND"


def key_prefix(prefix: str, mode: Mode) -> str:
    """What every key of the pool starts with. In a Cluster the prefix is a hash tag (`{P}`):
    all the pool's keys hash to one slot, as the fenced scripts that touch several need. Other
    modes keep the plain prefix, the names deployments already hold their state under."""
    if mode != "cluster":
        return prefix
    if "{" in prefix or "}" in prefix:
        raise StateConfigError(
            f"--state-prefix {prefix!r}: no braces with redis+cluster (it becomes the hash tag)"
        )
    if not prefix:
        raise StateConfigError("--state-prefix: empty; redis+cluster needs a prefix for its hash tag")
    return f"{{{prefix}}}"


class ReplicasBehind(StoreUnavailable):
    """Fewer replicas than `replicas=N` confirmed a journal append in time: treated like any
    failed append (the replica steps down; nobody was told about the batch)."""


#: What redis-py (and resp.py) raise when a call did not happen: the seam's StoreUnavailable.
_FAILED = (RedisError, RedisClusterException, OSError)


def _unavailable(e: BaseException) -> BaseException:
    """A client's failure as the seam's (StaleTerm and StoreUnavailable pass as they are)."""
    if isinstance(e, _FAILED):
        failure = StoreUnavailable(str(e) or type(e).__name__)
        failure.__cause__ = e
        return failure
    return e


@contextlib.contextmanager
def seam() -> Iterator[None]:
    """Raise a client's failure as StoreUnavailable: the replica names no Redis type."""
    try:
        yield
    except _FAILED as e:
        raise _unavailable(e) from e


def id_key(stream_id: str) -> tuple[int, int]:
    """A stream id's order: ids compare as (milliseconds, sequence)."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


#: How long a standby's XREAD may block on the lean tail connection.
IDLE_TAIL_MS = 1000


def _sid(pos: Position) -> str:
    """The seam's position as a stream id (START: before the first entry)."""
    return pos if pos != START else "0-0"


class RedisStore:
    """One replica's view of the shared state keys: a `StateStore` (scheduler/state/store.py).
    Every call may raise StoreUnavailable; the fenced writes StaleTerm."""

    def __init__(
        self,
        url: str,
        prefix: str,
        replica_id: str,
        timeout_s: float = 1.0,
        lines: SharedLines | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.token = f"{replica_id}:-"  # this replica's term token; a new one per won term
        self.target = parse_target(url)
        # A call that WAITs for replicas may take the replica timeout on top of its own.
        wait_s = self.target.replica_timeout_ms / 1000 if self.target.replicas else 0.0
        # Any: redis-py's stubs type replies as bytes | str, and this client always returns bytes.
        self.key_prefix = key_prefix(prefix, self.target.mode)  # may refuse the prefix: before connecting
        self.redis: Any = connect(self.target, timeout_s + wait_s)
        self.k_leader = self.key("leader")
        self.k_journal = self.key("journal")
        self.k_snapshot = self.key("snapshot")
        self.k_trimmed = self.key("trimmed")
        self.k_alive = self.key("alive")
        self._append = self.redis.register_script(_APPEND)
        self._snapshot = self.redis.register_script(_SNAPSHOT)
        self._extend = self.redis.register_script(_EXTEND)
        self._swap = self.redis.register_script(_SWAP)
        self._resign = self.redis.register_script(_RESIGN)
        # The hot journal append on its own lean connection where there is ONE known primary
        # (plain redis://); TLS, Sentinel (the primary moves) and Cluster keep redis-py's.
        self._fast: RespConnection | None = None
        self._tail_conn: RespConnection | None = None
        self.idle_tail_ms = 0  # redis-py: a tail waits only within the call timeout
        self._lease: SharedLine | None = None
        # bench/failover.py --append both: the same append over redis-py, in the same run.
        lean = os.environ.get(APPEND_ENV, "resp") != "redis-py"
        if lean and self.target.mode == "redis" and not self.target.tls:
            host, port = self.target.hosts[0]
            self._fast = RespConnection(
                host,
                port,
                timeout_s=timeout_s + wait_s,
                db=self.target.db,
                username=self.target.username,
                password=self.target.password,
            )
            # A standby's tail on a lean connection of its own too: redis-py parses an XREAD
            # reply a line at a time, each an await (most of a follower's CPU, bench/scaleout.py);
            # its own, so a blocked XREAD never holds an append back.
            # It may wait a second for entries: an idle pool is followed with a read a second, not
            # eight (its timeout covers the wait; a take-over reads the rest on redis-py).
            self.idle_tail_ms = IDLE_TAIL_MS
            self._tail_conn = RespConnection(
                host,
                port,
                timeout_s=timeout_s + wait_s + IDLE_TAIL_MS / 1000,
                db=self.target.db,
                username=self.target.username,
                password=self.target.password,
            )
            # The leader lease's renewals on a line shared by the stores of every pool of this
            # process (resp_shared.py): the renewals due in one turn go out as one write. Never
            # behind an append's WAIT nor a blocked XREAD; bounded by the call timeout alone.
            self._lease = (lines or SharedLines()).line(
                host,
                port,
                timeout_s=timeout_s,
                db=self.target.db,
                username=self.target.username,
                password=self.target.password,
            )

    @property
    def where(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.target.hosts)

    def key(self, name: str) -> str:
        """The Redis key `name` of this pool: every key of a pool must be named here, so that in
        a Cluster they share one hash slot (the fenced scripts touch several at once)."""
        return f"{self.key_prefix}:{name}"

    async def close(self) -> None:
        with seam():
            if self._fast is not None:
                await self._fast.close()
            if self._tail_conn is not None:
                await self._tail_conn.close()
            if self._lease is not None:
                lease, self._lease = self._lease, None
                await lease.release()
            await self.redis.aclose()

    # ------------------------------------------------------------------ leadership

    async def try_lead(self, ttl_s: float) -> bool:
        """Win a new term: the key is free, or still holds our own previous term's token."""
        ms = max(1, int(ttl_s * 1000))
        token = f"{self.replica_id}:{secrets.token_hex(6)}"
        with seam():
            won = bool(await self.redis.set(self.k_leader, token, nx=True, px=ms)) or bool(
                await self._swap(keys=[self.k_leader], args=[self.token, token, ms])
            )
        if won:
            self.token = token
        return won

    async def extend_lead(self, ttl_s: float, now: float) -> bool:
        """Keep the lease; record `now` (our clock) as the last time this leader was known alive."""
        ms = max(1, int(ttl_s * 1000))
        with seam():
            lease = self._lease
            if lease is None:
                return bool(
                    await self._extend(keys=[self.k_leader, self.k_alive], args=[self.token, ms, repr(now)])
                )
            call = (self.k_leader, self.k_alive, self.token, ms, repr(now))
            reply = await lease.call(("EVALSHA", _EXTEND_SHA, 2, *call))
            if isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT"):
                # The server lost the script (a restart, SCRIPT FLUSH): that call did nothing.
                reply = await lease.call(("EVAL", _EXTEND, 2, *call))
            if isinstance(reply, ResponseError):
                raise reply
            return bool(reply)

    async def alive(self) -> float | None:
        """When the last leader last renewed its lease (its clock), if one ever did."""
        with seam():
            v = await self.redis.get(self.k_alive)
        return None if v is None else float(v)

    async def resign(self) -> None:
        with seam():
            await self._resign(keys=[self.k_leader], args=[self.token])

    async def leader(self) -> str | None:
        with seam():
            v = await self.redis.get(self.k_leader)
        return None if v is None else v.decode()

    # ------------------------------------------------------------------ journal

    async def append(self, records: list[bytes], token: str) -> Position:
        """Append records in one script fenced by the term `token`; the id of the last. Raises
        StaleTerm."""
        keys = [self.k_leader, self.k_journal]
        with seam():
            try:
                if self._fast is not None:
                    last = await self._append_fast(records, token)
                elif self.target.replicas:
                    last = await self._with_replicas(_APPEND, keys, [token, *records])
                else:
                    last = await self._append(keys=keys, args=[token, *records])
            except ResponseError as e:
                if "NOTLEADER" in str(e):
                    raise StaleTerm(str(e)) from e
                raise
        return _text(last)

    def append_nowait(self, records: list[bytes], token: str, done: AppendDone) -> bool:
        """`append`, sent now on the lean connection if it is open: `done` gets the last id, or
        the failure (StaleTerm, StoreUnavailable), from the event loop, in the pass the reply
        arrives in. False (nothing sent) where there is no open lean connection: await `append` instead."""
        fast = self._fast
        if fast is None or not fast.ready:
            return False
        keys = [self.k_leader, self.k_journal]
        args: list[bytes | str] = [token, *records]
        # WAIT pipelined after the append when `replicas` > 0, on the same connection (WAIT
        # counts its own connection's writes).
        n = self.target.replicas
        wait: list[tuple[Any, ...]] = [("WAIT", n, self.target.replica_timeout_ms)] if n else []

        def first(replies: list[Any] | BaseException) -> None:
            # The server lost the script (SCRIPT FLUSH, a restart): that EVALSHA wrote nothing,
            # and the WAIT after this EVAL covers what it writes.
            if _noscript(replies) and fast.ready:
                fast.send([("EVAL", _APPEND, len(keys), *keys, *args), *wait], last)
            else:
                last(replies)

        def last(replies: list[Any] | BaseException) -> None:
            try:
                if isinstance(replies, BaseException):
                    raise replies
                outcome: str | BaseException = _text(self._fast_result(replies))
            except Exception as e:  # noqa: BLE001 - whatever it is, `done` must hear of it
                outcome = _unavailable(e)
            done(outcome)

        fast.send([("EVALSHA", _APPEND_SHA, len(keys), *keys, *args), *wait], first)
        return True

    async def _append_fast(self, records: list[bytes], token: str) -> str:
        """`append_nowait`, awaited: on the lean connection, opened first if need be."""
        assert self._fast is not None
        await self._fast.connect()
        fut: asyncio.Future[str | BaseException] = asyncio.get_running_loop().create_future()

        def done(outcome: str | BaseException) -> None:
            if not fut.done():  # its caller may have been cancelled
                fut.set_result(outcome)

        if not self.append_nowait(records, token, done):
            raise ConnectionError(f"redis {self._fast.host}:{self._fast.port}: not connected")
        outcome = await fut
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _fast_result(self, replies: list[Any]) -> Any:
        """The append's reply, or raise: StaleTerm (fenced), ReplicasBehind, a ResponseError."""
        assert self._fast is not None
        result = replies[0]
        if isinstance(result, ResponseError):
            if "NOTLEADER" in str(result):
                raise StaleTerm(str(result)) from result
            self._fast.drop()  # e.g. READONLY: the node was demoted; connect afresh next time
            raise result
        n = self.target.replicas
        if n:
            if isinstance(replies[1], ResponseError):
                raise replies[1]
            if int(replies[1]) < n:
                ms = self.target.replica_timeout_ms
                raise ReplicasBehind(f"{replies[1]} of {n} replicas confirmed the append within {ms} ms")
        return result

    async def _with_replicas(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run `script`, then WAIT until `replicas` replicas hold it, on ONE connection (WAIT
        counts the writes of its own connection). Raises ReplicasBehind if they do not in time."""
        n, ms = self.target.replicas, self.target.replica_timeout_ms
        where: dict[str, Any] = {}
        if self.target.mode == "cluster":
            try:
                await self.redis.initialize()  # the slot map, once
                where["target_nodes"] = self.redis.get_node_from_key(keys[0])  # the keys' one slot
            except RedisClusterException as e:
                raise ConnectionError(f"redis cluster: {e}") from e
        # EVAL, not EVALSHA: a pipeline cannot reload a script the server lost (a promoted replica).
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.execute_command("EVAL", script, len(keys), *keys, *args, **where)
                pipe.execute_command("WAIT", n, ms, **where)
                result, acked = await pipe.execute(raise_on_error=False)
        except RedisClusterException as e:
            raise ConnectionError(f"redis cluster: {e}") from e
        if isinstance(result, Exception):
            raise result
        if isinstance(acked, Exception):
            raise acked
        if int(acked) < n:
            raise ReplicasBehind(f"{acked} of {n} replicas confirmed the append within {ms} ms")
        return result

    async def journal_after(self, after: Position, chunk: int = 2000) -> AsyncIterator[list[Entry]]:
        """Journal entries after `after` (START: all), in chunks."""
        start = f"({_sid(after)}"
        while True:
            with seam():
                rows = await self.redis.xrange(self.k_journal, min=start, max="+", count=chunk)
            if not rows:
                return
            out: list[Entry] = [(_text(rid), bytes(fields[b"e"])) for rid, fields in rows]
            yield out
            start = f"({out[-1][0]}"

    async def trimmed(self) -> bool:
        with seam():
            return bool(await self.redis.exists(self.k_trimmed))

    # ------------------------------------------------------------------ snapshots

    async def save_snapshot(
        self, data: bytes, fingerprint: str, covers: Position, at: float, token: str
    ) -> None:
        """Store the snapshot covering the journal up to `covers`, then trim what the one before
        it covered (`_SNAPSHOT`); fenced by the term `token`."""
        keys = [self.k_leader, self.k_snapshot, self.k_journal, self.k_trimmed]
        sid = _sid(covers)
        args: list[str | bytes] = [token, fingerprint, sid, repr(at), data]
        with seam():
            try:
                await self._snapshot(keys=keys, args=args)
            except ResponseError as e:
                if "NOTLEADER" in str(e):
                    raise StaleTerm(str(e)) from e
                raise

    async def load_snapshot(self) -> StoredSnapshot | None:
        with seam():
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
        with seam():
            return bool(await script(keys=[self.k_leader, self.k_leader_addr], args=[token, address]))

    async def leader_address(self) -> str | None:
        """The address the current leader published, or None (no leader, or the one that holds
        the lease has not published yet: never a previous term's address)."""
        with seam():
            token, rec = await self.redis.mget(self.k_leader, self.k_leader_addr)
        if token is None or rec is None:
            return None
        term, _, address = _text(rec).partition(" ")
        return address if term == _text(token) and address else None

    async def tail(self, after: Position, block_ms: int, count: int = 2000) -> Tail:
        """Journal entries after `after`, waiting up to `block_ms` for the first; and the stream
        id the stored snapshot covers, read after them (in one pipeline: Redis runs the HGET once
        the XREAD returned). A snapshot id past `after` whose entries did not come means the
        leader trimmed what the standby had not read (`gap`): it must reload the snapshot."""
        rows: list[Entry] = []
        with seam():
            if self._tail_conn is not None:
                xread = (
                    "XREAD",
                    "COUNT",
                    count,
                    "BLOCK",
                    max(1, block_ms),
                    "STREAMS",
                    self.k_journal,
                    _sid(after),
                )
                got, snap = await self._tail_conn.pipeline([xread, ("HMGET", self.k_snapshot, *_TRIM_FIELDS)])
                for reply in (got, snap):
                    if isinstance(reply, ResponseError):
                        raise reply
                for _, entries in got or ():  # [[key, [[id, [field, value, ...]], ...]]]
                    rows.extend((_text(rid), bytes(_field(kv, b"e"))) for rid, kv in entries)
            else:
                pipe = self.redis.pipeline(transaction=False)
                pipe.xread({self.k_journal: _sid(after)}, count=count, block=max(1, block_ms))
                pipe.hmget(self.k_snapshot, *_TRIM_FIELDS)
                got, snap = await pipe.execute()
                for _, entries in got or ():
                    rows.extend((_text(rid), bytes(fields[b"e"])) for rid, fields in entries)
        covers = _trimmed_to(snap)
        # Entries read before the trim (the first at or before the snapshot's) are no gap.
        gap = (
            covers is not None and covers > id_key(_sid(after)) and (not rows or id_key(rows[0][0]) > covers)
        )
        return Tail(rows, gap)

    async def trimmed_past(self, after: Position) -> bool:
        """Entries after `after` were trimmed (`trimmed_to` is past it)."""
        with seam():
            fields = await self.redis.hmget(self.k_snapshot, *_TRIM_FIELDS)
        dropped = _trimmed_to(fields)
        return dropped is not None and dropped > id_key(_sid(after))


#: The snapshot's fields that say how far the journal was trimmed (`_trimmed_to`).
_TRIM_FIELDS = ("trimmed_to", "trimmed_for", "stream_id")


def _trimmed_to(fields: list[Any] | None) -> tuple[int, int] | None:
    """The last journal entry dropped, from the snapshot's `_TRIM_FIELDS`: `trimmed_to` when it
    was written with the snapshot stored now (`trimmed_for` is its `stream_id`); else the
    snapshot was stored by an older build, which trimmed what it covered: its `stream_id` (a
    `trimmed_to` left by an earlier snapshot of this build would hide that trim)."""
    if not fields:
        return None
    dropped, dropped_for, covers = fields
    v = dropped if dropped is not None and dropped_for == covers else covers
    return None if v is None else id_key(_text(v))


def _noscript(replies: list[Any] | BaseException) -> bool:
    """The server lost the script (SCRIPT FLUSH, a restart): EVALSHA wrote nothing."""
    return not isinstance(replies, BaseException) and str(replies[0]).startswith("NOSCRIPT")


def _field(kv: list[bytes], name: bytes) -> bytes:
    """A stream entry's field from its raw [field, value, ...] list."""
    for i in range(0, len(kv) - 1, 2):
        if kv[i] == name:
            return kv[i + 1]
    raise ResponseError(f"journal entry without field {name!r}")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
