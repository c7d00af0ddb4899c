"""mTLS on every port: the scheduler (every service, health, reflection, KEDA), the worker, the
metrics port, and the clients of each (SDK, `slotsched status`, the worker's agent, the runtime's
WorkerClients). The PKI is generated per test module (tests/tls_certs.py).

What is proved: with `--tls-ca` a client without a certificate, or with one of another CA, or
speaking plaintext, is refused at the handshake (UNAVAILABLE), before any service; a client with a
certificate of the CA gets through, and the servicer sees the verified certificate, SAN URI
included, in `context.auth_context()` (where auth.py can read an identity from it). Without
`--tls-ca` TLS needs no client certificate. With a policy, KEDA's endpoint needs the worker or
admin role.
"""

from __future__ import annotations

import asyncio
import ssl
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler.api.gen.externalscaler import externalscaler_pb2, externalscaler_pb2_grpc
from scheduler.cli.status_table import status_main
from scheduler.client import AsyncClient, QoS
from scheduler.client.channel import tls_credentials
from scheduler.client.worker_runtime import WorkerClient
from scheduler.listen import TlsFiles, add_grpc_port
from scheduler.serve import RunningServer, start_server
from slots.worker.main import start_worker
from tests.grpc_fixtures import ADMIN_TOKEN, TOKENS, WORKER_TOKEN, policy_yaml, write_policy
from tests.tls_certs import CLIENT_SAN, Pki, make_pki


@pytest.fixture(scope="module")
def pki() -> Iterator[Pki]:
    with tempfile.TemporaryDirectory(prefix="slotsched-pki-") as d:
        yield make_pki(Path(d))


def _mtls(pki: Pki) -> TlsFiles:
    return TlsFiles(pki.server_cert, pki.server_key, pki.ca)


def _creds(pki: Pki, with_cert: bool = True) -> grpc.ChannelCredentials:
    creds = tls_credentials(
        pki.ca, pki.client_cert if with_cert else None, pki.client_key if with_cert else None
    )
    assert creds is not None
    return creds


async def _health(target: str, credentials: grpc.ChannelCredentials | None) -> Any:
    """Health.Check's status, or the error code of the call."""
    channel = (
        grpc.aio.secure_channel(target, credentials) if credentials else grpc.aio.insecure_channel(target)
    )
    async with channel:
        try:
            resp = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.aio.AioRpcError as e:
            return e.code()
        return resp.status


def _run_server(pki: Pki, tls: TlsFiles, policy: str | None, go: Any, **kw: Any) -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory() as d:
            path = write_policy(d, policy) if policy is not None else None
            server = await start_server(path, "127.0.0.1:0", None, tls=tls, **kw)
            try:
                await go(server)
            finally:
                await server.stop(0)

    asyncio.run(main())


def test_mtls_refuses_clients_without_a_certificate_of_its_ca(pki: Pki) -> None:
    async def go(server: RunningServer) -> None:
        target = server.target
        assert server.transport.startswith("mTLS")
        assert await _health(target, _creds(pki)) == health_pb2.HealthCheckResponse.SERVING
        # No certificate, another CA's certificate, plaintext: refused at the handshake.
        assert await _health(target, _creds(pki, with_cert=False)) == grpc.StatusCode.UNAVAILABLE
        stranger = tls_credentials(pki.ca, pki.other_client_cert, pki.other_client_key)
        assert await _health(target, stranger) == grpc.StatusCode.UNAVAILABLE
        assert await _health(target, None) == grpc.StatusCode.UNAVAILABLE
        # The SDK over mTLS: a whole session (files given as paths).
        async with (
            AsyncClient(
                target, tenant="product", tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key
            ) as c,
            c.session("s-tls", QoS.BURSTABLE) as s,
        ):
            assert s.slot
        # The SDK without a certificate cannot even reach the queue.
        async with AsyncClient(target, tenant="product", tls_ca=pki.ca, connect_timeout_s=1) as c:
            with pytest.raises(Exception) as exc:
                async with c.session("s-refused", QoS.BURSTABLE):
                    pass
            assert "Unavailable" in type(exc.value).__name__

    _run_server(pki, _mtls(pki), None, go)


def test_server_only_tls_needs_no_client_certificate(pki: Pki) -> None:
    async def go(server: RunningServer) -> None:
        assert server.transport.startswith("TLS")
        assert (
            await _health(server.target, _creds(pki, with_cert=False))
            == health_pb2.HealthCheckResponse.SERVING
        )
        assert await _health(server.target, None) == grpc.StatusCode.UNAVAILABLE  # plaintext is not spoken

    _run_server(pki, TlsFiles(pki.server_cert, pki.server_key), None, go)


def test_auth_context_carries_the_verified_client_san(pki: Pki) -> None:
    """A tiny servicer on a port bound by add_grpc_port: what grpc hands a handler over mTLS."""
    seen: dict[str, list[bytes]] = {}

    async def whoami(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        seen.update(context.auth_context())
        return b"ok"

    handler = grpc.method_handlers_generic_handler(
        "test.Who", {"Am": grpc.unary_unary_rpc_method_handler(whoami)}
    )

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = add_grpc_port(server, "127.0.0.1:0", "--listen", _mtls(pki))
        await server.start()
        try:
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", _creds(pki)) as ch:
                assert await ch.unary_unary("/test.Who/Am")(b"") == b"ok"
        finally:
            await server.stop(0)

    asyncio.run(main())
    assert CLIENT_SAN.encode() in seen["x509_subject_alternative_name"]
    assert seen["x509_common_name"] == [b"acme-runtime"]
    assert seen["transport_security_type"] == [b"ssl"]


def test_tls_files_are_checked_with_their_flags(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        TlsFiles("a.crt", None)
    with pytest.raises(ValueError, match="--tls-ca requires --tls-cert"):
        TlsFiles(ca="ca.crt")
    missing = TlsFiles(str(tmp_path / "nope.crt"), str(tmp_path / "nope.key"))
    with pytest.raises(ValueError, match="cannot read --tls-key .*nope.key"):
        missing.server_credentials()
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        AsyncClient("127.0.0.1:1", tls_cert=b"x")


def test_status_worker_and_keda_over_mtls(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`slotsched status --tls-*`, a worker serving and registering over mTLS, a runtime's
    WorkerClient with a certificate (and refused without), KEDA needing a role, metrics over HTTPS."""
    tls = _mtls(pki)

    async def go(server: RunningServer) -> None:
        target = server.target
        ok = await asyncio.to_thread(
            status_main, target, True, ADMIN_TOKEN, None, (pki.ca, pki.client_cert, pki.client_key)
        )
        assert ok == 0
        refused = await asyncio.to_thread(status_main, target, True, ADMIN_TOKEN, None, (pki.ca, None, None))
        assert refused == 1

        worker_tls = TlsFiles(pki.worker_cert, pki.worker_key, pki.ca)
        w = await start_worker(
            target, "w0", 1, snapshots=str(tmp_path), token=WORKER_TOKEN, tls=worker_tls, verify_leases=False
        )
        try:
            for _ in range(100):  # the agent registers over mTLS
                if "w0" in server.registry.workers:
                    break
                await asyncio.sleep(0.05)
            assert "w0" in server.registry.workers
            wc = WorkerClient(w.address, tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key)
            status = await wc.status()
            assert status.worker_id == "w0"
            await wc.close()
            bare = WorkerClient(w.address, tls_ca=pki.ca, rpc_timeout_s=3)
            with pytest.raises(Exception) as exc:
                await bare.status()
            assert getattr(exc.value, "code", None) == grpc.StatusCode.UNAVAILABLE
            await bare.close()
        finally:
            await w.stop(0)

        async with grpc.aio.secure_channel(target, _creds(pki)) as ch:
            keda = externalscaler_pb2_grpc.ExternalScalerStub(ch)
            ref = externalscaler_pb2.ScaledObjectRef(name="workers", namespace="slotsched")
            for md, code in (
                # Over mTLS the verified client certificate is a credential (the policy's
                # `identities`): one the policy does not name is refused, not anonymous.
                ((), grpc.StatusCode.PERMISSION_DENIED),
                ((("authorization", f"Bearer {TOKENS['acme']}"),), grpc.StatusCode.PERMISSION_DENIED),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await keda.GetMetricSpec(ref, metadata=md)
                assert err.value.code() == code
            spec = await keda.GetMetricSpec(ref, metadata=(("authorization", f"Bearer {WORKER_TOKEN}"),))
            assert spec.metricSpecs[0].targetSize == 1
            # KEDA sends no header: the token may come in the trigger's metadata instead.
            with_token = externalscaler_pb2.ScaledObjectRef(name="w", scalerMetadata={"token": WORKER_TOKEN})
            assert (await keda.IsActive(with_token)).result in (True, False)
            tenant_token = externalscaler_pb2.ScaledObjectRef(
                name="w", scalerMetadata={"token": TOKENS["acme"]}
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await keda.GetMetrics(externalscaler_pb2.GetMetricsRequest(scaledObjectRef=tenant_token))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED

        url = f"https://127.0.0.1:{server.metrics_port}/metrics"
        ctx = ssl.create_default_context(cafile=pki.ca)
        ctx.load_cert_chain(pki.client_cert, pki.client_key)
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, context=ctx, timeout=5).read())
        assert b"slotsched_" in body
        no_cert = ssl.create_default_context(cafile=pki.ca)
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            await asyncio.to_thread(lambda: urllib.request.urlopen(url, context=no_cert, timeout=5).read())

    async def main() -> None:
        with tempfile.TemporaryDirectory() as d:
            path = write_policy(d, policy_yaml())
            server = await start_server(
                path, "127.0.0.1:0", "127.0.0.1:0", static_pool=True, tls=tls, metrics_tls=True
            )
            try:
                await go(server)
            finally:
                await server.stop(0)

    asyncio.run(main())
