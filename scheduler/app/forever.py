"""`slotsched serve`: start a server (root.py), print where it listens, serve until SIGTERM or
SIGINT, then shut down gracefully: health NOT_SERVING, new work refused with UNAVAILABLE, open
Acquire streams ended with UNAVAILABLE (clients re-attach elsewhere), and the gRPC server
stopped within the grace. A replica whose state cannot be recovered stops and exits 1.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading

from scheduler.app.options import StateOptions
from scheduler.app.root import start_server
from scheduler.grants import GrantKeyError, GrantKeyring
from scheduler.listen import ListenError, TlsFiles, split_hostport
from scheduler.policy.errors import PolicyError
from scheduler.server.app import DEFAULT_LISTEN, DEFAULT_METRICS_LISTEN
from scheduler.server.auth import TENANT_HEADER

GC_THRESHOLDS = (3_000, 100, 100)  # gc.set_threshold while serving (the default: 700, 10, 10)


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

    mode = running.mode
    line = mode.state_line()
    if line is not None:
        print(f"slotsched state: {line}", flush=True)

    stop = asyncio.Event()
    aloop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        if threading.current_thread() is threading.main_thread():
            aloop.add_signal_handler(sig, stop.set)
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(mode.fatal_event.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in waits:
        w.cancel()
    fatal = mode.fatal
    print("slotsched shutting down", flush=True)
    await running.stop(grace_s)
    print("slotsched stopped", flush=True)
    if fatal is not None:
        print(f"slotsched: cannot recover the state: {fatal}", file=sys.stderr)
        return 1
    return 0
