"""The wire contract: generated code is fresh, importable, and the protos follow the house rules.

- `scheduler/api/gen/` matches what `python scripts/gen_proto.py` generates (else: regenerate);
- every generated module imports without sys.path tricks;
- every enum's zero value is `<PREFIX>_UNSPECIFIED`;
- the KEDA external scaler keeps KEDA's names, numbers, types and streaming shape;
- every message, field, enum, enum value, service and rpc of slotsched.v1 has a leading comment.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor, FileDescriptor

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
GEN_DIR = ROOT / "scheduler" / "api" / "gen"
SLOTSCHED_PROTOS = sorted(
    p.relative_to(PROTO_DIR).as_posix() for p in (PROTO_DIR / "slotsched").rglob("*.proto")
)


def _generated_modules() -> list[str]:
    mods = []
    for path in sorted(GEN_DIR.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        mods.append(".".join(parts))
    return mods


def test_generated_code_is_fresh() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (
        "generated code is stale; run `python scripts/gen_proto.py`\n" + proc.stdout + proc.stderr
    )


def test_expected_modules_exist() -> None:
    mods = set(_generated_modules())
    for name in ("common", "scheduler", "workers", "admin", "worker"):
        for suffix in ("_pb2", "_pb2_grpc"):
            assert f"scheduler.api.gen.slotsched.v1.{name}{suffix}" in mods
            if suffix == "_pb2":
                assert (GEN_DIR / "slotsched" / "v1" / f"{name}_pb2.pyi").is_file()
    assert "scheduler.api.gen.externalscaler.externalscaler_pb2_grpc" in mods


@pytest.mark.parametrize("module", _generated_modules())
def test_generated_module_imports(module: str) -> None:
    importlib.import_module(module)


def _file_descriptors() -> list[FileDescriptor]:
    mods = [importlib.import_module(m) for m in _generated_modules() if m.endswith("_pb2")]
    return [m.DESCRIPTOR for m in mods]


def _all_enums(fd: FileDescriptor) -> Iterator[EnumDescriptor]:
    yield from fd.enum_types_by_name.values()

    def walk(msg: Descriptor) -> Iterator[EnumDescriptor]:
        yield from msg.enum_types
        for nested in msg.nested_types:
            yield from walk(nested)

    for msg in fd.message_types_by_name.values():
        yield from walk(msg)


def test_enum_zero_values_are_unspecified() -> None:
    seen = 0
    for fd in _file_descriptors():
        for enum in _all_enums(fd):
            zero = enum.values_by_number.get(0)
            assert zero is not None, f"{enum.full_name} has no zero value"
            assert zero.name.endswith("_UNSPECIFIED"), f"{enum.full_name} zero value is {zero.name}"
            assert zero.index == 0, f"{enum.full_name}: the _UNSPECIFIED value must come first"
            seen += 1
    assert seen >= 7


def test_services_and_rpcs() -> None:
    from scheduler.api.gen.slotsched.v1 import admin_pb2, scheduler_pb2, worker_pb2, workers_pb2

    def methods(mod: object, service: str) -> dict[str, tuple[bool, bool]]:
        svc = mod.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
        assert svc.full_name == f"slotsched.v1.{service}"
        return {m.name: (m.client_streaming, m.server_streaming) for m in svc.methods}

    assert methods(scheduler_pb2, "Scheduler") == {
        "Acquire": (False, True),
        "Release": (False, False),
        "Renew": (False, False),
        "Yield": (False, False),
        "GetSession": (False, False),
        "RequestPermit": (False, False),
        "SettlePermit": (False, False),
        "Channel": (True, True),
        "RequestPermit": (False, False),
        "SettlePermit": (False, False),
    }
    assert set(methods(workers_pb2, "Workers")) == {"Register", "Heartbeat", "Drain", "Deregister"}
    assert set(methods(admin_pb2, "Admin")) == {
        "GetPolicy",
        "ApplyPolicy",
        "DescribePool",
        "ListLeases",
        "ListQueue",
    }
    assert set(methods(worker_pb2, "Worker")) == {"Start", "Checkpoint", "Stop", "Status"}
    event = scheduler_pb2.LeaseEvent.DESCRIPTOR
    assert [f.name for f in event.oneofs_by_name["event"].fields] == [
        "queued",
        "granted",
        "yield_requested",
        "revoked",
        "ended",
        "yield_cancelled",
    ]


def test_tenant_is_never_a_request_field() -> None:
    """The tenant comes from the caller's credential (Admin filters and Worker.Start excepted)."""
    from scheduler.api.gen.slotsched.v1 import scheduler_pb2, workers_pb2

    for mod in (scheduler_pb2, workers_pb2):
        for svc in mod.DESCRIPTOR.services_by_name.values():
            for m in svc.methods:
                assert "tenant" not in m.input_type.fields_by_name, f"{m.full_name} takes a tenant"


_KEDA: dict[str, dict[str, tuple[int, int, bool]]] = {
    # message -> field -> (number, type, repeated)
    "ScaledObjectRef": {
        "name": (1, FieldDescriptor.TYPE_STRING, False),
        "namespace": (2, FieldDescriptor.TYPE_STRING, False),
        "scalerMetadata": (3, FieldDescriptor.TYPE_MESSAGE, True),  # map<string, string>
    },
    "IsActiveResponse": {"result": (1, FieldDescriptor.TYPE_BOOL, False)},
    "GetMetricSpecResponse": {"metricSpecs": (1, FieldDescriptor.TYPE_MESSAGE, True)},
    "MetricSpec": {
        "metricName": (1, FieldDescriptor.TYPE_STRING, False),
        "targetSize": (2, FieldDescriptor.TYPE_INT64, False),
        "targetSizeFloat": (3, FieldDescriptor.TYPE_DOUBLE, False),
    },
    "GetMetricsRequest": {
        "scaledObjectRef": (1, FieldDescriptor.TYPE_MESSAGE, False),
        "metricName": (2, FieldDescriptor.TYPE_STRING, False),
    },
    "GetMetricsResponse": {"metricValues": (1, FieldDescriptor.TYPE_MESSAGE, True)},
    "MetricValue": {
        "metricName": (1, FieldDescriptor.TYPE_STRING, False),
        "metricValue": (2, FieldDescriptor.TYPE_INT64, False),
        "metricValueFloat": (3, FieldDescriptor.TYPE_DOUBLE, False),
    },
}


def test_keda_external_scaler_is_wire_compatible() -> None:
    from scheduler.api.gen.externalscaler import externalscaler_pb2 as es

    fd = es.DESCRIPTOR
    assert fd.package == "externalscaler"
    assert fd.name == "externalscaler/externalscaler.proto"
    for msg_name, fields in _KEDA.items():
        proto = descriptor_pb2.DescriptorProto()
        fd.message_types_by_name[msg_name].CopyToProto(proto)
        got = {
            f.name: (f.number, f.type, f.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
            for f in proto.field
        }
        assert got == fields, msg_name
    meta = fd.message_types_by_name["ScaledObjectRef"].fields_by_name["scalerMetadata"].message_type
    assert meta is not None and meta.GetOptions().map_entry
    assert [(f.name, f.type) for f in meta.fields] == [
        ("key", FieldDescriptor.TYPE_STRING),
        ("value", FieldDescriptor.TYPE_STRING),
    ]
    for msg_name, field_name, type_name in [
        ("GetMetricSpecResponse", "metricSpecs", "MetricSpec"),
        ("GetMetricsResponse", "metricValues", "MetricValue"),
        ("GetMetricsRequest", "scaledObjectRef", "ScaledObjectRef"),
    ]:
        field_type = fd.message_types_by_name[msg_name].fields_by_name[field_name].message_type
        assert field_type is not None and field_type.full_name == f"externalscaler.{type_name}"

    svc = fd.services_by_name["ExternalScaler"]
    assert svc.full_name == "externalscaler.ExternalScaler"
    got_methods = {
        m.name: (m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming)
        for m in svc.methods
    }
    assert got_methods == {
        "IsActive": ("externalscaler.ScaledObjectRef", "externalscaler.IsActiveResponse", False, False),
        "StreamIsActive": ("externalscaler.ScaledObjectRef", "externalscaler.IsActiveResponse", False, True),
        "GetMetricSpec": (
            "externalscaler.ScaledObjectRef",
            "externalscaler.GetMetricSpecResponse",
            False,
            False,
        ),
        "GetMetrics": ("externalscaler.GetMetricsRequest", "externalscaler.GetMetricsResponse", False, False),
    }


# ---------------------------------------------------------------- comments

# FileDescriptorProto / DescriptorProto / EnumDescriptorProto / ServiceDescriptorProto field numbers
# used in SourceCodeInfo paths.
_FILE_MESSAGE, _FILE_ENUM, _FILE_SERVICE = 4, 5, 6
_MSG_FIELD, _MSG_NESTED, _MSG_ENUM = 2, 3, 4
_ENUM_VALUE = 2
_SERVICE_METHOD = 2


@pytest.fixture(scope="module")
def slotsched_files(tmp_path_factory: pytest.TempPathFactory) -> list[descriptor_pb2.FileDescriptorProto]:
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("descriptors") / "slotsched.pb"
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path={PROTO_DIR}",
            f"--proto_path={resources.files('grpc_tools') / '_proto'}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *SLOTSCHED_PROTOS,
        ]
    )
    assert rc == 0, "protoc failed on proto/slotsched"
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return list(fds.file)


_Element = tuple[tuple[int, ...], str]


def _elements(fd: descriptor_pb2.FileDescriptorProto) -> Iterator[_Element]:
    """(source path, full name) of every message, field, enum, enum value, service and rpc."""

    def enum(path: tuple[int, ...], e: descriptor_pb2.EnumDescriptorProto, scope: str) -> Iterator[_Element]:
        yield path, f"{scope}.{e.name}"
        for i, v in enumerate(e.value):
            yield (*path, _ENUM_VALUE, i), f"{scope}.{e.name}.{v.name}"

    def message(path: tuple[int, ...], m: descriptor_pb2.DescriptorProto, scope: str) -> Iterator[_Element]:
        name = f"{scope}.{m.name}"
        if m.options.map_entry:  # synthesized for map<,> fields: documented by the field
            return
        yield path, name
        for i, f in enumerate(m.field):
            yield (*path, _MSG_FIELD, i), f"{name}.{f.name}"
        for i, nested in enumerate(m.nested_type):
            yield from message((*path, _MSG_NESTED, i), nested, name)
        for i, e in enumerate(m.enum_type):
            yield from enum((*path, _MSG_ENUM, i), e, name)

    for i, m in enumerate(fd.message_type):
        yield from message((_FILE_MESSAGE, i), m, fd.package)
    for i, e in enumerate(fd.enum_type):
        yield from enum((_FILE_ENUM, i), e, fd.package)
    for i, s in enumerate(fd.service):
        yield (_FILE_SERVICE, i), f"{fd.package}.{s.name}"
        for j, meth in enumerate(s.method):
            yield (_FILE_SERVICE, i, _SERVICE_METHOD, j), f"{fd.package}.{s.name}.{meth.name}"


def test_every_slotsched_element_has_a_leading_comment(
    slotsched_files: list[descriptor_pb2.FileDescriptorProto],
) -> None:
    assert sorted(f.name for f in slotsched_files) == SLOTSCHED_PROTOS
    missing = []
    checked = 0
    for fd in slotsched_files:
        assert fd.package == "slotsched.v1", fd.name
        comments = {tuple(loc.path): loc.leading_comments for loc in fd.source_code_info.location}
        for path, name in _elements(fd):
            checked += 1
            if not comments.get(path, "").strip():
                missing.append(f"{fd.name}: {name}")
    assert checked > 200
    assert not missing, "elements without a leading comment:\n  " + "\n  ".join(missing)


def test_rpc_comments_document_errors(slotsched_files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    """Each rpc's comment lists the status codes it can fail with."""
    undocumented = []
    for fd in slotsched_files:
        comments = {tuple(loc.path): loc.leading_comments for loc in fd.source_code_info.location}
        for i, s in enumerate(fd.service):
            for j, meth in enumerate(s.method):
                text = comments.get((_FILE_SERVICE, i, _SERVICE_METHOD, j), "")
                if "Errors" not in text or "UNAUTHENTICATED" not in text:
                    undocumented.append(f"{s.name}.{meth.name}")
    assert not undocumented, f"rpcs whose comment lists no error codes: {undocumented}"
