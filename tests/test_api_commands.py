"""The one table of session commands (scheduler/api/commands.py) and the wire vocabulary
(scheduler/api/wire.py) cover what the generated descriptors define: a command added to the
proto fails here until it has its row."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
from grpc_status import rpc_status

from scheduler.api import commands, wire
from scheduler.api.gen.slotsched.v1 import scheduler_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["Scheduler"]
ONEOF = {f.name: f for f in pb.ChannelCommand.DESCRIPTOR.oneofs_by_name["command"].fields}
ANSWERS = {f.name: f for f in pb.ChannelEvent.DESCRIPTOR.oneofs_by_name["kind"].fields}
COMMON_PROTO = Path(__file__).resolve().parents[1] / "proto" / "slotsched" / "v1" / "common.proto"


def test_every_channel_command_has_a_row() -> None:
    assert list(ONEOF) == list(commands.BY_FIELD)


def test_every_scheduler_rpc_is_a_command_or_named_as_none() -> None:
    rpcs = {m.name for m in SERVICE.methods}
    assert rpcs == set(commands.BY_RPC) | commands.NOT_COMMANDS
    assert not set(commands.BY_RPC) & commands.NOT_COMMANDS


def test_each_row_matches_its_descriptors() -> None:
    for c in commands.COMMANDS:
        method = SERVICE.methods_by_name[c.rpc]  # Withdraw stands for Release
        if c.name == c.rpc:
            assert method.input_type is c.request.DESCRIPTOR, c.name
            assert method.server_streaming is c.streaming, c.name
            assert not method.client_streaming, c.name
        if c.field is not None:
            assert ONEOF[c.field].message_type is c.request.DESCRIPTOR, c.name
        if c.answer is not None:
            assert c.answer in ANSWERS, c.name
            assert c.field is not None, f"{c.name}: an answer on a Channel it is not sent on"
            if c.name == c.rpc:  # the answer is the per-session rpc's response
                assert ANSWERS[c.answer].message_type is method.output_type, c.name
        elif c.field is not None:
            assert c.streaming, f"{c.name}: a Channel command no event answers"
        assert c.why, c.name


def test_the_answers_cover_the_channel_events_but_lease_events_and_errors() -> None:
    answered = {c.answer for c in commands.COMMANDS if c.answer}
    assert answered | {"event", "error"} == set(ANSWERS)


def test_renewals_are_what_frees_or_keeps_a_slot_or_gives_tokens_back() -> None:
    renewals = {c.name for c in commands.COMMANDS if c.flow is commands.Flow.RENEWALS}
    assert renewals == {"Renew", "Release", "Yield", "Withdraw", "SettlePermit"}


def test_only_a_permit_request_is_answered_again_on_its_ref() -> None:
    assert {c.name for c in commands.COMMANDS if c.follows} == {"RequestPermit"}


def test_every_reason_is_documented_with_its_status() -> None:
    text = COMMON_PROTO.read_text()
    documented = dict(re.findall(r"^//\s+([A-Z_]+)\s+([A-Z_]+):", text, re.M))
    assert {r.value: r.code.name for r in wire.Reason} == documented


def test_reasons_read_as_the_strings_on_the_wire() -> None:
    assert wire.Reason.NO_QUOTA == "NO_QUOTA"
    assert f"{wire.Reason.CHANNEL_FULL}" == "CHANNEL_FULL"
    assert wire.Reason("NOT_LEADER").code is grpc.StatusCode.UNAVAILABLE
    for code, reason in wire.DEFAULT_REASONS.items():
        assert reason.code is code


def test_details_key_is_grpc_status_s() -> None:
    assert rpc_status.GRPC_DETAILS_METADATA_KEY == wire.DETAILS
