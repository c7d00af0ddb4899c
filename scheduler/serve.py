"""The wiring root: composes the gRPC server, the durable state store, metrics and the autoscaler.

The only module that knows both scheduler/server/ and scheduler/state/ (see scheduler/ports.py
for the contract between them). `start_server` is what tests and embedders use (binds port 0,
returns the ports and a `stop`); `serve_forever` is what `slotsched serve` runs: it prints where it
listens, then on SIGTERM or SIGINT turns health to NOT_SERVING, refuses new work with UNAVAILABLE,
ends open Acquire streams with UNAVAILABLE (clients re-attach elsewhere), and stops the gRPC
server within the grace.

Without a policy file the server runs in INSECURE dev mode on the built-in policy: the tenant is
taken from the `x-slotsched-tenant` header and nothing is authenticated.

With `--state redis://…` (StateOptions) the replica journals to Redis and serves only while it
holds the leader lease (scheduler/state/replica.py): until then, and after stepping down, health
is NOT_SERVING and the leader gate answers the Scheduler, Workers, Admin and KEDA services
UNAVAILABLE "not the leader"; the reaper and the autoscaler run only on the leader.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health

from scheduler.autoscale_wiring import pool_autoscalers, register_static_workers
from scheduler.grants import GrantKeyError, GrantKeyring
from scheduler.listen import (
    ListenError,
    TlsFiles,
    add_grpc_port,
    check_bindable,
    close_metrics_http,
    split_hostport,
    start_metrics_http,
)
from scheduler.listen import default_advertise as default_advertise  # kept importable from here
from scheduler.policy.access import serving_warnings
from scheduler.policy.defaults import default_policy
from scheduler.policy.errors import PolicyError, Problem
from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import load_policy
from scheduler.pool_leadership import PoolLeadership, pool_leadership
from scheduler.replica_leadership import ReplicaLeadership
from scheduler.server.app import DEFAULT_LISTEN, DEFAULT_METRICS_LISTEN, assemble, assemble_pools
from scheduler.server.auth import TENANT_HEADER, Authenticator
from scheduler.server.loop import SchedulerLoop
from scheduler.server.metrics import Metrics
from scheduler.server.policy_log import PolicyLog
from scheduler.server.registry import WorkerRegistry
from slots.autoscaler.loop import Autoscaler
from slots.autoscaler.metrics import DemandGauges
from slots.autoscaler.pools import PoolAutoscalers, PoolsDemand
from snapshots.extras import needs_extra

if TYPE_CHECKING:  # redis and kubernetes are imported only when --state / --policy-source ask
    from scheduler.kube.policy_watch import Outcome, PolicyWatcher
    from scheduler.state.replica import Replica

log = logging.getLogger("slotsched.server")
GC_THRESHOLDS = (3_000, 100, 100)  # gc.set_threshold while serving (the default: 700, 10, 10)


@dataclass(frozen=True)
class StateOptions:
    """Where durable state lives (`slotsched serve --state`); memory keeps none."""

    state: str = "memory"  # memory | redis[+sentinel|+cluster]://… (scheduler/state/redis_connect.py)
    prefix: str = "slotsched"
    replica_id: str | None = None  # default hostname-pid
    #: The leader lease (scheduler/state/replica.py, "Election timing"): renewed every TTL/4, a
    #: dead leader is replaced within about TTL + campaign_interval_s.
    leader_ttl_s: float = 1.0
    campaign_interval_s: float = 0.1
    snapshot_every: int = 1000
    snapshot_interval_s: float = 60.0
    #: HOST:PORT clients are sent to while this replica leads (NOT_LEADER names it); default the
    #: listen address, or $POD_IP / the hostname with the bound port when listening on all.
    advertise: str | None = None
    #: "replica": one leader runs every pool; "pool": each pool its own leader, the pools spread
    #: over the replicas (scheduler/pool_leadership.py).
    leadership: str = "replica"


@dataclass
class RunningServer:
    port: int
    metrics_port: int | None
    host: str
    secure: bool
    policy: Policy
    loop: SchedulerLoop
    registry: WorkerRegistry
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    _httpd: WSGIServer | None = None
    autoscaler: Autoscaler | None = None  # the first pool's loop (the only one, of one pool)
    autoscalers: PoolAutoscalers | None = None  # every pool's loop, by pool
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stopped: bool = False
    replica: Replica | None = None  # redis mode
    #: Makes grants and tags lease ids; workers get their keys from it in Register and Heartbeat.
    grant_keys: GrantKeyring = field(default_factory=GrantKeyring.generate)
    transport: str = "plaintext"  # TlsFiles.describe() of the gRPC port
    pools: PoolLeadership | None = (
        None  # --leadership pool: every pool's unit and replica (loop: the first's)
    )

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    async def begin_shutdown(self) -> None:
        """Health NOT_SERVING, new calls UNAVAILABLE, open streams ended with UNAVAILABLE."""
        await self.health.enter_graceful_shutdown()
        self.loop.begin_shutdown()
        if self.pools is not None:
            self.pools.begin_shutdown()

    async def stop(self, grace: float | None = 1.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.begin_shutdown()
        if self.replica is not None:
            await self.replica.stop()  # resign at once: a standby takes over without waiting a TTL
        if self.pools is not None:
            await self.pools.stop()
        if self._httpd is not None:
            # shutdown() waits out serve_forever's 0.5 s poll; nothing needs to wait for it.
            threading.Thread(target=close_metrics_http, args=(self._httpd,), daemon=True).start()
        await self.server.stop(grace)
        for t in self._tasks:
            t.cancel()
        # Let them run their `finally` (a watcher's stop, a leader's task list) before the loop
        # closes; an exception of a task that had already failed is dropped here, not leaked.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.autoscalers is not None:
            # The local actuator stops the worker processes it started, waiting for each to exit:
            # off the event loop.
            await asyncio.to_thread(self.autoscalers.close)
        self.loop.close()
        if self.pools is not None:
            self.pools.close()


def _load(policy_path: str | None, watcher: PolicyWatcher | None = None) -> tuple[Policy, bool]:
    if watcher is not None:
        policy_path = str(watcher.ref)
        policy, warnings = watcher.read()
    elif policy_path is None:
        return default_policy(), False  # the INSECURE warning comes once the server has started
    else:
        policy, warnings = load_policy(policy_path)
    for w in [*warnings, *serving_warnings(policy)]:  # policy validate's (yaml_io.check_policy_file)
        log.warning("policy %s: %s", policy_path, w)
    return policy, True


async def start_server(
    policy_path: str | None = None,
    listen: str = "127.0.0.1:0",
    metrics_listen: str | None = "127.0.0.1:0",
    static_pool: bool = True,
    *,
    heartbeat_interval_s: float = 5.0,
    autoscaler_env: Mapping[str, str] | None = None,
    autoscale_period_s: float = 15.0,
    state: StateOptions | None = None,
    grant_keys: GrantKeyring | None = None,
    policy_source: str | None = None,
    kube_api: Any = None,
    tls: TlsFiles | None = None,
    metrics_tls: bool = False,
) -> RunningServer:
    """Start a server on the running event loop. Raises PolicyError for a bad policy file.

    `grant_keys` make grants and tag lease ids (scheduler/grants.py); None = a key generated now.
    Workers get their own keys, derived from it, in their Register and Heartbeat answers.

    `policy_source` `kubernetes://NAMESPACE/NAME` (instead of `policy_path`) reads the policy from
    that SchedulingPolicy object and applies its changes live (scheduler/kube/policy_watch.py);
    `kube_api` is the kubernetes ApiClient to use (default: in-cluster, else the kubeconfig).

    `tls` (cert + key, and a CA for mTLS) secures the gRPC port: every service, health,
    reflection and KEDA's endpoint; `metrics_tls` serves /metrics over HTTPS with the same files
    (otherwise metrics stay plain: keep that port cluster-internal, e.g. behind a NetworkPolicy).

    `autoscaler_env` (default: the process environment) chooses the companion autoscaler's
    actuator through SLOTSCHED_AUTOSCALER (one of `factory.KINDS`,
    slots/actuators/factory.py). The KEDA external scaler is always served.

    `state` (default memory) with a redis:// URL makes this a Redis-backed replica; a bad URL
    raises ValueError naming `--state`."""
    state = state or StateOptions()
    redis_url = None
    if state.state != "memory":
        scheme, sep, _ = state.state.partition("://")  # the scheme only: the URL may hold a password
        with needs_extra("redis", f"--state {scheme}{sep and '://…'}"):
            from scheduler.state.redis_store import parse_state

        redis_url = parse_state(state.state)
    watcher = _watcher(policy_path, policy_source, kube_api)
    if watcher is None:
        policy, secure = _load(policy_path)
    else:
        policy, secure = await asyncio.to_thread(_load, None, watcher)  # a blocking GET
    keys = grant_keys if grant_keys is not None else GrantKeyring.generate()
    metrics = Metrics()
    pools = pool_leadership(
        redis_url, state, policy, metrics, keys, watcher, heartbeat_interval_s, static_pool
    )
    loop = pools.routes.first().loop if pools is not None else SchedulerLoop(policy, metrics)
    policy_log = PolicyLog(policy_source or policy_path, durable=redis_url is not None)
    if watcher is not None and pools is not None:
        pools.bind_watcher(watcher, secure, policy_log)
    elif watcher is not None:
        _bind_policy_watcher(watcher, loop, secure, policy_log)
    auth = Authenticator(secure, (lambda: policy) if pools is not None else (lambda: loop.core.policy))
    registry = WorkerRegistry(loop, heartbeat_interval_s)

    def register_static_pool() -> None:  # local-N; of several pools local-<pool>-N, each in its pool
        register_static_workers(registry, policy)

    def serving() -> None:
        # A standby's (or a stepped-down leader's) core is stale: end KEDA's stream so it
        # reconnects through the Service to the leader, rather than read frozen demand.
        if loop.shutting_down:
            raise RuntimeError("this replica is not serving")

    demand = PoolsDemand(
        lambda name: loop.core.describe(name), lambda: loop.core.policy, serving
    )  # by the trigger's pool

    leadership: ReplicaLeadership | None = None
    if pools is not None:  # any replica answers each pool's demand from that pool's core here
        routes = pools.routes
        demand = PoolsDemand(routes.describe, lambda: policy)
        grpc_server = assemble_pools(routes, auth, demand, keys, policy_log)
    elif redis_url is None:
        if static_pool:
            register_static_pool()  # redis mode: on a fresh store only (the journal has them otherwise)
        grpc_server = assemble(loop, registry, auth, demand, grant_keys=keys, policy_log=policy_log)
    else:
        static = register_static_pool if static_pool else None
        leadership = ReplicaLeadership(redis_url, state, loop, registry, policy, metrics, static, watcher)
        grpc_server = assemble(
            loop,
            registry,
            auth,
            demand,
            serving=leadership.serving,
            leader=leadership.leader,
            grant_keys=keys,
            policy_log=policy_log,
            store_down=leadership.replica.reach.down,
        )
        if keys.ephemeral:
            log.warning(
                "no grant key given (--grant-key-file / $SLOTSCHED_GRANT_KEYS): lease ids and grants "
                "signed by this replica are refused after a failover"
            )
    placeholder = next((kid for kid in keys.kids if kid.startswith("replace-me")), None)
    if placeholder is not None:
        # The deploy's placeholder key is committed to the repository: anyone can sign with it
        # (a verify-only line too: every listed key verifies).
        log.warning(
            "grant key %r is the deploy's published placeholder: anyone can forge grants with it; "
            "replace deploy/base/secrets/grant-keys (README, Deploy)",
            placeholder,
        )
    await grpc_server.set_serving(redis_url is None)
    await grpc_server.set_store(redis_url is None)  # Redis: the replica says once it answers

    host = split_hostport(listen, "--listen")[0] or "0.0.0.0"
    if metrics_listen:
        check_bindable(metrics_listen, "--metrics-listen")  # before binding anything: nothing to undo
    server = grpc_server.server
    if metrics_tls and (tls is None or not tls.enabled):
        raise ValueError("--metrics-tls reuses --tls-cert and --tls-key: give them too")
    port = add_grpc_port(server, listen, "--listen", tls)
    httpd = None
    metrics_port = None
    if metrics_listen:
        try:
            mtls = tls if metrics_tls else None
            httpd = start_metrics_http(metrics_listen, "--metrics-listen", metrics.registry, mtls)
        except (ListenError, ValueError):
            await server.stop(None)  # frees the gRPC port bound above
            raise
        metrics_port = httpd.server_port
    await server.start()
    running = RunningServer(
        port, metrics_port, host, secure, policy, loop, registry, server, grpc_server.health, httpd
    )
    running.grant_keys = keys
    running.transport = tls.describe() if tls is not None else "plaintext"
    running.pools = pools
    _add_autoscaler(running, metrics, host, autoscaler_env, autoscale_period_s)
    if running.autoscalers is None:  # KEDA or static: the drain estimate and oldest waits still
        metrics.registry.register(DemandGauges(demand.pool_names, demand.scale_input))
    if watcher is not None:
        running._tasks.append(asyncio.create_task(watcher.run()))
    if pools is not None:
        try:
            await pools.start(grpc_server, host, port)
        except BaseException:
            await running.stop(0)
            raise
        if running.autoscalers is not None:  # gated per pool: a pool's loop runs where it is led
            running._tasks.append(asyncio.create_task(running.autoscalers.run()))
    elif leadership is None:
        running._tasks.append(asyncio.create_task(registry.run_reaper()))
        if running.autoscalers is not None:
            running._tasks.append(asyncio.create_task(running.autoscalers.run()))
    else:
        await leadership.start(running, grpc_server)
    policy_log.started()
    if not secure:
        # Only now, with the ports bound: a start that fails says why, not this.
        log.warning(
            "INSECURE dev mode: no policy file, using the built-in policy; the tenant is taken from the "
            "%s header and no caller is authenticated. Do not expose this port.",
            TENANT_HEADER,
        )
    return running


def _watcher(policy_path: str | None, source: str | None, kube_api: Any) -> PolicyWatcher | None:
    if source is None:
        return None
    if policy_path is not None:
        raise ValueError("--policy and --policy-source name two policies: give one")
    from scheduler.kube.policy_watch import PolicyWatcher, default_api_client, parse_policy_source

    ref = parse_policy_source(source)
    return PolicyWatcher(ref, kube_api if kube_api is not None else default_api_client())


def _bind_policy_watcher(watcher: PolicyWatcher, loop: SchedulerLoop, secure: bool, plog: PolicyLog) -> None:
    """Every new version of the SchedulingPolicy object goes Admin.ApplyPolicy's path."""
    from scheduler.kube.policy_watch import Outcome

    async def apply(policy: Policy, warnings: list[Problem]) -> Outcome:
        if loop.shutting_down:  # a standby (or stopping): the leader applies it; we do on taking the lead
            return Outcome(False, "Standby", "", report=False)
        if secure and not policy.access.admins:  # Admin.ApplyPolicy's refusal, for the same reason
            return Outcome(
                False,
                "NoAdmins",
                "spec.access.admins is empty: it would lock every operator out of the "
                "Admin service; the policy in force is unchanged",
            )
        old = loop.core.policy
        loop.apply_policy(policy)
        generation = plog.next_generation()
        await loop.durable()
        plog.applied(generation, old, policy, f"the object {watcher.ref}")
        return Outcome(True, "Applied", f"policy {policy.name} in force")

    watcher.bind(apply, reporting=lambda: not loop.shutting_down)


def _add_autoscaler(
    running: RunningServer,
    metrics: Metrics,
    host: str,
    autoscaler_env: Mapping[str, str] | None,
    period_s: float,
) -> None:
    """The companion autoscaler, if SLOTSCHED_AUTOSCALER names an actuator (not started here):
    one loop per pool, each with its own actuator (scheduler/autoscale_wiring.py)."""
    env = os.environ if autoscaler_env is None else autoscaler_env
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    where = f"{reach}:{running.port}"
    if running.pools is not None:  # each pool's loop runs where the pool is led
        loops = running.pools.autoscalers(env, where, metrics.registry, period_s)
    else:
        loops = pool_autoscalers(running.loop, running.registry, env, where, metrics.registry, period_s)
    if loops is not None:
        running.autoscalers, running.autoscaler = loops, loops.first


async def serve_forever(
    policy_path: str | None = None,
    listen: str = DEFAULT_LISTEN,
    metrics_listen: str | None = DEFAULT_METRICS_LISTEN,
    static_pool: bool = True,
    grace_s: float = 5.0,
    autoscaler: str | None = None,
    state: StateOptions | None = None,
    grant_key_file: str | None = None,
    policy_source: str | None = None,
    tls: TlsFiles | None = None,
    metrics_tls: bool = False,
) -> int:
    """Serve until SIGTERM/SIGINT, then shut down gracefully. Returns the process exit code.

    `autoscaler` (one of slots/actuators/factory.KINDS) overrides SLOTSCHED_AUTOSCALER.
    `grant_key_file` (else $SLOTSCHED_GRANT_KEYS, else a generated key) makes grants."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        env = dict(os.environ)
        if autoscaler is not None:
            env["SLOTSCHED_AUTOSCALER"] = autoscaler
        keys = GrantKeyring.from_config(grant_key_file, env)
        running = await start_server(
            policy_path,
            listen,
            metrics_listen,
            static_pool,
            autoscaler_env=env,
            state=state,
            policy_source=policy_source,
            grant_keys=keys,
            tls=tls,
            metrics_tls=metrics_tls,
        )
    except GrantKeyError as e:
        print(f"slotsched: cannot start: {e}", file=sys.stderr)
        return 2
    except PolicyError as e:
        for p in e.problems:
            print(f"error: {p}", file=sys.stderr)
        print(f"slotsched: cannot start: invalid policy {policy_path or policy_source}", file=sys.stderr)
        return 2
    except ListenError as e:
        print(f"error: {e}", file=sys.stderr)  # names the address and the flag
        return 2
    except (OSError, RuntimeError, ValueError) as e:
        print(f"slotsched: cannot start: {e}", file=sys.stderr)
        return 1
    # Everything allocated so far (modules, descriptors, the policy) lives as long as the process:
    # keep it out of the collector's full passes, which otherwise stall the loop now and then.
    gc.freeze()
    # Serving allocates no garbage cycles to speak of (a second of a flood: 6 objects), yet at
    # the default thresholds the collector walked the young objects ~80 times a second and the
    # older ones every few: pauses of 5-30 ms, a quiet tenant's p99 under a flood
    # (bench/flood.py). Cycles are still collected, less often.
    gc.set_threshold(*GC_THRESHOLDS)
    print(f"slotsched serving gRPC on {running.target}", flush=True)  # the target last: scripts read it
    print(f"slotsched transport: {running.transport}", flush=True)
    if running.metrics_port is not None:
        mhost = split_hostport(metrics_listen or "", "--metrics-listen")[0] or "0.0.0.0"
        scheme = "https" if metrics_tls else "http"
        print(f"slotsched metrics on {scheme}://{mhost}:{running.metrics_port}/metrics", flush=True)
    if running.secure:
        n = len(running.policy.tenants)
        print(f"slotsched mode: secure, policy {running.policy.name!r} with {n} tenants", flush=True)
    else:
        print(f"slotsched mode: INSECURE dev mode (tenant from the {TENANT_HEADER} header)", flush=True)
    keys = running.grant_keys
    signer = "a key generated at start (no --grant-key-file)" if keys.ephemeral else f"key {keys.kids[0]!r}"
    verifying = "" if keys.ephemeral else f" (verifying {', '.join(keys.kids)})"
    print(f"slotsched grants: made with {signer}{verifying}", flush=True)

    replica = running.replica
    if replica is not None:
        down = replica.reach.down()  # not a standby: it cannot lead until the store answers
        role = f"{down}; retrying" if down else "leader" if replica.serving else "standby"
        print(f"slotsched state: redis ({role}, replica {replica.store.replica_id})", flush=True)
    if running.pools is not None:
        led = running.pools.led_here()
        print(
            f"slotsched state: redis, per-pool leadership (replica {running.pools.replica_id}, "
            f"leading {len(led)} of {len(running.pools.units)} pools: {', '.join(led) or 'none yet'})",
            flush=True,
        )

    stop = asyncio.Event()
    aloop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        if threading.current_thread() is threading.main_thread():
            aloop.add_signal_handler(sig, stop.set)
    waits = [asyncio.create_task(stop.wait())]
    if replica is not None:
        waits.append(asyncio.create_task(replica.fatal_event.wait()))
    if running.pools is not None:
        waits.append(asyncio.create_task(running.pools.fatal_event.wait()))
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in waits:
        w.cancel()
    fatal = replica.fatal if replica is not None else running.pools.fatal if running.pools else None
    print("slotsched shutting down", flush=True)
    await running.stop(grace_s)
    print("slotsched stopped", flush=True)
    if fatal is not None:
        print(f"slotsched: cannot recover the state: {fatal}", file=sys.stderr)
        return 1
    return 0
