"""Per-worker grant keys (format g2, scheduler/grants.py): each property the Ed25519 grants had,
shown on the pure functions the scheduler and the worker share, and the worker's one heartbeat for
a key id it does not know yet.

The worker accepts only what the scheduler granted for that worker, slot, epoch and expiry; a
worker cannot make a grant another worker accepts; keys rotate; two replicas loading the same key
file accept each other's grants (a failover). The same over real gRPC, Redis and a failover:
tests/test_grant_failover.py.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.grants import (
    GRANT_GRACE_S,
    GrantClaim,
    GrantKeyring,
    GrantRefused,
    GrantVerifier,
    make_grant,
    worker_key,
)
from slots.worker import service as service_module
from slots.worker.host import ActorHost
from slots.worker.leases import LeaseView
from slots.worker.service import WorkerService
from snapshots.local import LocalSnapshotStore

NOW = 1_700_000_000.0
W0 = GrantClaim("acme", "s1", "w0/0#3", 3, "w0", 0)
W1 = GrantClaim("globex", "s9", "w1/0#7", 7, "w1", 0)
PD, FP = "permission_denied", "failed_precondition"


def _refused(v: GrantVerifier, token: str, claim: GrantClaim, now: float = NOW) -> GrantRefused:
    with pytest.raises(GrantRefused) as e:
        v.verify(token, claim, now)
    return e.value


def _key_file(path: Path, *kids: str) -> str:
    path.write_text("".join(f"{k}:{base64.b64encode(os.urandom(32)).decode()}\n" for k in kids))
    return str(path)


def test_each_worker_is_handed_its_own_key_derived_from_the_secret() -> None:
    seed = os.urandom(32)
    ring = GrantKeyring([("k1", seed)])
    ((kid, k0),) = ring.worker_keys("w0")
    assert (kid, k0) == ("k1", worker_key(seed, "w0")) and len(k0) == 32
    assert dict(ring.worker_keys("w1"))["k1"] != k0  # another worker, another key
    assert k0 not in (seed, worker_key(seed, "w0 "), worker_key(os.urandom(32), "w0"))


def test_a_worker_can_make_grants_only_for_itself() -> None:
    """Worker w0 holds K_w0: what it makes with it fools only itself (it is the one enforcing);
    w1 refuses every such grant, whatever w0 puts in it, its own claims included."""
    ring = GrantKeyring.generate("k1")
    k0 = dict(ring.worker_keys("w0"))["k1"]
    v0, v1 = ring.verifier("w0"), ring.verifier("w1")
    v0.verify(make_grant("k1", k0, W0, NOW), W0, NOW)  # w0 fooling itself
    forged = make_grant("k1", k0, W1, NOW)  # w0's attempt at a grant for w1's actor
    e = _refused(v1, forged, W1)
    assert (e.code, "not valid" in e.message) == (PD, True)
    # w1's own, real grant is refused by w0 (a grant names one worker), and the other way round.
    assert _refused(v0, ring.sign(W1, NOW), replace(W1, worker_id="w0")).code == PD
    assert _refused(v1, ring.sign(W0, NOW), replace(W0, worker_id="w1")).code == PD


@pytest.mark.parametrize(
    ("name", "mutate"),
    [
        ("another key", lambda t: GrantKeyring.generate("k1").sign(W0, NOW)),
        ("a flipped MAC bit", lambda t: t[:-2] + ("A" if t[-2] != "A" else "B") + t[-1]),
        ("a later expiry", lambda t: t.replace(f".{int(NOW + GRANT_GRACE_S)}.", f".{int(NOW) + 9999}.")),
        ("a short MAC", lambda t: t[:-6]),
        ("an empty MAC", lambda t: t.rsplit(".", 1)[0] + "."),
    ],
)
def test_forged_or_altered_grants_are_refused(name: str, mutate: object) -> None:
    ring = GrantKeyring.generate("k1")
    token = ring.sign(W0, NOW)
    bad = mutate(token)  # type: ignore[operator]
    assert bad != token, name
    e = _refused(ring.verifier("w0"), bad, W0)
    assert e.code == PD and ("not valid" in e.message or "malformed" in e.message), (name, e.message)


def test_a_grant_of_another_epoch_or_slot_is_refused() -> None:
    ring = GrantKeyring.generate("k1")
    v, token = ring.verifier("w0"), ring.sign(W0, NOW)
    assert _refused(v, token, replace(W0, epoch=4, lease_id="w0/0#4")).code == PD  # superseded epoch
    assert _refused(v, token, replace(W0, epoch=2)).code == PD
    e = _refused(v, token, replace(W0, slot=1))
    assert e.code == PD and "for slot 0, not slot 1" in e.message


def test_an_expired_grant_is_failed_precondition_and_the_expiry_is_bound() -> None:
    ring = GrantKeyring.generate("k1")
    v, token = ring.verifier("w0"), ring.sign(W0, NOW)
    v.verify(token, W0, NOW + GRANT_GRACE_S)
    e = _refused(v, token, W0, NOW + GRANT_GRACE_S + 2)
    assert e.code == FP and "expired" in e.message


def test_rotation_a_new_key_is_handed_out_before_it_signs_and_the_old_one_until_removed() -> None:
    seeds = {"old": os.urandom(32), "new": os.urandom(32)}
    steps = [["old"], ["old", "new"], ["new", "old"], ["new"]]  # the operator's four key files
    rings = [GrantKeyring([(k, seeds[k]) for k in kids]) for kids in steps]
    handed = [[kid for kid, _ in r.worker_keys("w0")] for r in rings]
    assert handed == steps  # the first is the one grants are made with
    first = rings[0].sign(W0, NOW)
    after = rings[2].sign(W0, NOW)
    assert first.split(".")[1] == "old" and after.split(".")[1] == "new"
    # Each step's worker (keys from that step's heartbeat) accepts the previous step's grants.
    base = GrantVerifier()
    for ring in rings[:3]:
        base.with_keys("w0", ring.worker_keys("w0")).verify(first, W0, NOW)
    for ring in rings[2:]:
        base.with_keys("w0", ring.worker_keys("w0")).verify(after, W0, NOW)
    # Removed: refused, saying the key is unknown (the worker heartbeats once before refusing).
    e = _refused(base.with_keys("w0", rings[3].worker_keys("w0")), first, W0)
    assert e.code == PD and e.unknown_key and "'old'" in e.message
    # A known key id with a wrong MAC is no reason to ask the scheduler again.
    tampered = after[:-2] + ("AA" if after[-2:] != "AA" else "BB")
    assert not _refused(base.with_keys("w0", rings[3].worker_keys("w0")), tampered, W0).unknown_key


def test_replicas_loading_the_same_key_file_accept_each_others_grants(tmp_path: Path) -> None:
    """A failover: the new leader derives the same K_w, so every grant (and lease id) the old one
    issued stays valid, and workers keep the keys they have."""
    path = _key_file(tmp_path / "keys", "k2", "k1")
    a, b = GrantKeyring.load(path), GrantKeyring.load(path)
    assert a.worker_keys("w0") == b.worker_keys("w0")
    b.verifier("w0").verify(a.sign(W0, NOW), W0, NOW)
    a.verifier("w0").verify(b.sign(W0, NOW), W0, NOW)
    assert b.core_of(a.wire_lease_id(W0.lease_id)) == W0.lease_id
    other = GrantKeyring.load(_key_file(tmp_path / "other", "k2", "k1"))  # a misconfigured replica
    assert _refused(other.verifier("w0"), a.sign(W0, NOW), W0).code == PD
    assert other.core_of(a.wire_lease_id(W0.lease_id)) is None


def test_g1_grants_of_an_older_scheduler_need_the_public_keys() -> None:
    """Workers upgraded before their scheduler: given `--grant-public-keys`, they accept its
    Ed25519 grants (bound as tightly); without, they accept g2 only."""
    ring = GrantKeyring.generate("k1")
    old = ring.sign_v1(W0, NOW)
    with_public = GrantVerifier.parse(ring.public_text()).with_keys("w0", ring.worker_keys("w0"))
    with_public.verify(old, W0, NOW)
    with_public.verify(ring.sign(W0, NOW), W0, NOW)
    assert _refused(with_public, old, replace(W0, epoch=4)).code == PD
    e = _refused(GrantVerifier().with_keys("w0", ring.worker_keys("w0")), old, W0)
    assert e.code == PD and "--grant-public-keys" in e.message


def test_grants_are_short_and_a_verifier_never_shows_its_keys() -> None:
    ring = GrantKeyring.generate("k1")
    long_ids = GrantClaim("acme", "s" * 256, "w" * 253 + "/255#9007199254740991", 2**53 - 1, "w" * 253, 255)
    assert len(ring.sign(long_ids, NOW)) <= 64  # the ids are bound, not carried
    v = ring.verifier("w0")
    key = dict(ring.worker_keys("w0"))["k1"]
    assert key.hex() not in repr(v) and repr(key) not in repr(v) and "k1" in repr(v)


def test_a_grant_under_a_new_key_id_makes_the_worker_heartbeat_once_at_most_once_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler rotated to k2 since the worker's last heartbeat: the first k2 grant makes one
    heartbeat, whose answer brings k2. Made-up key ids cost at most one heartbeat a second."""
    k1 = os.urandom(32)
    old, new = GrantKeyring([("k1", k1)]), GrantKeyring([("k2", os.urandom(32)), ("k1", k1)])
    monkeypatch.setattr(service_module, "KEY_REFRESH_MIN_S", 0.05)  # a second, shortened
    service = WorkerService(ActorHost("w0", 1, LocalSnapshotStore(tmp_path)), grants=GrantVerifier())

    class Agent:  # the scheduler's answer to an immediate heartbeat: the rotated keys
        refreshes = 0
        view = LeaseView()

        async def refresh(self, after: float) -> LeaseView | None:
            Agent.refreshes += 1
            service.install_grant_keys(new.worker_keys("w0"))
            return self.view

    service.install_grant_keys(old.worker_keys("w0"))
    service.refresher = Agent()

    async def go() -> None:
        await service._verify_grant(old.sign(W0, time.time()), W0)  # a known key id: no heartbeat
        assert Agent.refreshes == 0
        await service._verify_grant(new.sign(W0, time.time()), W0)
        assert Agent.refreshes == 1 and service.grants is not None and service.grants.kids == ("k2", "k1")
        made_up = GrantKeyring.generate("k9").sign(W0, time.time())
        for expected in (1, 1, 2, 2):  # none within the interval of the last, then one
            if expected == 2 and Agent.refreshes == 1:
                await asyncio.sleep(0.06)
            with pytest.raises(GrantRefused, match="'k9'"):
                await service._verify_grant(made_up, W0)
            assert Agent.refreshes == expected
        await service.host.aclose()

    asyncio.run(go())
