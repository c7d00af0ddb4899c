"""The wire for non-Python clients: reflection v1 beside v1alpha (a v1 client over real gRPC),
the google.rpc protos shipped, go/java options on every proto, `buf lint` clean, and an ErrorInfo
with a documented reason on every PERMISSION_DENIED, FAILED_PRECONDITION and RESOURCE_EXHAUSTED."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, message_factory
from google.rpc import error_details_pb2, status_pb2

from scheduler.core.types import ErrorCode, Refused, RefuseReason, Rejected, SessionId
from scheduler.server import errors, reflection_v1
from tests.grpc_fixtures import TOKENS, B, Client, G, running_server, status_of

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
GOOGLE_RPC = Path(status_pb2.__file__).parent


# --- reflection v1 ------------------------------------------------------------------------------


def _v1_classes() -> tuple[Any, Any]:
    fd = reflection_v1.v1_file()
    req = message_factory.GetMessageClass(fd.message_types_by_name["ServerReflectionRequest"])
    resp = message_factory.GetMessageClass(fd.message_types_by_name["ServerReflectionResponse"])
    assert req.DESCRIPTOR.full_name == "grpc.reflection.v1.ServerReflectionRequest"
    return req, resp


def test_a_v1_reflection_client_lists_and_describes_the_services() -> None:
    req_cls, resp_cls = _v1_classes()
    with running_server(None) as server:

        async def go() -> list[Any]:
            async with grpc.aio.insecure_channel(server.target) as ch:
                call = ch.stream_stream(
                    f"/{reflection_v1.SERVICE_NAME}/ServerReflectionInfo",
                    request_serializer=req_cls.SerializeToString,
                    response_deserializer=resp_cls.FromString,
                )
                requests = [
                    req_cls(list_services=""),
                    req_cls(file_containing_symbol="slotsched.v1.Scheduler"),
                    req_cls(file_containing_symbol=reflection_v1.SERVICE_NAME),
                ]
                return [r async for r in call(iter(requests))]

        listed, scheduler, itself = asyncio.run(go())
    names = {s.name for s in listed.list_services_response.service}
    assert {"slotsched.v1.Scheduler", "slotsched.v1.Admin", "grpc.health.v1.Health"} <= names
    assert {"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"} <= names
    files = {}
    for blob in scheduler.file_descriptor_response.file_descriptor_proto:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(blob)
        files[fdp.name] = fdp
    assert files["slotsched/v1/scheduler.proto"].options.java_package == "dev.slotsched.v1"
    assert "slotsched/v1/common.proto" in files  # with its dependencies
    (own,) = itself.file_descriptor_response.file_descriptor_proto
    fdp = descriptor_pb2.FileDescriptorProto.FromString(own)
    assert (fdp.name, fdp.package) == ("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1")
    assert fdp.service[0].method[0].input_type == ".grpc.reflection.v1.ServerReflectionRequest"


# --- protos -------------------------------------------------------------------------------------


def test_the_google_rpc_protos_are_shipped_verbatim_with_their_licence() -> None:
    for name in ("status.proto", "error_details.proto"):
        shipped = (PROTO / "google" / "rpc" / name).read_text()
        assert shipped == (GOOGLE_RPC / name).read_text(), f"proto/google/rpc/{name} differs from googleapis"
        assert "Licensed under the Apache License, Version 2.0" in shipped


@pytest.mark.parametrize("path", sorted(p.relative_to(PROTO).as_posix() for p in PROTO.rglob("*.proto")))
def test_every_proto_names_its_go_and_java_packages(path: str) -> None:
    text = (PROTO / path).read_text()
    for option in ("go_package", "java_package", "java_multiple_files"):
        assert re.search(rf"^option {option} = ", text, re.M), f"{path}: no option {option}"


def _buf() -> list[str] | None:
    if shutil.which("buf"):
        return ["buf"]
    if shutil.which("npx"):
        return ["npx", "--yes", "@bufbuild/buf"]
    return None


def test_buf_lint_is_clean() -> None:
    cmd = _buf()
    if cmd is None:
        if os.environ.get("CI"):
            pytest.fail("neither buf nor npx is installed")
        pytest.skip("neither buf nor npx is installed (CI fails instead)")
    try:
        version = subprocess.run([*cmd, "--version"], cwd=PROTO, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        version = None
    if version is None or version.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"buf could not be run: {version.stderr if version else 'timeout'}")
        pytest.skip("buf could not be installed through npx (no registry?); CI fails instead")
    lint = subprocess.run([*cmd, "lint"], cwd=PROTO, capture_output=True, text=True, timeout=180)
    assert lint.returncode == 0, lint.stdout + lint.stderr


# --- ErrorInfo ----------------------------------------------------------------------------------


def documented_reasons() -> dict[str, str]:
    """reason -> code, from the ErrorInfo list in proto/slotsched/v1/common.proto."""
    text = (PROTO / "slotsched" / "v1" / "common.proto").read_text()
    return dict(
        re.findall(
            r"^//\s+([A-Z_]+)\s+(PERMISSION_DENIED|FAILED_PRECONDITION|RESOURCE_EXHAUSTED|UNAVAILABLE):",
            text,
            re.M,
        )
    )


def error_info(failure: errors.RpcFailure) -> error_details_pb2.ErrorInfo | None:
    md = dict(failure.trailing_metadata())
    if errors.DETAILS_KEY not in md:
        return None
    status = status_pb2.Status.FromString(md[errors.DETAILS_KEY])  # type: ignore[arg-type]
    assert status.code == failure.code.value[0]
    for d in status.details:
        info = error_details_pb2.ErrorInfo()
        if d.Unpack(info):
            return info
    return None


WITH_INFO = (
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


def _builders() -> list[tuple[str, errors.RpcFailure]]:
    out = [
        ("permission_denied", errors.permission_denied("no")),
        ("failed_precondition", errors.failed_precondition("no")),
        ("a bare RESOURCE_EXHAUSTED", errors.RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down")),
    ]
    for reason in RefuseReason:
        if reason is not RefuseReason.DUPLICATE_SESSION:
            out.append(
                (f"refused {reason}", errors.from_refused(Refused(SessionId("s"), reason, "m"), "acme"))
            )
    out += [(f"rejected {c}", errors.from_rejected(Rejected(None, c, "m"))) for c in ErrorCode]
    return out


@pytest.mark.parametrize(("name", "failure"), _builders(), ids=[n for n, _ in _builders()])
def test_every_such_error_carries_an_error_info_with_a_documented_reason(
    name: str, failure: errors.RpcFailure
) -> None:
    info = error_info(failure)
    if failure.code not in WITH_INFO:
        assert info is None, name
        return
    assert info is not None, f"{name}: {failure.code.name} without an ErrorInfo"
    assert info.domain == "slotsched.dev"
    documented = documented_reasons()
    assert info.reason in documented, f"{name}: reason {info.reason} is not documented in common.proto"
    assert documented[info.reason] == failure.code.name, name


def test_the_documented_reasons_are_the_ones_errors_py_uses() -> None:
    used = {v for k, v in vars(errors).items() if k.isupper() and isinstance(v, str) and v.isupper()}
    assert set(documented_reasons()) == used - {"DOMAIN"}


def test_no_quota_and_a_bad_credential_differ_by_reason_over_grpc() -> None:
    with running_server(None) as dev, running_server(_policy()) as secure:

        async def reason(target: str, **kw: str) -> tuple[grpc.StatusCode, str, dict[str, str]]:
            async with Client(target, **kw) as c:
                call = c.acquire("x", B if "tenant" in kw else G)
                code, _message = await status_of(call)
                md = dict(await call.trailing_metadata())
            status = status_pb2.Status.FromString(md[errors.DETAILS_KEY])
            for d in status.details:
                info = error_details_pb2.ErrorInfo()
                if d.Unpack(info):
                    return code, info.reason, dict(info.metadata)
            raise AssertionError("no ErrorInfo")

        no_quota = asyncio.run(reason(secure.target, token=TOKENS["globex"]))  # globex: no Guaranteed
        assert no_quota == (grpc.StatusCode.PERMISSION_DENIED, "NO_QUOTA", {"tenant": "globex"})
        bad = asyncio.run(reason(dev.target, tenant="nobody"))
        assert bad[:2] == (grpc.StatusCode.PERMISSION_DENIED, "CREDENTIAL_DENIED")


def _policy() -> str:
    from tests.grpc_fixtures import policy_yaml

    return policy_yaml()
