"""`LocalSnapshotStore`: snapshots in a local directory, the embedded default.

Why it is built this way: a checkpoint is written while a slot is being taken away, so the process may
die (or the disk fill) half way through. Bytes therefore go to a temp file in the destination directory,
are fsynced, and only then renamed into place with `os.replace`, which is atomic on POSIX: a reader sees
the whole snapshot or nothing, never a torn file. The full sha256 lives in a sidecar file
(`<name>.snap.sha256`) written, also atomically, *before* the data file appears, so a visible snapshot
always has its hash; a crash between the two leaves only an orphan sidecar, which nothing lists.

Layout: `<root>/<tenant>/<session>/<created-ms>-<sha256[:12]>.snap`; URIs are `file://<absolute path>`.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from snapshots.errors import ChecksumMismatch, SnapshotNotFound, TenantMismatch
from snapshots.ref import SnapshotRef
from snapshots.store import (
    NAME_RE,
    SNAPSHOT_SUFFIX,
    Chunk,
    created_ms,
    name_created,
    snapshot_name,
    validate_keep,
    validate_name,
    validate_sha256,
)

SIDECAR_SUFFIX = ".sha256"
_READ_CHUNK = 1 << 20


def _fsync_dir(path: Path) -> None:
    """Make a rename/creation in `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class LocalSnapshotStore:
    """A `SnapshotStore` on a local (or mounted) filesystem under `root`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.realpath(os.fspath(root)))
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalSnapshotStore({str(self.root)!r})"

    # --- writing -------------------------------------------------------------------------------

    def put(
        self,
        tenant: str,
        session: str,
        chunks: Iterable[Chunk],
        created: float | None = None,
        *,
        sha256: str | None = None,
    ) -> SnapshotRef:
        validate_name("tenant", tenant)
        validate_name("session", session)
        expected = validate_sha256(sha256)
        ms = created_ms(created)
        directory = self._ensure_dir(tenant, session)
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".part")
        tmp: str | None = tmp_name
        sidecar_written = False
        try:
            digest = hashlib.sha256()
            size = 0
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    digest.update(chunk)
                    size += f.write(chunk)  # bytes written, whatever the chunk's type
                f.flush()
                os.fsync(f.fileno())
            sha = digest.hexdigest()
            final = directory / snapshot_name(ms, sha)
            if expected is not None and sha != expected:
                raise ChecksumMismatch(SnapshotRef(final.as_uri(), size, expected, ms / 1000), expected, sha)
            self._write_sidecar(self._sidecar(final), sha)
            sidecar_written = True
            os.replace(tmp_name, final)
            tmp = None
            _fsync_dir(directory)
        except BaseException:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            if sidecar_written and not final.exists():
                with contextlib.suppress(OSError):
                    self._sidecar(final).unlink()
            raise
        return SnapshotRef(uri=final.as_uri(), size_bytes=size, sha256=sha, created=ms / 1000)

    def delete(self, ref: SnapshotRef, tenant: str) -> None:
        path = self._resolve(ref, tenant)
        self._remove(path)

    def retain(self, tenant: str, session: str, keep: int) -> int:
        validate_name("tenant", tenant)
        validate_name("session", session)
        validate_keep(keep)
        names = self._names(self.root / tenant / session)
        doomed = names[: len(names) - keep] if keep else names
        return sum(self._remove(self.root / tenant / session / name) for name in doomed)

    # --- reading -------------------------------------------------------------------------------

    def get(self, ref: SnapshotRef, tenant: str) -> bytes:
        path = self._resolve(ref, tenant)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SnapshotNotFound(ref) from None
        expected = ref.sha256 or self._recorded_sha(path)
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise ChecksumMismatch(ref, expected, actual)
        return data

    def open(self, ref: SnapshotRef, tenant: str) -> Iterator[bytes]:
        path = self._resolve(ref, tenant)
        try:
            f = path.open("rb")
        except FileNotFoundError:
            raise SnapshotNotFound(ref) from None
        try:
            expected = ref.sha256 or self._recorded_sha(path)
        except BaseException:
            f.close()
            raise
        return self._stream(ref, f, expected)

    @staticmethod
    def _stream(ref: SnapshotRef, f: BinaryIO, expected: str) -> Iterator[bytes]:
        digest = hashlib.sha256()
        with f:
            while chunk := f.read(_READ_CHUNK):
                digest.update(chunk)
                yield chunk
        actual = digest.hexdigest()
        if actual != expected:
            raise ChecksumMismatch(ref, expected, actual)

    def list(self, tenant: str, session: str) -> builtins.list[SnapshotRef]:
        validate_name("tenant", tenant)
        validate_name("session", session)
        directory = self.root / tenant / session
        refs: builtins.list[SnapshotRef] = []
        for name in self._names(directory):
            path = directory / name
            try:
                size = path.stat().st_size
                sha = self._sidecar(path).read_text(encoding="ascii").strip()
            except FileNotFoundError:
                continue  # deleted while we looked
            created = name_created(name)
            assert created is not None  # _names only returns snapshot names
            refs.append(SnapshotRef(uri=path.as_uri(), size_bytes=size, sha256=sha, created=created))
        return refs

    # --- helpers -------------------------------------------------------------------------------

    def _ensure_dir(self, tenant: str, session: str) -> Path:
        directory = self.root / tenant / session
        if not directory.is_dir():
            for d in (self.root / tenant, directory):
                if not d.is_dir():
                    d.mkdir(exist_ok=True)
                    _fsync_dir(d.parent)
        return directory

    @staticmethod
    def _sidecar(path: Path) -> Path:
        return path.with_name(path.name + SIDECAR_SUFFIX)

    @staticmethod
    def _write_sidecar(sidecar: Path, sha: str) -> None:
        fd, tmp = tempfile.mkstemp(dir=sidecar.parent, prefix=".tmp-", suffix=".sha256")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(sha + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, sidecar)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _recorded_sha(self, path: Path) -> str:
        try:
            return self._sidecar(path).read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return ""  # nothing recorded: verification fails with ChecksumMismatch, never passes

    def _remove(self, path: Path) -> bool:
        try:
            path.unlink()
            existed = True
        except FileNotFoundError:
            existed = False
        with contextlib.suppress(FileNotFoundError):
            self._sidecar(path).unlink()
        if existed:
            _fsync_dir(path.parent)
        return existed

    @staticmethod
    def _names(directory: Path) -> builtins.list[str]:
        try:
            entries = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(n for n in entries if NAME_RE.match(n))

    def _resolve(self, ref: SnapshotRef, tenant: str) -> Path:
        """Map a ref to its file, refusing anything outside `<root>/<tenant>/`."""
        validate_name("tenant", tenant)
        tenant_dir = self.root / tenant
        parts = urlsplit(ref.uri)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise TenantMismatch(ref, tenant, f"expected a file:// uri under {tenant_dir.as_uri()}/")
        raw = unquote(parts.path)
        if any(seg in (".", "..") for seg in raw.split("/")):
            raise TenantMismatch(ref, tenant, "relative path segments are not allowed")
        path = Path(os.path.realpath(raw))
        try:
            rel = path.relative_to(tenant_dir)
        except ValueError:
            raise TenantMismatch(ref, tenant, f"expected a path under {tenant_dir}/") from None
        if (
            len(rel.parts) != 2
            or rel.parts[0].startswith(".")
            or not rel.parts[1].endswith(SNAPSHOT_SUFFIX)
            or not NAME_RE.match(rel.parts[1])
        ):
            raise SnapshotNotFound(ref)
        return path
