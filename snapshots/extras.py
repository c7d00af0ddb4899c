"""Optional backends and the pip extra that installs each: one error type for all of them.

Why here: a base install (`pip install slotsched`) runs the SDK and `slotsched serve` on its
embedded defaults; Redis state, S3 snapshots, the Kubernetes adapters and the simulator's plots
each need an extra (pyproject.toml). Where such a backend is imported, `needs_extra` turns its
absence into `MissingExtra`, a message naming the extra to install. It lives in `snapshots/`, the
package every other imports and that imports none of them, so `scheduler/`, `slots/` and
`snapshots/` raise the one type the command line catches.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

#: Our own packages: an import of one of them failing is a bug, never a missing extra.
_OURS = frozenset({"scheduler", "slots", "snapshots"})


class MissingExtra(ModuleNotFoundError, RuntimeError):
    """An optional backend is not installed; `extra` is the pip extra that installs it.

    An ImportError to code that imports the backend, and a RuntimeError too, so that a command's
    "cannot start" handler (serve_forever's) reports it as it reports any other start-up error,
    after closing what it had opened."""

    def __init__(self, what: str, extra: str, cause: ImportError) -> None:
        super().__init__(
            f"{what} needs the {extra} extra: pip install 'slotsched[{extra}]' (from a clone of the "
            f"repository: pip install -e '.[{extra}]') ({cause})",
            name=cause.name,
        )
        self.extra = extra


@contextmanager
def needs_extra(extra: str, what: str) -> Iterator[None]:
    """Around the import of a backend: its absence (or a broken install) becomes `MissingExtra`
    naming `extra`; `what` says what needs it, as the user asked for it (a flag, a URL scheme)."""
    try:
        yield
    except MissingExtra:
        raise
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] in _OURS:
            raise  # a broken module of ours, not a package to install
        raise MissingExtra(what, extra, e) from e


__all__ = ["MissingExtra", "needs_extra"]
