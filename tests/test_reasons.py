"""The one table of refusal reasons (scheduler/api/reasons.py) and its readers agree: the core's
`RefuseReason`, the wire's `Reason`, the ErrorInfo reasons documented in common.proto, the SDK's
error classes, the server's statuses, the metric label and the simulator's RETRYABLE. A reason
without its row (or a row without its reason) fails here."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import grpc.aio
import pytest
from google.rpc import error_details_pb2, status_pb2

from scheduler.api import reasons, wire
from scheduler.client import errors as sdk_errors
from scheduler.client.reactions import from_rpc_error
from scheduler.core.types import Refused, RefuseReason, SessionId
from scheduler.server import errors as server_errors
from scheduler.sim.simulator import RETRYABLE

COMMON_PROTO = Path(__file__).resolve().parent.parent / "proto" / "slotsched" / "v1" / "common.proto"


def _documented() -> dict[str, str]:
    """ErrorInfo reason -> status name, from common.proto's list."""
    text = COMMON_PROTO.read_text()
    return dict(re.findall(r"^//\s+([A-Z_]+)\s+([A-Z_]+):", text, re.M))


def test_every_core_refusal_has_its_row_and_every_core_row_its_refusal() -> None:
    assert {r.value for r in RefuseReason} == set(reasons.CORE)


def test_every_wire_reason_has_its_row_with_its_status() -> None:
    assert set(wire.Reason) == set(reasons.BY_INFO)
    for reason in wire.Reason:
        assert reason.code.name == reasons.BY_INFO[reason].status, reason


def test_the_rows_are_the_reasons_common_proto_documents() -> None:
    documented = _documented()
    assert documented == {r.info: r.status for r in reasons.REASONS if r.info is not None}


def test_every_budget_refusal_has_its_row() -> None:
    from scheduler.core.budget.types import PermitRefuseReason, SettleRefuseReason

    assert {r.value for r in PermitRefuseReason} | {r.value for r in SettleRefuseReason} == set(
        reasons.BUDGET
    )


@pytest.mark.parametrize("value", sorted(reasons.BUDGET), ids=str)
def test_the_server_answers_a_budget_refusal_as_its_row_says(value: str) -> None:
    row = reasons.BUDGET[value]
    failure = server_errors.from_budget_refused(value, "m", "acme", "estimate.input_tokens", 2.5)
    assert (
        failure.code
        is grpc.StatusCode[row.status if row.info or row.status == "INVALID_ARGUMENT" else "INTERNAL"]
    )
    assert failure.reason == (row.info or "")
    if row.status == "INVALID_ARGUMENT":
        assert failure.message.startswith("estimate.input_tokens")
    retry_after = dict(failure.metadata).get(wire.RETRY_AFTER_MS)
    assert (retry_after == "2500") is (row.retry_after is reasons.RetryAfter.CORE)


def test_names_are_unique_and_status_names_are_grpcs() -> None:
    assert len(reasons.BY_NAME) == len(reasons.REASONS)
    for row in reasons.REASONS:
        assert row.status in grpc.StatusCode.__members__, row
        assert row.hint and row.metric == row.name, row


def _rpc_error(code: grpc.StatusCode, reason: str) -> grpc.aio.AioRpcError:
    info = error_details_pb2.ErrorInfo(reason=reason, domain=wire.DOMAIN)
    status = status_pb2.Status(code=code.value[0], message="m")
    status.details.add().Pack(info)
    trailers = grpc.aio.Metadata((wire.DETAILS, status.SerializeToString()))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailers, "m", None)


@pytest.mark.parametrize("row", [r for r in reasons.REASONS if r.info is not None], ids=lambda r: r.name)
def test_the_sdk_raises_each_reasons_class_carrying_the_reason(row: reasons.Row) -> None:
    assert row.info is not None
    cls = sdk_errors.BY_NAME[row.error]
    err = from_rpc_error(_rpc_error(grpc.StatusCode[row.status], row.info))
    assert type(err) is cls, (row.name, err)
    assert err.reason == row.info and err.code is grpc.StatusCode[row.status]


def test_every_error_class_of_the_table_is_the_sdks() -> None:
    for row in reasons.REASONS:
        assert issubclass(sdk_errors.BY_NAME[row.error], sdk_errors.SlotschedError), row


@pytest.mark.parametrize("reason", list(RefuseReason), ids=str)
def test_the_server_answers_a_core_refusal_as_its_row_says(reason: RefuseReason) -> None:
    row = reasons.of(reason)
    failure = server_errors.from_refused(Refused(SessionId("s"), reason, "m", retry_after_s=1.5), "acme")
    assert failure.code is grpc.StatusCode[row.status]
    assert failure.reason == (row.info or "")
    retry_after = dict(failure.metadata).get(wire.RETRY_AFTER_MS)
    assert (retry_after == "1500") is (row.retry_after is reasons.RetryAfter.CORE)


def test_the_simulator_retries_the_core_refusals_whose_row_says_so() -> None:
    expected = {RefuseReason.QUEUE_FULL, RefuseReason.TENANT_QUEUE_FULL}
    assert RETRYABLE == expected == {RefuseReason(n) for n in reasons.RETRYABLE}


def test_a_reason_without_a_row_is_named() -> None:
    with pytest.raises(KeyError, match="no row for the refusal reason 'nosuch'"):
        reasons.of("nosuch")
