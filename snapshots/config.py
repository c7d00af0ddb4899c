"""Build a `SnapshotStore` from one URL, so a single flag or config key selects and configures it.

`/var/lib/slotsched/snapshots` or `file:///var/lib/slotsched/snapshots` -> `LocalSnapshotStore`
(the embedded default); `s3://bucket/prefix?endpoint_url=http://minio:9000&region=us-east-1` ->
`S3SnapshotStore`. S3 query options: endpoint_url, region, multipart_threshold, part_size (bytes, or
with a KiB/MiB/GiB suffix), connect_timeout, read_timeout (seconds), max_attempts, addressing_style,
upload_concurrency (parts of one snapshot in flight).
Credentials never go in the URL: they come from the standard boto3 chain. S3 needs the `s3` extra
(boto3), imported only when an s3:// URL is given. Anything unrecognised is
refused with a ValueError naming it, rather than silently falling back to another store.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from snapshots.extras import needs_extra
from snapshots.local import LocalSnapshotStore
from snapshots.store import SnapshotStore

#: The URL forms, for the `--snapshots` help of `slotsched worker` and `slotsched demo`: a new store
#: adds its scheme here, where it is parsed, and nowhere else.
URL_FORMS = "a directory, file:///dir or s3://bucket/prefix?endpoint_url=..."

_SIZE_RE = re.compile(r"^(\d+)\s*(|b|k|kb|kib|m|mb|mib|g|gb|gib)$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _parse_size(name: str, text: str) -> int:
    m = _SIZE_RE.match(text.strip())
    if not m:
        raise ValueError(f"snapshot store option {name}={text!r} is not a size like 8388608 or 8MiB")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()[:1]]


def _parse_text(name: str, text: str) -> str:
    if not text:
        raise ValueError(f"snapshot store option {name} is empty")
    return text


def _parse_number(kind: Callable[[str], float]) -> Callable[[str, str], float]:
    def parse(name: str, text: str) -> float:
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"snapshot store option {name}={text!r} is not a valid number") from None

    return parse


_S3_OPTIONS: dict[str, Callable[[str, str], Any]] = {
    "endpoint_url": _parse_text,
    "region": _parse_text,
    "multipart_threshold": _parse_size,
    "part_size": _parse_size,
    "connect_timeout": _parse_number(float),
    "read_timeout": _parse_number(float),
    "max_attempts": _parse_number(int),
    "addressing_style": _parse_text,
    "upload_concurrency": _parse_number(int),
}


def store_from_url(url: str) -> SnapshotStore:
    """Return the store `url` describes; raise ValueError naming what is wrong with it."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("snapshot store URL is empty: give a directory, file:///dir or s3://bucket/prefix")
    url = url.strip()
    if "://" not in url:
        return LocalSnapshotStore(Path(url).expanduser())
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"snapshot store URL {url!r}: file URLs must be local (file:///path)")
        if parts.query or parts.fragment:
            raise ValueError(f"snapshot store URL {url!r}: file URLs take no options")
        path = unquote(parts.path)
        if not path:
            raise ValueError(f"snapshot store URL {url!r} names no directory")
        return LocalSnapshotStore(path)
    if scheme == "s3":
        bucket = parts.netloc
        if not bucket:
            raise ValueError(f"snapshot store URL {url!r} names no bucket (s3://bucket/prefix)")
        if parts.fragment:
            raise ValueError(f"snapshot store URL {url!r}: unexpected fragment #{parts.fragment}")
        kwargs: dict[str, Any] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
            parse = _S3_OPTIONS.get(key)
            if parse is None:
                known = ", ".join(sorted(_S3_OPTIONS))
                raise ValueError(f"snapshot store URL {url!r}: unknown option {key!r} (known: {known})")
            if key in kwargs:
                raise ValueError(f"snapshot store URL {url!r}: option {key!r} given twice")
            kwargs[key] = parse(key, value)
        with needs_extra("s3", "an s3:// snapshot store"):  # boto3: not in a base install
            from snapshots.s3 import S3SnapshotStore

        return S3SnapshotStore(bucket, prefix=unquote(parts.path), **kwargs)
    raise ValueError(
        f"snapshot store URL {url!r}: unsupported scheme {parts.scheme!r} (use a path, file:// or s3://)"
    )
