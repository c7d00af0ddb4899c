"""What every slotsched gRPC server does with a request's bytes before a servicer sees them.

Why here and not in each servicer: gRPC Python decodes a request before the handler runs, and a
decoder that raises (protobuf's DecodeError on hostile bytes) ends the call UNKNOWN with a Python
class name in the message. And a field's length is best checked once, for every rpc alike, before
any servicer quotes it into an error (a 1 MB id echoed into the status message overflows the
trailers and comes back RESOURCE_EXHAUSTED). So the servers register their servicers through
`GuardedRegistrar`, which wraps every unary-request method: the request is decoded here, its
string fields and maps are checked against `limit_for`, and a request that fails either never
reaches the servicer: the server's `refuse(context, field, description)` ends the call
(INVALID_ARGUMENT, chosen by the server: the scheduler's in scheduler/server/errors.py).

Limits (defined in scheduler/api/wire.py, documented in the proto files): a request string
field is at most 256 bytes (`MAX_STRING_BYTES`: ids, names, tenants), except a snapshot `uri`,
a `page_token` and KEDA's `scalerMetadata` values (2048 bytes) and ApplyPolicy's `yaml`
(256 KiB, `MAX_POLICY_BYTES`); a map or repeated field holds at most 64 entries. Errors quote
at most `QUOTE_CHARS` characters of an offending value. A Timestamp or Duration outside the
range protobuf defines for it is refused too (converting one raises ValueError deep inside a
servicer).

Streaming-request methods are registered unchanged (server reflection: grpc decodes its
messages one by one inside the servicer's iterator), except those whose request type is in
`STREAM_REQUESTS` (the Scheduler's Channel): their messages are decoded and checked by the same
rules, one by one. Such a message batches independent items in one repeated field (named in
`STREAM_REQUESTS`: a Channel's `commands`), and one bad item must not sink the others (other
sessions share the stream), so each element of that field is checked on its own: a message with
some elements over a limit arrives at the servicer as a `PartlyRefused` (the decoded message,
and per refused element's index a `Refused` naming the field from the element down, e.g.
`acquire.session_id`), which the servicer answers element by element. What cannot be put on one
element arrives as a `Refused`, and the servicer ends the call with it: bytes that do not
decode, more elements than allowed (a Channel message may hold up to `MAX_CHANNEL_COMMANDS`
commands, `_ENTRY_LIMITS`), another field of the message over a limit. A message that passes
arrives as itself, as before.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from scheduler.api.wire import (  # the limits' one home; imported from here too
    MAX_CHANNEL_COMMANDS,
    MAX_ENTRIES,
    MAX_LONG_STRING_BYTES,
    MAX_POLICY_BYTES,
    MAX_STRING_BYTES,
    QUOTE_CHARS,
)

#: Repeated fields (by name) allowed more than MAX_ENTRIES entries: a Channel batches commands.
_ENTRY_LIMITS: dict[str, int] = {"commands": MAX_CHANNEL_COMMANDS}
#: Streaming-request messages decoded and checked here (their servicer handles a `Refused` and a
#: `PartlyRefused`), each with its repeated message field whose elements are refused one by one.
STREAM_REQUESTS: dict[str, str] = {"slotsched.v1.ChannelRequest": "commands"}

#: Fields (by name, in any request message) allowed more than MAX_STRING_BYTES.
_LONGER: dict[str, int] = {
    "uri": MAX_LONG_STRING_BYTES,
    "page_token": MAX_LONG_STRING_BYTES,
    "scalerMetadata": MAX_LONG_STRING_BYTES,
    "yaml": MAX_POLICY_BYTES,
}

#: What a server does with a refused request: end the call with INVALID_ARGUMENT naming `field`.
Refuse = Callable[[Any, str, str], Awaitable[None]]


def limit_for(field: str) -> int:
    """The most bytes a request's string field named `field` may hold."""
    return _LONGER.get(field, MAX_STRING_BYTES)


def quote(value: str, chars: int = QUOTE_CHARS) -> str:
    """`value` for an error message: repr of at most `chars` characters, then an ellipsis."""
    return repr(value) if len(value) <= chars else repr(value[:chars]) + "…"


class Refused:
    """What the guarded deserializer returns instead of a request: why it was refused."""

    __slots__ = ("description", "field")

    def __init__(self, field: str, description: str) -> None:
        self.field = field
        self.description = description


class PartlyRefused:
    """What the guarded deserializer of a `STREAM_REQUESTS` message returns when only some
    elements of its batched field are over a limit: the decoded `message`, and `refused`: per
    such element's index, why (its field path starts at the element, e.g. `acquire.session_id`).
    Every other element passed every check."""

    __slots__ = ("message", "refused")

    def __init__(self, message: Message, refused: dict[int, Refused]) -> None:
        self.message = message
        self.refused = refused


# ---------------------------------------------------------------- field checks

# One plan per message type: (field name, kind, limit, nested plan); computed once.
_Plan = tuple[tuple[str, str, int, Any], ...]
_PLANS: dict[str, _Plan] = {}


def _plan(desc: Any) -> _Plan:
    cached = _PLANS.get(desc.full_name)
    if cached is not None:
        return cached
    _PLANS[desc.full_name] = ()  # a recursive message type stops here
    steps: list[tuple[str, str, int, Any]] = []
    for f in desc.fields:
        repeated = f.is_repeated
        if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            steps.append((f.name, "map", limit_for(f.name), f.message_type.fields_by_name["value"]))
        elif f.type == FieldDescriptor.TYPE_STRING:
            steps.append((f.name, "strings" if repeated else "string", limit_for(f.name), None))
        elif f.type == FieldDescriptor.TYPE_BYTES:
            steps.append((f.name, "bytes" if repeated else "byte", limit_for(f.name), None))
        elif f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.full_name in _TIME_RANGES:
            steps.append((f.name, "times" if repeated else "time", 0, f.message_type.full_name))
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            nested = _plan(f.message_type)
            if nested or repeated:
                steps.append((f.name, "messages" if repeated else "message", 0, f.message_type))
        elif repeated:
            steps.append((f.name, "scalars", 0, None))
    plan = tuple(steps)
    _PLANS[desc.full_name] = plan
    return plan


# The ranges protobuf defines for its time types (converting anything outside raises ValueError).
_TIME_RANGES = {
    "google.protobuf.Timestamp": (-62_135_596_800, 253_402_300_799, 0),
    "google.protobuf.Duration": (-315_576_000_000, 315_576_000_000, -999_999_999),
}


def _bad_time(path: str, value: Any, kind: str) -> tuple[str, str] | None:
    lo, hi, min_nanos = _TIME_RANGES[kind]
    s, n = value.seconds, value.nanos
    if lo <= s <= hi and min_nanos <= n <= 999_999_999 and not (s and n and (s < 0) != (n < 0)):
        return None
    return path, f"not a valid {kind.rpartition('.')[2]} (seconds {s}, nanos {n})"


def _too_long(path: str, value: str | bytes, limit: int) -> tuple[str, str] | None:
    if len(value) * 4 <= limit:  # a str of n characters is at most 4n bytes of UTF-8
        return None
    size = len(value.encode()) if isinstance(value, str) else len(value)
    if size <= limit:
        return None
    shown = quote(value) if isinstance(value, str) else f"{size} bytes"
    return path, f"longer than {limit} bytes (got {size}): {shown}"


# A checker: the first (field path from the message, description) of a message over its
# limits, or None. One is compiled per message type from its plan, once, so checking a request
# costs a call per field it could hold (a oneof: one `WhichOneof`, then only the member set),
# not an interpretation of the plan per field (2.4 -> 1.7 us a Channel command on a bench machine).
_Bad = tuple[str, str] | None
_Check = Callable[[Any], _Bad]
_CHECKERS: dict[str, _Check] = {}


def _ok(msg: Any) -> _Bad:
    return None


def _checker(desc: Any) -> _Check:
    chk = _CHECKERS.get(desc.full_name)
    if chk is None:
        chk = _CHECKERS[desc.full_name] = _compile(desc, _plan(desc))
    return chk


def _step(name: str, kind: str, limit: int, extra: Any, is_set: bool = False) -> _Check:
    """The check of one plan step (`is_set`: the field is known to be set, a oneof's member)."""
    if kind in ("string", "byte"):

        def one_string(msg: Any) -> _Bad:
            value = getattr(msg, name)
            if value and len(value) * 4 > limit:  # a str of n characters is at most 4n bytes
                return _too_long(name, value, limit)
            return None

        return one_string
    if kind == "message":
        full, dot = extra.full_name, name + "."

        def one_message(msg: Any) -> _Bad:
            if not is_set and not msg.HasField(name):  # reading an unset submessage builds one
                return None
            bad = (_CHECKERS.get(full) or _checker(extra))(getattr(msg, name))
            return None if bad is None else (dot + bad[0], bad[1])

        return one_message
    if kind == "time":

        def one_time(msg: Any) -> _Bad:
            if not is_set and not msg.HasField(name):
                return None
            return _bad_time(name, getattr(msg, name), extra)

        return one_time

    def entries(msg: Any) -> _Bad:
        value = getattr(msg, name)
        # most requests leave their maps and lists empty (an Acquire's selector, fallback_pools)
        return _entries(value, name, kind, limit, extra) if value else None

    return entries


def _entries(value: Any, path: str, kind: str, limit: int, extra: Any) -> _Bad:
    """The check of a map or repeated field."""
    most = _ENTRY_LIMITS.get(path, MAX_ENTRIES)
    if len(value) > most:
        return path, f"more than {most} entries (got {len(value)})"
    if kind == "map":
        for k, v in value.items():
            if isinstance(k, str) and (bad := _too_long(f"{path}[key]", k, MAX_STRING_BYTES)):
                return bad
            if extra.type == FieldDescriptor.TYPE_MESSAGE:
                if bad := check(v, f"{path}[{quote(str(k), 16)}]."):
                    return bad
            elif isinstance(v, str | bytes) and (bad := _too_long(f"{path}[{quote(str(k), 16)}]", v, limit)):
                return bad
    elif kind in ("strings", "bytes"):
        for i, v in enumerate(value):
            if bad := _too_long(f"{path}[{i}]", v, limit):
                return bad
    elif kind == "times":
        for i, v in enumerate(value):
            if bad := _bad_time(f"{path}[{i}]", v, extra):
                return bad
    elif kind == "messages":
        for i, v in enumerate(value):
            if bad := check(v, f"{path}[{i}]."):
                return bad
    return None


def _compile(desc: Any, plan: _Plan) -> _Check:
    """The checker of `plan`'s steps, in order; a run of steps that are members of one oneof
    becomes one step (at most one member is set: the same first error)."""
    steps: list[_Check] = []
    i = 0
    while i < len(plan):
        oneof = desc.fields_by_name[plan[i][0]].containing_oneof
        j = i + 1
        while (
            j < len(plan) and oneof is not None and desc.fields_by_name[plan[j][0]].containing_oneof is oneof
        ):
            j += 1
        if oneof is None or j - i < 2:
            steps.append(_step(*plan[i]))
        else:
            steps.append(_one_of(oneof.name, {st[0]: _step(*st, is_set=True) for st in plan[i:j]}))
        i = j
    if not steps:
        return _ok
    if len(steps) == 1:
        return steps[0]
    run = tuple(steps)

    def each(msg: Any) -> _Bad:
        for step in run:
            bad = step(msg)
            if bad is not None:
                return bad
        return None

    return each


def _one_of(oneof: str, members: dict[str, _Check]) -> _Check:
    def one_of(msg: Any) -> _Bad:
        which = msg.WhichOneof(oneof)
        step = members.get(which) if which is not None else None
        return None if step is None else step(msg)

    return one_of


def check(msg: Message, prefix: str = "", plan: _Plan | None = None) -> tuple[str, str] | None:
    """The first (field path, description) of `msg` over its limits, or None (`plan`: the
    fields to check, all by default)."""
    chk = _checker(msg.DESCRIPTOR) if plan is None else _compile(msg.DESCRIPTOR, plan)
    bad = chk(msg)
    return bad if bad is None or not prefix else (prefix + bad[0], bad[1])


def deserializer(cls: type[Message]) -> Callable[[bytes], Message | Refused]:
    """Decode a request of type `cls`, or return Refused: not a valid message, or over a limit."""
    name = cls.DESCRIPTOR.name
    from_string = cls.FromString
    chk = _checker(cls.DESCRIPTOR)

    def decode(data: bytes) -> Message | Refused:
        try:
            msg = from_string(data)
        except Exception:  # DecodeError, or a RuntimeError from upb on deeply nested groups
            return Refused("request", f"not a valid {name} ({len(data)} bytes)")
        bad = chk(msg)
        return msg if bad is None else Refused(*bad)

    return decode


def batch_deserializer(
    cls: type[Message], field: str
) -> Callable[[bytes], Message | Refused | PartlyRefused]:
    """Decode a message of type `cls` whose repeated message field `field` batches independent
    items: Refused for what concerns the whole message (not valid, too many items, another field
    over a limit), PartlyRefused if some items are over a limit, else the message (module doc)."""
    desc = cls.DESCRIPTOR
    f = desc.fields_by_name[field]
    if not f.is_repeated or f.type != FieldDescriptor.TYPE_MESSAGE:
        raise ValueError(f"{desc.full_name}.{field} is not a repeated message field")
    name = desc.name
    from_string = cls.FromString
    rest = _compile(desc, tuple(step for step in _plan(desc) if step[0] != field))
    most = _ENTRY_LIMITS.get(field, MAX_ENTRIES)
    check_item = _checker(f.message_type)

    def decode(data: bytes) -> Message | Refused | PartlyRefused:
        try:
            msg = from_string(data)
        except Exception:  # DecodeError, or a RuntimeError from upb on deeply nested groups
            return Refused("request", f"not a valid {name} ({len(data)} bytes)")
        if bad := rest(msg):
            return Refused(*bad)
        items = getattr(msg, field)
        if len(items) > most:
            return Refused(field, f"more than {most} entries (got {len(items)})")
        refused: dict[int, Refused] | None = None
        for i, item in enumerate(items):
            if bad := check_item(item):
                if refused is None:
                    refused = {}
                refused[i] = Refused(*bad)
        return msg if refused is None else PartlyRefused(msg, refused)

    return decode


# ---------------------------------------------------------------- handler wrapping


def _request_class(handler: grpc.RpcMethodHandler) -> type[Message] | None:
    fn = handler.request_deserializer
    owner = getattr(fn, "__self__", None)  # the generated code passes `Message.FromString`
    return owner if isinstance(owner, type) and issubclass(owner, Message) else None


def guard_handler(handler: grpc.RpcMethodHandler | None, refuse: Refuse) -> grpc.RpcMethodHandler | None:
    """`handler` with a guarded deserializer and a behaviour that refuses a Refused request."""
    if handler is None:
        return handler
    cls = _request_class(handler)
    if cls is None:
        return handler
    if handler.request_streaming:
        batched = STREAM_REQUESTS.get(cls.DESCRIPTOR.full_name)
        if batched is None or handler.stream_stream is None:
            return handler
        return grpc.stream_stream_rpc_method_handler(
            handler.stream_stream,
            request_deserializer=batch_deserializer(cls, batched),
            response_serializer=handler.response_serializer,
        )
    kw = {"request_deserializer": deserializer(cls), "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary(request: Any, context: Any) -> Any:
            if type(request) is Refused:
                await refuse(context, request.field, request.description)
                return None
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, **kw)
    inner_stream = handler.unary_stream
    if inspect.isasyncgenfunction(inner_stream):

        async def stream_gen(request: Any, context: Any) -> AsyncIterator[Any]:
            if type(request) is Refused:
                await refuse(context, request.field, request.description)
                return
            async for item in inner_stream(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(stream_gen, **kw)

    async def stream(request: Any, context: Any) -> Any:  # writes with context.write
        if type(request) is Refused:
            await refuse(context, request.field, request.description)
            return None
        return await inner_stream(request, context)

    return grpc.unary_stream_rpc_method_handler(stream, **kw)


class _GuardedGeneric(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, inner: grpc.GenericRpcHandler, refuse: Refuse) -> None:
        self._inner = inner
        self._refuse = refuse
        self._cache: dict[str, grpc.RpcMethodHandler | None] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        guarded = self._cache.get(method)
        if guarded is None:
            guarded = guard_handler(self._inner.service(handler_call_details), self._refuse)
            if guarded is not None:  # only methods this handler serves: unknown names are unbounded
                self._cache[method] = guarded
        return guarded


class GuardedRegistrar:
    """Pass this instead of the server to the generated `add_*Servicer_to_server` functions (and
    health, reflection): every unary-request method it registers is guarded (module doc)."""

    def __init__(self, server: grpc.aio.Server, refuse: Refuse) -> None:
        self._server = server
        self._refuse = refuse

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_GuardedGeneric(h, self._refuse) for h in handlers))

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        guarded = {name: guard_handler(h, self._refuse) for name, h in handlers.items()}
        self._server.add_registered_method_handlers(service, guarded)


__all__ = [
    "MAX_CHANNEL_COMMANDS",
    "MAX_ENTRIES",
    "STREAM_REQUESTS",
    "MAX_LONG_STRING_BYTES",
    "MAX_POLICY_BYTES",
    "MAX_STRING_BYTES",
    "QUOTE_CHARS",
    "GuardedRegistrar",
    "PartlyRefused",
    "Refused",
    "batch_deserializer",
    "check",
    "deserializer",
    "guard_handler",
    "limit_for",
    "quote",
]
