"""What the benches that run `slotsched` subprocesses share: the bench tenant's policy and a clean
stop of the processes (SIGTERM, then SIGKILL after a grace), so every bench ends."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence

from scheduler.policy.identities import hash_token


def bench_policy(token: str, admin: str | None = None) -> str:
    """One tenant `bench` with room for 128 Burstable leases on 8 x 16 slots, long leases."""
    access = f'  access:\n    admins: ["{hash_token(admin)}"]\n' if admin is not None else ""
    return (
        "apiVersion: slotsched.dev/v1alpha1\n"
        "kind: SchedulingPolicy\n"
        "metadata: {name: bench}\n"
        "spec:\n"
        "  pool: {slotsPerWorker: 16, workers: 8, minWorkers: 1, maxWorkers: 8, floor: 0}\n"
        "  timing: {leaseTTLSeconds: 300}\n"
        "  tenants:\n"
        "    - name: bench\n"
        "      burstable: {nominal: 128, limit: 128}\n"
        f'      tokens: ["{hash_token(token)}"]\n' + access
    )


def stop_all(procs: Sequence[subprocess.Popen[str]], grace_s: float = 15.0) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
