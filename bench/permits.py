"""What does a token budget permit cost on the wire, next to a Renew on the same server?

One slotsched server (a subprocess, the bench policy plus a budget whose limits never bind: the
permits measured never wait on tokens, only on the server) and one load generator (its own
process) on one open `Scheduler.Channel`, with 64 sessions holding leases:

* round trip at c1: `request_permit` until its `permit` answer (granted), vs `renew` until its
  `renewed` answer, one at a time, interleaved in rounds; the medians' ratio. The permit's
  settle goes alone once it is granted, answered before the next request and not timed (a lone
  session's shape: its LLM call, then its settle, then its next permit);
* throughput at c64: 64 loops each sending `request_permit` and awaiting the grant, the permit's
  settle sent as its own `settle_permit` command without waiting, in the next message (as the
  SDK settles: after the LLM call, not before its next permit), vs 64 loops renewing; permits
  per second over renewals per second;
* CPU time per operation at c64, by process (server and load generator, from /proc): what a
  permit (its request and its settle) costs the server next to a renewal, whatever else runs on
  the machine.

`--in-process` measures no wire: the CPU time per operation of the budget core alone (a
request and its settle) and of the server's operations (`SessionOps`: a permit's request and
settle, a renewal), `--iterations` of each in `--rounds` blocks, min and median; its last line
is `core_permit_us=U ops_permit_us=U ops_renew_us=U ops_cpu_ratio_permit_vs_renew=R` (the mins).

Usage: `python bench/permits.py [--iterations N] [--seconds S] [--rounds K] [--profile F]
[--in-process]` (`--profile F`: the server's cProfile stats written to F). The last line is
`permit_rtt_ratio_vs_renew=R permits_per_s_ratio_vs_renew=R commands_per_s_ratio_vs_renew=R
server_cpu_ratio_permit_vs_renew=R` (issue bars on the first two: <= 1.2 and >= 0.8). A permit
is two commands (its request and its settle) against a renewal's one: the third figure counts
commands, 2 x permits over renewals; the fourth is the server's CPU per permit over per renewal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

import grpc  # noqa: E402
from procs import bench_policy, stop_all  # noqa: E402

from scheduler.api.gen.slotsched.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc  # noqa: E402

TOKEN = "bench-token"
BUDGET = "llm"
SESSIONS = 64
_SERVE = (
    "import asyncio, cProfile, sys\n"
    "from scheduler.serve import serve_forever\n"
    "prof = cProfile.Profile() if len(sys.argv) > 2 else None\n"
    "prof and prof.enable()\n"
    "rc = asyncio.run(serve_forever(sys.argv[1], '127.0.0.1:0', None))\n"
    "prof and (prof.disable(), prof.dump_stats(sys.argv[2]))\n"
    "sys.exit(rc)\n"
)


def policy() -> str:
    """The bench policy and a budget of 10^9 tokens and requests a minute the tenant may use whole."""
    text = bench_policy(TOKEN)
    text = text.replace(
        "  tenants:\n",
        f"  budgets:\n    - {{name: {BUDGET}, tokensPerMinute: 1000000000, requestsPerMinute: 1000000000,"
        " maxPending: 100000, maxPendingPerTenant: 100000}\n  tenants:\n",
    )
    return (
        text + f"      budgets:\n        - {{budget: {BUDGET}, burstable: {{nominal: {{percent: 100}}}}}}\n"
    )


def _spawn(args: list[str], word: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if word in line:
            return proc, line.rsplit(" ", 1)[1].strip()
    proc.kill()
    raise RuntimeError(f"{args} did not start")


# ---------------------------------------------------------------- the load generator (subprocess)


class Gen:
    """One Channel: commands batched by a writer, answers dispatched by ref."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        stub = scheduler_pb2_grpc.SchedulerStub(self.channel)
        self.call = stub.Channel(metadata=(("authorization", f"Bearer {TOKEN}"),))
        self.pending: list[scheduler_pb2.ChannelCommand] = []
        self.ready = asyncio.Event()
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.leases: dict[str, Any] = {}
        self.granted = asyncio.Event()
        self.ref = 0
        self.tasks = [asyncio.create_task(self._write()), asyncio.create_task(self._read())]

    async def _write(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            batch, self.pending = self.pending, []
            await self.call.write(scheduler_pb2.ChannelRequest(commands=batch))

    async def _read(self) -> None:
        try:
            await self._dispatch()
        except BaseException as e:  # every waiter fails with it: the bench stops, not hangs
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(RuntimeError(f"channel reader failed: {e!r}"))
            raise

    async def _dispatch(self) -> None:
        while True:
            resp = await self.call.read()
            for ev in resp.events:
                kind = ev.WhichOneof("kind")
                if kind == "event" and ev.event.WhichOneof("event") == "granted":
                    self.leases[ev.session_id] = ev.event.granted.lease
                    if len(self.leases) == SESSIONS:
                        self.granted.set()
                elif kind == "error":
                    raise RuntimeError(f"error: {ev.error.status.message}")
                elif kind == "permit" and ev.permit.WhichOneof("state") == "queued":
                    continue  # its grant follows on the same ref
                fut = self.waiting.pop(ev.ref, None)
                if fut is not None and not fut.done():
                    fut.set_result(getattr(ev, kind))

    def send(self, wait: bool = True, **kind: Any) -> asyncio.Future[Any] | None:
        self.ref += 1
        fut = None
        if wait:
            fut = asyncio.get_running_loop().create_future()
            self.waiting[self.ref] = fut
        self.pending.append(scheduler_pb2.ChannelCommand(ref=self.ref, **kind))
        self.ready.set()
        return fut

    def renew(self, sid: str) -> asyncio.Future[Any]:
        lease = self.leases[sid]
        req = scheduler_pb2.RenewRequest(session_id=sid, lease_id=lease.lease_id, epoch=lease.epoch)
        fut = self.send(renew=req)
        assert fut is not None
        return fut

    async def request(self, sid: str) -> str:
        """A permit for `sid`, granted: its id."""
        est = scheduler_pb2.TokenUsage(input_tokens=100, output_tokens=100)
        fut = self.send(
            request_permit=scheduler_pb2.RequestPermitRequest(session_id=sid, budget=BUDGET, estimate=est)
        )
        assert fut is not None
        ev = await fut
        return str(ev.permit_id)

    def settle(self, sid: str, permit: str, wait: bool) -> asyncio.Future[Any] | None:
        """The permit's settle, its own command (an error answer stops the bench, waited or not)."""
        usage = scheduler_pb2.TokenUsage(input_tokens=100, output_tokens=50)
        settle = scheduler_pb2.SettlePermitRequest(session_id=sid, permit_id=permit, usage=usage)
        return self.send(wait=wait, settle_permit=settle)

    async def permit(self, sid: str) -> None:
        """A permit for `sid`, its settle sent without waiting, in the next message (module doc)."""
        self.settle(sid, await self.request(sid), wait=False)


async def _rtt(gen: Gen, kind: str, n: int) -> list[float]:
    out = []
    for i in range(n):
        sid = f"s{i % SESSIONS}"
        t0 = time.perf_counter()
        if kind == "permit":
            permit = await gen.request(sid)
            out.append(time.perf_counter() - t0)
            settled = gen.settle(sid, permit, wait=True)  # alone, answered before the next (not timed)
            assert settled is not None
            await settled
        else:
            await gen.renew(sid)
            out.append(time.perf_counter() - t0)
    return out


def cpu_s(pid: int) -> float:
    """A process's CPU time so far (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _rate(gen: Gen, kind: str, seconds: float, server: int, out: dict[str, list[float]]) -> float:
    """Operations per second at c64; each process's CPU time per operation appended to `out`."""
    done = 0
    cpu0 = (cpu_s(server), time.process_time())
    stop = time.perf_counter() + seconds

    async def loop(sid: str) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await (gen.permit(sid) if kind == "permit" else gen.renew(sid))
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(f"s{i}") for i in range(SESSIONS)))
    rate = done / (time.perf_counter() - t0)
    out[f"{kind}_server_cpu"].append((cpu_s(server) - cpu0[0]) / max(1, done))
    out[f"{kind}_client_cpu"].append((time.process_time() - cpu0[1]) / max(1, done))
    return rate


async def client_main(target: str, server: int, iterations: int, seconds: float, rounds: int) -> None:
    gen = Gen(target)
    for i in range(SESSIONS):
        req = scheduler_pb2.AcquireRequest(session_id=f"s{i}", qos=common_pb2.QOS_CLASS_BURSTABLE)
        gen.send(wait=False, acquire=req)
    await asyncio.wait_for(gen.granted.wait(), 30)
    await _rtt(gen, "permit", 200)  # warm up (the budget's buckets start empty)
    await _rtt(gen, "renew", 200)
    out: dict[str, list[float]] = {
        f"{kind}_{what}": []
        for kind in ("permit", "renew")
        for what in ("rtt", "rate", "server_cpu", "client_cpu")
    }
    for _ in range(rounds):
        for kind in ("permit", "renew"):
            out[f"{kind}_rtt"].append(statistics.median(await _rtt(gen, kind, iterations // rounds)))
        for kind in ("permit", "renew"):
            out[f"{kind}_rate"].append(await _rate(gen, kind, seconds / rounds / 2, server, out))
    print(json.dumps(out), flush=True)
    os._exit(0)  # the channel and its tasks go with the process


# ---------------------------------------------------------------- in process (--in-process)


async def _in_process(iterations: int, rounds: int) -> dict[str, list[float]]:
    """CPU time per operation without gRPC, in `rounds` blocks: the budget core alone (a request
    and its settle, `Budgets.handle`, events built), and the server's operations on one loop
    (`SessionOps.request_permit` then `settle_permit`, vs `renew`, request messages built)."""
    import gc

    from scheduler.core.budget.core import Budgets
    from scheduler.core.budget.types import BudgetName, PermitId, PermitRequest, Settle, Usage
    from scheduler.core.types import QoS, SessionId, TenantName, WorkerAdded, WorkerId
    from scheduler.grants import GrantKeyring
    from scheduler.policy.yaml_io import parse_policy
    from scheduler.server.loop import SchedulerLoop
    from scheduler.server.metrics import Metrics
    from scheduler.server.session_ops import SessionOps

    pol, _ = parse_policy(policy())
    core, now, n = Budgets(pol, 0.0), 100.0, 0
    est, used = Usage(100.0, 100.0), Usage(100.0, 50.0)

    def core_permits(k: int) -> None:
        nonlocal now, n
        for _ in range(k):
            n += 1
            pid, owner = PermitId(f"x.{n}"), f"bench/s{n % SESSIONS}"
            now += 1e-4
            ev = PermitRequest(pid, owner, TenantName("bench"), BudgetName(BUDGET), QoS.BURSTABLE, est)
            core.handle(ev, now)
            now += 1e-4
            core.handle(Settle(pid, owner, used), now)

    loop = SchedulerLoop(pol, Metrics())
    for w in range(8):
        loop.submit(WorkerAdded(WorkerId(f"w{w}"), 16))
    ops = SessionOps(loop, GrantKeyring.generate())
    for i in range(SESSIONS):
        req = scheduler_pb2.AcquireRequest(session_id=f"s{i}", qos=common_pb2.QOS_CLASS_BURSTABLE)
        ops.open("bench", req)
    wire = {}
    for i in range(SESSIONS):
        view = loop.session(SessionId(f"bench/s{i}"))
        assert view is not None and view.lease is not None
        wire[f"s{i}"] = (ops.keys.wire_lease_id(view.lease.lease_id), view.lease.epoch)
    pb_est = scheduler_pb2.TokenUsage(input_tokens=100, output_tokens=100)
    pb_used = scheduler_pb2.TokenUsage(input_tokens=100, output_tokens=50)

    def permits(k: int) -> None:
        for i in range(k):
            sid = f"s{i % SESSIONS}"
            req = scheduler_pb2.RequestPermitRequest(session_id=sid, budget=BUDGET, estimate=pb_est)
            ev = ops.request_permit("bench", req)
            settle = scheduler_pb2.SettlePermitRequest(session_id=sid, permit_id=ev.permit_id, usage=pb_used)
            ops.settle_permit("bench", settle)

    def renewals(k: int) -> None:
        for i in range(k):
            sid = f"s{i % SESSIONS}"
            lease_id, epoch = wire[sid]
            ops.renew("bench", scheduler_pb2.RenewRequest(session_id=sid, lease_id=lease_id, epoch=epoch))

    kinds = {"core_permit": core_permits, "ops_permit": permits, "ops_renew": renewals}
    for run in kinds.values():
        run(300)  # warm up (the budget's buckets start empty)
    gc.collect()
    gc.freeze()  # as the server does (app/forever.py)
    out: dict[str, list[float]] = {k: [] for k in kinds}
    block = max(1, iterations // rounds)
    for _ in range(rounds):
        for kind, run in kinds.items():
            t0 = time.process_time()
            run(block)
            out[kind].append((time.process_time() - t0) / block)
    return out


def in_process(iterations: int, rounds: int) -> None:
    r = asyncio.run(_in_process(iterations, rounds))
    lo = {k: min(v) * 1e6 for k, v in r.items()}
    mid = {k: statistics.median(v) * 1e6 for k, v in r.items()}
    print(
        f"in process, CPU per operation (min / median of {rounds} blocks): budget core a permit "
        f"(request and settle) {lo['core_permit']:.1f} / {mid['core_permit']:.1f} us; server "
        f"operations a permit {lo['ops_permit']:.1f} / {mid['ops_permit']:.1f} us, a renewal "
        f"{lo['ops_renew']:.1f} / {mid['ops_renew']:.1f} us"
    )
    print(
        f"core_permit_us={lo['core_permit']:.2f} ops_permit_us={lo['ops_permit']:.2f} "
        f"ops_renew_us={lo['ops_renew']:.2f} "
        f"ops_cpu_ratio_permit_vs_renew={lo['ops_permit'] / lo['ops_renew']:.3f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=2000, help="sequential operations per kind at c1")
    p.add_argument("--seconds", type=float, default=8.0, help="total duration of the c64 runs per kind")
    p.add_argument("--rounds", type=int, default=8, help="interleaved blocks per measurement")
    p.add_argument("--profile", help="write the server's cProfile stats to this file")
    p.add_argument(
        "--in-process", action="store_true",
        help="no gRPC: the budget core's and the server operations' CPU per permit and renewal",
    )  # fmt: skip
    p.add_argument("--client", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.in_process:
        in_process(args.iterations, args.rounds)
        return 0
    if args.client:
        target, pid = args.client
        asyncio.run(client_main(target, int(pid), args.iterations, args.seconds, args.rounds))
        return 0
    with tempfile.TemporaryDirectory(prefix="slotsched-bench-") as d:
        path = Path(d) / "policy.yaml"
        path.write_text(policy())
        profile = [str(Path(args.profile).resolve())] if args.profile else []
        server, target = _spawn([sys.executable, "-c", _SERVE, str(path), *profile], "serving gRPC on")
        try:
            me = str(Path(__file__).resolve())
            cmd = [sys.executable, me, "--client", target, str(server.pid),
                   "--iterations", str(args.iterations), "--seconds", str(args.seconds),
                   "--rounds", str(args.rounds)]  # fmt: skip
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            r = json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            stop_all([server])
    med = {k: statistics.median(v) for k, v in r.items()}
    print(
        f"c1 round trip p50: permit {med['permit_rtt'] * 1e6:.0f} us, renew {med['renew_rtt'] * 1e6:.0f} us"
    )
    print(f"c{SESSIONS} per second: permits {med['permit_rate']:.0f}, renewals {med['renew_rate']:.0f}")
    print(
        f"c{SESSIONS} CPU per operation: server {med['permit_server_cpu'] * 1e6:.0f} us a permit "
        f"(request and settle), {med['renew_server_cpu'] * 1e6:.0f} us a renewal; load generator "
        f"{med['permit_client_cpu'] * 1e6:.0f} us, {med['renew_client_cpu'] * 1e6:.0f} us"
    )
    print(
        f"permit_rtt_ratio_vs_renew={med['permit_rtt'] / med['renew_rtt']:.3f} "
        f"permits_per_s_ratio_vs_renew={med['permit_rate'] / med['renew_rate']:.3f} "
        f"commands_per_s_ratio_vs_renew={2 * med['permit_rate'] / med['renew_rate']:.3f} "
        f"server_cpu_ratio_permit_vs_renew={med['permit_server_cpu'] / med['renew_server_cpu']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
