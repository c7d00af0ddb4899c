"""The leader gate of a replicated server: while this replica does not serve (a standby, or a
leader that stepped down), every rpc of the gated services answers UNAVAILABLE with reason
NOT_LEADER, naming the leader when it is known, or the state store when this replica cannot
reach it (errors.not_leader); health and reflection stay open.

Why a registrar and not a `grpc.aio.ServerInterceptor`: with any interceptor installed, grpc.aio
runs the interceptor chain as a coroutine on every call before it finds the handler, about 60 us
per call on a busy two-core machine, a fifth of what a durable Acquire adds to a reply
(bench/failover.py, `durable_p50_ratio`). Here the check is one call in front of the servicer's
own coroutine, wrapped once at registration, like the wire guard (scheduler/api/guard.py).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from scheduler.server import errors


class GatedRegistrar:
    """Pass this in place of the server (or another registrar) to the generated
    `add_*Servicer_to_server` functions: the methods of `services` answer NOT_LEADER while
    `serving()` is False; any other service is registered unchanged."""

    def __init__(
        self,
        inner: Any,
        services: Sequence[str],
        serving: Callable[[], bool],
        leader: Callable[[], str | None],
        store_down: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._inner = inner
        self._services = frozenset(services)
        self._prefixes = tuple(f"/{name}/" for name in services)
        self._serving = serving
        self._leader = leader
        self._store_down = store_down

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._inner.add_generic_rpc_handlers(tuple(_GatedGeneric(h, self) for h in handlers))

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        if service in self._services:
            handlers = {name: self.gate(h) for name, h in handlers.items()}
        self._inner.add_registered_method_handlers(service, handlers)

    def gates(self, method: str) -> bool:
        return method.startswith(self._prefixes)

    async def _refuse(self, context: Any) -> None:
        await errors.abort(context, errors.not_leader(self._leader(), self._store_down()))

    def gate(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """`handler` with a behaviour that first checks `serving()`."""
        kw = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        serving, refuse = self._serving, self._refuse
        for kind, make in (
            ("unary_unary", grpc.unary_unary_rpc_method_handler),
            ("unary_stream", grpc.unary_stream_rpc_method_handler),
            ("stream_unary", grpc.stream_unary_rpc_method_handler),
            ("stream_stream", grpc.stream_stream_rpc_method_handler),
        ):
            inner = getattr(handler, kind)
            if inner is None:
                continue
            if inspect.isasyncgenfunction(inner):
                return make(_gated_generator(inner, serving, refuse), **kw)
            return make(_gated(inner, serving, refuse), **kw)
        return handler


def _gated(inner: Any, serving: Callable[[], bool], refuse: Callable[[Any], Any]) -> Any:
    async def behaviour(request: Any, context: Any) -> Any:
        if not serving():
            await refuse(context)
            return None
        return await inner(request, context)

    return behaviour


def _gated_generator(inner: Any, serving: Callable[[], bool], refuse: Callable[[Any], Any]) -> Any:
    async def behaviour(request: Any, context: Any) -> AsyncIterator[Any]:
        if not serving():
            await refuse(context)
            return
        async for item in inner(request, context):
            yield item

    return behaviour


class _GatedGeneric(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, inner: grpc.GenericRpcHandler, registrar: GatedRegistrar) -> None:
        self._inner = inner
        self._registrar = registrar
        self._cache: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(details)
        if handler is None or not self._registrar.gates(details.method):
            return handler
        gated = self._cache.get(details.method)
        if gated is None:  # only methods this handler serves: unknown names never get here
            gated = self._cache[details.method] = self._registrar.gate(handler)
        return gated
