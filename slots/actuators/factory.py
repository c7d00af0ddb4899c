"""Choosing an actuator from configuration (flags or the environment of a pod).

Why one module: `slotsched serve` and the Kubernetes manifests (deploy/components/autoscaler
sets SLOTSCHED_AUTOSCALER* variables) name the actuator as text; everything that turns that text
into an object, and every error about it, lives here. `BUILDERS` is the one list of kinds (the
`--autoscaler` choices read it): a new actuator is its module and one row here.

    SLOTSCHED_AUTOSCALER               off (default) | local | kubernetes | dry-run
    SLOTSCHED_AUTOSCALER_TARGET        kubernetes: Deployment/NAME, StatefulSet/NAME, or
                                       PLURAL.GROUP/VERSION/KIND/NAME (a custom resource)
    SLOTSCHED_AUTOSCALER_POD_SELECTOR  kubernetes: label selector of the worker pods (optional
                                       for a Deployment or StatefulSet: read from its scale)
    POD_NAMESPACE                      kubernetes: the target's namespace (default "default")
    SLOTSCHED_WORKER_COMMAND           local: the worker command line (shell words), with
                                       {worker_id} {slots} {scheduler} {pool}; default `slotsched worker`
    SLOTSCHED_WORKER_STOP_COMMAND      local: run on removal too, same placeholders (a container's stop)
    SLOTSCHED_WORKER_IMAGE             local: run each worker as a container of this image instead
                                       (local.container_command; a worker command wins over it)
    SLOTSCHED_CONTAINER_RUNTIME        local, with an image: docker (default) or podman (a path too)

Many pools: `actuator_from_env(..., pool=NAME, target=TEXT)` builds one pool's actuator: the
kubernetes one scales the pool's own target (its `PoolSpec.target`; with several pools each
needs one), the local one starts workers that join that pool (`--pool NAME`, ids
`worker-NAME-N`).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from slots.actuators.base import Actuator
from slots.actuators.dry_run import DryRunActuator
from slots.actuators.local import (
    DEFAULT_WORKER_COMMAND,
    LocalActuator,
    container_command,
    container_stop_command,
)
from snapshots.extras import needs_extra

if TYPE_CHECKING:  # the kubernetes client is imported only when a cluster is the target
    from slots.actuators.kubernetes import ScaleTarget

#: What needs the kubernetes client, the `kubernetes` extra (absent from a base install).
_KUBERNETES_USER = "the kubernetes actuator (--autoscaler kubernetes)"


def parse_target(text: str, namespace: str = "default") -> ScaleTarget:
    """`Deployment/NAME`, `StatefulSet/NAME` or `PLURAL.GROUP/VERSION/KIND/NAME` as a ScaleTarget."""
    with needs_extra("kubernetes", _KUBERNETES_USER):
        from slots.actuators.kubernetes import ScaleTarget

    parts = text.strip().split("/")
    if len(parts) == 2 and parts[0].lower() in ("deployment", "deployments"):
        return ScaleTarget.deployment(parts[1], namespace)
    if len(parts) == 2 and parts[0].lower() in ("statefulset", "statefulsets"):
        return ScaleTarget.statefulset(parts[1], namespace)
    if len(parts) == 4 and "." in parts[0]:
        plural, group = parts[0].split(".", 1)
        return ScaleTarget.custom(group, parts[1], plural, parts[2], parts[3], namespace)
    raise ValueError(
        f"autoscaler target {text!r}: expected Deployment/NAME, StatefulSet/NAME "
        "or PLURAL.GROUP/VERSION/KIND/NAME"
    )


#: Builds the actuator of one kind from the environment, the scheduler's address and slots per worker.
Builder = Callable[[Mapping[str, str], str, int], Actuator | None]


def _off(env: Mapping[str, str], scheduler: str, slots: int) -> None:
    return None


def _dry_run(env: Mapping[str, str], scheduler: str, slots: int) -> Actuator:
    return DryRunActuator()


def _local(env: Mapping[str, str], scheduler: str, slots: int) -> Actuator:
    command = env.get("SLOTSCHED_WORKER_COMMAND")
    image = env.get("SLOTSCHED_WORKER_IMAGE", "")
    runtime = env.get("SLOTSCHED_CONTAINER_RUNTIME", "docker")
    stop_text = env.get("SLOTSCHED_WORKER_STOP_COMMAND")
    stop: tuple[str, ...] | None = tuple(shlex.split(stop_text)) if stop_text else None
    pool = env.get(_POOL, "")
    if command:
        argv: tuple[str, ...] = tuple(shlex.split(command))
    elif image:
        argv = container_command(image, runtime, worker_args=("--pool", "{pool}") if pool else ())
        stop = stop or container_stop_command(runtime)
    else:
        argv = (*DEFAULT_WORKER_COMMAND, "--pool", "{pool}") if pool else DEFAULT_WORKER_COMMAND
    if not pool:
        return LocalActuator(scheduler=scheduler, slots=slots, command=argv, stop_command=stop)
    return LocalActuator(
        scheduler=scheduler,
        slots=slots,
        command=argv,
        pool=pool,
        id_prefix=f"worker-{pool}",
        stop_command=stop,
    )


def _kubernetes(env: Mapping[str, str], scheduler: str, slots: int) -> Actuator:
    with needs_extra("kubernetes", _KUBERNETES_USER):
        from slots.actuators.kubernetes import KubernetesActuator

    text = env.get("SLOTSCHED_AUTOSCALER_TARGET", "")
    if not text and env.get(_POOL):
        raise ValueError(
            f"pool {env[_POOL]!r} has no autoscaler target (spec.pools[].target): "
            "with several pools each names its own"
        )
    if not text:
        raise ValueError("SLOTSCHED_AUTOSCALER=kubernetes needs SLOTSCHED_AUTOSCALER_TARGET")
    target = parse_target(text, env.get("POD_NAMESPACE", "default"))
    return KubernetesActuator(target, pod_selector=env.get("SLOTSCHED_AUTOSCALER_POD_SELECTOR") or None)


#: Every actuator kind, in the order `--help` shows them: the one list (cli/serve.py reads it).
BUILDERS: dict[str, Builder] = {"off": _off, "local": _local, "kubernetes": _kubernetes, "dry-run": _dry_run}
KINDS = tuple(BUILDERS)
_POOL = "SLOTSCHED_AUTOSCALER_POOL"  # set by actuator_from_env for one pool of several


def actuator_from_env(
    env: Mapping[str, str], *, scheduler: str, slots: int, pool: str = "", target: str = ""
) -> Actuator | None:
    """The actuator the environment asks for, or None for `off`. Raises ValueError on bad config.
    `pool` (one pool of several) and its `target` (overriding SLOTSCHED_AUTOSCALER_TARGET)."""
    if pool or target:
        env = {**env, _POOL: pool}
        if pool:
            env.pop("SLOTSCHED_AUTOSCALER_TARGET", None)  # one target cannot size several pools
        if target:
            env["SLOTSCHED_AUTOSCALER_TARGET"] = target
    kind = env.get("SLOTSCHED_AUTOSCALER", "off").strip().lower() or "off"
    build = BUILDERS.get(kind)
    if build is None:
        raise ValueError(f"SLOTSCHED_AUTOSCALER={kind!r}: expected one of {', '.join(KINDS)}")
    return build(env, scheduler, slots)
