"""Limits on what a caller may make the server parse: ApplyPolicy's YAML.

Why: a policy arrives as text from the network, and YAML can make a small text expensive. Deep
nesting makes PyYAML's recursive composer raise RecursionError; aliases (a "billion laughs"
document) expand a few kilobytes into millions of nodes for whoever walks the result; and a large
document takes seconds of pure-Python parsing. So ApplyPolicy (admin_service.py) parses in a
worker thread, never on the event loop that serves renewals, and only a document within these
limits, checked first on libyaml's event stream (no tree is built, nothing recurses):

* the limits of every policy text (scheduler/policy/yaml_limits.py, which a policy file is held
  to as well, so `policy validate` says what ApplyPolicy says): `MAX_POLICY_BYTES` (256 KiB, checked
  first; also refused at decode time, scheduler/api/guard.py), `MAX_POLICY_DEPTH`, `MAX_POLICY_NODES`.

Each refusal is INVALID_ARGUMENT on `yaml` naming the limit (errors.py).
"""

from __future__ import annotations

from scheduler.policy.errors import Problem
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import parse_policy
from scheduler.policy.yaml_limits import (  # noqa: F401 (re-exported)
    MAX_POLICY_BYTES,
    MAX_POLICY_DEPTH,
    MAX_POLICY_NODES,
    yaml_limit_problem,
)
from scheduler.server import errors


def parse_policy_limited(text: str) -> tuple[Policy, list[Problem]]:
    """`parse_policy` within the limits above (raises RpcFailure, or PolicyError from the parser).
    Blocking: call it in a thread."""
    problem = yaml_limit_problem(text)
    if problem is not None:
        raise errors.policy_limit(problem)
    try:
        return parse_policy(text)
    except RecursionError:  # a limit the scan did not foresee (e.g. a recursive alias)
        raise errors.policy_limit(
            f"nests too deep to parse: the policy depth limit is {MAX_POLICY_DEPTH}"
        ) from None
