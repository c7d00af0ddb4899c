"""Does one tenant's flood slow another tenant's grants? (issue 22) Side by side in one run:

* the server: `slotsched serve --policy P --no-static-pool` (in-memory), its own process;
* a worker: a raw Workers client (own process) registered with 32 slots, heartbeating every second
  on a fixed schedule with a deadline of one interval; a heartbeat is *missed* if it fails or its
  reply comes after the next is due, and after each phase Admin.DescribePool must still list it;
* the quiet tenant (own process, one Channel on its own connection): `--quiet-samples` sequential
  acquire → Granted → release, paced over `--seconds` (20/s by default, under the deploy's 50/s
  tenant bucket); one refused or not granted within `--grant-timeout` is a *grant missed* (counted
  at the timeout in the percentiles); samples left after twice the span: `quiet_granted` says;
* the flooder: `--flood-procs` processes, `--connections` TCP connections, `--channels` Channel
  streams over them, each keeping `--window` messages of `--batch` commands in flight as fast as
  the server answers: `renew`, Renews of leases it does not hold; `churn`, acquire+withdraw pairs
  of fresh sessions (its Burstable limit is 2, so nearly all queue; a granted one is released).
  It ignores retry-after: refusals (RESOURCE_EXHAUSTED) and other errors are counted.

One server per rate-limit setting (`deploy`: spec.rateLimits of deploy/base/policy/policy.yaml;
`none`): the quiet tenant alone, then each flood mode (the flood runs `--ramp` s first).
Progress goes to stderr; the last line is `quiet_p50_ms_alone=… quiet_p99_ms_alone=…
quiet_p50_ms_flood=… quiet_p99_ms_flood=… quiet_p99_ratio=… quiet_grants_missed=… quiet_granted=…
worker_heartbeats_missed=… flooder_commands=… flooder_refused=… flooder_errors=…
flooder_cmds_per_s=… server_cpu_s=… flooder_cpu_s=…`, prefixed `MODE_` when both modes run and
`LIMITS_` when both settings do (e.g. `churn_none_quiet_p99_ratio`). CPU seconds are over the flood
phase (the server's from /proc). Targets: quiet_p99_ratio <= 2.0, no grant or heartbeat missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import yaml  # noqa: E402
from procs import stop_all  # noqa: E402

from scheduler.api.gen.slotsched.v1 import (  # noqa: E402
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    workers_pb2,
    workers_pb2_grpc,
)
from scheduler.policy.identities import hash_token  # noqa: E402

QUIET, FLOOD, ADMIN, WORKER = "quiet-token", "flood-token", "admin-token", "worker-token"
WORKER_ID, WORKER_SLOTS = "flood-worker-0", 32
DEPLOY_POLICY = ROOT / "deploy" / "base" / "policy" / "policy.yaml"
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
HB_INTERVAL_S = 1.0


def say(msg: str) -> None:
    print(f"[flood {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def policy_yaml(limits: str, seats: int | None = None, turn_ms: float | None = None) -> str:
    spec: dict[str, Any] = {
        "pool": {"slotsPerWorker": WORKER_SLOTS, "workers": 1, "minWorkers": 1, "maxWorkers": 1, "floor": 0},
        "timing": {"leaseTTLSeconds": 300},
        "tenants": [
            {"name": "quiet", "burstable": {"nominal": 8, "limit": 16}, "tokens": [hash_token(QUIET)]},
            {"name": "flood", "burstable": {"nominal": 2, "limit": 2}, "tokens": [hash_token(FLOOD)]},
        ],
        "access": {
            "admins": [hash_token(ADMIN)],
            "workers": [{"tokens": [hash_token(WORKER)], "workerIds": [WORKER_ID], "maxSlots": WORKER_SLOTS}],
        },
        "limits": {k: v for k, v in (("seats", seats), ("turnMillis", turn_ms)) if v is not None},
    }
    if limits == "deploy":
        spec["rateLimits"] = yaml.safe_load(DEPLOY_POLICY.read_text())["spec"]["rateLimits"]
    doc = {"apiVersion": "slotsched.dev/v1alpha1", "kind": "SchedulingPolicy", "metadata": {"name": "flood"}}
    return yaml.safe_dump({**doc, "spec": spec}, sort_keys=False)


def md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def own_connection(address: str, tag: str) -> grpc.aio.Channel:
    """A channel on a TCP connection of its own (no subchannel shared with the process's others)."""
    opts = [("grpc.use_local_subchannel_pool", 1), ("bench.connection", tag)]
    return grpc.aio.insecure_channel(address, options=opts)


def out(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


async def worker_main(address: str) -> None:
    ch = own_connection(address, "worker")
    stub = workers_pb2_grpc.WorkersStub(ch)  # type: ignore[no-untyped-call]
    req = workers_pb2.RegisterRequest(worker_id=WORKER_ID, address="127.0.0.1:1", slots=WORKER_SLOTS)
    await stub.Register(req, metadata=md(WORKER), timeout=10)  # the server is serving already
    out({"registered": True})
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    next_at = time.monotonic()
    while not stop.is_set():
        t0 = time.monotonic()
        code = "OK"
        try:
            await stub.Heartbeat(
                workers_pb2.HeartbeatRequest(worker_id=WORKER_ID), metadata=md(WORKER), timeout=HB_INTERVAL_S
            )
        except grpc.aio.AioRpcError as e:
            code = e.code().name
        out({"hb": t0, "ms": (time.monotonic() - t0) * 1e3, "code": code})
        next_at += HB_INTERVAL_S
        # The next heartbeat is due on the fixed schedule (not one interval after this reply).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))
    await ch.close(None)


class QuietChannel:
    """One Channel; one session at a time: acquire, wait for Granted, release, wait for the answer."""

    def __init__(self, address: str) -> None:
        self.ch = own_connection(address, "quiet")
        self.call = scheduler_pb2_grpc.SchedulerStub(self.ch).Channel(metadata=md(QUIET))  # type: ignore[no-untyped-call]
        self.waiting: dict[str, asyncio.Future[Any]] = {}
        self.ref = 0
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            resp = await self.call.read()
            if resp is grpc.aio.EOF:
                for f in self.waiting.values():
                    if not f.done():
                        f.set_exception(RuntimeError("channel ended"))
                return
            for ev in resp.events:
                kind = ev.WhichOneof("kind")
                f = self.waiting.get(ev.session_id)
                if f is None or f.done():
                    continue
                if kind == "error":
                    f.set_exception(
                        RuntimeError(f"code {ev.error.status.code}: {ev.error.status.message[:80]}")
                    )
                elif kind == "event" and ev.event.WhichOneof("event") in ("granted", "ended", "revoked"):
                    f.set_result(ev.event)
                elif kind == "released":
                    f.set_result(ev)

    async def _send(self, sid: str, **cmd: Any) -> asyncio.Future[Any]:
        self.ref += 1
        f = asyncio.get_running_loop().create_future()
        self.waiting[sid] = f
        await self.call.write(
            scheduler_pb2.ChannelRequest(commands=[scheduler_pb2.ChannelCommand(ref=self.ref, **cmd)])
        )
        return f

    async def sample(self, sid: str, timeout: float) -> float | None:
        """Acquire→Granted in seconds, or None when not granted within `timeout` (or refused)."""
        t0 = time.perf_counter()
        acq = scheduler_pb2.AcquireRequest(session_id=sid, qos=common_pb2.QOS_CLASS_BURSTABLE)
        try:
            ev = await asyncio.wait_for(await self._send(sid, acquire=acq), timeout)
        except (TimeoutError, RuntimeError) as e:
            say(f"quiet: {sid} not granted: {e!r}")
            with contextlib.suppress(TimeoutError, RuntimeError):  # give the request up, whatever came of it
                withdraw = scheduler_pb2.WithdrawRequest(session_id=sid)
                await asyncio.wait_for(await self._send(sid, withdraw=withdraw), timeout)
            return None
        latency = time.perf_counter() - t0
        if ev.WhichOneof("event") != "granted":
            return None
        lease = ev.granted.lease
        rel = scheduler_pb2.ReleaseRequest(session_id=sid, lease_id=lease.lease_id, epoch=lease.epoch)
        try:  # the Ended{RELEASED} event, then the released answer
            f = await self._send(sid, release=rel)
            await asyncio.wait_for(f, timeout)
        except (TimeoutError, RuntimeError) as e:
            say(f"quiet: release of {sid}: {e!r}")
        return latency


async def quiet_main(address: str, tag: str, samples: int, interval: float, timeout: float) -> None:
    """Warm up, say ready, wait for `go` on stdin, then take `samples` paced `interval` apart
    (none started after twice the span, so it always ends)."""
    q = QuietChannel(address)
    for i in range(10):  # warm-up: connection, code paths (before any flood starts)
        await q.sample(f"{tag}-warm{i}", timeout)
    out({"ready": True})
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    cpu0, t_start = time.process_time(), time.monotonic()
    lat: list[float] = []
    missed = 0
    for i in range(samples):
        if time.monotonic() > t_start + 2 * samples * interval:
            break
        await asyncio.sleep(max(0.0, t_start + i * interval - time.monotonic()))
        r = await q.sample(f"{tag}-{i}", timeout)
        missed += r is None
        lat += [r] if r is not None else []
    out({"latencies": lat, "missed": missed, "t0": t_start, "t1": time.monotonic(),
         "cpu_s": time.process_time() - cpu0})  # fmt: skip
    q.call.cancel()
    q.reader.cancel()
    await q.ch.close(None)


class Flood:
    def __init__(self) -> None:
        self.commands = self.answered = self.refused = self.errors = self.granted = self.reopened = 0


class Stream:
    """One flood Channel's bookkeeping: commands sent whose answer has not come, and its window."""

    def __init__(self, window: int, batch: int) -> None:
        self.limit = (window - 1) * batch  # send again once no more than this is unanswered
        self.pending = 0
        self.room = asyncio.Event()
        self.room.set()
        self.acquires: set[int] = set()  # refs of acquires: only an error answers one
        self.releases: list[scheduler_pb2.ChannelCommand] = []  # churn: leases granted, to give back

    async def read(self, call: Any, f: Flood) -> None:
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                return
            for ev in resp.events:
                kind = ev.WhichOneof("kind")
                if kind == "event":
                    if ev.event.WhichOneof("event") == "granted":  # churn: under the tenant's limit
                        f.granted += 1
                        lease = ev.event.granted.lease
                        rel = scheduler_pb2.ReleaseRequest(
                            session_id=ev.session_id, lease_id=lease.lease_id, epoch=lease.epoch
                        )
                        self.releases.append(scheduler_pb2.ChannelCommand(release=rel))
                    continue
                if ev.ref == 0:
                    continue
                if kind == "error":
                    if ev.error.status.code == RESOURCE_EXHAUSTED:
                        f.refused += 1
                    else:
                        f.errors += 1
                if ev.ref in self.acquires:
                    self.acquires.discard(ev.ref)
                    continue
                f.answered += 1
                self.pending -= 1
                if self.pending <= self.limit:
                    self.room.set()


def flood_message(mode: str, name: str, seq: int, batch: int, st: Stream) -> tuple[list[Any], int]:
    """The next message: `batch` Renews of leases nobody holds, or acquire+withdraw pairs of fresh
    sessions (and the releases of any granted)."""
    cmds = []
    if mode == "renew":
        for _ in range(batch):
            seq += 1
            r = scheduler_pb2.RenewRequest(
                session_id=f"{name}-{seq}", lease_id=f"w0/{seq % 32}#1.x{seq}", epoch=1
            )
            cmds.append(scheduler_pb2.ChannelCommand(ref=seq, renew=r))
        return cmds, seq
    for _ in range(batch // 2):
        seq += 2
        sid = f"{name}-{seq}"
        a = scheduler_pb2.AcquireRequest(session_id=sid, qos=common_pb2.QOS_CLASS_BURSTABLE)
        w = scheduler_pb2.WithdrawRequest(session_id=sid)
        cmds += [
            scheduler_pb2.ChannelCommand(ref=seq - 1, acquire=a),
            scheduler_pb2.ChannelCommand(ref=seq, withdraw=w),
        ]
        st.acquires.add(seq - 1)
    for c in st.releases:
        seq += 1
        c.ref = seq
        cmds.append(c)
    st.releases.clear()
    return cmds, seq


async def flood_stream(
    stub: Any, mode: str, name: str, batch: int, window: int, f: Flood, stop: asyncio.Event
) -> None:
    """One Channel stream of the flood, as fast as the server answers (a stream the server ends is
    opened again)."""
    seq = 0
    while not stop.is_set():
        call = stub.Channel(metadata=md(FLOOD))
        st = Stream(window, batch)
        task = asyncio.create_task(st.read(call, f))
        try:
            while not stop.is_set() and not task.done():
                await st.room.wait()
                cmds, seq = flood_message(mode, name, seq, batch, st)
                st.pending += sum(1 for c in cmds if c.ref not in st.acquires)
                if st.pending > st.limit:
                    st.room.clear()
                f.commands += len(cmds)
                await call.write(scheduler_pb2.ChannelRequest(commands=cmds))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            pass
        finally:
            task.cancel()
            call.cancel()
        if not stop.is_set():
            f.reopened += 1
            await asyncio.sleep(0.1)


async def flooder_main(
    address: str, mode: str, proc: int, channels: list[int], batch: int, window: int
) -> None:
    """`channels[c]` streams on each of its connections."""
    f = Flood()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    chans = [own_connection(address, f"flood-{proc}-{c}") for c in range(len(channels))]
    for ch in chans:
        await asyncio.wait_for(ch.channel_ready(), 10)
    cpu0, t0 = time.process_time(), time.monotonic()
    out({"ready": True})
    tasks = []
    for c, ch in enumerate(chans):
        stub = scheduler_pb2_grpc.SchedulerStub(ch)  # type: ignore[no-untyped-call]
        for s in range(channels[c]):
            tasks.append(
                asyncio.create_task(flood_stream(stub, mode, f"f{proc}.{c}.{s}", batch, window, f, stop))
            )
    await stop.wait()
    cpu, secs = time.process_time() - cpu0, time.monotonic() - t0
    out({"commands": f.commands, "answered": f.answered, "refused": f.refused, "errors": f.errors,
         "granted": f.granted, "reopened": f.reopened, "cpu_s": cpu, "seconds": secs})  # fmt: skip
    for t in tasks:
        t.cancel()
    os._exit(0)  # the streams' teardown is not worth waiting for


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Proc:
    """A subprocess whose stdout lines are JSON (or the server's banner), read by a thread."""

    def __init__(self, args: list[str], log: Path, stdin: bool = False) -> None:
        self.log = open(log, "w")  # noqa: SIM115 (closed by run_setting)
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.getenv('PYTHONPATH', '')}"}
        self.p = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                  stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                  preexec_fn=_die_with_parent)  # fmt: skip
        self.lines: list[str] = []
        self.cv = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def go(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write("go\n")
        self.p.stdin.flush()

    def _pump(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            with self.cv:
                self.lines.append(line.strip())
                self.cv.notify_all()
        with self.cv:
            self.lines.append("")  # EOF
            self.cv.notify_all()

    def wait_for(self, pred: Any, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        seen = 0
        with self.cv:
            while True:
                for line in self.lines[seen:]:
                    if line == "":
                        raise RuntimeError(f"{what}: the process ended (see {self.log.name})")
                    if pred(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{what}: not within {timeout:.0f} s (see {self.log.name})")
                self.cv.wait(left)

    def json_with(self, key: str, timeout: float, what: str) -> dict[str, Any]:
        line = self.wait_for(lambda s: s.startswith("{") and f'"{key}"' in s, timeout, what)
        return dict(json.loads(line))


def cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else (xs or [0.0])[0]


def worker_listed(address: str) -> bool:
    async def go() -> bool:
        async with grpc.aio.insecure_channel(address) as ch:
            stub = admin_pb2_grpc.AdminStub(ch)  # type: ignore[no-untyped-call]
            pool = await stub.DescribePool(admin_pb2.DescribePoolRequest(), metadata=md(ADMIN), timeout=10)
            return any(w.worker_id == WORKER_ID for w in pool.workers)

    try:
        return asyncio.run(go())
    except grpc.RpcError as e:
        say(f"DescribePool failed: {e}")
        return False


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_setting(
    limits: str, modes: list[str], args: argparse.Namespace, tmp: Path, me: str
) -> dict[str, dict[str, Any]]:
    """One server with the setting's policy: the alone phase, then each flood mode."""
    policy = tmp / f"policy-{limits}.yaml"
    policy.write_text(policy_yaml(limits, args.seats, args.turn_millis))
    py = sys.executable
    procs: list[Proc] = []
    try:
        server = Proc([py, "-m", "scheduler.cli", "serve", "--policy", str(policy), "--listen", "127.0.0.1:0",
                       "--metrics-listen", "", "--no-static-pool"], tmp / f"server-{limits}.log")  # fmt: skip
        procs.append(server)
        banner = server.wait_for(lambda s: "serving gRPC on" in s, 30, "server start")
        address = banner.rsplit(" ", 1)[1]
        say(f"[{limits}] server pid {server.p.pid} on {address}")
        wlog = tmp / f"worker-{limits}.log"
        worker = Proc([py, me, "--proc", "worker", json.dumps({"address": address})], wlog)
        procs.append(worker)
        worker.json_with("registered", 30, "worker register")
        interval = args.seconds / args.quiet_samples

        def quiet(tag: str) -> Proc:
            kw = {"address": address, "tag": tag, "samples": args.quiet_samples, "interval": interval,
                  "timeout": args.grant_timeout}  # fmt: skip
            q = Proc(
                [py, me, "--proc", "quiet", json.dumps(kw)], tmp / f"quiet-{limits}-{tag}.log", stdin=True
            )
            procs.append(q)
            q.json_with("ready", 60, f"quiet {tag} warm-up")
            return q

        def phase(tag: str, q: Proc) -> dict[str, Any]:
            c0 = cpu_s(server.p.pid)
            q.go()
            r = q.json_with("latencies", 2 * args.seconds + 3 * args.grant_timeout + 30, f"quiet {tag}")
            r["server_cpu_s"] = cpu_s(server.p.pid) - c0
            with worker.cv:  # the heartbeats sent while the quiet tenant measured
                hbs = [
                    h
                    for ln in worker.lines
                    if '"hb"' in ln and r["t0"] <= (h := json.loads(ln))["hb"] <= r["t1"]
                ]
            r["hb_missed"] = sum(1 for h in hbs if h["code"] != "OK" or h["ms"] > HB_INTERVAL_S * 1e3)
            r["hb_max_ms"] = max((h["ms"] for h in hbs), default=0.0)
            if not worker_listed(address):
                say(f"[{limits}] {tag}: the worker is no longer registered")
                r["hb_missed"] += 1
            # A grant missed counts at the timeout (a lower bound).
            lat = [x * 1e3 for x in r["latencies"]] + [args.grant_timeout * 1e3] * r["missed"]
            r["p50"], r["p99"] = pct(lat, 50), pct(lat, 99)
            say(f"[{limits}] {tag}: quiet p50 {r['p50']:.2f} p90 {pct(lat, 90):.2f} p99 {r['p99']:.2f} max"
                f" {max(lat, default=0):.2f} ms, {len(r['latencies'])} granted, {r['missed']} missed;"
                f" heartbeats missed {r['hb_missed']}"
                f" (slowest {r['hb_max_ms']:.0f} ms); server cpu {r['server_cpu_s']:.1f} s,"
                f" quiet cpu {r['cpu_s']:.1f} s")  # fmt: skip
            return r

        alone = phase("alone", quiet("alone"))
        results: dict[str, dict[str, Any]] = {}
        for mode in modes:
            q = quiet(mode)  # warmed up before the flood
            flooders = []
            conns = split(args.connections, args.flood_procs)
            chans = [split(c, k) for c, k in zip(split(args.channels, args.flood_procs), conns, strict=True)]
            for i in range(args.flood_procs):
                kw = {"address": address, "mode": mode, "proc": i, "channels": chans[i], "batch": args.batch,
                      "window": args.window}  # fmt: skip
                fp = Proc(
                    [py, me, "--proc", "flooder", json.dumps(kw)], tmp / f"flooder-{limits}-{mode}-{i}.log"
                )
                procs.append(fp)
                flooders.append(fp)
            for fp in flooders:
                fp.json_with("ready", 30, f"flooder {mode} ready")
            at_flood = time.monotonic()
            time.sleep(args.ramp)
            r = phase(mode, q)
            for fp in flooders:
                fp.p.send_signal(signal.SIGTERM)
            fl = [fp.json_with("commands", 20, f"flooder {mode} stats") for fp in flooders]
            for fp in flooders:
                fp.p.wait(10)
                procs.remove(fp)
            r["flooder"] = {k: sum(x[k] for x in fl) for k in fl[0]}
            r["flooder"]["per_proc_cpu"] = [round(x["cpu_s"], 1) for x in fl]
            flood_s = time.monotonic() - at_flood
            r["flooder"]["rate"] = r["flooder"]["commands"] / max(flood_s, 1e-9)
            fsum = r["flooder"]
            say(f"[{limits}] {mode} flood: {fsum['commands']} commands ({fsum['rate']:.0f}/s),"
                f" {fsum['answered']} answered, {fsum['refused']} refused, {fsum['errors']} other errors,"
                f" {fsum['granted']} granted, {fsum['reopened']} streams reopened;"
                f" flooder cpu {fsum['per_proc_cpu']} s")  # fmt: skip
            results[mode] = {"alone": alone, "flood": r}
        return results
    finally:
        stop_all([p.p for p in procs], 5)
        for p in procs:
            p.log.close()


def figures(res: dict[str, Any]) -> dict[str, str]:
    a, f = res["alone"], res["flood"]
    fl = f["flooder"]
    return {
        "quiet_p50_ms_alone": f"{a['p50']:.2f}",
        "quiet_p99_ms_alone": f"{a['p99']:.2f}",
        "quiet_p50_ms_flood": f"{f['p50']:.2f}",
        "quiet_p99_ms_flood": f"{f['p99']:.2f}",
        "quiet_p99_ratio": f"{f['p99'] / a['p99']:.2f}",
        "quiet_grants_missed": str(f["missed"]),
        "quiet_granted": str(len(f["latencies"])),
        "worker_heartbeats_missed": str(f["hb_missed"]),
        "flooder_commands": str(fl["commands"]),
        "flooder_refused": str(fl["refused"]),
        "flooder_errors": str(fl["errors"]),
        "flooder_cmds_per_s": f"{fl['rate']:.0f}",
        "server_cpu_s": f"{f['server_cpu_s']:.1f}",
        "flooder_cpu_s": f"{fl['cpu_s']:.1f}",
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["renew", "churn", "both"], default="both")
    p.add_argument("--rate-limits", choices=["deploy", "none", "both"], default="deploy")
    p.add_argument("--seconds", type=float, default=20.0, help="each phase's measurement")
    p.add_argument("--quiet-samples", type=int, default=400, help="quiet acquires per phase")
    p.add_argument("--channels", type=int, default=100, help="flood Channel streams")
    p.add_argument("--connections", type=int, default=10, help="flood connections")
    p.add_argument("--flood-procs", type=int, default=2, help="flooder processes")
    p.add_argument("--batch", type=int, default=100, help="commands per flood message")
    p.add_argument("--window", type=int, default=2, help="flood messages in flight per stream")
    for flag, kind in (("--seats", int), ("--turn-millis", float)):  # spec.limits.seats, .turnMillis
        p.add_argument(flag, type=kind, help="the policy's spec.limits key (default: its default)")
    p.add_argument("--ramp", type=float, default=1.0, help="seconds of flood before measuring")
    p.add_argument("--grant-timeout", type=float, default=5.0, help="a quiet grant later is missed")
    p.add_argument("--proc", nargs=2, metavar=("ROLE", "JSON"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.proc:  # one of the bench's own processes: its keyword arguments as JSON
        role = {"worker": worker_main, "quiet": quiet_main, "flooder": flooder_main}[args.proc[0]]
        asyncio.run(role(**json.loads(args.proc[1])))  # type: ignore[operator]
        return 0
    if args.connections > args.channels or args.flood_procs > args.connections:
        p.error("need flood-procs <= connections <= channels")
    modes = ["renew", "churn"] if args.mode == "both" else [args.mode]
    settings = ["deploy", "none"] if args.rate_limits == "both" else [args.rate_limits]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally blocks stop the processes
    me = str(Path(__file__).resolve())
    line: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="slotsched-flood-") as d:
        for limits in settings:
            for mode, res in run_setting(limits, modes, args, Path(d), me).items():
                prefix = (f"{mode}_" if len(modes) > 1 else "") + (f"{limits}_" if len(settings) > 1 else "")
                line.update({prefix + k: v for k, v in figures(res).items()})
    print(" ".join(f"{k}={v}" for k, v in line.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
