"""Policy as a Kubernetes object: watch one SchedulingPolicy and apply it live.

`slotsched serve --policy-source kubernetes://NAMESPACE/NAME` reads the object at start-up, then
watches it (list, then watch from the list's resourceVersion; a 410 Gone relists) and hands every
new generation to `apply` (scheduler/app/: the loop's apply_policy, the path Admin.ApplyPolicy takes). A
policy the validator refuses, or `apply` refuses, leaves the one in force. The verdict goes to the
object's status subresource: conditions Valid and Applied (status, reason, message,
observedGeneration), the validator's messages included.

The kubernetes client blocks: the list/watch runs in a thread that hands objects to the event
loop; validation, apply and the status write (in a worker thread) happen in order on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, cast

from scheduler.policy.crd import APPLIED, GROUP, PLURAL, VALID, VERSION
from scheduler.policy.errors import PolicyError, Problem
from scheduler.policy.model import Policy
from scheduler.policy.validate import policy_from_dict
from snapshots.extras import needs_extra

with needs_extra("kubernetes", "--policy-source kubernetes://…"):  # not in a base install
    from kubernetes import client, config, watch
    from kubernetes.client.exceptions import ApiException

log = logging.getLogger("slotsched.policy")

SCHEME: Final = "kubernetes://"
MAX_MESSAGE: Final = 4000  # keep status small: the first errors say what to fix


@dataclass(frozen=True)
class PolicyRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.namespace}/{self.name}"


def parse_policy_source(source: str) -> PolicyRef:
    """`kubernetes://NAMESPACE/NAME` -> PolicyRef; ValueError naming --policy-source otherwise."""
    rest = source.removeprefix(SCHEME)
    ns, _, name = rest.partition("/")
    if not source.startswith(SCHEME) or not ns or not name or "/" in name:
        raise ValueError(f"--policy-source {source!r}: expected kubernetes://NAMESPACE/NAME")
    return PolicyRef(ns, name)


@dataclass(frozen=True)
class Outcome:
    """What `apply` did with a valid policy. `report` False: not this replica's to say (a standby
    applies nothing and writes no status; it applies the latest policy when it leads)."""

    applied: bool
    reason: str
    message: str
    report: bool = True


Apply = Callable[[Policy, list[Problem]], Awaitable[Outcome]]


def policy_document(obj: dict[str, Any]) -> dict[str, Any]:
    """The object in the policy file's shape: Kubernetes' own metadata and the status dropped."""
    meta = obj.get("metadata") or {}
    doc: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind", "spec") if k in obj}
    doc["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
    return doc


def _version(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid", "")), str(meta.get("generation", meta.get("resourceVersion", "")))


def default_api_client() -> client.ApiClient:
    """In a pod: the ServiceAccount's token; elsewhere: the kubeconfig."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


class PolicyWatcher:
    def __init__(
        self,
        ref: PolicyRef,
        api_client: client.ApiClient,
        *,
        watch_timeout_s: int = 300,
        backoff_s: float = 2.0,
    ) -> None:
        self.ref = ref
        self._api = client.CustomObjectsApi(api_client)
        self._watch_timeout_s = watch_timeout_s
        self._backoff_s = backoff_s
        self._apply: Apply | None = None
        self._reporting: Callable[[], bool] = lambda: True
        self._done: tuple[str, str] | None = None  # the object version last handled
        self._latest: dict[str, Any] | None = None  # the latest object seen
        self._stopped = threading.Event()
        self._w: watch.Watch | None = None
        self.relists = 0

    # -- start-up (blocking: call it in a thread) --------------------------------------------

    def read(self) -> tuple[Policy, list[Problem]]:
        """The object's policy now; PolicyError (the validator's) if invalid or absent."""
        try:
            obj = cast(
                dict[str, Any],
                self._api.get_namespaced_custom_object(
                    GROUP, VERSION, self.ref.namespace, PLURAL, self.ref.name
                ),
            )
        except ApiException as e:
            raise PolicyError(
                [Problem(str(self.ref), f"cannot read the SchedulingPolicy: {e.status} {e.reason}")]
            ) from e
        self._latest = obj
        return policy_from_dict(policy_document(obj))

    # -- the watch ----------------------------------------------------------------------------

    def bind(self, apply: Apply, reporting: Callable[[], bool] = lambda: True) -> None:
        """Where valid versions go; `reporting()` False (a standby): no status is written."""
        self._apply, self._reporting = apply, reporting

    async def run(self) -> None:
        """Report the object read at start-up, then apply every new version until cancelled."""
        aloop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        thread = threading.Thread(target=self._watch, args=(aloop, queue), name="policy-watch", daemon=True)
        thread.start()
        try:
            if self._latest is not None and self._reporting():
                # Applied at start-up (it built the loop), or by resync() on taking the lead
                # (then already handled): only its status is left to write.
                await self._handle(self._latest, applied_already=True)
            while True:
                obj = await queue.get()
                if obj is None:
                    log.warning("SchedulingPolicy %s is gone: the policy in force stays", self.ref)
                    continue
                self._latest = obj
                await self._handle(obj)
        finally:
            self.stop()

    async def resync(self) -> None:
        """Apply the latest object again and report it (a replica taking the lead)."""
        if self._latest is not None and self._apply is not None:
            await self._handle(self._latest, force=True)

    def stop(self) -> None:
        self._stopped.set()
        if self._w is not None:
            self._w.stop()  # type: ignore[no-untyped-call]

    def _watch(self, aloop: asyncio.AbstractEventLoop, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
        ns, name = self.ref.namespace, self.ref.name
        selector = f"metadata.name={name}"
        rv: str | None = None

        def put(obj: dict[str, Any] | None) -> None:
            aloop.call_soon_threadsafe(queue.put_nowait, obj)

        while not self._stopped.is_set():
            try:
                if rv is None:
                    listed = cast(
                        dict[str, Any],
                        self._api.list_namespaced_custom_object(
                            GROUP, VERSION, ns, PLURAL, field_selector=selector
                        ),
                    )
                    self.relists += 1
                    rv = listed["metadata"]["resourceVersion"]
                    items = listed.get("items") or []
                    put(items[0] if items else None)
                self._w = w = watch.Watch()  # type: ignore[no-untyped-call]
                for event in w.stream(  # type: ignore[no-untyped-call]
                    self._api.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    ns,
                    PLURAL,
                    field_selector=selector,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    # A timeout also turns off the client's own 410 retry (same stale version):
                    # a 410 reaches us, and we relist.
                    timeout_seconds=self._watch_timeout_s,
                    _request_timeout=(10, self._watch_timeout_s + 10),
                ):
                    if self._stopped.is_set():
                        return
                    obj = event["object"]
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        put(obj)
                    elif event["type"] == "DELETED":
                        put(None)
            except ApiException as e:
                if e.status == 410:
                    log.info("SchedulingPolicy %s: resourceVersion %s is gone, relisting", self.ref, rv)
                    rv = None
                    continue
                log.warning("SchedulingPolicy %s: watch failed: %s %s", self.ref, e.status, e.reason)
                self._stopped.wait(self._backoff_s)
            except Exception as e:  # noqa: BLE001 - the API server's outage must not end the watch
                if self._stopped.is_set():
                    return
                log.warning("SchedulingPolicy %s: watch failed: %s", self.ref, e)
                self._stopped.wait(self._backoff_s)

    # -- one version of the object --------------------------------------------------------------

    async def _handle(
        self, obj: dict[str, Any], *, force: bool = False, applied_already: bool = False
    ) -> None:
        version = _version(obj)
        if version == self._done and not force:
            return  # our own status write, or a resync of what is in force
        assert self._apply is not None
        try:
            policy, warnings = policy_from_dict(policy_document(obj))
        except PolicyError as e:
            self._done = version
            message = "; ".join(str(p) for p in e.problems)
            log.warning("SchedulingPolicy %s is invalid, the policy in force stays: %s", self.ref, message)
            if self._reporting():
                refused = Outcome(False, "Invalid", "not applied: the policy in force is unchanged")
                await self._report(obj, (False, "Invalid", message), refused)
            return
        if applied_already:
            outcome = Outcome(True, "Applied", "applied at start-up")
        else:
            try:
                outcome = await self._apply(policy, warnings)
            except Exception as e:  # e.g. the state store unreachable mid-write, a step-down
                # Not applied now; `_done` stays behind, so the next event or a resync retries.
                # The watch must outlive this: an exception here would end it for good.
                log.warning("SchedulingPolicy %s: not applied, will retry: %s", self.ref, e)
                if self._reporting():
                    await self._report(obj, (True, "Valid", "valid"), Outcome(False, "Unavailable", str(e)))
                return
        self._done = version
        if outcome.report:
            note = "; ".join(str(w) for w in warnings)
            valid = (True, "Valid", f"valid, with warnings: {note}" if note else "valid")
            await self._report(obj, valid, outcome)

    async def _report(self, obj: dict[str, Any], valid: tuple[bool, str, str], applied: Outcome) -> None:
        meta = obj.get("metadata") or {}
        generation = meta.get("generation")
        before = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
            status = "True" if ok else "False"
            prev = before.get(kind) or {}
            c: dict[str, Any] = {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message[:MAX_MESSAGE],
                # Kubernetes convention: the time the status last changed, not the last write.
                "lastTransitionTime": prev.get("lastTransitionTime", now)
                if prev.get("status") == status
                else now,
            }
            if generation is not None:
                c["observedGeneration"] = generation
            return c

        status: dict[str, Any] = {
            "conditions": [
                condition(VALID, *valid),
                condition(APPLIED, applied.applied, applied.reason, applied.message),
            ]
        }
        if generation is not None:
            status["observedGeneration"] = generation
        try:
            await asyncio.to_thread(
                self._api.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                self.ref.namespace,
                PLURAL,
                self.ref.name,
                {"status": status},
            )
        except ApiException as e:
            log.warning("SchedulingPolicy %s: cannot write its status: %s %s", self.ref, e.status, e.reason)
        except Exception as e:  # noqa: BLE001 - the status is a report: never fatal
            log.warning("SchedulingPolicy %s: cannot write its status: %s", self.ref, e)
