"""Test PKI: a CA, a server certificate for 127.0.0.1/localhost, client certificates with a SAN URI.

Generated with `cryptography` at test time (EC P-256, valid for a day), written as PEM files to a
directory; nothing is checked in. `make_pki(dir)` returns the paths; `other` is a second CA with a
client certificate of its own, which a server trusting only the first CA must refuse.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CLIENT_SAN = "spiffe://slotsched.test/tenant/acme"
WORKER_SAN = "spiffe://slotsched.test/worker/w0"


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    worker_cert: str  # server and client use: a worker serves and calls the scheduler
    worker_key: str
    other_ca: str
    other_client_cert: str
    other_client_key: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[str, str]:
    cert_path, key_path = path.with_suffix(".crt"), path.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert_path), str(key_path)


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    cn: str,
    sans: list[x509.GeneralName],
    usages: list[x509.ObjectIdentifier],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca[1], hashes.SHA256())
    )
    return cert, key


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca("slotsched test CA")
    other = _ca("some other CA")
    local = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = _leaf(ca, "scheduler", local, [ExtendedKeyUsageOID.SERVER_AUTH])
    client = _leaf(
        ca, "acme-runtime", [x509.UniformResourceIdentifier(CLIENT_SAN)], [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    worker = _leaf(
        ca,
        "w0",
        [*local, x509.UniformResourceIdentifier(WORKER_SAN)],
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    stranger = _leaf(
        other, "acme-runtime", [x509.UniformResourceIdentifier(CLIENT_SAN)], [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    ca_path = directory / "ca.crt"
    ca_path.write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    other_path = directory / "other-ca.crt"
    other_path.write_bytes(other[0].public_bytes(serialization.Encoding.PEM))
    s_cert, s_key = _write(directory / "server", *server)
    c_cert, c_key = _write(directory / "client", *client)
    w_cert, w_key = _write(directory / "worker", *worker)
    o_cert, o_key = _write(directory / "stranger", *stranger)
    return Pki(str(ca_path), s_cert, s_key, c_cert, c_key, w_cert, w_key, str(other_path), o_cert, o_key)
