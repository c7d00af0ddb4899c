"""The gRPC wire contract of slotsched (`proto/slotsched/v1`, `proto/externalscaler`).

`scheduler.api.gen` holds the Python code generated from it by `python scripts/gen_proto.py`
(never edit it by hand; `python scripts/gen_proto.py --check` and `tests/test_proto_generated.py`
fail when it is stale). Import generated modules as
`from scheduler.api.gen.slotsched.v1 import scheduler_pb2, scheduler_pb2_grpc`; importing a
`*_pb2` module registers its descriptor in the default pool, which is all server reflection needs.
"""
