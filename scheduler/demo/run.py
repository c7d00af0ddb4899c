"""`slotsched demo`: a scheduler, a pool of reference workers and a multi-tenant workload, live.

Why one command: the claim of slotsched — on a pool too small for everything, Guaranteed work
gets a slot within the grace period, Burstable tenants get their nominal, batch work soaks up the
rest, and preemption checkpoints instead of killing — is best checked by watching it happen on
real gRPC, real actors with real state and a real snapshot store, with the outcome measured.

Everything runs in this process, on one event loop: the scheduler (`start_server`, the same
server `slotsched serve` runs, without a static pool), three reference workers
(`slots.worker.main.start_worker`, each its own gRPC server on loopback, registering and
heartbeating like a worker process would) and the sessions (the SDK plus
`scheduler.client.worker_runtime.actor_session`). In-process workers start in milliseconds; the
end-to-end test runs the same code as separate processes.

Time to slot, preemptions and revocations are read from the scheduler's own decisions (an
observer on its loop), exactly as the simulator reads them; checkpoints from the lease holders'
runtime; resumes and lost work from the workers' metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from scheduler.client import AsyncClient, Phase, SlotschedError
from scheduler.client.worker_runtime import ActorRuntime, WorkerClients, actor_session
from scheduler.core.types import Decision, Granted, Revoked, YieldCause, YieldRequested
from scheduler.demo import workload as wl
from scheduler.policy.identities import hash_token
from scheduler.serve import RunningServer, start_server
from scheduler.server.metrics import CLASS_ORDER
from scheduler.sim.stats import CLASS_KEYS, percentile
from slots.worker.actor import ActorConfig
from slots.worker.main import RunningWorker, start_worker

log = logging.getLogger("slotsched.demo")

ACTOR = ActorConfig(bytes_per_turn=16 << 10, turn_interval_s=0.25)
POLL_S = 0.1


def _pcts(values: Sequence[float], digits: int = 3) -> dict[str, float]:
    v = list(values)
    return {
        "p50": round(percentile(v, 50), digits),
        "p95": round(percentile(v, 95), digits),
        "p99": round(percentile(v, 99), digits),
        "max": round(max(v), digits) if v else 0.0,
    }


@dataclass
class Observed:
    """What the scheduler decided, as it decided it."""

    waits: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in CLASS_KEYS})
    preemptions: int = 0
    revocations: int = 0
    lost_slot_seconds: float = 0.0
    yield_to_grant: list[float] = field(default_factory=list)
    _yield_at: dict[str, float] = field(default_factory=dict)

    def __call__(self, event: object, decisions: Sequence[Decision], now: float) -> None:
        for d in decisions:
            if isinstance(d, Granted):
                self.waits[d.lease.qos.value].append(d.waited_s)
                asked = self._yield_at.pop(d.lease.session, None)
                if asked is not None:
                    self.yield_to_grant.append(now - asked)
            elif isinstance(d, YieldRequested):
                if d.cause is not YieldCause.DRAIN:
                    self.preemptions += 1
                    if d.for_session is not None:
                        self._yield_at[d.for_session] = now
            elif isinstance(d, Revoked):
                self.revocations += 1
                self.lost_slot_seconds += d.lost_slot_seconds


class Demo:
    def __init__(self, duration_s: float, snapshots: str, seed: int, out: TextIO) -> None:
        self.duration_s = duration_s
        self.snapshots = snapshots
        self.snapshots_label = snapshots
        self.seed = seed
        self.out = out
        self.rng = random.Random(seed)
        self.tokens = wl.tokens(seed)
        self.worker_token = wl.worker_token(seed)
        self.observed = Observed()
        self.completed: dict[str, int] = defaultdict(int)
        self.refused = 0
        self.session_errors = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self._seq = 0
        self.server: RunningServer | None = None
        self.workers: list[RunningWorker] = []
        self.clients: dict[str, AsyncClient] = {}
        # Lease holders show the workers a token of their own; the workers accept only it.
        self.runtime_token = f"demo-runtime-{self.rng.getrandbits(64):016x}"
        self.worker_clients = WorkerClients(token=self.runtime_token)
        self.runtime = ActorRuntime(self.worker_clients, checkpoint_timeout_s=wl.YIELD_GRACE_S)
        self.started_at = 0.0

    # ------------------------------------------------------------------ setup and teardown

    async def start(self, policy_path: str) -> None:
        self.server = await start_server(
            policy_path, "127.0.0.1:0", metrics_listen=None, static_pool=False, heartbeat_interval_s=1.0
        )
        self.server.loop.observers.append(self.observed)
        target = self.server.target
        for i in range(wl.WORKERS):
            w = await start_worker(
                target,
                f"demo-w{i}",
                wl.SLOTS_PER_WORKER,
                snapshots=self.snapshots,
                token=self.worker_token,
                accept_token_hashes=[hash_token(self.runtime_token)],
                grants=self.server.grant_keys.verifier(),  # the scheduler's key, made at start
                actor_config=ACTOR,
                drain_timeout_s=2.0,
            )
            self.workers.append(w)
        for w in self.workers:
            await asyncio.wait_for(w.agent.registered.wait(), 10)
        self.clients = {t: AsyncClient(target, token=tok) for t, tok in self.tokens.items()}

    async def stop(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for c in self.clients.values():
            await c.close()
        await self.worker_clients.close()
        for w in self.workers:
            await w.stop()
        if self.server is not None:
            await self.server.stop(0.5)

    # ------------------------------------------------------------------ workload

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _next_id(self, stream: wl.Stream) -> str:
        self._seq += 1
        return f"{stream.tenant}-{self._seq}"

    async def _session(self, stream: wl.Stream, work_s: float) -> None:
        sid = self._next_id(stream)
        loop = asyncio.get_running_loop()
        try:
            async with actor_session(self.clients[stream.tenant], sid, stream.qos, self.runtime) as s:
                held, last = 0.0, loop.time()
                while held < work_s and s.phase is not Phase.ENDED:
                    await asyncio.sleep(POLL_S)
                    now = loop.time()
                    if s.phase is Phase.HOLDING:
                        held += now - last
                    last = now
            self.completed[stream.qos.value] += 1
        except SlotschedError as e:
            self.refused += 1
            log.info("session %s refused: %s", sid, e)
            await asyncio.sleep(1.0)  # back off before the stream's next session
        except Exception as e:
            self.session_errors += 1
            log.warning("session %s failed: %r", sid, e)
            await asyncio.sleep(1.0)

    async def _closed_loop(self, stream: wl.Stream) -> None:
        await asyncio.sleep(stream.first_at_s)
        while True:
            await self._session(stream, self.rng.uniform(*stream.work_s))

    async def _open_loop(self, stream: wl.Stream) -> None:
        await asyncio.sleep(stream.first_at_s)
        while True:
            self._spawn(self._session(stream, self.rng.uniform(*stream.work_s)))
            await asyncio.sleep(self.rng.expovariate(1.0 / stream.mean_interarrival_s))

    def start_workload(self) -> None:
        self.started_at = time.monotonic()
        for stream in wl.STREAMS:
            if stream.concurrency:
                for _ in range(stream.concurrency):
                    self._spawn(self._closed_loop(stream))
            else:
                self._spawn(self._open_loop(stream))

    # ------------------------------------------------------------------ reporting

    def _worker_totals(self) -> tuple[int, int, float]:
        verified = sum(w.metrics.resumes_verified_total() for w in self.workers)
        failures = sum(w.metrics.resume_failures_total() for w in self.workers)
        lost = sum(w.metrics.work_lost_total() for w in self.workers)
        return verified, failures, lost

    def table(self) -> str:
        assert self.server is not None
        view = self.server.loop.core.describe()
        t = time.monotonic() - self.started_at
        verified, failures, lost = self._worker_totals()
        cps = [c for c in self.runtime.checkpoints if c.ref is not None]
        lines = [
            f"slotsched demo  t={t:5.1f}s/{self.duration_s:.0f}s   pool {view.capacity} slots "
            f"({len(self.workers)} in-process workers x {wl.SLOTS_PER_WORKER}), floor {view.floor}, "
            f"free {view.free}",
            f"{'class':<12}{'held':>6}{'pending':>9}{'granted':>9}{'p50 wait':>10}{'p95 wait':>10}{'max':>9}",
        ]
        for i, q in enumerate(CLASS_ORDER):
            w = self.observed.waits[q.value]
            p = _pcts(w, 2)
            lines.append(
                f"{q.value:<12}{view.held[i]:>6}{view.pending[i]:>9}{len(w):>9}"
                f"{p['p50']:>9.2f}s{p['p95']:>9.2f}s{p['max']:>8.2f}s"
            )
        size_kib = percentile([c.ref.size_bytes / 1024 for c in cps if c.ref is not None], 50)
        ms = percentile([c.seconds * 1000 for c in cps], 50)
        lines.append(
            f"preemptions {self.observed.preemptions}   checkpoints {len(cps)} (p50 {size_kib:.0f} KiB in "
            f"{ms:.0f} ms)   resumes verified {verified}   resume failures {failures}   "
            f"work lost {lost:.1f} slot-s"
        )
        return "\n".join(lines)

    def outcome(self) -> dict[str, Any]:
        verified, failures, lost = self._worker_totals()
        classes = {k: {"count": len(w), "time_to_slot": _pcts(w)} for k, w in self.observed.waits.items()}
        cps = list(self.runtime.checkpoints)
        ok = [c for c in cps if c.ref is not None]
        sizes = [float(c.ref.size_bytes) for c in ok if c.ref is not None]
        return {
            "classes": classes,
            "preemptions": self.observed.preemptions,
            "resumes_verified": verified,
            "resume_failures": failures,
            "work_lost_slot_seconds": round(lost, 3),
            "revocations": self.observed.revocations,
            "scheduler_work_lost_slot_seconds": round(self.observed.lost_slot_seconds, 3),
            "checkpoints": {
                "count": len(ok),
                "failed": len(cps) - len(ok),
                "bytes": {"p50": percentile(sizes, 50), "max": max(sizes) if sizes else 0.0},
                "seconds": _pcts([c.seconds for c in ok], 4),
            },
            "preemption_log": [
                {
                    "session": c.session_id,
                    "bytes": c.ref.size_bytes if c.ref else 0,
                    "checkpoint_s": round(c.seconds, 4),
                    "error": c.error,
                }
                for c in cps[:100]
            ],
            "yield_to_grant_s": _pcts(self.observed.yield_to_grant, 4),
            "sessions": {
                "completed": {k: self.completed.get(k, 0) for k in CLASS_KEYS},
                "refused": self.refused,
                "errors": self.session_errors,
            },
            "duration_s": self.duration_s,
            "pool": {"workers": wl.WORKERS, "slots_per_worker": wl.SLOTS_PER_WORKER, "floor": wl.FLOOR},
            "workers_mode": "in-process",
            "snapshots": self.snapshots_label,
        }


def render_outcome(o: dict[str, Any]) -> str:
    ran = (
        f"PARTIAL outcome (interrupted) after {o['elapsed_s']:.1f}s of {o['duration_s']:.0f}s"
        if o.get("partial")
        else f"outcome after {o['duration_s']:.0f}s"
    )
    lines = [
        "",
        f"{ran} on {o['pool']['workers']} workers x "
        f"{o['pool']['slots_per_worker']} slots (floor {o['pool']['floor']}), snapshots in {o['snapshots']}",
        "",
        f"time to slot      {'count':>6}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}",
    ]
    for k in CLASS_KEYS:
        c = o["classes"][k]
        t = c["time_to_slot"]
        lines.append(
            f"  {k:<16}{c['count']:>6}{t['p50']:>8.2f}s{t['p95']:>8.2f}s{t['p99']:>8.2f}s{t['max']:>8.2f}s"
        )
    cp = o["checkpoints"]
    ytg = o["yield_to_grant_s"]
    lines += [
        "",
        f"preemptions       {o['preemptions']} (yield requested -> waiter granted: "
        f"p50 {ytg['p50'] * 1000:.0f} ms, max {ytg['max'] * 1000:.0f} ms)",
        f"checkpoints       {cp['count']} written, {cp['failed']} failed; "
        f"size p50 {cp['bytes']['p50'] / 1024:.0f} KiB, max {cp['bytes']['max'] / 1024:.0f} KiB; "
        f"time p50 {cp['seconds']['p50'] * 1000:.0f} ms, max {cp['seconds']['max'] * 1000:.0f} ms",
    ]
    for p in o["preemption_log"][:10]:
        status = "ok" if p["error"] is None else f"FAILED: {p['error']}"
        kib, ms = p["bytes"] / 1024, p["checkpoint_s"] * 1000
        lines.append(f"    {p['session']:<14}{kib:>9.0f} KiB {ms:>7.0f} ms  {status}")
    if len(o["preemption_log"]) > 10:
        lines.append(f"    ... {len(o['preemption_log']) - 10} more")
    lines += [
        f"resumes verified  {o['resumes_verified']}",
        f"resume failures   {o['resume_failures']}",
        f"revocations       {o['revocations']}",
        f"work lost         {o['work_lost_slot_seconds']:.2f} slot-seconds (workers); "
        f"{o['scheduler_work_lost_slot_seconds']:.2f} (scheduler)",
        "sessions done     " + ", ".join(f"{k} {v}" for k, v in o["sessions"]["completed"].items()),
    ]
    return "\n".join(lines)


async def run_demo(
    duration_s: float = 60.0,
    snapshots: str | None = None,
    seed: int = 1,
    out: TextIO = sys.stderr,
    live_every_s: float | None = None,
    stop: asyncio.Event | None = None,
) -> dict[str, Any]:
    """Run the demo for `duration_s` and return its outcome (the `--json` document).

    Setting `stop` ends the run early: everything is shut down as at the end of a full run and
    the outcome covers what was measured until then, marked `"partial": true`."""
    stop = stop if stop is not None else asyncio.Event()
    tmp = tempfile.mkdtemp(prefix="slotsched-demo-")
    snap_url = snapshots or os.path.join(tmp, "snapshots")
    tty = out.isatty()
    every = live_every_s if live_every_s is not None else (1.0 if tty else 5.0)
    demo = Demo(duration_s, snap_url, seed, out)
    if snapshots is None:
        demo.snapshots_label = "a temporary directory (removed)"
    policy_path = os.path.join(tmp, "policy.yaml")
    with open(policy_path, "w", encoding="utf-8") as f:
        f.write(wl.policy_yaml(demo.tokens, demo.worker_token))
    drawn = 0
    try:
        if await _unless_stopped(demo.start(policy_path), stop):
            demo.start_workload()
            deadline = time.monotonic() + duration_s
            while True:
                text = demo.table()
                if tty and drawn:
                    out.write(f"\x1b[{drawn}F\x1b[J")
                out.write(text + "\n" if tty else text + "\n\n")
                out.flush()
                drawn = text.count("\n") + 1
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), min(every, left))
    finally:
        elapsed = time.monotonic() - demo.started_at if demo.started_at else 0.0
        with contextlib.suppress(Exception):
            await demo.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    outcome = demo.outcome()
    outcome["partial"] = stop.is_set()
    outcome["elapsed_s"] = round(min(elapsed, duration_s), 3)
    return outcome


async def _unless_stopped(aw: Any, stop: asyncio.Event) -> bool:
    """Await `aw` unless `stop` is set first (then cancel it); True if it completed."""
    task = asyncio.ensure_future(aw)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return False
    task.result()  # its error, if any
    return True


async def _run_until_signal(
    duration_s: float, snapshots: str | None, seed: int
) -> tuple[dict[str, Any], int | None]:
    """`run_demo`, ended early by the first SIGINT (Ctrl-C) or SIGTERM: (outcome, that signal)."""
    import signal

    stop = asyncio.Event()
    caught: list[int] = []
    aloop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if caught:
            # Shutting down is bounded (workers drain for 2 s), but a user who presses Ctrl-C
            # twice wants out now: leave without cleanup, still without a traceback.
            print("\nslotsched demo: interrupted again, quitting at once", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        caught.append(signum)
        print(
            "\nslotsched demo: interrupted, stopping (the outcome so far follows)",
            file=sys.stderr,
            flush=True,
        )
        stop.set()

    # The loop's handlers rather than KeyboardInterrupt: the interrupt then ends the run at an
    # await of our choosing, the servers and workers are shut down and the outcome is printed.
    sigs = (signal.SIGINT, signal.SIGTERM)
    for sig in sigs:
        aloop.add_signal_handler(sig, on_signal, int(sig))
    try:
        outcome = await run_demo(duration_s, snapshots, seed, stop=stop)
    finally:
        for sig in sigs:
            aloop.remove_signal_handler(sig)
    return outcome, (caught[0] if caught else None)


def demo_main(duration_s: float, snapshots: str | None, seed: int, as_json: bool) -> int:
    """Run the demo and print its outcome; 0, or 128 + the signal (130 for Ctrl-C) if cut short."""
    import json

    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("slotsched.worker").setLevel(logging.WARNING)  # lost work is always shown
    outcome, signum = asyncio.run(_run_until_signal(duration_s, snapshots, seed))
    if as_json:
        print(json.dumps(outcome))
    else:
        print(render_outcome(outcome))
    return 0 if signum is None else 128 + signum
