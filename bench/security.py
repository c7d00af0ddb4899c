"""What the trust boundary costs per Acquire.

Signed grants (scheduler/grants.py): every Granted is signed once on the scheduler (Ed25519, plus
the HMAC tag of the lease id) and verified once by the worker on Start; Checkpoint and Stop verify
again. This script measures, as a microbenchmark on this machine, the scheduler's cost per grant
(sign + tag), the worker's (verify) and their sum: `signed_grant_overhead_us`, the median over
batches (each batch's mean over `--n` grants, so timer resolution does not matter).

    python bench/security.py [--n 500] [--batches 15]

The last line holds the headline `key=value` pairs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.grants import GrantClaim, GrantKeyring  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500, help="grants per batch (default %(default)s)")
    ap.add_argument("--batches", type=int, default=15, help="batches; the median is reported (%(default)s)")
    args = ap.parse_args(argv)
    keys = GrantKeyring.generate("k1")
    verifier = keys.verifier()
    expires = time.time() + 30
    # Realistic field sizes: a 36-char session id (a UUID), a pod-like worker id.
    claims = []
    for i in range(args.n):
        worker = f"agent-pool-7f9c-{i % 64}"
        session = f"{i:08d}-7c1e-4f7e-9a51-3f6c2b9d1e{i % 100:02d}"
        claims.append(GrantClaim("acme", session, f"{worker}/{i % 8}#{i}", i, worker, i % 8))
    tokens = [keys.sign(c, expires) for c in claims]
    now = time.time()

    sign_us = _per_op_us(
        lambda i: (keys.sign(claims[i], expires), keys.wire_lease_id(claims[i].lease_id)),
        args.n,
        args.batches,
    )
    verify_us = _per_op_us(lambda i: verifier.verify(tokens[i], claims[i], now), args.n, args.batches)
    grant_bytes = max(len(t) for t in tokens)
    print(f"grants: Ed25519, {grant_bytes} bytes each; {args.batches} batches of {args.n}")
    print(f"scheduler per grant (sign + lease-id tag): {sign_us:.1f} us")
    print(f"worker per call (verify):                  {verify_us:.1f} us")
    print(
        f"signed_grant_overhead_us={sign_us + verify_us:.1f} sign_us={sign_us:.1f} verify_us={verify_us:.1f} "
        f"grant_bytes={grant_bytes}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
