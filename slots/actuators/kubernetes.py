"""Workers as pods: the actuator sets the replica count of a Deployment, a StatefulSet or a custom
resource (e.g. a WorkerPool), with the official `kubernetes` client.

Why pod-deletion-cost: a ReplicaSet that scales down picks its victims itself. The loop has
already drained particular workers (worker id == pod name), so before lowering the replica count
`remove` annotates exactly those pods with `controller.kubernetes.io/pod-deletion-cost: "-1000"`,
and the ReplicaSet deletes them and no other. A StatefulSet always removes its highest ordinals,
so there `remove` only proceeds when the drained pods are those ordinals (prefer a Deployment).

Every scale decision the loop acts on also becomes a core/v1 Event on the target, carrying the
numbers that caused it (desired, current, weighted demand, reason), so `kubectl describe` shows
why the pool changed. Calls that fail raise `ActuatorError` (HTTP status mapped in one place);
pods that fail or crash-loop are reported once by `poll_errors`.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from slots.actuators.base import ActuatorError, ScaleNote, WorkerInfo, WorkerPhase

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MERGE_PATCH = "application/merge-patch+json"
_BAD_WAITING = frozenset(
    {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"}
)
_PERMANENT = frozenset({400, 401, 403, 404, 405, 415, 422})

T = TypeVar("T")


@dataclass(frozen=True)
class ScaleTarget:
    kind: str  # Deployment, StatefulSet, or a custom resource's kind
    name: str
    namespace: str = "default"
    group: str = ""  # custom resources only: group, version, plural
    version: str = ""
    plural: str = ""

    @classmethod
    def deployment(cls, name: str, namespace: str = "default") -> ScaleTarget:
        return cls("Deployment", name, namespace)

    @classmethod
    def statefulset(cls, name: str, namespace: str = "default") -> ScaleTarget:
        return cls("StatefulSet", name, namespace)

    @classmethod
    def custom(
        cls, group: str, version: str, plural: str, kind: str, name: str, namespace: str = "default"
    ) -> ScaleTarget:
        return cls(kind, name, namespace, group, version, plural)

    @property
    def is_custom(self) -> bool:
        return bool(self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.is_custom else "apps/v1"


def load_api_client() -> client.ApiClient:
    """In-cluster service account first, then the local kubeconfig."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


class KubernetesActuator:
    def __init__(
        self,
        target: ScaleTarget,
        *,
        pod_selector: str | None = None,
        api_client: client.ApiClient | None = None,
        component: str = "slotsched-autoscaler",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if target.kind not in ("Deployment", "StatefulSet") and not target.is_custom:
            raise ValueError(f"{target.kind} needs group, version and plural (ScaleTarget.custom)")
        if target.is_custom and not pod_selector:
            raise ValueError("a custom resource target needs pod_selector (its scale has no selector)")
        api = api_client if api_client is not None else load_api_client()
        self.target = target
        self.component = component
        self._api = api
        self._owns_api = api_client is None
        self._apps = client.AppsV1Api(api)
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._selector = pod_selector
        self._clock = clock
        self._errors: builtins.list[str] = []
        self._reported: set[tuple[str, str]] = set()
        self._scaled_away: set[str] = set()  # pods this actuator already removed

    # ------------------------------------------------------------------ Actuator

    def scale_to(self, n: int) -> None:
        current = self._read_replicas()
        if n > current:
            self._patch_replicas(n)

    def remove(self, worker_ids: builtins.list[str]) -> None:
        ids = [w for w in worker_ids if w not in self._scaled_away]
        if not ids:
            return
        if self.target.kind == "StatefulSet":
            self._check_highest_ordinals(ids)
        marked = [pod for pod in ids if self._mark_for_deletion(pod)]
        if marked:
            current = self._read_replicas()
            self._patch_replicas(max(0, current - len(marked)))
        self._scaled_away.update(ids)

    def list(self) -> builtins.list[WorkerInfo]:
        ns = self.target.namespace
        pods = _call(
            f"list pods {self.selector()!r}",
            lambda: self._core.list_namespaced_pod(ns, label_selector=self.selector()),
        )
        out = []
        names = set()
        for pod in pods.items:
            name = pod.metadata.name if pod.metadata is not None and pod.metadata.name else ""
            names.add(name)
            phase = pod.status.phase if pod.status is not None and pod.status.phase else "Unknown"
            if pod.metadata is not None and pod.metadata.deletion_timestamp is not None:
                state = WorkerPhase.STOPPING
            elif phase in ("Failed", "Succeeded"):
                state = WorkerPhase.STOPPING
                self._report(name, phase, f"pod {name} is {phase}")
            elif phase == "Running" and _ready(pod):
                state = WorkerPhase.RUNNING
            else:
                state = WorkerPhase.STARTING
            for reason in _waiting_reasons(pod):
                self._report(name, reason, f"pod {name}: a container is waiting with {reason}")
            out.append(WorkerInfo(name, state, phase))
        self._scaled_away &= names
        return out

    def poll_errors(self) -> builtins.list[str]:
        out, self._errors = self._errors, []
        return out

    def record(self, note: ScaleNote) -> None:
        """A core/v1 Event on the target with the numbers behind the decision."""
        t = self.target
        now = datetime.datetime.fromtimestamp(self._clock(), datetime.UTC)
        reason = "ScaleUp" if note.direction == "up" else "ScaleDown"
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{t.name}.{time.time_ns():x}", namespace=t.namespace),
            involved_object=client.V1ObjectReference(
                api_version=t.api_version, kind=t.kind, name=t.name, namespace=t.namespace
            ),
            reason=reason,
            message=note.message(),
            type="Warning" if note.at_ceiling else "Normal",
            source=client.V1EventSource(component=self.component, host=socket.gethostname()),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        _call(
            f"create Event on {t.kind} {t.name}",
            lambda: self._core.create_namespaced_event(
                t.namespace, event, _headers={"Content-Type": "application/json"}
            ),
        )

    def close(self) -> None:
        if self._owns_api:
            self._api.close()  # type: ignore[no-untyped-call]

    # ------------------------------------------------------------------ the target

    def selector(self) -> str:
        if self._selector is None:
            t = self.target
            if t.kind == "Deployment":
                scale = _call(
                    f"read {t.kind} {t.name}/scale",
                    lambda: self._apps.read_namespaced_deployment_scale(t.name, t.namespace),
                )
            else:
                scale = _call(
                    f"read {t.kind} {t.name}/scale",
                    lambda: self._apps.read_namespaced_stateful_set_scale(t.name, t.namespace),
                )
            if scale.status is None or not scale.status.selector:
                raise ActuatorError(
                    f"{t.kind} {t.name}/scale has no selector: pass pod_selector", retry=False
                )
            self._selector = scale.status.selector
        return self._selector

    def _read_replicas(self) -> int:
        t = self.target
        what = f"read {t.kind} {t.name} replicas"
        if t.is_custom:
            obj = _call(
                what,
                lambda: self._custom.get_namespaced_custom_object(
                    t.group, t.version, t.namespace, t.plural, t.name
                ),
            )
            spec = cast(dict[str, Any], obj).get("spec") or {}
            return int(spec.get("replicas") or 0)
        if t.kind == "Deployment":
            scale = _call(what, lambda: self._apps.read_namespaced_deployment_scale(t.name, t.namespace))
        else:
            scale = _call(what, lambda: self._apps.read_namespaced_stateful_set_scale(t.name, t.namespace))
        return int(scale.spec.replicas or 0) if scale.spec is not None else 0

    def _patch_replicas(self, n: int) -> None:
        t = self.target
        body = {"spec": {"replicas": n}}
        what = f"set {t.kind} {t.name} replicas to {n}"
        if t.is_custom:
            _call(
                what,
                lambda: self._custom.patch_namespaced_custom_object(
                    t.group, t.version, t.namespace, t.plural, t.name, body, _content_type=MERGE_PATCH
                ),
            )
        elif t.kind == "Deployment":
            _call(
                what,
                lambda: self._apps.patch_namespaced_deployment_scale(
                    t.name, t.namespace, body, _content_type=MERGE_PATCH
                ),
            )
        else:
            _call(
                what,
                lambda: self._apps.patch_namespaced_stateful_set_scale(
                    t.name, t.namespace, body, _content_type=MERGE_PATCH
                ),
            )

    def _mark_for_deletion(self, pod: str) -> bool:
        """Annotate the pod so the ReplicaSet removes it first; False if it is already gone."""
        body = {"metadata": {"annotations": {DELETION_COST: "-1000"}}}
        try:
            patched = self._core.patch_namespaced_pod(
                pod, self.target.namespace, body, _content_type=MERGE_PATCH
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise _error(f"annotate pod {pod}", e) from e
        except Exception as e:
            raise ActuatorError(f"annotate pod {pod}: {e}") from e
        return patched.metadata is None or patched.metadata.deletion_timestamp is None

    def _check_highest_ordinals(self, ids: builtins.list[str]) -> None:
        n = self._read_replicas()
        top = {f"{self.target.name}-{i}" for i in range(max(0, n - len(ids)), n)}
        if set(ids) != top:
            raise ActuatorError(
                f"StatefulSet {self.target.name} removes its highest ordinals ({', '.join(sorted(top))}), "
                f"not {', '.join(ids)}: use a Deployment to remove the drained pods",
                retry=False,
            )

    def _report(self, pod: str, reason: str, message: str) -> None:
        if (pod, reason) not in self._reported:
            self._reported.add((pod, reason))
            self._errors.append(message)


def _call(what: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ApiException as e:
        raise _error(what, e) from e
    except ActuatorError:
        raise
    except Exception as e:  # connection refused, TLS, timeouts: worth retrying
        raise ActuatorError(f"{what}: {type(e).__name__}: {e}") from e


def _error(what: str, e: ApiException) -> ActuatorError:
    """HTTP status to what the caller should do: 4xx (but 408/409/429) won't heal by retrying."""
    message = ""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        message = str(json.loads(e.body or "").get("message") or "")  # a Status object
    status = e.status if isinstance(e.status, int) else 0
    return ActuatorError(
        f"{what}: HTTP {status} {e.reason or ''} {message}".rstrip(), retry=status not in _PERMANENT
    )


def _ready(pod: client.V1Pod) -> bool:
    conditions = pod.status.conditions if pod.status is not None else None
    return any(c.type == "Ready" and c.status == "True" for c in conditions or [])


def _waiting_reasons(pod: client.V1Pod) -> builtins.list[str]:
    statuses = pod.status.container_statuses if pod.status is not None else None
    out = []
    for s in statuses or []:
        waiting = s.state.waiting if s.state is not None else None
        if waiting is not None and waiting.reason in _BAD_WAITING:
            out.append(waiting.reason)
    return out
