"""Limits on what a caller may make the server parse: ApplyPolicy's YAML.

Why: a policy arrives as text from the network, and YAML can make a small text expensive. Deep
nesting makes PyYAML's recursive composer raise RecursionError; aliases (a "billion laughs"
document) expand a few kilobytes into millions of nodes for whoever walks the result; and a large
document takes seconds of pure-Python parsing. So ApplyPolicy (admin_service.py) parses in a
worker thread, never on the event loop that serves renewals, and only a document within these
limits, checked first on libyaml's event stream (no tree is built, nothing recurses):

* at most `MAX_POLICY_BYTES` (256 KiB, scheduler/api/guard.py; also refused at decode time),
* nesting at most `MAX_POLICY_DEPTH` (32) collections deep (a policy needs 6),
* at most `MAX_POLICY_NODES` (100,000) nodes with every alias expanded.

Each refusal is INVALID_ARGUMENT on `yaml` naming the limit (errors.py).
"""

from __future__ import annotations

import yaml

from scheduler.api.guard import MAX_POLICY_BYTES
from scheduler.policy.errors import Problem
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import parse_policy
from scheduler.server import errors

MAX_POLICY_DEPTH = 32
MAX_POLICY_NODES = 100_000

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's event parser when built with it


def yaml_limit_problem(text: str) -> str | None:
    """Which limit `text` breaks (a sentence for the caller), or None. Malformed YAML is not
    judged here: the parser reports it with its line and column."""
    size = len(text.encode())
    if size > MAX_POLICY_BYTES:
        return f"longer than {MAX_POLICY_BYTES} bytes (got {size}): the policy size limit"
    # Per open collection, its node count; per anchor, the nodes an alias to it adds.
    frames: list[int] = [0]
    anchors: dict[str, int] = {}
    anchored: list[str | None] = []
    try:
        for ev in yaml.parse(text, Loader=_Loader):
            if isinstance(ev, yaml.CollectionStartEvent):
                frames.append(1)
                anchored.append(ev.anchor)
                if len(frames) - 1 > MAX_POLICY_DEPTH:
                    return f"nests deeper than {MAX_POLICY_DEPTH} levels: the policy depth limit"
            elif isinstance(ev, yaml.CollectionEndEvent):
                n = frames.pop()
                anchor = anchored.pop()
                if anchor is not None:
                    anchors[anchor] = n
                frames[-1] += n
            elif isinstance(ev, yaml.ScalarEvent):
                frames[-1] += 1
                if ev.anchor is not None:
                    anchors[ev.anchor] = 1
            elif isinstance(ev, yaml.AliasEvent):
                frames[-1] += anchors.get(ev.anchor or "", 1)
            else:
                continue
            if sum(frames) > MAX_POLICY_NODES:
                return (
                    f"expands to more than {MAX_POLICY_NODES} nodes (aliases counted expanded): "
                    "the policy node limit"
                )
    except yaml.YAMLError:
        return None
    return None


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
