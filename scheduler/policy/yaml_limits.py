"""Limits on the YAML a policy may be: its size, nesting depth and alias-expanded node count.

Why: YAML can make a small text expensive. Deep nesting makes PyYAML's recursive composer raise
RecursionError; aliases (a "billion laughs" document) expand a few kilobytes into millions of
nodes for whoever walks the result. So every policy text, a file as much as an ApplyPolicy
request, is held to its size first (before any parsing: an oversize text is refused at once, not
after seconds of parsing), then scanned on the parser's event stream (no tree is built, nothing
recurses):

* at most `MAX_POLICY_BYTES` (256 KiB) of UTF-8,
* nesting at most `MAX_POLICY_DEPTH` (32) collections deep (a policy needs 6),
* at most `MAX_POLICY_NODES` (100,000) nodes with every alias expanded.

The scan is independent of which parser PyYAML was built with: libyaml (PyYAML >= 6.0.2) refuses
deep nesting itself with a ScannerError before any event, at a depth of its own. A document
libyaml refuses is scanned again with PyYAML's pure-Python parser (a state machine: it does not
recurse either) so that a limit of ours is reported as ours, not as malformed YAML.
"""

from __future__ import annotations

from typing import Any

import yaml

#: The policy size limit, of every policy text: a file (`policy validate`, `policy apply`, `serve`)
#: as much as ApplyPolicy's `yaml`. scheduler/api/wire.py's MAX_POLICY_BYTES is this value (the wire
#: contract imports nothing of ours); tests/test_policy_check.py holds the two equal.
MAX_POLICY_BYTES = 256 * 1024
MAX_POLICY_DEPTH = 32
MAX_POLICY_NODES = 100_000

_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _scan(text: str, loader: Any) -> str | None:
    # Per open collection, its node count; per anchor, the nodes an alias to it adds.
    frames: list[int] = [0]
    anchors: dict[str, int] = {}
    anchored: list[str | None] = []
    for ev in yaml.parse(text, Loader=loader):
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
    return None


def size_problem(text: str) -> str | None:
    """`text` past the policy size limit (a sentence naming it), or None. Cheap: no parsing."""
    if len(text) * 4 <= MAX_POLICY_BYTES:  # at most 4 bytes a character: no need to encode
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_POLICY_BYTES:
        return f"longer than {MAX_POLICY_BYTES} bytes (got {size}): the policy size limit"
    return None


def yaml_limit_problem(text: str) -> str | None:
    """Which limit `text` breaks (a sentence naming it), or None: its size first, then its depth
    and nodes. Malformed YAML is not judged here: the parser reports it with its line and column."""
    size = size_problem(text)
    if size is not None:
        return size
    try:
        return _scan(text, _FAST_LOADER)
    except yaml.YAMLError:
        if _FAST_LOADER is yaml.SafeLoader:
            return None
    try:  # libyaml refused it: its own depth cap, or malformed YAML (then None)
        return _scan(text, yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return None
