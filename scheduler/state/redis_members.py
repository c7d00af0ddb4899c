"""The membership (members.py) in Redis: a sorted set of replica ids scored by when each one's
liveness lapses, in milliseconds of Redis's own clock (`TIME`, read inside the script, so no
replica's clock matters), and a hash of their addresses. Both keys share the prefix's hash tag,
so the script runs within one slot of a Cluster.

Keys under the prefix P (as redis_store.py's, a hash tag `{P}` in a Cluster):
`P:members` (zset: replica id -> lapse ms), `P:member_addr` (hash: replica id -> address) and
`P:owners` (hash: pool -> replica id, and the table's version under the field `\x00version`,
which no pool name can be: a DNS label).
"""

from __future__ import annotations

from typing import Any

from scheduler.state.members import Member
from scheduler.state.redis_connect import connect, parse_target
from scheduler.state.redis_store import key_prefix, seam

__all__ = ["RedisMembers"]

# KEYS: members, addresses. The live members: id, address, id, address... by Redis's clock.
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
_ANSWER_LIVE = """
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
local out = {}
for _, id in ipairs(live) do
  table.insert(out, id)
  table.insert(out, redis.call('HGET', KEYS[2], id) or '')
end
return out
"""
_LIVE = _NOW + _ANSWER_LIVE
# ARGV: replica id, ttl ms, address. Beat, forget members lapsed a minute ago (a replica gone
# for good), answer the live ones.
_BEAT = (
    _NOW
    + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
for _, id in ipairs(gone) do redis.call('HDEL', KEYS[2], id) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
"""
    + _ANSWER_LIVE
)

# KEYS: owners, members. ARGV: expected version, the number of live ids, the live ids the table
# was computed from, then pool, replica pairs. The compare-and-set, of the version and of the live
# set (by Redis's clock, now): a table computed from a membership read before a replica rejoined
# or lapsed is not written (members.py says why).
_SET_OWNERS = (
    _NOW
    + """
local v = tonumber(redis.call('HGET', KEYS[1], '\\0version') or '0')
if v ~= tonumber(ARGV[1]) then return 0 end
local n = tonumber(ARGV[2])
local want = {}
for i = 3, 2 + n do want[ARGV[i]] = true end
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')
if #live ~= n then return 0 end
for _, id in ipairs(live) do
  if not want[id] then return 0 end
end
redis.call('DEL', KEYS[1])
for i = 3 + n, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[1], '\\0version', v + 1)
return 1
"""
)
VERSION = "\x00version"


def _members(reply: list[Any]) -> list[Member]:
    pairs = zip(reply[::2], reply[1::2], strict=True)
    return sorted(Member(_text(rid), _text(addr)) for rid, addr in pairs)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RedisMembers:
    """The replicas' membership under one prefix (the deployment's `--state-prefix`)."""

    def __init__(self, url: str, prefix: str, timeout_s: float = 1.0) -> None:
        target = parse_target(url)
        p = key_prefix(prefix, target.mode)
        self.keys = [f"{p}:members", f"{p}:member_addr"]
        self.k_owners = f"{p}:owners"
        self.redis: Any = connect(target, timeout_s)
        self._beat = self.redis.register_script(_BEAT)
        self._live = self.redis.register_script(_LIVE)
        self._set_owners = self.redis.register_script(_SET_OWNERS)

    async def beat(self, replica_id: str, address: str, ttl_s: float) -> list[Member]:
        ms = max(1, int(ttl_s * 1000))
        with seam():
            return _members(await self._beat(keys=self.keys, args=[replica_id, ms, address]))

    async def live(self) -> list[Member]:
        with seam():
            return _members(await self._live(keys=self.keys, args=[]))

    async def owners(self) -> tuple[int, dict[str, str]]:
        with seam():
            raw = await self.redis.hgetall(self.k_owners)
        table = {_text(k): _text(v) for k, v in raw.items()}
        version = int(table.pop(VERSION, "0"))
        return version, table

    async def set_owners(self, version: int, owners: dict[str, str], live: list[str]) -> bool:
        ids = sorted(set(live))
        args: list[object] = [version, len(ids), *ids]
        for pool, replica in sorted(owners.items()):
            args += [pool, replica]
        with seam():
            return bool(await self._set_owners(keys=[self.k_owners, self.keys[0]], args=args))

    async def leave(self, replica_id: str) -> None:
        with seam():
            await self.redis.zrem(self.keys[0], replica_id)
            await self.redis.hdel(self.keys[1], replica_id)

    async def close(self) -> None:
        with seam():
            await self.redis.aclose()
