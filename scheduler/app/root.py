"""The composition root: `start_server` builds a running server from its options.

Which serving mode runs is decided here once, by `MODES` (`--leadership`, and whether `--state`
names a store); each mode's module says what it wires (running.py's `Mode`), and nothing below
this package knows which mode runs: every servicer serves the units of the mode's router
(scheduler/server/pool_routes.py). The rest is the same for every mode: the policy, the grant
keys, metrics, the gRPC server, the ports, the autoscaler's loops, the policy watcher.

Without a policy file the server runs in INSECURE dev mode on the built-in policy: the tenant is
taken from the `x-slotsched-tenant` header and nothing is authenticated.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from scheduler.app.memory import Memory
from scheduler.app.one_leader import OneLeader
from scheduler.app.options import StateOptions
from scheduler.app.policy_source import load, watcher_of
from scheduler.app.pools import PoolLeadership
from scheduler.app.running import Build, Mode, RunningServer
from scheduler.grants import GrantKeyring
from scheduler.listen import (
    ListenError,
    TlsFiles,
    add_grpc_port,
    check_bindable,
    split_hostport,
    start_metrics_http,
)
from scheduler.server.auth import TENANT_HEADER, Authenticator
from scheduler.server.metrics import Metrics
from scheduler.server.policy_log import PolicyLog
from scheduler.state.config import state_url
from slots.autoscaler.metrics import DemandGauges

log = logging.getLogger("slotsched.server")

#: `(--leadership, a state store named)` -> the mode that wires it.
MODES: dict[tuple[str, bool], Callable[[Build], Mode]] = {
    ("replica", False): Memory,  # one loop, state in memory
    ("replica", True): OneLeader,  # one loop, journaled, served by the leader of every pool
    ("pool", True): PoolLeadership,  # a unit per pool, each led by its own replica
}
_LEADERSHIPS = tuple(dict.fromkeys(leadership for leadership, _ in MODES))  # replica, pool


def mode_of(state: StateOptions, durable: bool) -> Callable[[Build], Mode]:
    build = MODES.get((state.leadership, durable))
    if build is not None:
        return build
    if state.leadership not in _LEADERSHIPS:
        raise ValueError(f"--leadership {state.leadership!r}: {' or '.join(_LEADERSHIPS)}")
    raise ValueError(
        f"--leadership {state.leadership} needs --state redis…: each pool's leader lease lives there"
    )


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

    `state` (default memory) with a store's URL (scheduler/state/config.py) makes this a
    replica journaling there; a bad URL raises ValueError naming `--state`."""
    state = state or StateOptions()
    url = state_url(state.state)
    watcher = watcher_of(policy_path, policy_source, kube_api)
    if watcher is None:
        policy, secure = load(policy_path)
    else:
        policy, secure = await asyncio.to_thread(load, None, watcher)  # a blocking GET
    keys = grant_keys if grant_keys is not None else GrantKeyring.generate()
    metrics = Metrics()
    wire = mode_of(state, url is not None)
    mode = wire(Build(policy, state, url, metrics, keys, watcher, heartbeat_interval_s, static_pool))
    plog = PolicyLog(policy_source or policy_path, durable=mode.durable)
    if watcher is not None:
        mode.bind_watcher(watcher, secure, plog)
    auth = Authenticator(secure, mode.policy)
    demand = mode.demand()
    grpc_server = mode.assemble(auth, keys, plog, demand)
    placeholder = next((kid for kid in keys.kids if kid.startswith("replace-me")), None)
    if placeholder is not None:
        # The deploy's placeholder key is committed to the repository: anyone can sign with it
        # (a verify-only line too: every listed key verifies).
        log.warning(
            "grant key %r is the deploy's published placeholder: anyone can forge grants with it; "
            "replace deploy/base/secrets/grant-keys (README, Deploy)",
            placeholder,
        )
    await grpc_server.set_serving(not mode.durable)
    await grpc_server.set_store(not mode.durable)  # a replica says once the store answers

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
    first = mode.router.first()
    running = RunningServer(
        port,
        metrics_port,
        host,
        secure,
        policy,
        first.loop,
        first.registry,
        server,
        grpc_server.health,
        mode,
        httpd,
    )
    running.grant_keys = keys
    running.transport = tls.describe() if tls is not None else "plaintext"
    _add_autoscaler(running, metrics, host, autoscaler_env, autoscale_period_s)
    if running.autoscalers is None:  # KEDA or static: the drain estimate and oldest waits still
        metrics.registry.register(DemandGauges(demand.pool_names, demand.scale_input))
    if watcher is not None:
        running._tasks.append(asyncio.create_task(watcher.run()))
    await mode.start(running, grpc_server)
    plog.started()
    if not secure:
        # Only now, with the ports bound: a start that fails says why, not this.
        log.warning(
            "INSECURE dev mode: no policy file, using the built-in policy; the tenant is taken from the "
            "%s header and no caller is authenticated. Do not expose this port.",
            TENANT_HEADER,
        )
    return running


def _add_autoscaler(
    running: RunningServer,
    metrics: Metrics,
    host: str,
    autoscaler_env: Mapping[str, str] | None,
    period_s: float,
) -> None:
    """The companion autoscaler, if SLOTSCHED_AUTOSCALER names an actuator (not started here):
    one loop per pool, each with its own actuator (scheduler/autoscale_wiring.py); the mode
    starts them (where each pool is led)."""
    env = os.environ if autoscaler_env is None else autoscaler_env
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    loops = running.mode.autoscalers(env, f"{reach}:{running.port}", metrics.registry, period_s)
    if loops is not None:
        running.autoscalers, running.autoscaler = loops, loops.first
