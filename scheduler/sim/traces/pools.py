"""Spreading imported sessions over pools by a rule (`slotsched trace import --pool-rule`).

A rule is a comma-separated list of entries `POOL[|FALLBACK…][:PERCENT%]`, e.g. `gpu:10%,cpu` or
`gpu|cpu:25%,cpu`. Each session falls in one entry by a stable hash (sha256) of its session id
(or of its tenant, `by="tenant"`: all of a tenant's sessions in one pool) into [0, 100): the
entries with a percent take their shares in order, the entries without one split what is left
evenly. The session then asks for the entry's first pool, with the rest as fallbacks in order.
Deterministic: the same trace and rule give the same pools.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, replace

from scheduler.sim.workload import SessionPlan


class PoolRuleError(ValueError):
    pass


@dataclass(frozen=True)
class PoolRule:
    entries: tuple[tuple[tuple[str, ...], float], ...]  # (pools in order, share in percent)
    by: str = "session"

    @classmethod
    def parse(cls, text: str, by: str = "session") -> PoolRule:
        if by not in ("session", "tenant"):
            raise PoolRuleError(f"--pool-by must be session or tenant, not {by!r}")
        raw: list[tuple[tuple[str, ...], float | None]] = []
        for part in text.split(","):
            names_text, _, pct = part.strip().partition(":")
            names = tuple(n.strip() for n in names_text.split("|"))
            if not all(names):
                raise PoolRuleError(f"pool rule {text!r}: an empty pool name in {part.strip()!r}")
            share: float | None = None
            if pct:
                try:
                    share = float(pct.strip().rstrip("%"))
                except ValueError:
                    raise PoolRuleError(f"pool rule {text!r}: {pct!r} is not a percent") from None
                if not 0 <= share <= 100:
                    raise PoolRuleError(f"pool rule {text!r}: {pct!r} is not within 0-100%")
            raw.append((names, share))
        given = sum(s for _, s in raw if s is not None)
        if given > 100 + 1e-9:
            raise PoolRuleError(f"pool rule {text!r}: the shares add up to {given:g}% > 100%")
        rest = [e for e in raw if e[1] is None]
        if not rest and given < 100 - 1e-9:
            raise PoolRuleError(
                f"pool rule {text!r}: the shares add up to {given:g}%: end with a pool without one"
            )
        each = (100 - given) / len(rest) if rest else 0.0
        return cls(tuple((n, each if s is None else s) for n, s in raw), by)

    def pools_for(self, key: str) -> tuple[str, ...]:
        x = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64 * 100
        acc = 0.0
        for names, share in self.entries:
            acc += share
            if x < acc:
                return names
        return self.entries[-1][0]


def spread(plans: Iterable[SessionPlan], rule: PoolRule) -> list[SessionPlan]:
    out = []
    for p in plans:
        names = rule.pools_for(p.tenant if rule.by == "tenant" else p.session_id)
        out.append(replace(p, pool=names[0], fallback=names[1:]))
    return out
