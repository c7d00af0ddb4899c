"""Identities from a verified mTLS client certificate, on the Authenticator alone (the TLS layer and
its end-to-end test are another module's): a fake servicer context carries the `auth_context()`
grpc fills in for a peer whose certificate the TLS layer verified."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from scheduler.policy.identities import hash_token
from scheduler.policy.yaml_io import parse_policy
from scheduler.server.auth import Authenticator, certificate_names
from scheduler.server.errors import RpcFailure

Code = grpc.StatusCode

POLICY, _ = parse_policy(
    f"""
apiVersion: slotsched.dev/v1alpha1
kind: SchedulingPolicy
metadata: {{name: certs}}
spec:
  pool: {{slotsPerWorker: 2, workers: 2, minWorkers: 0, maxWorkers: 2, floor: 0}}
  tenants:
    - name: acme
      tokens: ["{hash_token("acme-token")}"]
      identities: ["spiffe://example.org/acme/runtime"]
    - name: globex
      identities: ["runtime.globex.example.org"]
  access:
    admins: [{{identity: "spiffe://example.org/ops"}}]
    workers:
      - identities: ["spiffe://example.org/ns/slotsched/sa/worker"]
        workerIdPrefix: "slotsched-worker-"
        maxSlots: 4
"""
)


class Ctx:
    """The two things Authenticator reads from a grpc.aio.ServicerContext."""

    def __init__(
        self, md: tuple[tuple[str, str], ...] = (), auth: dict[str, list[bytes]] | None = None
    ) -> None:
        self._md = md
        self._auth = auth if auth is not None else {"transport_security_type": [b"insecure"]}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth


def cert(*sans: str, cn: str = "ignored-when-sans") -> dict[str, list[bytes]]:
    """auth_context() of a TLS peer with a verified client certificate."""
    ac: dict[str, list[bytes]] = {
        "transport_security_type": [b"ssl"],
        "x509_common_name": [cn.encode()],
        "security_level": [b"TSI_PRIVACY_AND_INTEGRITY"],
    }
    if sans:
        ac["x509_subject_alternative_name"] = [s.encode() for s in sans]
    return ac


def auth() -> Authenticator:
    return Authenticator(True, lambda: POLICY)


def failure(fn: Any, *args: Any) -> RpcFailure:
    with pytest.raises(RpcFailure) as e:
        fn(*args)
    return e.value


def test_tenant_from_a_certificate_san() -> None:
    a = auth()
    assert a.tenant(Ctx(auth=cert("spiffe://example.org/acme/runtime"))) == "acme"
    assert a.tenant(Ctx(auth=cert("other.example.org", "runtime.globex.example.org"))) == "globex"
    assert a.tenant(Ctx(auth=cert(cn="runtime.globex.example.org"))) == "globex"  # no SAN: the CN


def test_a_bearer_token_wins_over_the_certificate() -> None:
    ctx = Ctx(md=(("authorization", "Bearer acme-token"),), auth=cert("runtime.globex.example.org"))
    assert auth().tenant(ctx) == "acme"


def test_roles_from_certificates() -> None:
    a = auth()
    admin = a.require_admin(Ctx(auth=cert("spiffe://example.org/ops")))
    assert admin.role == "admin"
    w = a.worker(Ctx(auth=cert("spiffe://example.org/ns/slotsched/sa/worker")))
    assert w.role == "worker" and w.key == "spec.access.workers[0]"
    a.require_scope(w, "slotsched-worker-0")
    f = failure(a.require_scope, w, "local-0")
    assert f.code is Code.PERMISSION_DENIED
    assert "'local-0'" in f.message and "spec.access.workers[0].workerIdPrefix" in f.message
    # A tenant's certificate is no role; the message says what the certificate is.
    f = failure(a.require_admin, Ctx(auth=cert("spiffe://example.org/acme/runtime")))
    assert (
        f.code is Code.PERMISSION_DENIED
        and "this client certificate authenticates tenant 'acme'" in f.message
    )
    f = failure(a.tenant, Ctx(auth=cert("spiffe://example.org/ops")))
    assert f.code is Code.PERMISSION_DENIED and "names no tenant" in f.message


@pytest.mark.parametrize(
    ("ctx", "code", "words"),
    [
        pytest.param(Ctx(), Code.UNAUTHENTICATED, "client certificate", id="plaintext-no-token"),
        pytest.param(Ctx(auth={}), Code.UNAUTHENTICATED, "missing credential", id="no-auth-context"),
        # TLS without a client certificate: grpc sets no x509 property.
        pytest.param(
            Ctx(auth={"transport_security_type": [b"ssl"]}),
            Code.UNAUTHENTICATED,
            "missing",
            id="tls-no-client-cert",
        ),
        # x509 names on a connection that is not TLS are not trusted.
        pytest.param(
            Ctx(auth={**cert("spiffe://example.org/ops"), "transport_security_type": [b"insecure"]}),
            Code.UNAUTHENTICATED,
            "missing",
            id="names-without-tls",
        ),
        pytest.param(
            Ctx(auth=cert("stranger.example.org")), Code.PERMISSION_DENIED, "names no tenant", id="unknown"
        ),
        pytest.param(
            Ctx(auth=cert("spiffe://example.org/ops", "spiffe://example.org/acme/runtime")),
            Code.PERMISSION_DENIED,
            "names 2 identities of the policy (spec.tenants[0], spec.access.admins)",
            id="two-identities",
        ),
    ],
)
def test_certificates_that_are_no_identity(ctx: Ctx, code: Code, words: str) -> None:
    a = auth()
    for _ in range(2):  # the second time from the cache: the same answer
        f = failure(a.tenant, ctx)
        assert f.code is code and words in f.message, f.message


def test_certificate_names_reads_every_san_kind() -> None:
    ac = cert("a.example.org")
    ac["peer_spiffe_id"] = [b"spiffe://example.org/x"]
    ac["peer_dns"] = [b"a.example.org"]
    assert certificate_names(Ctx(auth=ac)) == ["a.example.org", "spiffe://example.org/x"]

    class Bare:  # a context without auth_context(): no certificate
        def invocation_metadata(self) -> tuple[()]:
            return ()

    assert certificate_names(Bare()) == []
