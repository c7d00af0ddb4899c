"""A certificate identity matches only a SAN of its own type, over real gRPC mTLS.

The certificates are made here by `openssl` from a CA of the test's own, as an outside tester would
make them: an e-mail SAN and a DNS SAN each holding the text of the admin's SPIFFE ID, a real URI
SAN, a certificate with no SAN whose CN holds it, and one with two URI SANs. Each calls
`Admin.DescribePool` of a scheduler whose policy lists `spiffe://sec/admin` as its admin identity:
only the real URI SAN is the admin (before the match was typed, the e-mail and DNS SANs were
taken for it and answered OK).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from scheduler.api.gen.slotsched.v1 import admin_pb2, admin_pb2_grpc
from scheduler.client.channel import tls_credentials
from scheduler.listen import TlsFiles
from scheduler.serve import start_server
from tests.grpc_fixtures import policy_yaml, write_policy

ADMIN_ID = "spiffe://sec/admin"
TENANT_ID = "spiffe://sec/tenant"
OK = grpc.StatusCode.OK

# name -> (subject, extensions of the client certificate), as openssl's -subj and -extfile take them
CLIENTS: dict[str, tuple[str, str]] = {
    "email-san": ("/CN=x", f"subjectAltName=email:{ADMIN_ID}"),
    "dns-san": ("/CN=x", f"subjectAltName=DNS:{ADMIN_ID}"),
    "uri-san": ("/CN=x", f"subjectAltName=URI:{ADMIN_ID}"),
    "no-san-cn": ("/CN=" + ADMIN_ID.replace("/", "\\/"), ""),
    "two-uri-sans": ("/CN=x", f"subjectAltName=URI:{ADMIN_ID},URI:spiffe://sec/someone-else"),
    "two-uri-sans-two-identities": ("/CN=x", f"subjectAltName=URI:{ADMIN_ID},URI:{TENANT_ID}"),
    "uri-san-beside-email": ("/CN=x", f"subjectAltName=email:ops@sec.example,URI:{ADMIN_ID}"),
}


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


def _leaf(d: Path, name: str, subject: str, extensions: str) -> None:
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
    (d / f"{name}.ext").write_text(extensions + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "1", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d,
    )  # fmt: skip


@pytest.fixture(scope="module")
def certs() -> Iterator[Path]:
    assert shutil.which("openssl"), "this test makes its certificates with the openssl command"
    with tempfile.TemporaryDirectory(prefix="slotsched-san-") as tmp:
        d = Path(tmp)
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=sec test CA", cwd=d,
        )  # fmt: skip
        _leaf(
            d,
            "server",
            "/CN=localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth",
        )
        for name, (subject, ext) in CLIENTS.items():
            _leaf(d, name, subject, "\n".join(e for e in (ext, "extendedKeyUsage=clientAuth") if e))
        yield d


def _policy() -> str:
    doc = yaml.safe_load(policy_yaml())
    doc["spec"]["access"]["admins"] = [{"identity": ADMIN_ID}]
    doc["spec"]["tenants"][0]["identities"] = [TENANT_ID]
    return yaml.safe_dump(doc, sort_keys=False)


def _describe_pool_as_each(d: Path) -> dict[str, grpc.StatusCode]:
    """Admin.DescribePool's status for each client certificate, over mTLS to a real scheduler."""

    async def main() -> dict[str, grpc.StatusCode]:
        tls = TlsFiles(str(d / "server.crt"), str(d / "server.key"), str(d / "ca.crt"))
        server = await start_server(write_policy(d, _policy()), "127.0.0.1:0", None, tls=tls)
        codes: dict[str, grpc.StatusCode] = {}
        try:
            port = server.target.rsplit(":", 1)[1]
            for name in CLIENTS:
                creds = tls_credentials(str(d / "ca.crt"), str(d / f"{name}.crt"), str(d / f"{name}.key"))
                assert creds is not None
                async with grpc.aio.secure_channel(f"localhost:{port}", creds) as ch:
                    try:
                        await admin_pb2_grpc.AdminStub(ch).DescribePool(
                            admin_pb2.DescribePoolRequest(), timeout=10
                        )
                        codes[name] = OK
                    except grpc.aio.AioRpcError as e:
                        codes[name] = e.code()
        finally:
            await server.stop(0)
        return codes

    return asyncio.run(main())


def test_only_a_uri_san_is_a_uri_identity_over_mtls(certs: Path) -> None:
    refused = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
    codes = _describe_pool_as_each(certs)
    assert codes["uri-san"] is OK  # the admin's real certificate
    assert codes["uri-san-beside-email"] is OK  # an e-mail SAN beside it changes nothing
    # The text of the admin's SPIFFE ID in a SAN of another type, or in the CN, is not the admin.
    for name in ("email-san", "dns-san", "no-san-cn"):
        assert codes[name] in refused, (name, codes[name])
    # Two URI SANs, one of them the admin's: it is still the admin (the other names nobody of
    # the policy; a certificate naming two identities is refused, tests/test_auth_certificates.py).
    assert codes["two-uri-sans"] is OK
    # Two URI SANs naming two identities of the policy (the admin and a tenant): refused.
    assert codes["two-uri-sans-two-identities"] is grpc.StatusCode.PERMISSION_DENIED
