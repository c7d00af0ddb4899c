"""The lean RESP connection of the journal append (scheduler/state/resp.py): the parser on every
reply type, whole and split at every byte; and against real redis-server processes on free ports:
the fenced append through it (wrong token → StaleTerm), NOSCRIPT after SCRIPT FLUSH, AUTH with
a username and password plus SELECT, WAIT for a replica, and a SIGKILLed Redis mid-append raising
what the replica treats as a failed append (then reconnecting once Redis is back)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler.state.redis_store import RedisStore, ReplicasBehind
from scheduler.state.resp import Incomplete, RespConnection, pack_command, parse
from scheduler.state.resp_shared import SharedLines
from scheduler.state.store import StaleTerm, StoreUnavailable
from tests.test_state_redis import REDIS_BIN, RedisProc, free_port

pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_BIN) and not os.environ.get("CI"), reason="redis-server not installed"
)

# (wire bytes, parsed reply); error replies compare by their message.
REPLIES: list[tuple[bytes, Any]] = [
    (b"+OK\r\n", b"OK"),
    (b"+\r\n", b""),
    (b"-NOTLEADER\r\n", ResponseError("NOTLEADER")),
    (b"-ERR wrong number of arguments\r\n", ResponseError("ERR wrong number of arguments")),
    (b":0\r\n", 0),
    (b":-42\r\n", -42),
    (b":1733000000000\r\n", 1733000000000),
    (b"$5\r\nhello\r\n", b"hello"),
    (b"$0\r\n\r\n", b""),
    (b"$4\r\na\r\nb\r\n", b"a\r\nb"),  # CRLF inside a bulk is data
    (b"$-1\r\n", None),
    (b"*0\r\n", []),
    (b"*-1\r\n", None),
    (b"*3\r\n:1\r\n$3\r\nfoo\r\n$-1\r\n", [1, b"foo", None]),
    (b"*2\r\n*1\r\n+a\r\n-ERR x\r\n", [[b"a"], ResponseError("ERR x")]),
    (b"*2\r\n$15\r\n1733000000000-0\r\n*2\r\n$1\r\ne\r\n$2\r\n{}\r\n", [b"1733000000000-0", [b"e", b"{}"]]),
]


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, ResponseError):
        return isinstance(got, ResponseError) and str(got) == str(want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_same, got, want))
    return type(got) is type(want) and bool(got == want)


@pytest.mark.parametrize(("wire", "want"), REPLIES, ids=[repr(w)[2:30] for w, _ in REPLIES])
def test_parse_every_reply_type_whole_and_split_at_every_byte(wire: bytes, want: Any) -> None:
    got, end = parse(wire + b"+next\r\n")
    assert _same(got, want) and end == len(wire)
    for cut in range(len(wire)):  # a reply split across packets: nothing until its last byte
        assert parse(wire[:cut]) == (Incomplete, 0)
    assert parse(b"xx" + wire, 2)[1] == len(wire) + 2


@pytest.mark.parametrize("wire", [b"?1\r\n", b":x\r\n", b"$3\r\nabcde\r\n", b"*z\r\n"])
def test_parse_refuses_bytes_that_are_not_resp(wire: bytes) -> None:
    with pytest.raises(ConnectionError):
        parse(wire)


def test_encode_is_an_array_of_bulk_strings() -> None:
    assert pack_command("SET", b"k\r\n", 7) == b"*3\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$1\r\n7\r\n"


def test_pipeline_reads_replies_split_across_packets() -> None:
    """A server answering byte by byte: every reply still arrives whole and in order."""

    async def body() -> None:
        replies = b"+OK\r\n$5\r\nhello\r\n*2\r\n:1\r\n-ERR no\r\n"

        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.read(1024)
            for i in range(len(replies)):
                w.write(replies[i : i + 1])
                await w.drain()
                await asyncio.sleep(0)
            await r.read(1024)  # until the client goes
            w.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = RespConnection("127.0.0.1", port, timeout_s=5)
        try:
            got = await conn.pipeline([("A",), ("B",), ("C",)])
            assert got[:2] == [b"OK", b"hello"] and got[2][0] == 1 and str(got[2][1]) == "ERR no"
        finally:
            await conn.close()
            server.close()
            await server.wait_closed()

    asyncio.run(body())


def test_append_through_resp_is_fenced_and_survives_script_flush() -> None:
    with tempfile.TemporaryDirectory(prefix="slotsched-resp-") as d:
        r = RedisProc(d).start()

        async def go() -> None:
            a = RedisStore(r.url, "t", "a")
            b = RedisStore(r.url, "t", "b")
            assert a._fast is not None  # plain redis:// takes the lean path
            try:
                assert await a.try_lead(5.0)
                first = await a.append([b"one", b"two"], a.token)
                with pytest.raises(StaleTerm):
                    await b.append([b"intruder"], b.token)
                with pytest.raises(StaleTerm):
                    await a.append([b"stale"], "a:not-this-term")
                await a.redis.script_flush()  # the server lost the script: EVAL loads it again
                last = await a.append([b"three"], a.token)
                assert last > first
                rows = await a.redis.xrange(a.k_journal)
                assert [f[b"e"] for _, f in rows] == [b"one", b"two", b"three"]
                assert _text(rows[1][0]) == first and _text(rows[2][0]) == last
            finally:
                await a.close()
                await b.close()

        try:
            asyncio.run(go())
        finally:
            r.kill()


def test_the_lease_renews_through_resp_fenced_and_after_a_script_flush() -> None:
    """The leader lease's renewal on its own lean connection: kept by its term's token only,
    the lease's TTL moved, and again after the server lost the script (NOSCRIPT, then EVAL)."""
    with tempfile.TemporaryDirectory(prefix="slotsched-resp-") as d:
        r = RedisProc(d).start()

        async def go() -> None:
            a = RedisStore(r.url, "t", "a")
            b = RedisStore(r.url, "t", "b")
            assert a._lease is not None  # plain redis:// takes the lean path
            try:
                assert await a.try_lead(5.0)
                assert await a.extend_lead(60.0, 1.5)
                assert await a.redis.pttl(a.k_leader) > 5_000  # moved to about 60 s
                assert await a.alive() == 1.5
                assert not await b.extend_lead(60.0, 2.0)  # another term's token keeps nothing
                assert await a.alive() == 1.5
                await a.redis.script_flush()
                assert await a.extend_lead(30.0, 3.0)
                assert await a.alive() == 3.0
            finally:
                await a.close()
                await b.close()

        try:
            asyncio.run(go())
        finally:
            r.kill()


def test_an_idle_standby_waits_a_second_per_read_within_its_connection_timeout() -> None:
    """On plain redis:// a standby's tail may block `idle_tail_ms` (a second: an idle pool is
    followed with a read a second, not eight), well past the call timeout, without timing out;
    an entry appended meanwhile ends the wait at once."""
    with tempfile.TemporaryDirectory(prefix="slotsched-resp-") as d:
        r = RedisProc(d).start()

        async def go() -> None:
            a = RedisStore(r.url, "t", "a", timeout_s=0.2)
            b = RedisStore(r.url, "t", "b", timeout_s=0.2)
            try:
                assert b.idle_tail_ms == 1000
                assert await a.try_lead(5.0)
                last = await a.append([b"one"], a.token)
                t0 = time.monotonic()
                idle = await b.tail(last, b.idle_tail_ms)
                assert idle.entries == [] and not idle.gap
                assert time.monotonic() - t0 >= 0.5  # it waited past the 0.2 s call timeout
                waiting = asyncio.ensure_future(b.tail(last, b.idle_tail_ms))
                await a.append([b"two"], a.token)
                got = await asyncio.wait_for(waiting, 5)
                assert [e for _, e in got.entries] == [b"two"]
            finally:
                await a.close()
                await b.close()

        try:
            asyncio.run(go())
        finally:
            r.kill()


# The snapshot script of the builds before decision 0023: it trimmed what it covered.
_OLD_SNAPSHOT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('NOTLEADER') end
redis.call('HSET', KEYS[2], 'fingerprint', ARGV[2], 'stream_id', ARGV[3], 'at', ARGV[4], 'data', ARGV[5])
redis.call('XTRIM', KEYS[3], 'MINID', ARGV[6])
redis.call('SET', KEYS[4], '1')
return 1
"""


def test_a_snapshot_an_older_build_stored_after_ours_still_shows_its_trim() -> None:
    """A pool led by this build (snapshots trim one behind) then by an older one (a snapshot
    trims what it covers, and leaves this build's trimmed_to behind): a standby between the two
    cuts sees the gap and a take-over's catch-up the trim, not a stale trimmed_to."""
    with tempfile.TemporaryDirectory(prefix="slotsched-resp-") as d:
        r = RedisProc(d).start()

        async def go() -> None:
            a = RedisStore(r.url, "t", "a")
            b = RedisStore(r.url, "t", "b")
            try:
                assert await a.try_lead(5.0)
                ps = [await a.append([f"r{i}".encode()], a.token) for i in range(6)]
                await a.save_snapshot(b"s1", "fp", ps[0], 1.0, a.token)
                await a.save_snapshot(b"s2", "fp", ps[1], 2.0, a.token)  # trims up to ps[0]
                assert not (await b.tail(ps[0], 10)).gap and not await b.trimmed_past(ps[0])
                ms, _, seq = ps[4].partition("-")
                keys = [a.k_leader, a.k_snapshot, a.k_journal, a.k_trimmed]
                await a.redis.eval(
                    _OLD_SNAPSHOT, 4, *keys, a.token, "fp", ps[4], "5.0", b"s5", f"{ms}-{int(seq) + 1}"
                )
                # A standby at ps[2] (past this build's trimmed_to, behind the old build's cut).
                assert await b.trimmed_past(ps[2]) and (await b.tail(ps[2], 10)).gap
                assert not await b.trimmed_past(ps[4]) and not (await b.tail(ps[4], 10)).gap
            finally:
                await a.close()
                await b.close()

        try:
            asyncio.run(go())
        finally:
            r.kill()


def test_a_line_its_last_store_let_go_sends_and_opens_nothing_more() -> None:
    with tempfile.TemporaryDirectory(prefix="slotsched-resp-") as d:
        r = RedisProc(d).start()

        async def go() -> None:
            lines = SharedLines()
            line = lines.line("127.0.0.1", r.port, timeout_s=1.0)
            assert await line.call(("PING",)) == b"PONG"
            await line.release()
            with pytest.raises(ConnectionError):
                await line.call(("PING",))
            assert not line.conn.ready

        try:
            asyncio.run(go())
        finally:
            r.kill()


def test_the_renewals_of_many_pools_made_in_one_turn_share_one_write() -> None:
    """Stores of one process (one `SharedLines`, as the backend makes per `--state` URL) send the
    lease renewals asked for in the same loop turn as ONE write, each answered as if alone: its
    own term kept or refused, its own NOSCRIPT retried; a dead server fails every one of them."""
    with tempfile.TemporaryDirectory(prefix="slotsched-resp-") as d:
        r = RedisProc(d).start()

        async def go() -> None:
            lines = SharedLines()
            stores = [RedisStore(r.url, f"pool{i}", "a", 1.0, lines) for i in range(5)]
            other = RedisStore(r.url, "pool0", "b", 1.0, lines)
            line = stores[0]._lease
            assert line is not None and all(s._lease is line for s in [*stores, other])
            try:
                for s in stores:
                    assert await s.try_lead(5.0)
                # The first: NOSCRIPT for all (a new server), then EVAL for all: two writes.
                assert await asyncio.gather(*(s.extend_lead(60.0, 0.5) for s in stores)) == [True] * 5
                assert line.writes == 2
                got = await asyncio.gather(
                    *(s.extend_lead(60.0, 1.0) for s in stores), other.extend_lead(60.0, 9.0)
                )
                assert got == [True] * 5 + [False]  # b holds no term of pool0: refused alone
                assert line.writes == 3
                for s in stores:
                    assert await s.redis.pttl(s.k_leader) > 5_000
                assert await stores[0].alive() == 1.0
                await stores[0].redis.script_flush()
                assert await asyncio.gather(*(s.extend_lead(30.0, 2.0) for s in stores)) == [True] * 5
                assert [await s.alive() for s in stores] == [2.0] * 5
                r.kill()
                got = await asyncio.gather(
                    *(s.extend_lead(30.0, 3.0) for s in stores), return_exceptions=True
                )
                assert all(isinstance(g, StoreUnavailable) for g in got), got
            finally:
                for s in [*stores, other]:
                    await s.close()
            assert not line.conn.ready and not lines._lines  # the last store closed it

        try:
            asyncio.run(go())
        finally:
            r.kill()


def _text(v: bytes) -> str:
    return v.decode()


def _redis(port: int, directory: str, *extra: str) -> subprocess.Popen[bytes]:
    args = [REDIS_BIN, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", directory]
    proc = subprocess.Popen([*args, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis(port=port).ping()
            return proc
        except redis.AuthenticationError:
            return proc  # up (and wants a password)
        except redis.ResponseError as e:
            if "NOAUTH" in str(e):
                return proc
            raise
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)


def test_auth_with_username_and_password_and_select_db() -> None:
    with tempfile.TemporaryDirectory(prefix="slotsched-resp-") as d:
        port = free_port()
        proc = _redis(port, d)
        admin = redis.Redis(port=port)
        admin.acl_setuser(
            "sched", enabled=True, passwords=["+s3cret"], keys=["*"], channels=["*"], commands=["+@all"]
        )
        admin.acl_setuser("default", enabled=False)  # from now on only sched, with its password
        url = f"redis://sched:s3cret@127.0.0.1:{port}/3"
        try:

            async def go() -> None:
                store = RedisStore(url, "t", "a")
                try:
                    assert await store.try_lead(5.0)  # redis-py, same credentials
                    await store.append([b"x"], store.token)
                    # In database 3, where redis-py (which SELECTs 3 too) reads it back.
                    assert [f[b"e"] for _, f in await store.redis.xrange(store.k_journal)] == [b"x"]
                    plain = redis.asyncio.Redis(port=port, username="sched", password="s3cret", db=0)
                    assert await plain.xlen(store.k_journal) == 0
                    await plain.aclose()
                finally:
                    await store.close()
                wrong = RespConnection("127.0.0.1", port, timeout_s=2, username="sched", password="nope")
                with pytest.raises(redis.AuthenticationError):
                    await wrong.execute("PING")
                anonymous = RespConnection("127.0.0.1", port, timeout_s=2)
                with pytest.raises(ResponseError, match="NOAUTH"):
                    await anonymous.execute("PING")
                await anonymous.close()

            asyncio.run(go())
        finally:
            _stop(proc)


def test_wait_for_a_replica_on_the_same_connection() -> None:
    with tempfile.TemporaryDirectory(prefix="slotsched-resp-") as d:
        port, rport = free_port(), free_port()
        primary = _redis(port, d, "--repl-diskless-sync-delay", "0")  # sync at once, not after 5 s
        os.makedirs(f"{d}/r")
        replica = _redis(rport, f"{d}/r", "--replicaof", "127.0.0.1", str(port))
        deadline = time.monotonic() + 15
        while "online" not in str(redis.Redis(port=port).info("replication").get("slave0", {})):
            assert time.monotonic() < deadline, "the replica did not sync"
            time.sleep(0.05)
        try:

            async def go() -> None:
                store = RedisStore(f"redis://127.0.0.1:{port}/0?replicas=1&replica_timeout_ms=2000", "t", "a")
                try:
                    assert await store.try_lead(5.0)
                    await store.append([b"held"], store.token)  # WAIT said 1 replica has it
                    assert redis.Redis(port=rport).xlen(store.k_journal) == 1
                    _stop(replica)
                    store.target = dataclasses.replace(store.target, replica_timeout_ms=50)
                    with pytest.raises(ReplicasBehind):
                        await store.append([b"unconfirmed"], store.token)
                finally:
                    await store.close()

            asyncio.run(go())
        finally:
            _stop(replica)
            _stop(primary)


def test_a_killed_redis_mid_append_fails_the_append_then_it_reconnects() -> None:
    """SIGSTOP (the append gets no reply: a timeout) then SIGKILL (the connection breaks): both
    raise StoreUnavailable, the replica's "append failed, step down"; Redis back, appends work."""
    with tempfile.TemporaryDirectory(prefix="slotsched-resp-") as d:
        r = RedisProc(d).start()

        async def go() -> None:
            store = RedisStore(r.url, "t", "a", timeout_s=0.5)
            try:
                assert await store.try_lead(30.0)
                await store.append([b"before"], store.token)
                assert r.proc is not None
                r.proc.send_signal(signal.SIGSTOP)
                with pytest.raises(StoreUnavailable):  # no reply within the store's timeout
                    await store.append([b"stalled"], store.token)
                r.proc.send_signal(signal.SIGCONT)
                await store.append([b"after-timeout"], store.token)  # a new connection
                pending = asyncio.ensure_future(store.append([b"x" * 50_000] * 200, store.token))
                await asyncio.sleep(0)  # the write is under way
                assert not pending.done()
                r.kill()
                with pytest.raises(StoreUnavailable):
                    await pending
                with pytest.raises(StoreUnavailable):  # still down: connecting fails like redis-py
                    await store.append([b"down"], store.token)
                r.start()  # AOF always: the lease key and journal survive
                await store.append([b"back"], store.token)
                rows = redis.Redis(port=r.port).xrange(store.k_journal)  # redis-py's pool: stale
                got = [f[b"e"] for _, f in rows if not f[b"e"].startswith(b"xx")]
                assert got[0] == b"before" and got[-1] == b"back" and b"down" not in got
            finally:
                await store.close()

        try:
            asyncio.run(go())
        finally:
            r.kill()


@contextlib.asynccontextmanager
async def _scripted(script: list[tuple[int, bytes]], timeout_s: float = 5) -> AsyncIterator[RespConnection]:
    """A connected RespConnection to a server that, for each (n, reply) in turn, reads until n
    more commands came in (one `*` array header each: the tests' commands hold no other `*`),
    then writes `reply`."""

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        read, want = b"", 0
        for n, reply in script:
            want += n
            while read.count(b"*") < want:
                chunk = await r.read(4096)
                if not chunk:
                    return
                read += chunk
            w.write(reply)
            await w.drain()
        await r.read(1024)
        w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    conn = RespConnection("127.0.0.1", server.sockets[0].getsockname()[1], timeout_s=timeout_s)
    try:
        await conn.connect()
        yield conn
    finally:
        await conn.close()
        server.close()
        await server.wait_closed()


def test_sends_are_pipelined_and_answered_in_order_from_the_protocol() -> None:
    """Two sends before any reply: each callback gets its own replies, in order, and is called
    from the protocol (no task awaits them)."""

    async def body() -> None:
        async with _scripted([(1, b"+PONG\r\n"), (3, b":1\r\n$1\r\nx\r\n-ERR no\r\n")]) as conn:
            assert conn.ready
            got: list[Any] = []
            conn.send([("PING",)], got.append)
            conn.send([("INCR", "k"), ("GET", "x"), ("BAD",)], got.append)
            deadline = time.monotonic() + 5
            while len(got) < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.001)
            assert got[0] == [b"PONG"]
            assert got[1][:2] == [1, b"x"] and str(got[1][2]) == "ERR no"

    asyncio.run(body())


def test_a_cancelled_caller_does_not_shift_the_replies_of_the_next() -> None:
    """The first caller gives up before its reply; the reply is read and discarded, and the next
    caller gets its own (a connection matching replies by order must never hand one to another)."""

    async def body() -> None:
        async with _scripted([(1, b""), (1, b"$5\r\nfirst\r\n$6\r\nsecond\r\n")]) as conn:
            first = asyncio.ensure_future(conn.execute("GET", "a"))
            await asyncio.sleep(0.05)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert await asyncio.wait_for(conn.execute("GET", "b"), 5) == b"second"

    asyncio.run(body())


def test_a_timeout_or_unsolicited_bytes_fail_every_waiting_request_then_it_reconnects() -> None:
    async def body() -> None:
        # No reply at all: both pipelined requests fail with a timeout (a RedisError), in order.
        async with _scripted([(2, b"")], timeout_s=0.2) as conn:
            got: list[Any] = []
            conn.send([("A",)], got.append)
            conn.send([("B",)], got.append)
            await asyncio.sleep(0.5)
            assert [type(g) for g in got] == [RedisTimeoutError, RedisTimeoutError]
            assert not conn.ready
        # A reply nobody asked for: the connection cannot be trusted any more.
        async with _scripted([(1, b"+OK\r\n+EXTRA\r\n")]) as conn:
            got = []
            conn.send([("A",)], got.append)
            await asyncio.sleep(0.2)
            assert got == [[b"OK"]] and not conn.ready

    asyncio.run(body())


def test_a_callback_that_raises_does_not_break_the_connection() -> None:
    async def body() -> None:
        async with _scripted([(2, b"+one\r\n+two\r\n")]) as conn:
            got: list[Any] = []

            def broken(_: Any) -> None:
                raise RuntimeError("a caller's bug")

            conn.send([("A",)], broken)
            conn.send([("B",)], got.append)
            await asyncio.sleep(0.2)
            assert got == [[b"two"]] and conn.ready

    asyncio.run(body())


def test_a_connection_opened_on_another_event_loop_is_not_ready() -> None:
    """A store reused across event loops (tests, a restarted loop): the old loop's transport is
    dead, so `send` must not be offered it; the next call connects afresh on the new loop."""
    conn = RespConnection("127.0.0.1", 1, timeout_s=5)

    async def first() -> tuple[asyncio.Server, int]:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(4096):
                w.write(b"+PONG\r\n" * data.count(b"*"))
                await w.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return server, server.sockets[0].getsockname()[1]

    async def use_and_check(expect_ready_before: bool) -> None:
        server, port = await first()
        conn.port = port
        try:
            assert conn.ready is expect_ready_before
            assert await conn.execute("PING") == b"PONG"
            assert conn.ready
        finally:
            server.close()

    asyncio.run(use_and_check(False))
    asyncio.run(use_and_check(False))  # open on the first loop, yet not ready on this one
