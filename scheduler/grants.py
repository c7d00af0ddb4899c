"""Grants and tagged lease ids: the capability a lease holder shows a worker.

Why: a runtime token only says "may talk to this worker"; it does not say which actor. The
scheduler therefore vouches for every grant it hands out (in each Granted and Renew reply), and
the reference worker accepts Start, Checkpoint and Stop only with a valid grant for exactly that
actor: tenant, session, lease, epoch, worker, slot, until an expiry.

Why a MAC under a per-worker key (format g2), not a signature: only the worker a grant names ever
checks it, so it needs no proof a third party can check. From each scheduler secret `k` of the
keyring the scheduler derives one key per worker,

    K_w = HMAC-SHA256(secret_k, "slotsched-grant-v2" 0x00 worker_id)

and hands K_w (every key id's) to worker `w` only, in the answers to its own authenticated
Register and Heartbeat (scheduler/server/workers_service.py: a worker credential acts only for
the ids in its scope, checked first). A grant is HMAC-SHA256 under K_w, truncated to 16 bytes:
a few microseconds to make and to check, where Ed25519 took ~90 µs to sign and ~200 to verify
(`python bench/security.py`). What it keeps:

* a worker can make grants only for itself (it holds only K_w): the party that enforces them;
* no worker can make a grant another accepts: K_v needs the secret, and the Workers service
  hands K_v only to a credential whose scope holds v (or to an admin, who may act as any worker,
  and to anyone in insecure dev mode: docs/security.md says what an admin token is worth);
* a runtime holding a grant can change none of its fields (the MAC binds them) and learns no key;
* replicas load the same secrets, so they derive the same K_w: a failover keeps every grant;
* rotation as before (below), with nothing to do on the workers: each Heartbeat answer carries
  the keys of every listed key id.

    g2.<kid>.<slot>.<expires unix s>.<22 base64url chars: the MAC>

MAC message = "slotsched-grant-v2\\n" kid, epoch, slot, expires, then tenant, session_id, lease_id
and worker_id each as "<length>:<text>" (one line each): unambiguous whatever the ids hold.
`lease_id` is the core's id (`worker/slot#epoch`), not the wire form.

g1 is the Ed25519 grant of earlier schedulers (`g1.<kid>.<slot>.<expires>.<signature>` over JSON
["slotsched.grant.v1", kid, tenant, session_id, lease_id, epoch, worker_id, slot, expires]): a
worker given the public keys (`--grant-public-keys`) still accepts it, so workers can be upgraded
before their scheduler. The server no longer makes any (`GrantKeyring.sign_v1`: bench and tests).

Lease ids on the wire carry a keyed tag, `<core id>.<16 base64url chars>` (HMAC-SHA256 under a
key derived from the secret), so they cannot be guessed; the server accepts only a tag that
verifies under one of its keys. The core keeps the plain id, so journal replay is unaffected.

Keys: a file (or `$SLOTSCHED_GRANT_KEYS`) of `kid:base64` lines, 32 random bytes each (the same
files as before: a secret is also the g1 Ed25519 seed). The first line signs; every line
verifies. The file is read at start, so each step below is a restart of every replica (one at a
time: a standby takes over). Rotation without downtime: add the new key as the second line on
every replica (workers get its K_w at their next heartbeat), make it the first line (a worker shown a grant
under a key id it does not know yet heartbeats at once), wait one grant lifetime (lease TTL +
GRANT_GRACE_S: renewals re-sign), then remove the old one.

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
TOKEN_VERSION = "g2"
V1 = "g1"
_DOMAIN = "slotsched-grant-v2"
_KEY_CONTEXT = b"slotsched-grant-v2\x00"  # + worker id: K_w
_DOMAIN_V1 = "slotsched.grant.v1"
_TAG_CONTEXT = b"slotsched lease-id tag v1"
_MAC_BYTES = 16  # 128 bits: forging stays a 2^-128 guess per try
_TAG_CHARS = 16  # 12 bytes of HMAC, base64url
_KID_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_TAG_RE = re.compile(rf"^[A-Za-z0-9_-]{{{_TAG_CHARS}}}$")
_MAX_TOKEN = 200
_CACHE = 65_536  # entries a keyring remembers per cache (wire ids, worker keys); cleared when full


class GrantKeyError(ValueError):
    """A key file or key line is malformed (the message names where)."""


class GrantRefused(Exception):
    """A grant does not authorize the call; `code` is `permission_denied` (forged, malformed, for
    another actor or worker, unknown key) or `failed_precondition` (expired). `unknown_key`: the
    key id is not (yet) known to this worker; a heartbeat may bring it."""

    def __init__(self, code: str, message: str, *, unknown_key: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.unknown_key = unknown_key


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
    signature: bytes  # the MAC (g2) or the Ed25519 signature (g1)
    version: str = TOKEN_VERSION


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _message(kid: str, claim: GrantClaim, slot: int, expires: int) -> bytes:
    t, s, le, w = claim.tenant, claim.session_id, claim.lease_id, claim.worker_id
    return (
        f"{_DOMAIN}\n{kid}\n{claim.epoch}\n{slot}\n{expires}\n"
        f"{len(t)}:{t}\n{len(s)}:{s}\n{len(le)}:{le}\n{len(w)}:{w}"
    ).encode()


def _mac(key: bytes, kid: str, claim: GrantClaim, slot: int, expires: int) -> bytes:
    return hmac.digest(key, _message(kid, claim, slot, expires), "sha256")[:_MAC_BYTES]


def _message_v1(kid: str, claim: GrantClaim, slot: int, expires: int) -> bytes:
    doc = [
        _DOMAIN_V1,
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


def worker_key(secret: bytes, worker_id: str) -> bytes:
    """K_w: the key of `worker_id`'s grants under one scheduler secret (32 bytes)."""
    return hmac.digest(secret, _KEY_CONTEXT + worker_id.encode(), "sha256")


def make_grant(kid: str, key: bytes, claim: GrantClaim, lease_expires_at: float) -> str:
    """The g2 token for `claim` under `key` (= K_w of `claim.worker_id`), valid until the lease's
    expiry plus GRANT_GRACE_S. Whoever holds K_w can make these: the scheduler, and worker w
    itself (which only fools itself)."""
    expires = math.ceil(lease_expires_at + GRANT_GRACE_S)
    return (
        f"{TOKEN_VERSION}.{kid}.{claim.slot}.{expires}.{_b64url(_mac(key, kid, claim, claim.slot, expires))}"
    )


def parse_token(token: str) -> ParsedGrant:
    """Split a grant token; GrantRefused(permission_denied) naming what is malformed."""
    if not token:
        raise GrantRefused(
            "permission_denied", "grant: required (the lease's grant, as the scheduler sent it)"
        )
    if len(token) > _MAX_TOKEN:
        raise GrantRefused("permission_denied", f"grant: malformed (longer than {_MAX_TOKEN} bytes)")
    parts = token.split(".")
    if len(parts) != 5 or parts[0] not in (TOKEN_VERSION, V1):
        raise GrantRefused(
            "permission_denied", f"grant: malformed (expected {TOKEN_VERSION}.KID.SLOT.EXPIRES.MAC)"
        )
    version, kid, slot, expires, sig = parts
    if not _KID_RE.match(kid) or not slot.isdigit() or not expires.isdigit():
        raise GrantRefused("permission_denied", "grant: malformed (key id, slot or expiry)")
    try:
        signature = _unb64url(sig)
    except (binascii.Error, ValueError):
        raise GrantRefused("permission_denied", "grant: malformed (MAC is not base64url)") from None
    return ParsedGrant(kid, int(slot), int(expires), signature, version)


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
            raise GrantKeyError(f"{source}: entry {n} ({kid}): a grant key is 32 bytes, got {len(raw_key)}")
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


# ------------------------------------------------------------------ the worker's side


class GrantVerifier:
    """The worker's side: its own keys (K_w by key id, as the scheduler handed them) and, for g1
    grants of a scheduler not upgraded yet, the scheduler's Ed25519 public keys. Immutable: the
    agent installs each answer's keys as a new verifier (`with_keys`)."""

    def __init__(
        self,
        public: Mapping[str, Ed25519PublicKey] | None = None,
        *,
        worker_id: str = "",
        keys: Mapping[str, bytes] | None = None,
    ) -> None:
        self.public = dict(public or {})
        self.worker_id = worker_id
        self._keys = dict(keys or {})

    def __repr__(self) -> str:  # never the keys
        return f"GrantVerifier(worker_id={self.worker_id!r}, kids={self.kids}, v1={tuple(self.public)})"

    @classmethod
    def parse(cls, text: str, source: str = "grant public keys") -> GrantVerifier:
        return cls({kid: Ed25519PublicKey.from_public_bytes(raw) for kid, raw in _parse_lines(text, source)})

    @classmethod
    def load(cls, path: str) -> GrantVerifier:
        return cls.parse(_read(path), path)

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def with_keys(self, worker_id: str, keys: Iterable[tuple[str, bytes]]) -> GrantVerifier:
        """This verifier with `worker_id`'s keys replaced by `keys` (the g1 public keys kept)."""
        return GrantVerifier(self.public, worker_id=worker_id, keys=dict(keys))

    def same_keys(self, worker_id: str, keys: Iterable[tuple[str, bytes]]) -> bool:
        """Whether `with_keys(worker_id, keys)` would change nothing (the order included)."""
        return worker_id == self.worker_id and tuple(keys) == tuple(self._keys.items())

    def verify(self, token: str, claim: GrantClaim, now: float) -> ParsedGrant:
        """Accept `token` for exactly `claim` at unix time `now`, or raise GrantRefused."""
        g = parse_token(token)
        if g.slot != claim.slot:
            raise GrantRefused("permission_denied", f"grant: for slot {g.slot}, not slot {claim.slot}")
        if g.version == TOKEN_VERSION:
            key = self._keys.get(g.kid)
            if key is None:
                raise GrantRefused(
                    "permission_denied",
                    f"grant: made with key {g.kid!r}, which the scheduler has not given this worker",
                    unknown_key=True,
                )
            ok = hmac.compare_digest(_mac(key, g.kid, claim, g.slot, g.expires), g.signature)
        else:
            public = self.public.get(g.kid)
            if public is None:
                raise GrantRefused(
                    "permission_denied",
                    f"grant: a g1 grant signed with key {g.kid!r}, which this worker does not trust "
                    "(g1 needs the scheduler's public keys, --grant-public-keys)",
                )
            try:
                public.verify(g.signature, _message_v1(g.kid, claim, g.slot, g.expires))
                ok = True
            except InvalidSignature:
                ok = False
        if not ok:
            raise GrantRefused(
                "permission_denied",
                "grant: not valid for this actor (for another tenant, session, lease, epoch or worker; "
                "or forged)",
            )
        if g.expires < now:
            raise GrantRefused(
                "failed_precondition",
                f"grant: expired {now - g.expires:.0f}s ago (the lease's Renew returns a fresh one)",
            )
        return g


# ------------------------------------------------------------------ the scheduler's side


@dataclass(frozen=True)
class _Secret:
    kid: str
    seed: bytes
    tag_key: bytes


class GrantKeyring:
    """The scheduler's side: secrets; the first signs, all verify (tags included)."""

    def __init__(self, keys: Iterable[tuple[str, bytes]], *, ephemeral: bool = False) -> None:
        self._keys = tuple(
            _Secret(kid, seed, hmac.digest(seed, _TAG_CONTEXT, "sha256")) for kid, seed in keys
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
        # K_w of every key id, by worker: derived once per worker, not per grant.
        self._per_worker: dict[str, tuple[tuple[str, bytes], ...]] = {}
        self._v1: Ed25519PrivateKey | None = None

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

    def worker_keys(self, worker_id: str) -> tuple[tuple[str, bytes], ...]:
        """(kid, K_w) of every key, the signing one first: what worker `worker_id` verifies with.
        Hand them to that worker only (its own authenticated Register and Heartbeat)."""
        keys = self._per_worker.get(worker_id)
        if keys is None:
            keys = tuple((k.kid, worker_key(k.seed, worker_id)) for k in self._keys)
            if len(self._per_worker) >= _CACHE:
                self._per_worker.clear()
            self._per_worker[worker_id] = keys
        return keys

    def verifier(self, worker_id: str | None = None) -> GrantVerifier:
        """What a worker verifies with: the g1 public keys, and `worker_id`'s keys if given (a
        running worker gets those from the scheduler instead, see slots/worker/agent.py)."""
        public = {k.kid: Ed25519PrivateKey.from_private_bytes(k.seed).public_key() for k in self._keys}
        if worker_id is None:
            return GrantVerifier(public)
        return GrantVerifier(public, worker_id=worker_id, keys=dict(self.worker_keys(worker_id)))

    def public_text(self) -> str:
        """`kid:base64` lines of the g1 public keys, in order (workers that still accept g1)."""
        lines = []
        for k in self._keys:
            public = Ed25519PrivateKey.from_private_bytes(k.seed).public_key()
            raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
            lines.append(f"{k.kid}:{base64.b64encode(raw).decode()}\n")
        return "".join(lines)

    def sign(self, claim: GrantClaim, lease_expires_at: float) -> str:
        """The grant token for `claim`, valid until the lease's expiry plus GRANT_GRACE_S."""
        kid, key = self.worker_keys(claim.worker_id)[0]
        return make_grant(kid, key, claim, lease_expires_at)

    def sign_v1(self, claim: GrantClaim, lease_expires_at: float) -> str:
        """A g1 (Ed25519) grant, as schedulers before g2 made them: for the bench and tests only
        (an Ed25519 signature costs ~90 µs; the server signs g2)."""
        k = self._keys[0]
        expires = math.ceil(lease_expires_at + GRANT_GRACE_S)
        if self._v1 is None:  # made once: the bench times the signature, as the server paid it
            self._v1 = Ed25519PrivateKey.from_private_bytes(k.seed)
        sig = self._v1.sign(_message_v1(k.kid, claim, claim.slot, expires))
        return f"{V1}.{k.kid}.{claim.slot}.{expires}.{_b64url(sig)}"

    @staticmethod
    def _tag(key: bytes, core_id: str) -> str:
        return _b64url(hmac.digest(key, core_id.encode(), "sha256")[:12])

    def wire_lease_id(self, core_id: str) -> str:
        """The id a tenant sees and quotes: the core id plus its keyed tag."""
        wire = self._wire.get(core_id)
        if wire is None:
            wire = f"{core_id}.{self._tag(self._keys[0].tag_key, core_id)}"
            if len(self._wire) >= _CACHE:
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
    """`python -m scheduler.grants new KID` prints a new key line; `python -m scheduler.grants
    public [FILE]` prints the g1 public lines of a key file (workers that still accept g1)."""
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
    print("usage: python -m scheduler.grants new KID | public [KEY_FILE]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
