"""Who put which policy in force, and whether it outlives a restart.

Every policy put in force live (Admin.ApplyPolicy, or a new version of the SchedulingPolicy
object) is logged once: who applied it, its generation and a one-line summary of what changed
(scheduler/policy/diff.py), so the log alone says why quotas moved. The generation counts the
policies this replica has put in force since it started: 1 is the one it started (or took the
lead) with. It is not journaled, so a restart or a failover counts from 1 again.

With in-memory state a restart silently goes back to the policy file (or the built-in policy):
`started` says so in the log, and Admin.GetPolicy / ApplyPolicy answer with trailing metadata
naming the generation, the state store (`memory` or `redis`) and where the policy at start came
from, which `slotsched policy apply` turns into a note.
"""

from __future__ import annotations

import logging

from scheduler.api import wire
from scheduler.policy.diff import diff_policies, summary
from scheduler.policy.model import Policy

log = logging.getLogger("slotsched.policy")

# The trailing metadata keys are the wire's (scheduler/api/wire.py), read by the CLI too.
GENERATION_KEY = wire.POLICY_GENERATION
STATE_KEY = wire.STATE  # memory | redis
ORIGIN_KEY = wire.POLICY_ORIGIN  # the --policy file, kubernetes://NS/NAME, or BUILT_IN
BUILT_IN = "built-in"
KUBERNETES = "kubernetes://"


class PolicyLog:
    def __init__(self, origin: str | None, durable: bool) -> None:
        """`origin`: the policy file or object the server started from (None: the built-in
        policy); `durable`: whether the state (and so an applied policy) survives a restart."""
        self.origin = origin or BUILT_IN
        self.durable = durable
        self.generation = 1

    def started(self) -> None:
        """At serve start: say what a restart does to a policy applied live."""
        if self.origin.startswith(KUBERNETES):
            log.info(
                "policy from %s: a policy applied with Admin.ApplyPolicy lasts until the object changes "
                "or the server restarts",
                self.origin,
            )
        elif not self.durable:
            back = "the built-in policy" if self.origin == BUILT_IN else f"the policy file {self.origin}"
            log.info(
                "state in memory: a policy applied live (Admin.ApplyPolicy, `slotsched policy apply`) "
                "lasts until a restart, which goes back to %s",
                back,
            )

    def next_generation(self) -> int:
        """Call as the policy goes in force (same loop pass): generations follow apply order."""
        self.generation += 1
        return self.generation

    def applied(self, generation: int, old: Policy, new: Policy, by: str) -> None:
        log.info(
            "policy %s applied by %s: generation %d; %s",
            new.name,
            by,
            generation,
            summary(diff_policies(old, new)),
        )

    def metadata(self, generation: int | None = None) -> tuple[tuple[str, str], ...]:
        """Trailing metadata of GetPolicy and ApplyPolicy (metadata values are printable ASCII)."""
        origin = self.origin.encode("ascii", "backslashreplace").decode("ascii")
        return (
            (GENERATION_KEY, str(self.generation if generation is None else generation)),
            (STATE_KEY, "redis" if self.durable else "memory"),
            (ORIGIN_KEY, "".join(c if " " <= c <= "~" else "?" for c in origin)),
        )
