"""gRPC server reflection v1 (`grpc.reflection.v1.ServerReflection`) beside v1alpha.

grpcio-reflection ships only `grpc.reflection.v1alpha`; grpcurl, Postman and the Go and Java
tooling ask for v1 first. v1 is the same protocol under another package, message for message and
field for field, so the v1alpha servicer serves it: its messages (de)serialize v1's bytes as they
are. The v1 file descriptor is derived from the installed v1alpha one (package and type names
renamed) and added to the default pool, so reflection can describe its own v1 service too.
"""

from __future__ import annotations

from typing import Any, Final

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection, reflection_pb2

SERVICE_NAME: Final = "grpc.reflection.v1.ServerReflection"
FILE_NAME: Final = "grpc/reflection/v1/reflection.proto"
_OLD, _NEW = "grpc.reflection.v1alpha", "grpc.reflection.v1"


def v1_file() -> FileDescriptor:
    """The v1 reflection proto's descriptor, in the default pool (added on first use)."""
    pool = descriptor_pool.Default()
    try:
        return pool.FindFileByName(FILE_NAME)
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    fdp.name, fdp.package = FILE_NAME, _NEW
    fdp.options.Clear()
    fdp.options.java_package, fdp.options.java_multiple_files = "io.grpc.reflection.v1", True
    fdp.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    old = f".{_OLD}."
    for msg in fdp.message_type:
        for f in msg.field:
            if f.type_name.startswith(old):
                f.type_name = f".{_NEW}." + f.type_name[len(old) :]
    for svc in fdp.service:
        for m in svc.method:
            m.input_type = m.input_type.replace(old, f".{_NEW}.")
            m.output_type = m.output_type.replace(old, f".{_NEW}.")
    pool.Add(fdp)
    return pool.FindFileByName(FILE_NAME)


def enable(service_names: tuple[str, ...], server: Any) -> None:
    """Reflection v1alpha and v1 on an aio server, both listing `service_names` and themselves."""
    v1_file()
    names = (*service_names, reflection.SERVICE_NAME, SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection.enable_server_reflection(names, server)
    handler = grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
