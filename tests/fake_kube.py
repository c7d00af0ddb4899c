"""A small Kubernetes API server for one namespaced custom resource: get, list, watch (chunked, from
a resourceVersion, 410 Gone for a version that is too old) and the status subresource (merge
patch). The real `kubernetes` client talks to it over HTTP, as it would to an API server.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class FakeObjectApi:
    """One object at /apis/GROUP/VERSION/namespaces/NS/PLURAL/NAME (None: absent)."""

    group: str
    version: str
    namespace: str
    plural: str
    obj: dict[str, Any] | None = None
    rv: int = 1
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    gone_before: int = 0  # a watch from a resourceVersion below this gets 410 Gone
    requests: list[tuple[str, str]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    closing: bool = False

    @property
    def base(self) -> str:
        return f"/apis/{self.group}/{self.version}/namespaces/{self.namespace}/{self.plural}"

    def _event(self, kind: str) -> None:
        assert self.obj is not None
        self.rv += 1
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        self.events.append((self.rv, kind, copy.deepcopy(self.obj)))
        self.cond.notify_all()

    def create(self, obj: dict[str, Any]) -> None:
        with self.cond:
            self.obj = copy.deepcopy(obj)
            self.obj.setdefault("metadata", {}).update(uid="uid-1", generation=1, namespace=self.namespace)
            self._event("ADDED")

    def set_spec(self, spec: dict[str, Any]) -> None:
        """An edit of the spec: a new generation (as `kubectl apply` makes)."""
        with self.cond:
            assert self.obj is not None
            self.obj["spec"] = copy.deepcopy(spec)
            self.obj["metadata"]["generation"] += 1
            self._event("MODIFIED")

    def expire_history(self) -> None:
        """Compaction: every resourceVersion seen so far is too old to watch from."""
        with self.cond:
            self.gone_before = self.rv + 1
            self.cond.notify_all()

    def condition(self, kind: str) -> dict[str, Any] | None:
        with self.cond:
            conds = ((self.obj or {}).get("status") or {}).get("conditions") or []
            return next((copy.deepcopy(c) for c in conds if c["type"] == kind), None)

    def wait_for(self, pred: Any, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; object: {json.dumps(self.obj)}")
            time.sleep(0.02)

    # -- the HTTP side -------------------------------------------------------------------------

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.requests.append((h.command, h.path))
        name = (self.obj or {}).get("metadata", {}).get("name")
        if h.command == "GET" and url.path == self.base and q.get("watch") in ("true", "1", "True"):
            return self._watch(h, int(q.get("resourceVersion") or 0), float(q.get("timeoutSeconds") or 30))
        if h.command == "GET" and url.path == self.base:
            with self.cond:
                items = [copy.deepcopy(self.obj)] if self.obj else []
                body = {
                    "apiVersion": f"{self.group}/{self.version}",
                    "kind": "List",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": items,
                }
            return _send(h, 200, body)
        if h.command == "GET" and url.path == f"{self.base}/{name}":
            return _send(h, 200, copy.deepcopy(self.obj))
        if h.command == "PATCH" and url.path == f"{self.base}/{name}/status":
            n = int(h.headers.get("Content-Length") or 0)
            patch = json.loads(h.rfile.read(n))
            with self.cond:
                assert self.obj is not None
                self.obj["status"] = patch["status"]  # a merge patch of status replaces its lists
                self._event("MODIFIED")  # the generation stays: status is a subresource
                out = copy.deepcopy(self.obj)
            return _send(h, 200, out)
        return _send(h, 404, status(404, "NotFound", f"no route {h.command} {h.path}"))

    def _watch(self, h: BaseHTTPRequestHandler, since: int, timeout_s: float) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        deadline = time.monotonic() + timeout_s
        sent = since
        while True:
            with self.cond:
                if since < self.gone_before:
                    out = [
                        {
                            "type": "ERROR",
                            "object": status(410, "Expired", f"too old resource version: {since}"),
                        }
                    ]
                    done = True
                else:
                    out = [{"type": k, "object": o} for rv, k, o in self.events if rv > sent]
                    sent = max([sent, *(rv for rv, _, _ in self.events)])
                    done = self.closing or time.monotonic() > deadline
                    if not out and not done:
                        self.cond.wait(0.05)
            try:
                for ev in out:
                    data = (json.dumps(ev) + "\n").encode()
                    h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    h.wfile.flush()
                if done:
                    h.wfile.write(b"0\r\n\r\n")
                    return
            except OSError:
                return


def _send(h: BaseHTTPRequestHandler, code: int, body: Any) -> None:
    data = json.dumps(body).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


@contextmanager
def serving(fake: FakeObjectApi) -> Iterator[client.ApiClient]:
    """Serve `fake` on loopback; yields a kubernetes ApiClient pointed at it."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            fake.handle(self)

        do_PATCH = do_GET  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{httpd.server_port}"
    api = client.ApiClient(cfg)
    try:
        yield api
    finally:
        with fake.cond:
            fake.closing = True
            fake.cond.notify_all()
        httpd.shutdown()
        httpd.server_close()
        api.close()
