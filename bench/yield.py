"""Cost of checkpoint-and-yield: time from YieldRequested to the waiter's Granted, next to a plain
boto3 upload of the same number of bytes to the same S3 server, for 1, 16 and 128 MiB actors.

Set-up, all on loopback: a moto S3 server (its own process), the scheduler in this process
(`start_server`, one slot), a reference worker in its own process (`slotsched worker`, actor
state of exactly the size measured), and two sessions driven by the SDK with the runtime
callbacks: a BestEffort session whose actor holds the slot, and a Guaranteed session that
preempts it. Yield-to-grant is read from the scheduler's own decisions (an observer on its loop:
the YieldRequested's time to the waiter's Granted), so it contains the whole path: the event to
the holder, Worker.Checkpoint (serialise, hash, stream to S3, commit), Worker.Stop, Scheduler.Yield
and the grant. The Guaranteed session then leaves, the BestEffort one resumes (restoring its
state from S3) and the next repetition starts.

The baseline is the fastest of `put_object` and `upload_fileobj` (boto3's managed transfer) of the
same number of bytes, run in this process in the same run, interleaved with the repetitions; its
objects are deleted (untimed) before the preemption, so both uploads face the same server state.
Overhead = median(yield-to-grant) - median(baseline upload). Target: <= 50 ms.

    python bench/yield.py          # last line: overhead_ms_1MiB=X overhead_ms_16MiB=Y overhead_ms_128MiB=Z
    python bench/yield.py --sizes 1,16 --repeat 5
    python bench/yield.py --store-options multipart_threshold=16MiB    # multipart above 16 MiB

Figures (this 2-CPU box, --repeat 5, overhead at 1 / 16 / 128 MiB), default store (one PutObject
up to 256 MiB, 16 MiB parts 4 in flight above): 4.7 / -13.7 / 27.3 ms. With 16 MiB multipart
(`--store-options multipart_threshold=16MiB`): 4.3 / -28.6 / 249.8 ms, 128 MiB ranging 250-660 ms
over runs, all of it moto's CompleteMultipartUpload re-assembling the object. Before the S3 write
path was reworked (sequential parts, Content-MD5 per part, copies of the state): 6.2 / 116.5 /
1114.6 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from scheduler.client import AsyncClient, Phase, QoS  # noqa: E402
from scheduler.client.worker_runtime import ActorRuntime, WorkerClients, actor_session  # noqa: E402
from scheduler.core.types import Decision, Granted, YieldCause, YieldRequested  # noqa: E402
from scheduler.policy.identities import hash_token  # noqa: E402
from scheduler.serve import start_server  # noqa: E402
from slots.worker.actor import TRAILER_SIZE  # noqa: E402
from tests.fixtures_s3 import AWS_TEST_ENV, MotoServer, free_port, make_bucket, s3_client  # noqa: E402

MiB = 1 << 20
TOKENS = {"batch": "bench-batch", "sre": "bench-sre"}
WORKER_TOKEN = "bench-worker"  # the worker registers with a worker-role token (spec.access.workers)


def policy_text() -> str:
    doc = {
        "apiVersion": "slotsched.dev/v1alpha1",
        "kind": "SchedulingPolicy",
        "metadata": {"name": "bench-yield"},
        "spec": {
            "pool": {"slotsPerWorker": 1, "workers": 1, "minWorkers": 0, "maxWorkers": 1, "floor": 1},
            "timing": {"yieldGraceSeconds": 120, "leaseTTLSeconds": 300, "minRuntimeSeconds": 0},
            "access": {"workers": [{"tokens": [hash_token(WORKER_TOKEN)], "workerIdPrefix": "bench-"}]},
            "tenants": [
                {"name": "batch", "guaranteed": 0, "burstable": {"nominal": 0, "limit": 0},
                 "tokens": [hash_token(TOKENS["batch"])]},
                {"name": "sre", "guaranteed": 1, "burstable": {"nominal": 0, "limit": 0},
                 "tokens": [hash_token(TOKENS["sre"])]},
            ],
        },
    }  # fmt: skip
    return yaml.safe_dump(doc, sort_keys=False)


class Observer:
    """Yield-to-grant from the scheduler's decisions (its own clock)."""

    def __init__(self) -> None:
        self.asked: dict[str, float] = {}
        self.samples: list[float] = []

    def __call__(self, event: object, decisions: list[Decision], now: float) -> None:
        for d in decisions:
            if isinstance(d, YieldRequested) and d.cause is not YieldCause.DRAIN and d.for_session:
                self.asked[d.for_session] = now
            elif isinstance(d, Granted):
                t = self.asked.pop(d.lease.session, None)
                if t is not None:
                    self.samples.append(now - t)


def baseline_upload(endpoint: str, bucket: str, data: bytes) -> float:
    """Fastest of a single PutObject and boto3's managed upload of `data`.

    Both objects are deleted afterwards (untimed): the checkpoint that follows must not share the
    server with 2 x size bytes of baseline objects the baseline itself never had to: on moto an
    upload next to them is 100-300 ms slower at 128 MiB, whichever kind of upload it is.
    """
    client = s3_client(endpoint)
    keys = [f"baseline/put-{time.time_ns()}", f"baseline/managed-{time.time_ns()}"]
    t0 = time.perf_counter()
    client.put_object(Bucket=bucket, Key=keys[0], Body=data)
    put = time.perf_counter() - t0
    t0 = time.perf_counter()
    client.upload_fileobj(io.BytesIO(data), bucket, keys[1])
    managed = time.perf_counter() - t0
    client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
    return min(put, managed)


def clear_bucket(endpoint: str, bucket: str) -> None:
    client = s3_client(endpoint)
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})


async def wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.01)


async def measure_size(
    size: int,
    repeat: int,
    target: str,
    observer: Observer,
    endpoint: str,
    bucket: str,
    tmp: str,
    store_opts: str,
) -> tuple[list[float], list[float], list[float]]:
    """(yield-to-grant samples, baseline samples, checkpoint RPC samples), in seconds."""
    wport = free_port()
    log = open(os.path.join(tmp, f"worker-{size}.log"), "wb")  # noqa: SIM115
    worker = subprocess.Popen(
        [
            sys.executable, "-m", "scheduler.cli", "worker", "--scheduler", target,
            "--worker-id", f"bench-{size}", "--slots", "1", "--listen", f"127.0.0.1:{wport}",
            "--snapshots", f"s3://{bucket}/snaps?endpoint_url={endpoint}&region=us-east-1{store_opts}",
            "--token", WORKER_TOKEN, "--bytes-per-turn", str(size - TRAILER_SIZE),
            "--turn-interval", "0.05", "--max-turns", "1", "--drain-timeout", "5",
        ],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    workers = WorkerClients()
    runtime = ActorRuntime(workers, checkpoint_timeout_s=110)
    batch = AsyncClient(target, token=TOKENS["batch"])
    sre = AsyncClient(target, token=TOKENS["sre"])
    payload = os.urandom(size)
    ytg_before = len(observer.samples)
    base: list[float] = []
    try:
        async with actor_session(batch, f"be-{size}", QoS.BESTEFFORT, runtime) as be:

            async def one_turn() -> bool:
                status = await workers(be.worker_address).status()
                return any(s.session_id == be.session_id and s.turns >= 1 for s in status.slots)

            await wait_for(one_turn, 120, "the actor's first turn")
            for i in range(repeat + 1):  # the first round warms both paths up and is not counted
                b = await asyncio.to_thread(baseline_upload, endpoint, bucket, payload)
                if i == 0:
                    ytg_before = len(observer.samples) + 1
                else:
                    base.append(b)
                async with actor_session(sre, f"g-{size}-{time.time_ns()}", QoS.GUARANTEED, runtime):
                    assert be.yields >= 1 and be.resume_from is not None
                    assert be.resume_from.size_bytes == size, be.resume_from
                # The incident is over: the BestEffort actor comes back from its snapshot.
                await be.wait_granted(180)
                await wait_for(lambda: be.phase is Phase.HOLDING, 180, "the resume")
                if size >= 64 * MiB:
                    await asyncio.to_thread(clear_bucket, endpoint, bucket)
    finally:
        await batch.close()
        await sre.close()
        await workers.close()
        worker.terminate()  # it deregisters from the scheduler in this process: do not block the loop
        await asyncio.to_thread(worker.wait, 30)
        log.close()
    rpc = [c.seconds for c in runtime.checkpoints if c.ref is not None][1:]
    return observer.samples[ytg_before:], base, rpc


async def main_async(sizes_mib: list[int], repeat: int, store_opts: str) -> dict[int, float]:
    for k, v in AWS_TEST_ENV.items():
        os.environ[k] = v
    moto = MotoServer().start()
    tmp = tempfile.mkdtemp(prefix="bench-yield-")
    policy = os.path.join(tmp, "policy.yaml")
    Path(policy).write_text(policy_text())
    server = await start_server(policy, "127.0.0.1:0", None, static_pool=False, heartbeat_interval_s=1.0)
    observer = Observer()
    server.loop.observers.append(observer)
    bucket = make_bucket(moto.endpoint_url)
    overheads: dict[int, float] = {}
    try:
        print(
            f"{'size':>8} {'yield->grant p50':>17} {'min':>8} {'upload p50':>11} "
            f"{'checkpoint rpc p50':>19} {'overhead':>9}"
        )
        for mib in sizes_mib:
            r = repeat if mib < 128 else max(1, min(repeat, 3))
            ytg, base, rpc = await measure_size(
                mib * MiB, r, server.target, observer, moto.endpoint_url, bucket, tmp, store_opts
            )
            over = (statistics.median(ytg) - statistics.median(base)) * 1000
            overheads[mib] = over
            print(
                f"{mib:>5}MiB {statistics.median(ytg) * 1000:>14.1f} ms {min(ytg) * 1000:>5.1f} ms"
                f" {statistics.median(base) * 1000:>8.1f} ms {statistics.median(rpc) * 1000:>16.1f} ms"
                f" {over:>6.1f} ms   (n={len(ytg)})",
                flush=True,
            )
            clear_bucket(moto.endpoint_url, bucket)
    finally:
        await server.stop(0.5)
        moto.close()
    return overheads


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", default="1,16,128", help="snapshot sizes in MiB (default %(default)s)")
    p.add_argument("--repeat", type=int, default=5, help="preemptions per size (128 MiB: at most 3)")
    p.add_argument(
        "--store-options",
        default="",
        help="extra S3 store URL options for the worker, e.g. multipart_threshold=256MiB",
    )
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    opts = "".join(f"&{o}" for o in args.store_options.split("&") if o)
    overheads = asyncio.run(main_async(sizes, args.repeat, opts))
    print(" ".join(f"overhead_ms_{mib}MiB={overheads[mib]:.1f}" for mib in sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
