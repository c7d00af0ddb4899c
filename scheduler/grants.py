"""Signed grants and tagged lease ids: the capability a lease holder shows a worker.

Why: a runtime token only says "may talk to this worker"; it does not say which actor. The
scheduler therefore signs every grant it hands out (Ed25519) and the reference worker accepts
Start, Checkpoint and Stop only with a valid grant for exactly that actor. Ed25519 rather than
HMAC so workers hold only public keys: a worker (or whoever steals its files) can verify grants
but never mint one for another worker's actors.

A grant token is detached: it carries the key id, the slot and the expiry, and signs them with
the fields the request itself names, so it stays short (~110 bytes) whatever the session id:

    g1.<kid>.<slot>.<expires unix s>.<base64url Ed25519 signature>

signed message = JSON ["slotsched.grant.v1", kid, tenant, session_id, lease_id, epoch,
worker_id, slot, expires]. `lease_id` is the core's id (`worker/slot#epoch`), not the wire form.

Lease ids on the wire carry a keyed tag, `<core id>.<16 base64url chars>` (HMAC-SHA256 under a
key derived from the signing key), so they cannot be guessed; the server accepts only a tag that
verifies under one of its keys. The core keeps the plain id, so journal replay is unaffected.

Keys: a file (or `$SLOTSCHED_GRANT_KEYS`) of `kid:base64` lines, 32-byte Ed25519 private seeds
on the scheduler, the matching public keys on workers (`python -m scheduler.grants public`).
The first line signs; every line verifies. Rotation without downtime: add the new key as the
second line (scheduler, then workers' public file), make it the first line on the scheduler,
wait one grant lifetime (lease TTL + GRANT_GRACE_S: renewals re-sign), then remove the old one.

Pure: stdlib and `cryptography` only, so the server, the worker and the SDK import it alike.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

GRANT_KEYS_ENV = "SLOTSCHED_GRANT_KEYS"
GRANT_PUBLIC_KEYS_ENV = "SLOTSCHED_GRANT_PUBLIC_KEYS"
#: A grant outlives its lease's expiry by this much: covers clock skew between scheduler and
#: worker and a Checkpoint racing the Renew reply that carries the next grant.
GRANT_GRACE_S = 60.0
TOKEN_VERSION = "g1"
_DOMAIN = "slotsched.grant.v1"
_TAG_CONTEXT = b"slotsched lease-id tag v1"
_TAG_CHARS = 16  # 12 bytes of HMAC, base64url
_KID_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_TAG_RE = re.compile(rf"^[A-Za-z0-9_-]{{{_TAG_CHARS}}}$")
_MAX_TOKEN = 200
_ISSUED_CACHE = 65_536  # wire ids remembered by a keyring (see GrantKeyring.wire_lease_id)


class GrantKeyError(ValueError):
    """A key file or key line is malformed (the message names where)."""


class GrantRefused(Exception):
    """A grant does not authorize the call; `code` is `permission_denied` (forged, malformed, for
    another actor or worker, unknown key) or `failed_precondition` (expired)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class GrantClaim:
    """What a grant binds: exactly one actor's lease on one slot."""

    tenant: str
    session_id: str
    lease_id: str  # the core id (see core_lease_id)
    epoch: int
    worker_id: str
    slot: int


@dataclass(frozen=True)
class ParsedGrant:
    kid: str
    slot: int
    expires: int
    signature: bytes


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _message(kid: str, claim: GrantClaim, slot: int, expires: int) -> bytes:
    doc = [
        _DOMAIN,
        kid,
        claim.tenant,
        claim.session_id,
        claim.lease_id,
        claim.epoch,
        claim.worker_id,
        slot,
        expires,
    ]
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def parse_token(token: str) -> ParsedGrant:
    """Split a grant token; GrantRefused(permission_denied) naming what is malformed."""
    if not token:
        raise GrantRefused(
            "permission_denied", "grant: required (the lease's grant, as the scheduler sent it)"
        )
    if len(token) > _MAX_TOKEN:
        raise GrantRefused("permission_denied", f"grant: malformed (longer than {_MAX_TOKEN} bytes)")
    parts = token.split(".")
    if len(parts) != 5 or parts[0] != TOKEN_VERSION:
        raise GrantRefused(
            "permission_denied", f"grant: malformed (expected {TOKEN_VERSION}.KID.SLOT.EXPIRES.SIG)"
        )
    _, kid, slot, expires, sig = parts
    if not _KID_RE.match(kid) or not slot.isdigit() or not expires.isdigit():
        raise GrantRefused("permission_denied", "grant: malformed (key id, slot or expiry)")
    try:
        signature = _unb64url(sig)
    except (binascii.Error, ValueError):
        raise GrantRefused("permission_denied", "grant: malformed (signature is not base64url)") from None
    return ParsedGrant(kid, int(slot), int(expires), signature)


def core_lease_id(wire_id: str) -> str:
    """The core's lease id inside a wire id: strips a well-formed tag (without verifying it).

    A core id always has a `/` and a `#` after its last dot (`worker/slot#epoch`), so a suffix of
    16 base64url characters after the last dot can only be a tag."""
    head, dot, tail = wire_id.rpartition(".")
    if dot and head and _TAG_RE.match(tail):
        return head
    return wire_id


# ------------------------------------------------------------------ key files


def _parse_lines(text: str, source: str) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    # Lines, with `#` comments dropped first (a comment may hold commas); then commas, so that an
    # environment variable can carry several keys on one line.
    body = "\n".join(raw.partition("#")[0] for raw in text.splitlines())
    for n, raw in enumerate(re.split(r"[\n,]", body), 1):
        line = raw.strip()
        if not line:
            continue
        kid, sep, b64 = line.partition(":")
        kid = kid.strip()
        if not sep or not _KID_RE.match(kid):
            raise GrantKeyError(f"{source}: entry {n}: expected KID:BASE64KEY, KID of 1-32 [A-Za-z0-9_-]")
        if kid in seen:
            raise GrantKeyError(f"{source}: entry {n}: key id {kid!r} listed twice")
        try:
            raw_key = base64.b64decode(
                b64.strip().replace("-", "+").replace("_", "/") + "=" * (-len(b64.strip()) % 4), validate=True
            )
        except (binascii.Error, ValueError):
            raise GrantKeyError(f"{source}: entry {n} ({kid}): the key is not base64") from None
        if len(raw_key) != 32:
            raise GrantKeyError(
                f"{source}: entry {n} ({kid}): an Ed25519 key is 32 bytes, got {len(raw_key)}"
            )
        seen.add(kid)
        out.append((kid, raw_key))
    if not out:
        raise GrantKeyError(f"{source}: no key (expected KID:BASE64KEY lines; the first one signs)")
    return out


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise GrantKeyError(f"grant key file {path}: {e.strerror or e}") from None


@dataclass(frozen=True)
class _SigningKey:
    kid: str
    private: Ed25519PrivateKey
    seed: bytes
    tag_key: bytes


class GrantVerifier:
    """The worker's side: public keys by id. Verifies grants; mints nothing."""

    def __init__(self, keys: Mapping[str, Ed25519PublicKey]) -> None:
        if not keys:
            raise GrantKeyError("a grant verifier needs at least one public key")
        self.keys = dict(keys)

    @classmethod
    def parse(cls, text: str, source: str = "grant public keys") -> GrantVerifier:
        return cls({kid: Ed25519PublicKey.from_public_bytes(raw) for kid, raw in _parse_lines(text, source)})

    @classmethod
    def load(cls, path: str) -> GrantVerifier:
        return cls.parse(_read(path), path)

    def verify(self, token: str, claim: GrantClaim, now: float) -> ParsedGrant:
        """Accept `token` for exactly `claim` at unix time `now`, or raise GrantRefused."""
        g = parse_token(token)
        key = self.keys.get(g.kid)
        if key is None:
            raise GrantRefused(
                "permission_denied", f"grant: signed with key {g.kid!r}, which this worker does not trust"
            )
        if g.slot != claim.slot:
            raise GrantRefused("permission_denied", f"grant: for slot {g.slot}, not slot {claim.slot}")
        try:
            key.verify(g.signature, _message(g.kid, claim, g.slot, g.expires))
        except InvalidSignature:
            raise GrantRefused(
                "permission_denied",
                "grant: not valid for this actor (for another tenant, session, lease, epoch or worker; "
                "or forged)",
            ) from None
        if g.expires < now:
            raise GrantRefused(
                "failed_precondition",
                f"grant: expired {now - g.expires:.0f}s ago (the lease's Renew returns a fresh one)",
            )
        return g


class GrantKeyring:
    """The scheduler's side: private keys; the first signs, all verify (tags included)."""

    def __init__(self, keys: Iterable[tuple[str, bytes]], *, ephemeral: bool = False) -> None:
        self._keys = tuple(
            _SigningKey(
                kid,
                Ed25519PrivateKey.from_private_bytes(seed),
                seed,
                hmac.digest(seed, _TAG_CONTEXT, "sha256"),
            )
            for kid, seed in keys
        )
        if not self._keys:
            raise GrantKeyError("a grant keyring needs at least one key")
        #: Generated at start (no key configured): grants die with this process.
        self.ephemeral = ephemeral
        # Wire ids this keyring issued, both ways: a lease's id is tagged for its Granted, its
        # Ended and every replay, and verified on each Renew and Release; an HMAC each time was
        # a measurable share of a grant. Bounded: cleared when full (the HMAC still decides).
        self._wire: dict[str, str] = {}
        self._core: dict[str, str] = {}

    @classmethod
    def parse(cls, text: str, source: str = GRANT_KEYS_ENV) -> GrantKeyring:
        return cls(_parse_lines(text, source))

    @classmethod
    def load(cls, path: str) -> GrantKeyring:
        return cls(_parse_lines(_read(path), path))

    @classmethod
    def generate(cls, kid: str = "dev") -> GrantKeyring:
        """A fresh random key (dev mode: no key configured)."""
        return cls([(kid, os.urandom(32))], ephemeral=True)

    @classmethod
    def from_config(cls, path: str | None, env: Mapping[str, str]) -> GrantKeyring:
        """`--grant-key-file`, else `$SLOTSCHED_GRANT_KEYS`, else a generated (ephemeral) key."""
        if path:
            return cls.load(path)
        text = env.get(GRANT_KEYS_ENV, "").strip()
        if text:
            return cls.parse(text)
        return cls.generate()

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(k.kid for k in self._keys)

    def verifier(self) -> GrantVerifier:
        return GrantVerifier({k.kid: k.private.public_key() for k in self._keys})

    def public_text(self) -> str:
        """`kid:base64` lines of the public keys, in order: the workers' key file."""
        lines = []
        for k in self._keys:
            raw = k.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
            lines.append(f"{k.kid}:{base64.b64encode(raw).decode()}\n")
        return "".join(lines)

    def sign(self, claim: GrantClaim, lease_expires_at: float) -> str:
        """The grant token for `claim`, valid until the lease's expiry plus GRANT_GRACE_S."""
        k = self._keys[0]
        expires = math.ceil(lease_expires_at + GRANT_GRACE_S)
        sig = k.private.sign(_message(k.kid, claim, claim.slot, expires))
        return f"{TOKEN_VERSION}.{k.kid}.{claim.slot}.{expires}.{_b64url(sig)}"

    @staticmethod
    def _tag(key: bytes, core_id: str) -> str:
        return _b64url(hmac.digest(key, core_id.encode(), "sha256")[:12])

    def wire_lease_id(self, core_id: str) -> str:
        """The id a tenant sees and quotes: the core id plus its keyed tag."""
        wire = self._wire.get(core_id)
        if wire is None:
            wire = f"{core_id}.{self._tag(self._keys[0].tag_key, core_id)}"
            if len(self._wire) >= _ISSUED_CACHE:
                self._wire.clear()
                self._core.clear()
            self._wire[core_id] = wire
            self._core[wire] = core_id
        return wire

    def core_of(self, wire_id: str) -> str | None:
        """The core id of a wire id whose tag verifies under one of the keys; None otherwise."""
        known = self._core.get(wire_id)
        if known is not None:
            return known  # issued by this keyring (exact string): its tag verified when made
        head, dot, tail = wire_id.rpartition(".")
        if not (dot and head and _TAG_RE.match(tail)):
            return None
        ok = False
        for k in self._keys:
            ok |= hmac.compare_digest(self._tag(k.tag_key, head), tail)
        return head if ok else None


def _main(argv: list[str]) -> int:
    """`python -m scheduler.grants new KID` prints a new private key line;
    `python -m scheduler.grants public [FILE]` prints the public lines of a private key file."""
    if len(argv) == 2 and argv[0] == "new" and _KID_RE.match(argv[1]):
        print(f"{argv[1]}:{base64.b64encode(os.urandom(32)).decode()}")
        return 0
    if argv and argv[0] == "public" and len(argv) <= 2:
        try:
            ring = (
                GrantKeyring.load(argv[1])
                if len(argv) == 2
                else GrantKeyring.parse(sys.stdin.read(), "stdin")
            )
        except GrantKeyError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        sys.stdout.write(ring.public_text())
        return 0
    print("usage: python -m scheduler.grants new KID | public [PRIVATE_KEY_FILE]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
