"""A real slotsched gRPC server for tests, on loopback, on a free port, in a background thread.

Why a thread with its own event loop: tests stay plain sync functions (no pytest-asyncio) and drive
clients with `asyncio.run(...)`, while the server keeps running between those runs exactly as in
production (one event loop owning the core). Reusable by the SDK and worker tests:

    from tests.grpc_fixtures import TOKENS, B, Client, next_event, policy_yaml, running_server

    def test_x() -> None:
        with running_server(policy_yaml()) as server:    # secure mode, tokens in TOKENS
            async def go() -> None:
                async with Client(server.target, token=TOKENS["acme"]) as c:
                    event = await next_event(c.acquire("s", B))
                    ...
            asyncio.run(go())

Tenant tokens (TOKENS) serve the Scheduler service only: Admin calls need ADMIN_TOKEN and
Workers calls WORKER_TOKEN (or ADMIN_TOKEN), which `policy_yaml` lists under `spec.access`.

(`pytest_plugins = ["tests.grpc_fixtures"]` also gives the `grpc_server` fixture; pytest then
warns that the module cannot be assert-rewritten if another test module imported it first.)

Helpers: `policy_yaml(...)` builds a policy (plaintext tokens are hashed), `ServerThread` /
`running_server(...)` start a server with any policy, `Client` bundles aio stubs and metadata,
`next_event(call)` reads one stream event with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import grpc
import pytest
import yaml

from scheduler.api.gen.slotsched.v1 import (
    admin_pb2_grpc,
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    workers_pb2_grpc,
)
from scheduler.grants import GrantKeyring
from scheduler.policy.identities import hash_token
from scheduler.serve import RunningServer, start_server

T = TypeVar("T")

G = common_pb2.QOS_CLASS_GUARANTEED
B = common_pb2.QOS_CLASS_BURSTABLE
BE = common_pb2.QOS_CLASS_BEST_EFFORT

TOKENS = {"acme": "acme-secret-token", "globex": "globex-secret-token", "batch": "batch-secret-token"}
# Role tokens (spec.access): an operator for the Admin service, a worker agent for Workers.
ADMIN_TOKEN = "admin-secret-token"
WORKER_TOKEN = "worker-secret-token"
WORKER_B_TOKEN = "worker-b-secret-token"  # pools_policy_yaml's second worker entry (pool cpu-b)
# The scope of WORKER_TOKEN (spec.access.workers[0]): worker ids starting with "w", 8 slots each.
WORKER_PREFIX = "w"
WORKER_MAX_SLOTS = 8

# acme: every class; globex: Burstable only (no Guaranteed, no BestEffort); batch: BestEffort only.
DEFAULT_TENANTS: list[dict[str, Any]] = [
    {"name": "acme", "guaranteed": 1, "burstable": {"nominal": 1, "limit": 2}},
    {"name": "globex", "guaranteed": 0, "burstable": {"nominal": 1, "limit": 2}, "bestEffort": {"limit": 0}},
    {"name": "batch", "guaranteed": 0, "burstable": {"nominal": 0, "limit": 0}},
]


def policy_yaml(
    tenants: list[dict[str, Any]] | None = None,
    *,
    name: str = "test",
    slots_per_worker: int = 1,
    workers: int = 2,
    floor: int = 1,
    lease_ttl_s: float = 30,
    yield_grace_s: float = 5,
    min_runtime_s: float = 0,
    max_pending: int = 100,
    max_pending_per_tenant: int = 100,
    admin_tokens: list[str] | None = None,
    worker_tokens: list[str] | None = None,
    worker_access: list[dict[str, Any]] | None = None,
    rate_limits: dict[str, Any] | None = None,
) -> str:
    """A policy document; each tenant gets the hash of TOKENS[name] (or of its own `token`).

    `admin_tokens` and `worker_tokens` are plaintext role tokens for `spec.access` (default:
    [ADMIN_TOKEN] and [WORKER_TOKEN]; [] for none). The worker tokens make one entry, scoped to
    worker ids starting with "w" (WORKER_PREFIX) and WORKER_MAX_SLOTS slots; `worker_access`
    replaces it with entries of your own (their `tokens` plaintext, hashed here).
    `rate_limits` is `spec.rateLimits` (default: none, so no call is rate-limited)."""
    specs = []
    for t in tenants if tenants is not None else DEFAULT_TENANTS:
        t = dict(t)
        token = t.pop("token", TOKENS.get(t["name"]))
        specs.append({**t, "tokens": [hash_token(token)] if token else []})
    doc: dict[str, Any] = {
        "apiVersion": "slotsched.dev/v1alpha1",
        "kind": "SchedulingPolicy",
        "metadata": {"name": name},
        "spec": {
            "pool": {
                "slotsPerWorker": slots_per_worker,
                "workers": workers,
                "minWorkers": 0,
                "maxWorkers": max(workers, 1),
                "floor": floor,
            },
            "timing": {
                "yieldGraceSeconds": yield_grace_s,
                "leaseTTLSeconds": lease_ttl_s,
                "minRuntimeSeconds": min_runtime_s,
            },
            "queue": {"maxPending": max_pending, "maxPendingPerTenant": max_pending_per_tenant},
            "tenants": specs,
            "access": {
                "admins": [hash_token(t) for t in ([ADMIN_TOKEN] if admin_tokens is None else admin_tokens)],
                "workers": _worker_entries(worker_tokens, worker_access),
            },
        },
    }
    if rate_limits is not None:
        doc["spec"]["rateLimits"] = rate_limits
    return yaml.safe_dump(doc, sort_keys=False)


def pools_policy_yaml(*, workers_per_pool: int = 1, lease_ttl_s: float = 30) -> str:
    """A platform of three pools, the test tenants' tokens and the role tokens of `policy_yaml`:

    - `cpu-a` (kind=cpu, cpuModel=icelake, 2 slots a worker) and `cpu-b` (kind=cpu,
      cpuModel=sapphire, 1 slot a worker), both with `compatibility: [cpuModel]`, so a snapshot
      taken on one does not resume on the other;
    - `gpu` (kind=gpu, gpu=a100, cpuModel=sapphire, 1 slot a worker, no compatibility keys).

    acme has Burstable nominal 1 / limit 2 and BestEffort in every pool; globex has Burstable in
    the CPU pools but none in `gpu` (its per-pool override); batch only BestEffort. The worker
    token's entry may join `cpu-a` and `gpu` (not `cpu-b`: a second entry, WORKER_B_TOKEN, may).
    Floors are 0; `workers_per_pool` static workers each (0 for none)."""
    doc: dict[str, Any] = yaml.safe_load(policy_yaml(floor=0, lease_ttl_s=lease_ttl_s))
    spec = doc["spec"]
    del spec["pool"]

    def pool(name: str, labels: dict[str, str], slots: int, compat: list[str]) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": name, "labels": labels}
        if compat:
            entry["compatibility"] = compat
        entry.update(
            slotsPerWorker=slots,
            workers=workers_per_pool,
            minWorkers=0,
            maxWorkers=max(workers_per_pool, 4),
            floor=0,
        )
        return entry

    spec["pools"] = [
        pool("cpu-a", {"kind": "cpu", "cpuModel": "icelake"}, 2, ["cpuModel"]),
        pool("cpu-b", {"kind": "cpu", "cpuModel": "sapphire"}, 1, ["cpuModel"]),
        pool("gpu", {"kind": "gpu", "gpu": "a100", "cpuModel": "sapphire"}, 1, []),
    ]
    spec["tenants"] = [
        {
            "name": "acme",
            "guaranteed": 0,
            "burstable": {"nominal": 1, "limit": 2},
            "tokens": [hash_token(TOKENS["acme"])],
        },
        {
            "name": "globex",
            "guaranteed": 0,
            "burstable": {"nominal": 1, "limit": 2},
            "bestEffort": {"limit": 0},
            "tokens": [hash_token(TOKENS["globex"])],
            "pools": [{"pool": "gpu", "burstableNominal": 0, "burstableLimit": 0}],
        },
        {
            "name": "batch",
            "guaranteed": 0,
            "burstable": {"nominal": 0, "limit": 0},
            "tokens": [hash_token(TOKENS["batch"])],
        },
    ]
    spec["access"]["workers"] = [
        {
            "tokens": [hash_token(WORKER_TOKEN)],
            "workerIdPrefix": WORKER_PREFIX,
            "maxSlots": WORKER_MAX_SLOTS,
            "pools": ["cpu-a", "gpu"],
        },
        {
            "tokens": [hash_token(WORKER_B_TOKEN)],
            "workerIdPrefix": "b",
            "maxSlots": WORKER_MAX_SLOTS,
            "pools": ["cpu-b"],
        },
    ]
    return yaml.safe_dump(doc, sort_keys=False)


def _worker_entries(tokens: list[str] | None, entries: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if entries is not None:
        return [{**e, "tokens": [hash_token(t) for t in e.get("tokens", [])]} for e in entries]
    tokens = [WORKER_TOKEN] if tokens is None else tokens
    if not tokens:
        return []
    return [
        {
            "tokens": [hash_token(t) for t in tokens],
            "workerIdPrefix": WORKER_PREFIX,
            "maxSlots": WORKER_MAX_SLOTS,
        }
    ]


def write_policy(directory: str | os.PathLike[str], text: str, name: str = "policy.yaml") -> str:
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


class ServerThread:
    """A server started by `start_server` on an event loop of its own thread."""

    def __init__(
        self,
        policy_path: str | None,
        *,
        static_pool: bool = True,
        heartbeat_interval_s: float = 5.0,
        grace_s: float = 0.5,
        grant_keys: GrantKeyring | None = None,
    ) -> None:
        self._args = (policy_path, static_pool, heartbeat_interval_s)
        self._grant_keys = grant_keys
        self._grace = grace_s
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.running: RunningServer | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        policy_path, static_pool, hb = self._args
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            self.running = await start_server(
                policy_path,
                "127.0.0.1:0",
                "127.0.0.1:0",
                static_pool,
                heartbeat_interval_s=hb,
                grant_keys=self._grant_keys,
            )
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self.running.stop(self._grace)

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(60):  # a bound, generous: the machine may be loaded
            raise TimeoutError("slotsched test server did not start within 60 s")
        if self._error is not None:
            raise self._error
        return self

    @property
    def server(self) -> RunningServer:
        assert self.running is not None
        return self.running

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.metrics_port}/metrics"

    def call(self, fn: Callable[[RunningServer], T]) -> T:
        """Run `fn(server)` on the server's loop (the only thread allowed to touch the core)."""
        assert self.loop is not None

        async def run() -> T:
            return fn(self.server)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def call_async(self, fn: Callable[[RunningServer], Awaitable[T]]) -> T:
        assert self.loop is not None

        async def run() -> T:
            return await fn(self.server)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)


@contextlib.contextmanager
def running_server(policy_text: str | None = None, **kwargs: Any) -> Iterator[ServerThread]:
    """A server on `policy_text` (secure mode), or on the built-in policy (dev mode) if None."""
    with tempfile.TemporaryDirectory(prefix="slotsched-test-") as d:
        path = write_policy(d, policy_text) if policy_text is not None else None
        server = ServerThread(path, **kwargs).start()
        try:
            yield server
        finally:
            server.stop()


class Client:
    """aio stubs on one channel, with the caller's credential as `md`. Use inside asyncio.run."""

    def __init__(self, target: str, token: str | None = None, tenant: str | None = None) -> None:
        self.target = target
        md: list[tuple[str, str]] = []
        if token is not None:
            md.append(("authorization", f"Bearer {token}"))
        if tenant is not None:
            md.append(("x-slotsched-tenant", tenant))
        self.md = tuple(md)

    async def __aenter__(self) -> Client:
        self.channel = grpc.aio.insecure_channel(self.target)
        self.scheduler = scheduler_pb2_grpc.SchedulerStub(self.channel)
        self.admin = admin_pb2_grpc.AdminStub(self.channel)
        self.workers = workers_pb2_grpc.WorkersStub(self.channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close(None)

    def acquire(self, session_id: str, qos: int, **kw: Any) -> Any:
        req = scheduler_pb2.AcquireRequest(session_id=session_id, qos=qos, **kw)
        return self.scheduler.Acquire(req, metadata=self.md)


async def next_event(call: Any, timeout: float = 5.0) -> scheduler_pb2.LeaseEvent:
    """The next event of an Acquire stream; fails the test if none comes in time."""
    ev = await asyncio.wait_for(call.read(), timeout)
    assert ev is not grpc.aio.EOF, f"stream ended: {await call.code()} {await call.details()}"
    return ev  # type: ignore[no-any-return]


async def until(call: Any, kind: str, timeout: float = 5.0) -> scheduler_pb2.LeaseEvent:
    """Read events until one of `kind` (queued, granted, yield_requested, revoked, ended)."""
    while True:
        ev = await next_event(call, timeout)
        if ev.WhichOneof("event") == kind:
            return ev


async def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    """Drain the stream and return its final status."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        while await asyncio.wait_for(call.read(), 10) is not grpc.aio.EOF:
            pass
    return await call.code(), await call.details()


@pytest.fixture
def grpc_server() -> Iterator[ServerThread]:
    """A secure-mode server on the default test policy (capacity 2, floor 1)."""
    with running_server(policy_yaml()) as server:
        yield server


def served_target(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> str:
    """The gRPC target a `slotsched serve` process prints ("serving gRPC on HOST:PORT"), read from
    its stdout; fails with its stderr when it printed none within `timeout_s`."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "serving gRPC on" in line:
            return line.rsplit(" ", 1)[1].strip()
    raise AssertionError(
        f"serve did not start: {proc.stderr.read() if proc.stderr and proc.poll() is not None else ''}"
    )
