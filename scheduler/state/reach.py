"""Whether a replica reaches its state store: said once when that changes, and every few seconds
while it does not (with the attempts and the last error), so a replica that cannot reach Redis is
never mistaken for a healthy standby. `down()` is what the NOT_LEADER refusal, health (through
`on_change`) and `slotsched serve`'s start-up line say meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("slotsched.state")

#: While the store does not answer, one log line per this many seconds (a standby retries every
#: few hundred milliseconds: a line per try would bury everything else).
REPORT_EVERY_S = 5.0


class StoreReach:
    def __init__(
        self,
        where: str,
        on_change: Callable[[str | None], Awaitable[None]] | None = None,
        *,
        report_every_s: float = REPORT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`where`: the store's address, its password masked; `on_change` is told `down()` each
        time the store stops or starts answering (and the first time it answers)."""
        self.where = where
        self.ok: bool | None = None  # None: not tried yet
        self.error = ""
        self.attempts = 0  # failed calls since it last answered
        self._on_change = on_change
        self._every = report_every_s
        self._clock = clock
        self._since = self._said = 0.0

    def down(self) -> str | None:
        """`state store unreachable at ADDRESS: ERROR` while it does not answer, else None."""
        return None if self.ok is not False else f"state store unreachable at {self.where}: {self.error}"

    async def failed(self, e: BaseException) -> None:
        """A call to the store failed (it is retried by the caller)."""
        now = self._clock()
        self.attempts += 1
        self.error = (str(e) or type(e).__name__).rstrip(".")  # it goes on with "; ..."
        if self.ok is not False:
            self.ok, self._since, self._said = False, now, now
            log.warning("%s; retrying (this replica cannot lead until it answers)", self.down())
            await self._tell()
        elif now - self._said >= self._every:
            self._said = now
            log.warning(
                "state store still unreachable at %s: %d failed attempts in %.0f s, the last: %s",
                self.where,
                self.attempts,
                now - self._since,
                self.error,
            )

    async def answered(self) -> None:
        """A call to the store succeeded. Callers check `ok is not True` first (the hot path)."""
        if self.ok is True:
            return
        if self.ok is False:
            log.info(
                "state store at %s answers again, after %d failed attempts in %.1f s",
                self.where,
                self.attempts,
                self._clock() - self._since,
            )
        self.ok, self.attempts = True, 0
        await self._tell()

    async def _tell(self) -> None:
        if self._on_change is not None:
            await self._on_change(self.down())
