"""The provider's own limit, read from its rate-limit response headers, for a permit's settle
(docs/agent-runtimes.md, "Token budgets"; docs/decisions/0016-provider-reported-limits.md).

`stated_limits(response, headers)` finds the headers without importing any provider's library:
`headers` if given (a dict, `httpx.Headers`, any mapping or list of pairs), else the response's
`.headers`, or its `.response.headers` (an SDK's raw response, or an `APIStatusError` of a 429),
or the response itself when it is a mapping of header names. It reads only the limits, per minute:

| dimension | Anthropic | OpenAI |
| --- | --- | --- |
| requests | `anthropic-ratelimit-requests-limit` | `x-ratelimit-limit-requests` |
| input tokens | `anthropic-ratelimit-input-tokens-limit` | |
| output tokens | `anthropic-ratelimit-output-tokens-limit` | |
| tokens (both) | | `x-ratelimit-limit-tokens` |

Anthropic's `anthropic-ratelimit-tokens-limit` (the most restrictive of its token limits) is not
read: it is not one dimension. Nor are `-remaining` and `-reset`: the scheduler counts the fleet's
window itself, and a remaining count is a rounded snapshot of a moment already past.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

# The ProviderLimits field each header fills.
HEADERS: dict[str, str] = {
    "anthropic-ratelimit-requests-limit": "requests_per_minute",
    "anthropic-ratelimit-input-tokens-limit": "input_tokens_per_minute",
    "anthropic-ratelimit-output-tokens-limit": "output_tokens_per_minute",
    "x-ratelimit-limit-requests": "requests_per_minute",
    "x-ratelimit-limit-tokens": "tokens_per_minute",
}


def _pairs(headers: Any) -> Iterable[tuple[Any, Any]]:
    items = getattr(headers, "items", None)
    if callable(items):
        return list(items())
    if isinstance(headers, list | tuple):
        return [(p[0], p[1]) for p in headers if isinstance(p, tuple | list) and len(p) == 2]
    return []


def _headers_of(response: Any) -> Any:
    for obj in (response, getattr(response, "response", None)):
        h = getattr(obj, "headers", None)
        if h is not None:
            return h
    return response if isinstance(response, Mapping) else None


def stated_limits(response: Any = None, headers: Any = None) -> dict[str, float]:
    """The ProviderLimits fields the headers state (empty: none), from `headers` or the
    response's; a value that is not a positive finite number is not a statement."""
    found: dict[str, float] = {}
    for name, value in _pairs(headers if headers is not None else _headers_of(response)):
        key = name.decode() if isinstance(name, bytes) else str(name)
        field = HEADERS.get(key.lower())
        if field is None:
            continue
        try:
            v = float(value.decode() if isinstance(value, bytes) else value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v) and v > 0:
            found[field] = v
    return found


__all__ = ["HEADERS", "stated_limits"]
