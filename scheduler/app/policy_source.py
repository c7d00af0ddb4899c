"""Where the policy comes from: a file, `--policy-source`'s SchedulingPolicy object, or (neither)
the built-in policy of INSECURE dev mode; and its warnings at start (`policy validate`'s)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scheduler.policy.access import serving_warnings
from scheduler.policy.defaults import default_policy
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import load_policy

if TYPE_CHECKING:  # kubernetes is imported only when --policy-source asks
    from scheduler.kube.policy_watch import PolicyWatcher

log = logging.getLogger("slotsched.server")


def load(policy_path: str | None, watcher: PolicyWatcher | None = None) -> tuple[Policy, bool]:
    """The policy and whether it is secure (a policy given: callers are authenticated)."""
    if watcher is not None:
        policy_path = str(watcher.ref)
        policy, warnings = watcher.read()
    elif policy_path is None:
        return default_policy(), False  # the INSECURE warning comes once the server has started
    else:
        policy, warnings = load_policy(policy_path)
    for w in [*warnings, *serving_warnings(policy)]:  # policy validate's (yaml_io.check_policy_file)
        log.warning("policy %s: %s", policy_path, w)
    return policy, True


def watcher_of(policy_path: str | None, source: str | None, kube_api: Any) -> PolicyWatcher | None:
    """`--policy-source kubernetes://NAMESPACE/NAME`'s watcher, or None."""
    if source is None:
        return None
    if policy_path is not None:
        raise ValueError("--policy and --policy-source name two policies: give one")
    from scheduler.kube.policy_watch import PolicyWatcher, default_api_client, parse_policy_source

    ref = parse_policy_source(source)
    return PolicyWatcher(ref, kube_api if kube_api is not None else default_api_client())
