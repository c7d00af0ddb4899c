"""Identities from a verified mTLS client certificate, on the Authenticator alone (the TLS layer and
its end-to-end test are another module's): a fake servicer context carries the `auth_context()`
grpc fills in for a peer whose certificate the TLS layer verified."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from scheduler.policy.identities import CertName, SanType, hash_token
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


# grpc's auth_context() key for each SAN type (as tests/test_auth_san_types.py sees it over mTLS).
_SAN_KEY = {"URI": "peer_uri", "DNS": "peer_dns", "email": "peer_email", "IP": "peer_ip"}


def cert(*sans: str, cn: str = "ignored-when-sans") -> dict[str, list[bytes]]:
    """auth_context() of a TLS peer with a verified client certificate; each SAN is written as
    openssl prints it ("URI:spiffe://…", "DNS:host", "email:…"); one without a type is a URI if it
    has a scheme, else a DNS name."""
    ac: dict[str, list[bytes]] = {
        "transport_security_type": [b"ssl"],
        "x509_common_name": [cn.encode()],
        "security_level": [b"TSI_PRIVACY_AND_INTEGRITY"],
    }
    for san in sans:
        kind, _, value = san.partition(":")
        if kind not in _SAN_KEY or not value or value.startswith("//"):
            kind, value = ("URI" if ":" in san else "DNS"), san
        ac.setdefault("x509_subject_alternative_name", []).append(value.encode())
        ac.setdefault(_SAN_KEY[kind], []).append(value.encode())
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


def test_certificate_names_are_typed() -> None:
    names = certificate_names(
        Ctx(auth=cert("URI:spiffe://example.org/x", "DNS:a.example.org", "email:a@b.c"))
    )
    assert names == [CertName(SanType.URI, "spiffe://example.org/x"), CertName(SanType.DNS, "a.example.org")]
    # The CN only when the certificate has no SAN at all, and as a DNS name.
    assert certificate_names(Ctx(auth=cert(cn="spiffe://example.org/x"))) == [
        CertName(SanType.DNS, "spiffe://example.org/x")
    ]
    assert certificate_names(Ctx(auth=cert("email:a@b.c", cn="a.example.org"))) == []

    class Bare:  # a context without auth_context(): no certificate
        def invocation_metadata(self) -> tuple[()]:
            return ()

    assert certificate_names(Bare()) is None


@pytest.mark.parametrize(
    ("sans", "cn", "admin"),
    [
        pytest.param(("URI:spiffe://example.org/ops",), "x", True, id="uri-san"),
        pytest.param(("email:spiffe://example.org/ops",), "x", False, id="email-san-holding-the-uri"),
        pytest.param(("DNS:spiffe://example.org/ops",), "x", False, id="dns-san-holding-the-uri"),
        pytest.param(("IP:spiffe://example.org/ops",), "x", False, id="ip-san-holding-the-uri"),
        pytest.param((), "spiffe://example.org/ops", False, id="cn-holding-the-uri"),
        pytest.param(("email:a@example.org",), "spiffe://example.org/ops", False, id="cn-beside-a-san"),
    ],
)
def test_an_identity_matches_only_a_san_of_its_own_type(sans: tuple[str, ...], cn: str, admin: bool) -> None:
    a = auth()
    for _ in range(2):  # the second time from the cache: the same answer
        if admin:
            assert a.require_admin(Ctx(auth=cert(*sans, cn=cn))).role == "admin"
        else:
            f = failure(a.require_admin, Ctx(auth=cert(*sans, cn=cn)))
            assert f.code is Code.PERMISSION_DENIED and "names no tenant or role" in f.message


def test_a_dns_identity_matches_only_a_dns_san_or_a_lone_cn() -> None:
    a = auth()
    assert a.tenant(Ctx(auth=cert("DNS:runtime.globex.example.org"))) == "globex"
    assert a.tenant(Ctx(auth=cert(cn="runtime.globex.example.org"))) == "globex"
    for other in ("URI:runtime.globex.example.org", "email:runtime.globex.example.org"):
        f = failure(a.tenant, Ctx(auth=cert(other, cn="runtime.globex.example.org")))
        assert f.code is Code.PERMISSION_DENIED, other
