"""What do the trust boundaries cost per Acquire? Grants, and mTLS against plaintext.

Grants (scheduler/grants.py): every Granted and every Renew reply carries a grant the scheduler
makes (g2: HMAC-SHA256 under the worker's own key, plus the HMAC tag of the lease id) and the
worker checks on Start, Checkpoint and Stop. Measured as a microbenchmark: the scheduler's cost
per grant (make + tag), per renewal (make + the Renew's lease-id check), the worker's (verify)
and their sum, `signed_grant_overhead_us`, the median over batches (each batch's mean over `--n`
grants). The same for the Ed25519 grants (g1) the scheduler made before, side by side in the same
run (`ed25519_grant_overhead_us`): what the change saves on this machine, now.

mTLS: two `slotsched serve` subprocesses of the same kind (secure mode, the same policy, in-memory
state): one plaintext, one with `--tls-cert/--tls-key/--tls-ca` (client certificates required).
The certificates are generated for the run (tests/tls_certs.py: EC P-256). One client process
drives both, alternating rounds so that machine noise falls on both alike: each operation is
Acquire until the Granted event, then Release (the pool always has a free slot). Channels are
opened once and warmed, so the TLS handshake is not in the figure: what is measured is the
steady-state cost of encrypting and authenticating every Acquire on a long-lived channel, which
is how the SDK uses its channel.

Usage: `python bench/security.py [--iterations N] [--rounds K] [--n N] [--batches B]
[--grants-only]`. The last line holds the headline `key=value` pairs: `tls_p50_ratio=R` (mTLS p50 /
plaintext p50; not with `--grants-only`), `signed_grant_overhead_us=U`, `scheduler_grant_us`,
`scheduler_renew_us` (the budget of issue 22: at most 20 each) and `ed25519_grant_overhead_us`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from procs import bench_policy, stop_all  # noqa: E402

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc  # noqa: E402
from scheduler.client.channel import tls_credentials  # noqa: E402
from scheduler.grants import GrantClaim, GrantKeyring  # noqa: E402
from tests.tls_certs import Pki, make_pki  # noqa: E402

TOKEN = "bench-token"
ADMIN = "bench-admin"
POLICY = bench_policy(TOKEN, ADMIN)


def _spawn(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "serve", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "serving gRPC on" in line:
            return proc, line.rsplit(" ", 1)[1].strip()
    proc.kill()
    raise RuntimeError(f"slotsched serve {' '.join(args)} did not start")


class Target:
    """One server and a long-lived channel to it; `op` is one Acquire->Granted (then Release)."""

    def __init__(self, address: str, credentials: grpc.ChannelCredentials | None) -> None:
        if credentials is None:
            self.channel = grpc.aio.insecure_channel(address)
        else:
            self.channel = grpc.aio.secure_channel(address, credentials)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)  # type: ignore[no-untyped-call]
        self.md = (("authorization", f"Bearer {TOKEN}"),)
        self.seq = 0

    async def op(self) -> float:
        self.seq += 1
        sid = f"s{self.seq}"
        t0 = time.perf_counter()
        call = self.stub.Acquire(
            scheduler_pb2.AcquireRequest(session_id=sid, qos=common_pb2.QOS_CLASS_BURSTABLE), metadata=self.md
        )
        ev = await call.read()
        took = time.perf_counter() - t0
        assert ev.WhichOneof("event") == "granted", ev
        lease = ev.granted.lease
        await self.stub.Release(
            scheduler_pb2.ReleaseRequest(session_id=sid, lease_id=lease.lease_id, epoch=lease.epoch),
            metadata=self.md,
        )
        while await call.read() is not grpc.aio.EOF:  # the Ended event, then OK
            pass
        return took


async def acquire_latency(targets: dict[str, Target], iterations: int, rounds: int) -> dict[str, list[float]]:
    """Per target, Acquire->Granted latencies (s), rounds alternating between the targets."""
    samples: dict[str, list[float]] = {name: [] for name in targets}
    for t in targets.values():  # warm: connect, handshake, first-call paths
        for _ in range(50):
            await t.op()
    for r in range(rounds):
        order = list(targets.items()) if r % 2 == 0 else list(reversed(targets.items()))
        for name, t in order:
            for _ in range(iterations):
                samples[name].append(await t.op())
    return samples


def tls_p50_ratio(pki: Pki, policy_path: str, iterations: int, rounds: int) -> dict[str, float]:
    """Acquire->Granted p50 over plaintext and over mTLS, same server kind, same run."""
    plain, plain_addr = _spawn(["--policy", policy_path, "--listen", "127.0.0.1:0", "--metrics-listen", ""])
    mtls, mtls_addr = _spawn(
        ["--policy", policy_path, "--listen", "127.0.0.1:0", "--metrics-listen", "",
         "--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tls-ca", pki.ca],
    )  # fmt: skip
    try:

        async def run() -> dict[str, list[float]]:
            creds = tls_credentials(pki.ca, pki.client_cert, pki.client_key)
            targets = {"plain": Target(plain_addr, None), "mtls": Target(mtls_addr, creds)}
            try:
                return await acquire_latency(targets, iterations, rounds)
            finally:
                for t in targets.values():
                    await t.channel.close()

        samples = asyncio.run(run())
    finally:
        stop_all((plain, mtls))
    p50 = {name: statistics.median(v) for name, v in samples.items()}
    p90 = {name: statistics.quantiles(v, n=10)[-1] for name, v in samples.items()}
    return {
        "plain_p50_us": p50["plain"] * 1e6,
        "mtls_p50_us": p50["mtls"] * 1e6,
        "plain_p90_us": p90["plain"] * 1e6,
        "mtls_p90_us": p90["mtls"] * 1e6,
        "tls_p50_ratio": p50["mtls"] / p50["plain"],
    }


def _per_op_us(fn: Callable[[int], object], n: int, batches: int) -> float:
    """Median over batches of the mean microseconds of `fn(i)`."""
    fn(0)  # warm up
    means = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        means.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(means)


def signed_grant_figures(n: int, batches: int) -> dict[str, float]:
    keys = GrantKeyring.generate("k1")
    expires = time.time() + 30
    # Realistic field sizes: a 36-char session id (a UUID), a pod-like worker id.
    claims = []
    for i in range(n):
        worker = f"agent-pool-7f9c-{i % 64}"
        session = f"{i:08d}-7c1e-4f7e-9a51-3f6c2b9d1e{i % 100:02d}"
        claims.append(GrantClaim("acme", session, f"{worker}/{i % 8}#{i}", i, worker, i % 8))
    # Each worker's verifier holds its own keys, as its agent installs them from a heartbeat.
    verifiers = {c.worker_id: keys.verifier(c.worker_id) for c in claims}
    wire = [keys.wire_lease_id(c.lease_id) for c in claims]
    now = time.time()
    out: dict[str, float] = {}
    for name, sign in (("mac", keys.sign), ("ed25519", keys.sign_v1)):
        tokens = [sign(c, expires) for c in claims]

        def make(i: int, sign: Callable[[GrantClaim, float], str] = sign) -> object:
            return sign(claims[i], expires), keys.wire_lease_id(claims[i].lease_id)

        def renew(i: int, sign: Callable[[GrantClaim, float], str] = sign) -> object:
            return keys.core_of(wire[i]), sign(claims[i], expires)

        def verify(i: int, tokens: list[str] = tokens) -> object:
            return verifiers[claims[i].worker_id].verify(tokens[i], claims[i], now)

        out[f"{name}_sign_us"] = _per_op_us(make, n, batches)
        out[f"{name}_renew_us"] = _per_op_us(renew, n, batches)
        out[f"{name}_verify_us"] = _per_op_us(verify, n, batches)
        out[f"{name}_bytes"] = float(max(len(t) for t in tokens))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=300, help="operations per target per round")
    ap.add_argument("--rounds", type=int, default=6, help="rounds, alternating the targets' order")
    ap.add_argument("--n", type=int, default=500, help="grants per batch (default %(default)s)")
    ap.add_argument("--batches", type=int, default=15, help="batches; the median is reported (%(default)s)")
    ap.add_argument("--grants-only", action="store_true", help="the grant figures only (no servers)")
    args = ap.parse_args()
    figures: dict[str, float] = {}
    g = signed_grant_figures(args.n, args.batches)
    print(f"grants: {args.batches} batches of {args.n}; g2 = HMAC-SHA256 per worker key, g1 = Ed25519")
    for name, label in (("mac", "g2 (now)"), ("ed25519", "g1 (before)")):
        print(
            f"{label:<12} {g[f'{name}_bytes']:.0f} bytes; scheduler per grant (make + lease-id tag) "
            f"{g[f'{name}_sign_us']:.1f} us, per renewal {g[f'{name}_renew_us']:.1f} us; "
            f"worker per call (verify) {g[f'{name}_verify_us']:.1f} us"
        )
    if not args.grants_only:
        with tempfile.TemporaryDirectory(prefix="slotsched-bench-security-") as d:
            pki = make_pki(Path(d) / "pki")
            policy_path = str(Path(d) / "policy.yaml")
            Path(policy_path).write_text(POLICY, encoding="utf-8")
            tls = tls_p50_ratio(pki, policy_path, args.iterations, args.rounds)
        n = args.iterations * args.rounds
        for kind, label in (("plain", "plaintext"), ("mtls", "mTLS")):
            print(
                f"Acquire->Granted over {label:<9}: p50 {tls[f'{kind}_p50_us']:.0f} us, "
                f"p90 {tls[f'{kind}_p90_us']:.0f} us ({n} operations)"
            )
        figures["tls_p50_ratio"] = tls["tls_p50_ratio"]
    figures["signed_grant_overhead_us"] = g["mac_sign_us"] + g["mac_verify_us"]
    figures["scheduler_grant_us"] = g["mac_sign_us"]
    figures["scheduler_renew_us"] = g["mac_renew_us"]
    figures["ed25519_grant_overhead_us"] = g["ed25519_sign_us"] + g["ed25519_verify_us"]
    print(" ".join(f"{k}={v:.2f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
